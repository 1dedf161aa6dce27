// The host core of pactrain in one include: masks, serialization, layouts, the host
// compactor, communicators (loopback), 16-bit value types, codecs, the sync engine, the
// planner and tuner, and pruning. MPI lives in <pactrain/mpi.hpp>.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/codec/half_precision.hpp>
#include <pactrain/codec/ternary.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/compactor.hpp>
#include <pactrain/cost_model.hpp>
#include <pactrain/detail/config.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>
#include <pactrain/feedback.hpp>
#include <pactrain/half.hpp>
#include <pactrain/huge_pages.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/planner.hpp>
#include <pactrain/pruning/pruner.hpp>
#include <pactrain/serialize.hpp>
#include <pactrain/sgd.hpp>
#include <pactrain/strategy.hpp>
#include <pactrain/sync.hpp>
#include <pactrain/sync_options.hpp>
#include <pactrain/tuner.hpp>
