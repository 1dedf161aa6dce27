// sparse, sparse-fp16 and sparse-ternary: pactrain::sync over the run's random mask.
#include "engine.hpp"

namespace sync_bench {

std::unique_ptr<strategy> make_sparse(const method_args& a) {
  return std::make_unique<engine_strategy<pactrain::identity_codec<float>>>(a.comm, a.o, a.n);
}

std::unique_ptr<strategy> make_sparse_fp16(const method_args& a) {
  return std::make_unique<engine_strategy<pactrain::fp16_codec>>(a.comm, a.o, a.n);
}

std::unique_ptr<strategy> make_sparse_ternary(const method_args& a) {
  return std::make_unique<engine_strategy<pactrain::ternary_codec, pactrain::error_feedback>>(
      a.comm, a.o, a.n, pactrain::ternary_codec{{.seed = a.o.seed}});
}

}  // namespace sync_bench
