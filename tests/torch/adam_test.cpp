// pactrain::adam against torch::optim::Adam and torch::optim::AdamW, bit for bit: several
// steps over tensors whose sizes are not multiples of the vector width, with and without
// weight decay, and entries whose gradient stays +0 (pruned) keeping their weight and zero
// moments.
//
// LibTorch first (common/torch_first.hpp): its glog's CHECK macros must give way to doctest's.
#include "common/torch_first.hpp"

#include <pactrain/adam.hpp>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

using namespace pactrain;

namespace {

using pactrain::test::same_bits;
std::span<const float> span_of(const torch::Tensor& t) {
  return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
}

// `steps` steps of torch's optimizer and of pactrain::adam over the same gradients, the
// first `pruned` entries' gradients +0 throughout; true when every step's weights agree.
bool agrees(std::int64_t n, const adam_options& o, std::int64_t pruned, int steps = 12) {
  torch::manual_seed(static_cast<std::uint64_t>(n));
  auto p = torch::randn({n});
  if (pruned > 0) p.narrow(0, 0, pruned).zero_();
  std::vector<float> mine(span_of(p).begin(), span_of(p).end());
  std::vector<float> m(static_cast<std::size_t>(n), 0.0f);
  std::vector<float> v(static_cast<std::size_t>(n), 0.0f);
  p.set_requires_grad(true);
  std::unique_ptr<torch::optim::Optimizer> theirs;
  if (o.decoupled) {
    theirs = std::make_unique<torch::optim::AdamW>(std::vector<torch::Tensor>{p},
                                                   torch::optim::AdamWOptions(o.lr)
                                                       .betas({o.beta1, o.beta2})
                                                       .eps(o.eps)
                                                       .weight_decay(o.weight_decay));
  } else {
    theirs = std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{p},
                                                  torch::optim::AdamOptions(o.lr)
                                                      .betas({o.beta1, o.beta2})
                                                      .eps(o.eps)
                                                      .weight_decay(o.weight_decay));
  }
  adam ours(o);
  bool same = true;
  for (int s = 0; s < steps; ++s) {
    auto g = torch::randn({n}) * (s % 3 == 2 ? 1e-3 : 1.0);
    if (pruned > 0) g.narrow(0, 0, pruned).zero_();
    p.mutable_grad() = g.clone();
    theirs->step();
    ours.step(mine, span_of(g), m, v);
    same = same && same_bits(span_of(p.detach()), mine);
  }
  for (std::int64_t i = 0; i < pruned; ++i) {
    same = same && mine[static_cast<std::size_t>(i)] == 0.0f &&
           m[static_cast<std::size_t>(i)] == 0.0f && v[static_cast<std::size_t>(i)] == 0.0f;
  }
  return same && ours.steps() == static_cast<std::uint64_t>(steps);
}

}  // namespace

TEST_CASE("adam: torch::optim::Adam bit for bit") {
  for (const std::int64_t n : {1, 37, 1000, 4099}) {
    CAPTURE(n);
    CHECK(agrees(n, {}, 0));
    CHECK(agrees(n, {.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 1e-2},
                 n / 3));
  }
  CHECK(agrees(0, {}, 0));
}

TEST_CASE("adam: torch::optim::AdamW bit for bit") {
  for (const std::int64_t n : {1, 37, 1000, 4099}) {
    CAPTURE(n);
    CHECK(agrees(n, adamw_options(), 0));
    CHECK(agrees(n, adamw_options(5e-3, 0.1), n / 3));
  }
}

TEST_CASE("adam: bad settings and buffers are refused, changing nothing") {
  CHECK_THROWS_AS(adam({.lr = -1}), error);
  CHECK_THROWS_AS(adam({.beta1 = 1.0}), error);
  CHECK_THROWS_AS(adam({.eps = std::nan("")}), error);
  adam a({});
  std::vector<float> p(4, 1.0f), g(4, 1.0f), m(3), v(4);
  CHECK_THROWS_WITH_AS(a.step(p, g, m, v),
                       "pactrain: adam::step: 4 parameters, 4 gradients and 3 and 4 moment entries",
                       error);
  CHECK(a.steps() == 0);
  CHECK(p == std::vector<float>(4, 1.0f));
}
