// Downstream smoke test: the installed (or embedded) headers compile in a foreign project, with
// the project's own compiler, and the program links and runs. It also runs one small sync per
// codec on one rank, so that the compactor's and codecs' kernels are compiled and checked
// there too. Built and run by run_consumer.cmake.
#include <pactrain/pactrain.hpp>
#include <pactrain/planner.hpp>

#include <cstdio>
#include <vector>

#if defined(PACTRAIN_CONSUMER_MPI)
#include <pactrain/mpi.hpp>
#endif

#if !defined(PACTRAIN_VERSION_MAJOR) || !defined(PACTRAIN_VERSION_MINOR) || \
    !defined(PACTRAIN_VERSION_PATCH)
#error "<pactrain/pactrain.hpp> does not define the PACTRAIN_VERSION_* macros"
#endif

namespace {

// One rank, 1000 entries, every third kept. With |g| = s = 0.5 at every entry the ternary
// rounding is exact (t = sign g), so every codec must return g at kept entries and +0 elsewhere.
template <class Codec>
bool one_rank_sync(Codec codec) {
  pactrain::param_layout layout;
  layout.add("w", 1000);
  pactrain::sync<pactrain::loopback_communicator, Codec> s{pactrain::loopback_communicator{},
                                                           layout, codec};
  s.set_masks(
      {pactrain::bitmap_mask::from_predicate(1000, [](std::size_t i) { return i % 3 == 0; })});
  std::vector<float> g(1000);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = i % 2 == 0 ? 0.5f : -0.5f;
  s.allreduce(std::span<float>(g));
  for (std::size_t i = 0; i < g.size(); ++i) {
    const float want = i % 3 != 0 ? 0.0f : (i % 2 == 0 ? 0.5f : -0.5f);
    if (g[i] != want) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 1;
#if defined(PACTRAIN_CONSUMER_MPI)
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
#else
  (void)argc;
  (void)argv;
#endif
  const bool ok = one_rank_sync(pactrain::identity_codec<float>{}) &&
                  one_rank_sync(pactrain::fp16_codec{}) &&
                  one_rank_sync<pactrain::error_feedback<pactrain::ternary_codec>>(
                      pactrain::ternary_codec{{.seed = 1}});
  std::printf("pactrain consumer: version %d.%d.%d, %d rank(s), syncs %s\n", PACTRAIN_VERSION_MAJOR,
              PACTRAIN_VERSION_MINOR, PACTRAIN_VERSION_PATCH, ranks, ok ? "ok" : "WRONG");
#if defined(PACTRAIN_CONSUMER_MPI)
  MPI_Finalize();
#endif
  return ok ? 0 : 1;
}
