// doctest's implementation, compiled once for every test main (tests/common/doctest_main.cpp,
// tests/mpi/mpi_doctest_main.cpp, tests/cuda/gpu_doctest_main.cpp): it costs about 6 s of one
// core per translation unit in the sanitizer build, where the mains themselves are small.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
