// The agreement protocol (detail/agreement.hpp) on its own: one allreduce when every rank
// agrees; otherwise every rank throws the same message, naming the first difference.
#include <doctest/doctest.h>

#include <pactrain/detail/agreement.hpp>
#include <pactrain/mpi.hpp>

#include "common/mpi_helpers.hpp"

#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

using namespace pactrain;
using detail::agreement_input;

namespace {

// Counts the collectives the protocol runs on the way to the MPI communicator.
class counting_communicator {
 public:
  using request_type = mpi_communicator::request_type;
  explicit counting_communicator(mpi_communicator& c) : c_(&c) {}
  [[nodiscard]] int rank() const { return c_->rank(); }
  [[nodiscard]] int size() const { return c_->size(); }
  template <class T>
  void allreduce(std::span<T> d, reduce_op op) {
    ++allreduces;
    c_->allreduce(d, op);
  }
  template <class T>
  request_type allreduce_async(std::span<T> d, reduce_op op) {
    ++allreduces;
    return c_->allreduce_async(d, op);
  }
  template <class T>
  void broadcast(std::span<T> d, int root) {
    ++broadcasts;
    c_->broadcast(d, root);
  }
  int allreduces = 0;
  int broadcasts = 0;

 private:
  mpi_communicator* c_;
};

param_layout three_tensors(std::size_t capacity = 64, const char* last = "w2") {
  param_layout l(capacity);
  l.add("w1", 4, 8).add("b1", 8).add(last, 2, 8);
  return l;
}

// Whether s is the same string on every rank.
bool same_on_every_rank(const std::string& s) {
  const std::uint64_t d = digest_builder(0).add(s).value();
  std::uint64_t v[2] = {d, ~d};
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return v[0] == ~v[1];
}

struct fixture {
  mpi_communicator mpi{MPI_COMM_WORLD};
  counting_communicator comm{mpi};
  param_layout layout = three_tensors();
  std::vector<std::uint64_t> digests = {11, 22, 33};
  int last_rank = comm.size() - 1;
  bool several = comm.size() > 1;
  agreement_input in() {
    agreement_input a;
    a.layout = &layout;
    a.mask_digests = digests;
    a.config_digest = 5;
    a.codec_digest = 7;
    a.operation = "set_masks";
    return a;
  }
  // The message every rank throws (checked to be the same), "" when none throws.
  std::string run(const agreement_input& a) {
    const std::string msg = test::error_of([&] { detail::agree(comm, a); });
    CHECK(same_on_every_rank(msg));
    return msg;
  }
};

}  // namespace

TEST_CASE_FIXTURE(fixture, "ranks that agree pay one allreduce of a few words") {
  CHECK(run(in()).empty());
  CHECK(comm.allreduces == 1);
  CHECK(comm.broadcasts == 0);
}

TEST_CASE_FIXTURE(fixture, "a rank's own error reaches every rank; the highest rank's wins") {
  auto a = in();
  if (comm.rank() == 0) a.local_error = "pactrain: rank zero's reason";
  if (comm.rank() == last_rank) a.local_error = "pactrain: the last rank's reason";
  CHECK(run(a) == "pactrain: set_masks rejected on rank " + std::to_string(last_rank) +
                      ": the last rank's reason");
  CHECK(comm.broadcasts == 1);
}

TEST_CASE_FIXTURE(fixture, "an error message is cut to the broadcast's 1023 bytes") {
  auto a = in();
  if (comm.rank() == 0) a.local_error = std::string(5000, 'x');
  CHECK(run(a) == "pactrain: set_masks rejected on rank 0: " + std::string(1023, 'x'));
}

TEST_CASE_FIXTURE(fixture, "different masks name the first different tensor") {
  if (comm.rank() == last_rank) digests[1] = 99;
  if (comm.rank() == last_rank) digests[2] = 98;
  auto msg = run(in());
  if (several) {
    CHECK(msg ==
          "pactrain: set_masks: masks differ across ranks, first at tensor 1 'b1' (name "
          "as on rank 0)");
    CHECK(comm.allreduces == 2);
  } else {
    CHECK(msg.empty());
  }
}

TEST_CASE_FIXTURE(fixture, "layouts: tensor count, tensor shape, bucket capacity") {
  const bool odd = comm.rank() == last_rank && several;
  SUBCASE("count") {
    if (odd) layout.add("extra", 3);
    if (odd) digests.push_back(44);
    CHECK(run(in()) == (several ? "pactrain: set_masks: layouts differ across ranks: between 3 "
                                  "and 4 tensors"
                                : ""));
  }
  SUBCASE("a tensor's name") {
    if (odd) layout = three_tensors(64, "w2_renamed");
    CHECK(run(in()) == (several ? "pactrain: set_masks: layouts differ across ranks, first at "
                                  "tensor 2 'w2' (name as on rank 0)"
                                : ""));
  }
  SUBCASE("the bucket capacity") {
    if (odd) layout = three_tensors(128);
    CHECK(run(in()) == (several ? "pactrain: set_masks: layouts differ across ranks: bucket "
                                  "capacities differ"
                                : ""));
  }
}

TEST_CASE_FIXTURE(fixture, "strategies and codec settings") {
  auto a = in();
  SUBCASE("strategies") {
    if (comm.rank() == last_rank) a.config_digest = 6;
    CHECK(run(a) == (several ? "pactrain: set_masks: bucket strategies differ across ranks" : ""));
  }
  SUBCASE("codec") {
    if (comm.rank() == last_rank) a.codec_digest = 8;
    CHECK(run(a) == (several ? "pactrain: set_masks: codec settings differ across ranks (codec "
                               "options, value type or "
                               "feedback)"
                             : ""));
  }
  SUBCASE("a rank's error is reported before any difference") {
    if (comm.rank() == last_rank) a.codec_digest = 8;
    if (comm.rank() == 0) a.local_error = "bad";
    CHECK(run(a) == "pactrain: set_masks rejected on rank 0: bad");
  }
}
