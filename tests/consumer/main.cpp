// Downstream smoke test: the installed (or embedded) headers compile in a foreign project and
// the program links and runs. Built and run by run_consumer.cmake.
#include <pactrain/pactrain.hpp>

#include <cstdio>

#if defined(PACTRAIN_CONSUMER_MPI)
#include <pactrain/mpi.hpp>
#endif

#if !defined(PACTRAIN_VERSION_MAJOR) || !defined(PACTRAIN_VERSION_MINOR) || \
    !defined(PACTRAIN_VERSION_PATCH)
#error "<pactrain/pactrain.hpp> does not define the PACTRAIN_VERSION_* macros"
#endif

int main(int argc, char** argv) {
  int ranks = 1;
#if defined(PACTRAIN_CONSUMER_MPI)
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
#else
  (void)argc;
  (void)argv;
#endif
  std::printf("pactrain consumer: version %d.%d.%d, %d rank(s)\n", PACTRAIN_VERSION_MAJOR,
              PACTRAIN_VERSION_MINOR, PACTRAIN_VERSION_PATCH, ranks);
#if defined(PACTRAIN_CONSUMER_MPI)
  MPI_Finalize();
#endif
  return 0;
}
