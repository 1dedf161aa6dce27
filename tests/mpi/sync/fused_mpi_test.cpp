// The fused optimizer step, sync::finish_step(sgd::fused(...)): bit for bit finish_step()
// followed by sgd::step() on the written-back gradient, for every strategy, codecs with and
// without feedback, momentum, Nesterov and weight decay, across mask commits; the gradient
// buffer of a sparse bucket is not written; a non-finite step updates nothing.
//
// Every rank runs every test case; CHECK (not REQUIRE) before collectives.
#include <doctest/doctest.h>

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include "common/mpi_helpers.hpp"
#include "common/test_data.hpp"

#include <mpi.h>

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

using namespace pactrain;

namespace {

using test::same_bits;
using test::world_rank;

constexpr bucket_strategy all_strategies[] = {bucket_strategy::sparse, bucket_strategy::dense,
                                              bucket_strategy::sparse_plain,
                                              bucket_strategy::dense_plain};

std::vector<float> gradient(std::size_t n, std::uint64_t step) {
  return test::spread_values(n, step, static_cast<std::uint64_t>(world_rank()));
}

// One model trained twice: `fused` through finish_step(update), `plain` through finish_step()
// and sgd::step; masks change at steps 0 and 3.
template <class Codec>
void check_fused(Codec codec, sgd_options o, bucket_strategy st) {
  using engine = pactrain::sync<mpi_communicator, Codec>;
  const auto l = test::small_layout();
  engine ef{mpi_communicator{MPI_COMM_WORLD}, l, codec};
  engine ep{mpi_communicator{MPI_COMM_WORLD}, l, codec};
  std::vector<float> pf = test::spread_values(l.total_size(), 99, 0), pp = pf;
  std::vector<float> mf(l.total_size()), mp(l.total_size());
  sgd of(o), op(o);
  const std::size_t nb = l.buckets().size();
  for (std::uint64_t step = 0; step < 6; ++step) {
    if (step % 3 == 0) {
      const auto masks =
          test::masks_for<bitmap_mask>(l, 0.3 + 0.1 * static_cast<double>(step), step);
      for (engine* e : {&ef, &ep}) {
        e->set_masks(masks);
        e->set_strategies(std::vector<bucket_strategy>(nb, st));
      }
      for (auto* v : {&pf, &pp, &mf, &mp}) apply_masks(l, masks, std::span<float>(*v));
    }
    auto gf = gradient(l.total_size(), step);
    auto gp = gf;
    const auto before = gf;
    ef.begin_step(std::span<float>(gf));
    ef.submit_bucket(nb - 1);
    auto update = of.fused(l, ef.masks(), std::span<float>(pf), std::span<float>(mf));
    ef.finish_step(update);
    ep.allreduce(std::span<float>(gp));
    op.step(pp, gp, mp);
    CHECK(same_bits(pf, pp));
    CHECK(same_bits(mf, mp));
    CHECK(of.steps() == op.steps());
    // A sparse bucket's gradients stay as they were: nothing is written back.
    if (is_sparse(st)) CHECK(same_bits(gf, before));
  }
}

}  // namespace

TEST_CASE("the fused step equals finish_step and sgd::step, bit for bit") {
  const sgd_options plain{.lr = 0.25};
  const sgd_options full{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3};
  const sgd_options nesterov{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true};
  for (const auto st : all_strategies) {
    CAPTURE(to_string(st));
    for (const auto& o : {plain, full, nesterov}) {
      check_fused<identity_codec<float>>({}, o, st);
      check_fused<error_feedback<ternary_codec>>(ternary_codec{{.seed = 4}}, o, st);
      check_fused<error_feedback<fp16_codec>>({}, o, st);
    }
  }
}

TEST_CASE("a non-finite step updates nothing and writes the gradients back") {
  using engine = pactrain::sync<mpi_communicator>;
  const auto l = test::small_layout();
  engine e{mpi_communicator{MPI_COMM_WORLD}, l};
  e.set_masks(test::masks_for<bitmap_mask>(l, 0.5, 1));
  std::vector<float> p = test::spread_values(l.total_size(), 7, 0), m(l.total_size());
  apply_masks(l, e.masks(), std::span<float>(p));
  const auto p0 = p;
  sgd opt({.lr = 0.1, .momentum = 0.9});
  auto g = gradient(l.total_size(), 0);
  for (std::size_t j = 0; j < l.total_size(); ++j) {
    if (world_rank() == 0 && e.masks()[0].test(j)) {
      g[j] = std::numeric_limits<float>::infinity();
      break;
    }
  }
  auto update = opt.fused(l, e.masks(), std::span<float>(p), std::span<float>(m));
  e.allreduce(std::span<float>(g), update);
  CHECK(e.stats().nonfinite_buckets == 1);
  CHECK(same_bits(p, p0));
  CHECK(opt.steps() == 0);
  // The results are written back as finish_step writes them: the bad bucket non-finite, the
  // others finite, pruned entries +0.
  std::size_t nonfinite = 0;
  for (const float x : g) nonfinite += !std::isfinite(x);
  CHECK(nonfinite >= 1);
}
