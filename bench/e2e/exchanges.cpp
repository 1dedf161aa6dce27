// make_exchange (point.hpp): the baselines built once, beside PowerSGD's methods, so that the
// trainers' programs need not compile them (or Eigen).
#include "../baselines/baselines.hpp"
#include "point.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

namespace e2e {

std::unique_ptr<examples::gradient_exchange> make_exchange(const run_options& o, MPI_Comm comm,
                                                           const pactrain::param_layout& layout,
                                                           const exchange_run& run) {
  const std::size_t n = layout.total_size();
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (o.method == "dense" || o.method == "fp16")
    return make_bench_exchange(o.method.c_str(), comm, n);
  if (o.method == "topk") {
    // The paper's warm-up (4 epochs) is short against its runs (90 to 164 epochs); a quarter
    // of ours at most, so that most of the run is at the final sparsity.
    const auto steps = std::llround(o.dgc_warmup_epochs * static_cast<double>(run.steps_per_epoch));
    const std::uint64_t warmup = std::min(static_cast<std::uint64_t>(steps), run.steps / 4);
    auto x = std::make_unique<dgc_exchange>(comm, layout,
                                            dgc_exchange::config{.momentum = run.momentum,
                                                                 .weight_decay = run.weight_decay,
                                                                 .sparsity = o.dgc_sparsity,
                                                                 .warmup_steps = warmup});
    if (rank == 0) {
      std::printf(
          "dgc: sparsity %g after a warm-up of %llu steps in %zu stages; %zu entries "
          "sent whole\n",
          o.dgc_sparsity, static_cast<unsigned long long>(warmup), x->warmup_stages(),
          x->whole_entries());
    }
    return x;
  }
  PACTRAIN_EXPECTS(o.method == "powersgd", "make_exchange: unknown method '" + o.method + "'");
  const std::size_t r = o.powersgd_rank == "match"
                            ? powersgd::rank_for_bytes(layout, run.k * sizeof(float))
                            : examples::to_count("--powersgd-rank", o.powersgd_rank);
  const auto dense =
      static_cast<std::uint64_t>(std::llround(o.powersgd_start * static_cast<double>(run.steps)));
  if (rank == 0) {
    std::printf("powersgd rank %zu, compressed from step %llu\n", r,
                static_cast<unsigned long long>(dense));
  }
  return std::make_unique<powersgd_exchange>(comm, layout, r, run.seed, dense);
}

}  // namespace e2e
