// The main() of every MPI test executable (tests/mpi/*_test.cpp): runs doctest on every rank
// and combines the verdicts, so a check that fails on one rank fails the whole test.
//
//   mpiexec -n 4 build/tests/mpi/<name>_test [doctest options]
//
// Output: rank 0 reports in full. Other ranks run with doctest's --minimal, which prints
// nothing while everything passes and, as it happens, every failed check plus the summary;
// their lines carry a "[rank N]" prefix. Printing as it happens (not buffering until the end)
// keeps the last words of a rank that crashes or hangs. PACTRAIN_TEST_ALL_RANKS_VERBOSE=1 gives
// every rank full output.
//
// Every rank must run the same test cases in the same order, and a test must reach the same
// collectives on every rank: check with CHECK before a collective, not REQUIRE, or a failure on
// one rank leaves the others waiting until the ctest timeout.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <ostream>
#include <streambuf>
#include <string>
#include <utility>

namespace {

// Writes to `out` line by line, each line prefixed, and flushes after every line: the output of
// ranks interleaves by whole lines, and a crash loses at most the line being written.
class prefixed_line_buf : public std::streambuf {
 public:
  prefixed_line_buf(std::ostream& out, std::string prefix)
      : out_(out), prefix_(std::move(prefix)) {}
  ~prefixed_line_buf() override { flush_line(); }

 protected:
  int_type overflow(int_type ch) override {
    if (traits_type::eq_int_type(ch, traits_type::eof())) return traits_type::not_eof(ch);
    line_.push_back(traits_type::to_char_type(ch));
    if (ch == '\n') flush_line();
    return ch;
  }
  // A flush of the stream passes whole lines only: doctest flushes mid-line.
  int sync() override { return 0; }

 private:
  void flush_line() {
    if (line_.empty()) return;
    out_ << prefix_ << line_;
    if (line_.back() != '\n') out_ << '\n';
    out_.flush();
    line_.clear();
  }

  std::ostream& out_;
  std::string prefix_;
  std::string line_;
};

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' && std::string(value) != "0";
}

}  // namespace

// Optional gate of a test executable (the device tests: no GPU, skip): when the executable
// defines it and it returns nonzero on any rank, every rank exits with the largest such code
// before running a test (77 is ctest's skip code).
extern "C" int pactrain_mpi_test_skip_code() __attribute__((weak));

int main(int argc, char** argv) {
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
    std::fprintf(stderr, "mpi_doctest_main: MPI_Init failed\n");
    return 2;
  }
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  if (pactrain_mpi_test_skip_code != nullptr) {
    int skip = pactrain_mpi_test_skip_code();
    MPI_Allreduce(MPI_IN_PLACE, &skip, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (skip != 0) {
      MPI_Finalize();
      return skip;
    }
  }

  int failed = 0;
  bool should_exit = false;
  {
    prefixed_line_buf rank_buf(std::cout, "[rank " + std::to_string(rank) + "] ");
    std::ostream rank_out(&rank_buf);

    doctest::Context context;
    // Defaults first, so the command line can override them. Open MPI gives ranks a pseudo
    // terminal, so doctest would colour output that ends up in ctest logs.
    context.setOption("no-colors", true);
    if (rank != 0 && !env_flag("PACTRAIN_TEST_ALL_RANKS_VERBOSE")) {
      context.setOption("minimal", true);
    }
    context.applyCommandLine(argc, argv);
    if (rank != 0) context.setCout(&rank_out);

    failed = context.run() != 0 ? 1 : 0;
    should_exit = context.shouldExit();
    rank_out.flush();
  }

  int any_failed = failed;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);

  int failing_ranks = 0;
  MPI_Reduce(&failed, &failing_ranks, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  // --help, --list-test-cases and the like set shouldExit(): no verdict without a run.
  if (rank == 0 && !should_exit) {
    std::cout << "[mpi] " << size << " rank(s): "
              << (any_failed != 0 ? std::to_string(failing_ranks) + " failed"
                                  : std::string("all passed"))
              << std::endl;
  }

  MPI_Finalize();
  return any_failed;
}
