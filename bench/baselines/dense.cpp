// dense: one MPI_Iallreduce (MPI_SUM, MPI_FLOAT, in place) of the whole gradient, then a scale
// by 1/P: the plain dense baseline, with whatever algorithm Open MPI picks or is told to use.
#include "../sync/harness.hpp"

namespace sync_bench {
namespace {

class dense_method final : public method {
 public:
  dense_method(MPI_Comm comm, std::size_t n) : comm_(comm), n_(n) { MPI_Comm_size(comm_, &ranks_); }
  double sync(std::span<float> g) override {
    allreduce_in_place(g.data(), g.size(), sizeof(float), MPI_FLOAT, MPI_SUM, comm_);
    const auto t0 = clock_type::now();
    const float scale = 1.0f / static_cast<float>(ranks_);
    for (auto& v : g) v *= scale;
    return seconds_since(t0);
  }
  [[nodiscard]] std::size_t bytes_sent() const override { return n_ * sizeof(float); }
  std::vector<float> reference(const options& o, int ranks) override {
    return dense_average(o, n_, ranks);
  }

 private:
  MPI_Comm comm_;
  std::size_t n_;
  int ranks_ = 1;
};

}  // namespace

std::unique_ptr<method> make_dense(const method_args& a) {
  return std::make_unique<dense_method>(a.comm, a.n);
}

}  // namespace sync_bench
