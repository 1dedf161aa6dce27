// The main() of the single-process device tests (tests/cuda/*_test.cu, except the MPI one,
// which uses tests/mpi/mpi_doctest_main.cpp): exits with 77, which ctest reports as skipped,
// when no CUDA device is usable, and runs doctest otherwise. Compiled by the host compiler, with
// doctest's implementation from tests/common/doctest_impl.cpp, so that no nvcc-compiled test
// compiles it.
#include <doctest/doctest.h>

#include <pactrain/cuda/detail/cuda_runtime.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (pactrain::detail::cuda_device_count() == 0) {
    std::printf("no CUDA device usable: %s: test skipped\n",
                pactrain::detail::cuda_device_status().c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
