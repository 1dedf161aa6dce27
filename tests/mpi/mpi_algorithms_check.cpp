// mpi_allreduce_algorithms(): what Open MPI's allreduces will run. Registered twice by
// tests/CMakeLists.txt, on one rank each (the query is local): mpi.mpi_algorithms_test.np1 with
// Open MPI's defaults, and mpi.mpi_algorithms_test.ring.np1 with the environment that forces
// the ring (OMPI_MCA_coll_libnbc_iallreduce_algorithm=1, coll/tuned's dynamic rules with
// allreduce algorithm 4) and PACTRAIN_TEST_EXPECT_RING=1. Not a *_test.cpp, so that the glob
// does not also register it on 2 and 4 ranks.
#include <doctest/doctest.h>

#include <pactrain/mpi.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>

using namespace pactrain;

namespace {

bool expect_ring() {
  const char* e = std::getenv("PACTRAIN_TEST_EXPECT_RING");
  return e != nullptr && std::string_view(e) == "1";
}

constexpr std::size_t mib = std::size_t{1} << 20;

}  // namespace

TEST_CASE("the query reports what Open MPI's allreduces will run") {
  const mpi_allreduce_config c = mpi_allreduce_algorithms();
  MESSAGE(to_string(c));
  if (!c.open_mpi) {
    MESSAGE("not Open MPI: nothing to check");
    CHECK_FALSE(c.readable);
    CHECK(c.nonblocking(mib, 4, 4) == allreduce_algorithm::unknown);
    return;
  }
  REQUIRE(c.readable);
  CHECK(c.nonblocking(mib, 4, 1) == allreduce_algorithm::single_rank);
  // 100 MB at 10% density: 2.5 Mi floats per rank, on 2 and 4 ranks, in place as the engine.
  const std::size_t payload = 10 * mib / 4;
  if (expect_ring()) {
    CHECK(c.nonblocking_forced == 1);
    CHECK(c.blocking_forced == 4);
    CHECK_FALSE(c.binomial_nonblocking());
    for (const int p : {2, 4}) {
      CHECK(c.nonblocking(payload, 4, p) == allreduce_algorithm::ring);
      CHECK(c.nonblocking(1024, 4, p) == allreduce_algorithm::ring);
      CHECK(c.blocking(payload, 4, p) == allreduce_algorithm::ring);
    }
    CHECK(mpi_algorithm_warning(c, 4).empty());
    CHECK(to_string(c).find("MPI_Iallreduce coll/libnbc forced ring") != std::string::npos);
  } else {
    CHECK(c.nonblocking_forced == 0);
    CHECK(c.blocking_forced == 0);
    CHECK(c.binomial_nonblocking());
    for (const int p : {2, 4}) {
      // libnbc: a binomial tree for every in-place call.
      CHECK(c.nonblocking(payload, 4, p) == allreduce_algorithm::binomial);
    }
    // With separate buffers, Rabenseifner's from 4 ranks and 64 KiB on; binomial below.
    CHECK(c.nonblocking(payload, 4, 4, false) == allreduce_algorithm::rabenseifner);
    CHECK(c.nonblocking(payload, 4, 2, false) == allreduce_algorithm::binomial);
    CHECK(c.nonblocking(16383, 4, 4, false) == allreduce_algorithm::binomial);
    // coll/tuned's fixed decision, commutative, from 4 KB to 100 MB.
    CHECK(c.blocking(1024, 4, 2) == allreduce_algorithm::ring);                // 4 KiB
    CHECK(c.blocking(2048, 4, 2) == allreduce_algorithm::recursive_doubling);  // 8 KiB
    CHECK(c.blocking(16384, 4, 2) == allreduce_algorithm::ring);               // 64 KiB
    CHECK(c.blocking(payload, 4, 2) == allreduce_algorithm::rabenseifner);     // 10 MiB
    CHECK(c.blocking(1024, 4, 4) == allreduce_algorithm::recursive_doubling);  // 4 KiB
    CHECK(c.blocking(2048, 4, 4) == allreduce_algorithm::rabenseifner);        // 8 KiB
    CHECK(c.blocking(25 * mib, 4, 4) == allreduce_algorithm::rabenseifner);    // 100 MiB
    CHECK(mpi_algorithm_warning(c, 1).empty());
    CHECK(mpi_algorithm_warning(c, 2).find("OMPI_MCA_coll_libnbc_iallreduce_algorithm=1") !=
          std::string::npos);
  }
}
