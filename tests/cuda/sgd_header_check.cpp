// <pactrain/cuda/sgd.hpp> must compile on its own and survive a second inclusion. It needs the
// CCCL headers (nvcc, or Thrust's CPP system), so the header check of
// cmake/PactrainHeaderCheck.cmake leaves it to this translation unit of the cuda-host test.
// clang-format off
#include <pactrain/cuda/sgd.hpp>
#include <pactrain/cuda/sgd.hpp>
// clang-format on
