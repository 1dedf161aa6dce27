// pactrain/torch.hpp on a tiny convolutional model over MPI (1, 2 and 4 ranks): the layout of
// named parameters, parameters and gradients bound to flat buffers, buckets handed over from
// AccumulateGrad hooks (bit for bit one allreduce after backward, the last bucket first),
// pactrain::sgd against torch::optim::SGD, pactrain::adam against torch::optim::Adam and AdamW
// (sizes not multiples of the vector width, pruned entries keeping weight and zero moments),
// and pruning of parameters and momentum.
//
// Every rank runs every test case; CHECK (not REQUIRE) before collectives.
// LibTorch first (common/torch_first.hpp): its glog's CHECK macros must give way to doctest's.
#include "common/torch_first.hpp"

#include <pactrain/adam.hpp>
#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>
#include <pactrain/sgd.hpp>

#include "common/mpi_helpers.hpp"

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

using namespace pactrain;

namespace {

using test::error_of;
using test::world_rank;
using test::world_size;

using sync_t = pactrain::sync<mpi_communicator>;

using test::batch;
using test::loss_of;
using test::make_net;
using test::net;
using test::same_bits;

// A sync engine that records which buckets are submitted, and when.
struct recording_sync {
  using value_type = sync_t::value_type;
  using mask_type = sync_t::mask_type;
  using communicator_type = sync_t::communicator_type;
  explicit recording_sync(sync_t& s) : inner(s) {}
  const param_layout& layout() const { return inner.layout(); }
  const std::vector<mask_type>& masks() const { return inner.masks(); }
  const std::vector<bucket_strategy>& strategies() const { return inner.strategies(); }
  void set_masks(std::vector<mask_type> m) { inner.set_masks(std::move(m)); }
  void set_strategies(std::vector<bucket_strategy> st) { inner.set_strategies(std::move(st)); }
  [[noreturn]] void reject_masks(std::string r) { inner.reject_masks(std::move(r)); }
  communicator_type& get_communicator() { return inner.get_communicator(); }
  const sync_stats& stats() const { return inner.stats(); }
  std::uint64_t step() const { return inner.step(); }
  bool step_open() const { return inner.step_open(); }
  void begin_step(std::span<float> g) {
    submitted.clear();
    inner.begin_step(g);
  }
  void submit_bucket(std::size_t b) {
    submitted.push_back(b);
    inner.submit_bucket(b);
  }
  void finish_step() { inner.finish_step(); }
  sync_t& inner;
  std::vector<std::size_t> submitted;
};

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

TEST_CASE("torch_params: the layout of the named parameters, bound to flat buffers") {
  auto m = make_net();
  const auto before = m->fc1->weight.clone();
  torch_params p(*m);
  const auto& l = p.layout();
  REQUIRE(l.tensor_count() == 6);
  CHECK(l.tensor(0).name == "conv.weight");
  CHECK(l.tensor(0).rows == 4);
  CHECK(l.tensor(0).cols == 9);  // [4, 1, 3, 3]: 4 x 9
  CHECK(l.tensor(1).name == "conv.bias");
  CHECK(l.tensor(1).rows == 0);
  CHECK(l.tensor(2).name == "fc1.weight");
  CHECK((p.prunable() == std::vector<bool>{true, false, true, false, true, false}));
  // Values are kept, and the parameters are views of the flat buffer.
  CHECK(torch::equal(m->fc1->weight, before));
  p.values()[l.tensor(2).offset] = 42.0f;
  CHECK(m->fc1->weight[0][0].item<float>() == 42.0f);
  // Backward writes into the flat gradient buffer.
  loss_of(m, 0, 0).backward();
  CHECK(m->fc2->bias.grad().data_ptr<float>() == p.grads().data() + l.tensor(5).offset);
  float sum = 0;
  for (const float g : p.grads()) sum += std::abs(g);
  CHECK(sum > 0);
  p.zero_grad();
  for (const float g : p.grads()) CHECK(g == 0.0f);
  // A predicate chooses what is prunable; a small bucket capacity gives several buckets.
  auto m2 = make_net();
  torch_params q(
      *m2, {.bucket_capacity = 100, .prunable = [](const std::string& name, const torch::Tensor&) {
              return name.starts_with("fc");
            }});
  CHECK((q.prunable() == std::vector<bool>{false, false, true, true, true, true}));
  CHECK(q.layout().buckets().size() == 3);  // conv (40), fc1.weight (1024), the rest (67)
}

TEST_CASE("torch_params: broadcast starts every rank from rank 0's weights") {
  torch::manual_seed(static_cast<std::uint64_t>(100 + world_rank()));
  net m;  // different weights on every rank
  torch_params p(*m);
  mpi_communicator comm{MPI_COMM_WORLD};
  p.broadcast(comm);
  std::vector<float> v(p.values().begin(), p.values().end());
  MPI_Bcast(v.data(), static_cast<int>(v.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  CHECK(same_bits(v, p.values()));
}

TEST_CASE("torch_overlap: buckets go out during backward, last first, as one allreduce would") {
  auto a = make_net();
  auto b = make_net();
  torch_params pa(*a, {.bucket_capacity = 200});
  torch_params pb(*b, {.bucket_capacity = 200});
  sync_t sa{mpi_communicator{MPI_COMM_WORLD}, pa.layout()};
  sync_t sb{mpi_communicator{MPI_COMM_WORLD}, pb.layout()};
  recording_sync rec(sa);
  torch_overlap<recording_sync> overlap(pa, rec);
  const std::size_t nb = pa.layout().buckets().size();
  REQUIRE(nb >= 3);
  for (std::uint64_t step = 0; step < 3; ++step) {
    overlap.begin_step();
    loss_of(a, step, world_rank()).backward();
    // Every bucket was submitted by the hooks, before finish_step, the last one first.
    CHECK(rec.submitted.size() == nb);
    CHECK(rec.submitted.front() == nb - 1);
    overlap.finish_step();

    pb.zero_grad();
    loss_of(b, step, world_rank()).backward();
    sb.allreduce(pb.grads());
    CHECK(same_bits(pa.grads(), pb.grads()));
  }
  // The average: rank r's gradient summed over ranks, times 1/P (to rounding).
  std::vector<float> local(pa.grads().size());
  {
    auto c = make_net();
    torch_params pc(*c, {.bucket_capacity = 200});
    loss_of(c, 2, world_rank()).backward();
    std::copy(pc.grads().begin(), pc.grads().end(), local.begin());
  }
  MPI_Allreduce(MPI_IN_PLACE, local.data(), static_cast<int>(local.size()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  std::size_t off = 0;
  for (std::size_t i = 0; i < local.size(); ++i) {
    const float want = local[i] / static_cast<float>(world_size());
    off += std::abs(pb.grads()[i] - want) > 1e-6f * (1.0f + std::abs(want));
  }
  CHECK(off == 0);
}

TEST_CASE("torch_params: row blocks, one bucket each, overlap as one allreduce") {
  auto a = make_net();
  auto b = make_net();
  torch_params pa(*a, {.bucket_capacity = 1, .rows_per_tensor = 5});
  torch_params pb(*b, {.bucket_capacity = 1});
  const auto& l = pa.layout();
  // fc1.weight [16, 64] becomes rows 0-4, 5-9, 10-14 and 15; conv [4, 9] and fc2 [3, 16] fit.
  REQUIRE(l.tensor_count() == 9);
  CHECK(l.buckets().size() == 9);
  CHECK(l.tensor(2).name == "fc1.weight.rows0");
  CHECK(l.tensor(5).name == "fc1.weight.rows15");
  CHECK(l.tensor(4).rows == 5);
  CHECK(l.tensor(5).rows == 1);
  CHECK(l.tensor(5).cols == 64);
  CHECK(l.total_size() == pb.layout().total_size());
  CHECK((pa.prunable() ==
         std::vector<bool>{true, false, true, true, true, true, false, true, false}));
  CHECK(pa.tensors_of(2) == std::pair<std::size_t, std::size_t>{2, 6});
  CHECK(pa.tensors_of(3) == std::pair<std::size_t, std::size_t>{6, 7});
  CHECK(error_of([&] { (void)pa.tensors_of(6); }).find("parameter 6 of 6") != std::string::npos);
  CHECK(a->fc2->weight.data_ptr<float>() == pa.values().data() + l.tensor(7).offset);
  // The same entries at the same offsets: overlap over the blocks is the whole-tensor allreduce.
  sync_t sa{mpi_communicator{MPI_COMM_WORLD}, l};
  sync_t sb{mpi_communicator{MPI_COMM_WORLD}, pb.layout()};
  recording_sync rec(sa);
  torch_overlap<recording_sync> overlap(pa, rec);
  for (std::uint64_t step = 0; step < 2; ++step) {
    overlap.begin_step();
    loss_of(a, step, world_rank()).backward();
    CHECK(rec.submitted.size() == 9);  // all from the hooks
    overlap.finish_step();
    pb.zero_grad();
    loss_of(b, step, world_rank()).backward();
    sb.allreduce(pb.grads());
    CHECK(same_bits(pa.grads(), pb.grads()));
  }
}

TEST_CASE("torch_overlap: a second backward in a step is an error after the step") {
  auto a = make_net();
  torch_params pa(*a);
  sync_t sa{mpi_communicator{MPI_COMM_WORLD}, pa.layout()};
  torch_overlap<sync_t> overlap(pa, sa);
  overlap.begin_step();
  loss_of(a, 0, world_rank()).backward();
  loss_of(a, 1, world_rank()).backward();
  const std::string what = error_of([&] { overlap.finish_step(); });
  CHECK(what.find("written twice in one step") != std::string::npos);
  CHECK_FALSE(sa.step_open());
  // The next step is fine.
  overlap.begin_step();
  loss_of(a, 2, world_rank()).backward();
  CHECK(error_of([&] { overlap.finish_step(); }).empty());
}

TEST_CASE("pactrain::sgd on the flat buffers equals torch::optim::SGD, bit for bit, fused too") {
  // The same batch on every rank: the average of P equal gradients is the gradient itself.
  for (const int c : {0, 1, 2}) {  // plain, Nesterov, Nesterov fused
    const bool nesterov = c > 0;
    const bool fused = c == 2;
    auto ref = make_net();
    torch::optim::SGD ref_opt(
        ref->parameters(),
        torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(5e-4).nesterov(nesterov));
    auto m = make_net();
    torch_params p(*m);
    sync_t s{mpi_communicator{MPI_COMM_WORLD}, p.layout()};
    torch_overlap<sync_t> overlap(p, s);
    sgd opt({.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = nesterov});
    for (std::uint64_t step = 0; step < 4; ++step) {
      ref_opt.zero_grad();
      loss_of(ref, step, 0).backward();
      ref_opt.step();
      overlap.begin_step();
      loss_of(m, step, 0).backward();
      if (fused) {  // the same weights without writing the gradients back
        auto update = opt.fused(p.layout(), s.masks(), p.values(), p.momentum());
        overlap.finish_step(update);
      } else {
        overlap.finish_step();
        opt.step(p.values(), p.grads(), p.momentum());
      }
    }
    std::size_t differ = 0;
    const auto rp = ref->parameters();
    for (std::size_t i = 0; i < rp.size(); ++i) {
      const auto r = rp[i].contiguous();
      differ += std::memcmp(r.data_ptr<float>(), p.parameters()[i].data_ptr<float>(),
                            static_cast<std::size_t>(r.numel()) * sizeof(float)) != 0;
    }
    CHECK(differ == 0);
  }
}

TEST_CASE("pruning through the adapter: pruned weights and momentum stay exactly zero") {
  auto m = make_net();
  torch_params p(*m);
  sync_t s{mpi_communicator{MPI_COMM_WORLD}, p.layout()};
  p.broadcast(s.get_communicator());
  torch_overlap<sync_t> overlap(p, s);
  sgd opt({.lr = 0.05, .momentum = 0.9});
  const std::uint64_t steps = 12;
  pruner<magnitude_pruning, gradual_schedule> pr(
      magnitude_pruning{}, gradual_schedule::over_run(steps, 0.25, 0.75, 0.8, 3), p.prunable());
  std::size_t updates = 0;
  for (std::uint64_t step = 0; step < steps; ++step) {
    overlap.begin_step();
    loss_of(m, step, world_rank()).backward();
    overlap.finish_step();
    opt.step(p.values(), p.grads(), p.momentum());
    if (pr.step(s, p.values_const())) {
      p.apply_masks(s.masks());
      ++updates;
    }
  }
  CHECK(updates == 4);  // the schedule's updates 0..3
  CHECK(pr.current_sparsity() == doctest::Approx(0.8));
  const auto& l = p.layout();
  std::size_t pruned = 0, nonzero_pruned = 0;
  for (std::size_t i = 0; i < l.tensor_count(); ++i) {
    const auto& t = l.tensor(i);
    for (std::size_t j = 0; j < t.size; ++j) {
      if (s.masks()[i].test(j)) continue;
      ++pruned;
      nonzero_pruned += p.values()[t.offset + j] != 0.0f || p.momentum()[t.offset + j] != 0.0f;
    }
  }
  CHECK(pruned > 0);
  CHECK(nonzero_pruned == 0);
  // The per-tensor forms: the same masks from pruner::step, the same masking by apply_masks.
  std::vector<std::span<float>> views;
  for (const auto& t : p.parameters()) {
    views.emplace_back(t.data_ptr<float>(), static_cast<std::size_t>(t.numel()));
  }
  sync_t flat{mpi_communicator{MPI_COMM_WORLD}, l};
  sync_t split{mpi_communicator{MPI_COMM_WORLD}, l};
  pruner<magnitude_pruning, one_shot_schedule> by_flat({}, {.step = 0, .sparsity = 0.5},
                                                       p.prunable());
  pruner<magnitude_pruning, one_shot_schedule> by_tensor({}, {.step = 0, .sparsity = 0.5},
                                                         p.prunable());
  CHECK(by_flat.step(flat, p.values_const()));
  CHECK(by_tensor.step(split, views));
  const bool same_masks = flat.masks() == split.masks();  // glog would stream the vectors
  CHECK(same_masks);
  std::fill(p.values().begin(), p.values().end(), 1.0f);
  apply_masks(l, flat.masks(), views);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < l.tensor_count(); ++i) {
    const auto& t = l.tensor(i);
    for (std::size_t j = 0; j < t.size; ++j) {
      wrong += p.values()[t.offset + j] != (flat.masks()[i].test(j) ? 1.0f : 0.0f);
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("torch_overlap refuses an engine over another layout") {
  auto m = make_net();
  torch_params p(*m);
  param_layout other;
  other.add("w", 3);
  sync_t s{mpi_communicator{MPI_COMM_WORLD}, other};
  CHECK(error_of([&] { torch_overlap<sync_t> o(p, s); }).find("not the parameters' layout") !=
        std::string::npos);
}

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
