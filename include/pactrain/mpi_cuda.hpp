// Moved to <pactrain/cuda/mpi_cuda.hpp>; this path forwards for this release.
#pragma once

#include <pactrain/cuda/mpi_cuda.hpp>
