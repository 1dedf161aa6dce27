// sparse, sparse-fp16 and sparse-ternary: pactrain::sync over the run's random mask; the
// -checked twins with sync_options::checked.
#include "engine.hpp"

namespace sync_bench {

std::unique_ptr<method> make_sparse(const method_args& a) {
  return std::make_unique<engine_method<pactrain::identity_codec<float>>>(a.comm, a.o, a.n);
}

std::unique_ptr<method> make_sparse_fp16(const method_args& a) {
  return std::make_unique<engine_method<pactrain::fp16_codec>>(a.comm, a.o, a.n);
}

std::unique_ptr<method> make_sparse_ternary(const method_args& a) {
  return std::make_unique<engine_method<pactrain::error_feedback<pactrain::ternary_codec>>>(
      a.comm, a.o, a.n, pactrain::ternary_codec{{.seed = a.o.seed}});
}

std::unique_ptr<method> make_sparse_checked(const method_args& a) {
  return std::make_unique<engine_method<pactrain::identity_codec<float>>>(
      a.comm, a.o, a.n, pactrain::identity_codec<float>{}, pactrain::sync_options{.checked = true});
}

std::unique_ptr<method> make_sparse_ternary_checked(const method_args& a) {
  return std::make_unique<engine_method<pactrain::error_feedback<pactrain::ternary_codec>>>(
      a.comm, a.o, a.n, pactrain::ternary_codec{{.seed = a.o.seed}},
      pactrain::sync_options{.checked = true});
}

}  // namespace sync_bench
