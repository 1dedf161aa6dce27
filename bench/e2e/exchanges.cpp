// make_exchange (point.hpp): the baselines built once, beside PowerSGD's methods, so that the
// trainers' programs need not compile them (or Eigen).
#include "baselines.hpp"
#include "point.hpp"

#include <cstdio>
#include <memory>
#include <string>

namespace e2e {

std::unique_ptr<examples::gradient_exchange> make_exchange(const std::string& method,
                                                           const std::string& powersgd_rank,
                                                           MPI_Comm comm,
                                                           const pactrain::param_layout& layout,
                                                           std::size_t k, float momentum,
                                                           float weight_decay, std::uint64_t seed) {
  const std::size_t n = layout.total_size();
  if (method == "dense" || method == "fp16") return make_bench_exchange(method.c_str(), comm, n);
  if (method == "topk") return std::make_unique<dgc_exchange>(comm, n, k, momentum, weight_decay);
  PACTRAIN_EXPECTS(method == "powersgd", "make_exchange: unknown method '" + method + "'");
  const std::size_t r = powersgd_rank == "match"
                            ? powersgd::rank_for_bytes(layout, k * sizeof(float))
                            : examples::to_count("--powersgd-rank", powersgd_rank);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) std::printf("powersgd rank %zu\n", r);
  return std::make_unique<powersgd_exchange>(comm, layout, r, seed);
}

}  // namespace e2e
