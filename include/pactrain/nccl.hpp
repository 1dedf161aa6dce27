// Moved to <pactrain/cuda/nccl.hpp>; this path forwards for this release.
#pragma once

#include <pactrain/cuda/nccl.hpp>
