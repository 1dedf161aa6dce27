// The device compactor's expectations (compactor_checks.hpp) on the CPU: thrust_compactor
// built with the host compiler on Thrust's CPP device system runs the same per-element
// functors as cuda_compactor's kernels. Label cuda-host; needs no GPU.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <pactrain/cuda/thrust_compactor.hpp>

#include "cuda/compactor_checks.hpp"

static_assert(THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CPP,
              "this test runs the device math on the CPU: build it with "
              "-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP");

TEST_CASE("thrust_compactor on the CPU equals host_compactor bit for bit") {
  pactrain::test::compactor_checks<pactrain::thrust_compactor>{}.all();
}
