// dense: one MPI_Allreduce (MPI_SUM, MPI_FLOAT, in place) of the whole gradient, then a scale
// by 1/P: the plain dense baseline, with whatever algorithm Open MPI picks or is told to use.
#include "../sync/harness.hpp"

namespace sync_bench {
namespace {

class dense_method final : public method {
 public:
  dense_method(MPI_Comm comm, std::size_t n) : comm_(comm), n_(n) {
    MPI_Comm_size(comm_, &ranks_);
  }
  double sync(std::span<float> g) override {
    for (std::size_t at = 0; at < g.size(); at += chunk) {
      const int c = static_cast<int>(std::min(chunk, g.size() - at));
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, g.data() + at, c, MPI_FLOAT, MPI_SUM, comm_),
                "MPI_Allreduce");
    }
    const auto t0 = clock_type::now();
    const float scale = 1.0f / static_cast<float>(ranks_);
    for (auto& v : g) v *= scale;
    return seconds_since(t0);
  }
  [[nodiscard]] std::size_t bytes_sent() const override { return n_ * sizeof(float); }
  std::vector<float> reference(const options& o, int ranks) override {
    return dense_average(o, n_, ranks);
  }
  [[nodiscard]] collective_choice collective(const pactrain::mpi_allreduce_config& c,
                                             int ranks) const override {
    return {pactrain::to_string(c.blocking(std::min(n_, chunk), sizeof(float), ranks)),
            c.readable && (c.blocking_forced != 0 || c.blocking_rules_file)};
  }

 private:
  static constexpr std::size_t chunk = std::size_t{1} << 30;
  MPI_Comm comm_;
  std::size_t n_;
  int ranks_ = 1;
};

}  // namespace

std::unique_ptr<method> make_dense(const method_args& a) {
  return std::make_unique<dense_method>(a.comm, a.n);
}

}  // namespace sync_bench
