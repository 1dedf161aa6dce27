// pactrain::data_parallel over MPI (1, 2 and 4 ranks): bit for bit the adapter's manual path,
// the habits that would silently unbind the buffers reported on every rank (also when one rank
// alone has them), gradient accumulation under no_sync() exactly one pass over the whole batch,
// pruning from the options, and the optimizer step skipped after a non-finite step.
//
// Every rank runs every test case; CHECK (not REQUIRE) before collectives.
// LibTorch first (common/torch_first.hpp): its glog's CHECK macros must give way to doctest's.
#include "common/torch_first.hpp"

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>
#include <pactrain/sgd.hpp>

#include "common/mpi_helpers.hpp"

#include <mpi.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <variant>
#include <vector>

using namespace pactrain;

namespace {

using test::error_of;
using test::world_rank;
using test::world_size;

using dp_t = data_parallel<mpi_communicator>;

using test::loss_of;
using test::make_net;
using test::net;
using test::same_bits;

std::uint64_t digest_of(std::span<const float> v) {
  digest_builder d(2);
  for (const float x : v) d.add(std::bit_cast<std::uint32_t>(x));
  return d.value();
}

mpi_communicator world() { return mpi_communicator{MPI_COMM_WORLD}; }

// The error step() throws on this rank after `mistake(model)` (run between zero_grad and step
// on the ranks `on`; the others run a plain backward pass), with a fresh model and engine;
// checks that the bound weights did not change (no optimizer step).
template <class Mistake>
std::string step_error(Mistake&& mistake, bool on = true) {
  auto m = make_net();
  dp_t dp(*m, world());
  const std::vector<float> before(dp.params().values().begin(), dp.params().values().end());
  dp.zero_grad();
  if (on) {
    mistake(m);
  } else {
    loss_of(m, 0, world_rank()).backward();
  }
  auto e = error_of([&] { dp.step(); });
  CHECK(same_bits(dp.params().values(), before));
  return e;
}

// Module::zero_grad's default habit, then backward: every gradient is a new tensor.
void set_to_none(net& m) {
  m->zero_grad(/*set_to_none=*/true);
  loss_of(m, 0, world_rank()).backward();
}

}  // namespace

TEST_CASE("data_parallel: bit for bit the adapter's parts put together by hand") {
  const int rank = world_rank();
  const sgd_options o{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4};
  auto a = make_net();
  dp_t dp(*a, world(), {.params = {.bucket_capacity = 100}, .optimizer = o});
  auto b = make_net();
  torch_params params(*b, {.bucket_capacity = 100});
  pactrain::sync s{world(), params.layout()};
  params.broadcast(s.get_communicator());
  torch_overlap overlap(params, s);
  sgd opt(o);
  for (std::uint64_t step = 0; step < 3; ++step) {
    dp.zero_grad();
    loss_of(a, step, rank).backward();
    dp.step();
    overlap.begin_step();
    loss_of(b, step, rank).backward();
    overlap.finish_step();
    opt.step(params.values(), params.grads(), params.momentum());
    CHECK(same_bits(dp.params().values(), params.values()));
    CHECK(same_bits(dp.params().grads(), params.grads()));
    CHECK(dp.stats().bytes_sent == s.stats().bytes_sent);
  }
  CHECK(test::same_on_every_rank(digest_of(dp.params().values_const())));
  CHECK(dp.skipped_steps() == 0);
}

TEST_CASE("data_parallel: AdamW bit for bit pactrain::adam over the synced gradients") {
  const int rank = world_rank();
  auto a = make_net();
  dp_t dp(*a, world(), {.optimizer = adamw_options(1e-2)});
  auto b = make_net();
  torch_params params(*b);
  pactrain::sync s{world(), params.layout()};
  params.broadcast(s.get_communicator());
  adam opt(adamw_options(1e-2));
  std::vector<float> v(params.values().size(), 0.0f);
  for (std::uint64_t step = 0; step < 3; ++step) {
    dp.zero_grad();
    loss_of(a, step, rank).backward();
    dp.step();
    params.zero_grad();
    loss_of(b, step, rank).backward();
    s.allreduce(params.grads());
    opt.step(params.values(), params.grads(), params.momentum(), v);
    CHECK(same_bits(dp.params().values(), params.values()));
    CHECK(same_bits(dp.second_moment(), v));
  }
}

TEST_CASE("data_parallel: unbound gradients and weights throw on every rank, naming the cause") {
  const int rank = world_rank();
  const int last = world_size() - 1;
  SUBCASE("gradients set to none, on every rank") {
    const auto e = step_error(set_to_none);
    CHECK(e.find("the gradient of 'conv.weight' is not the bound buffer") != std::string::npos);
    CHECK(e.find("set to none") != std::string::npos);
  }
  SUBCASE("one rank alone: every rank throws its error") {
    const auto e = step_error(set_to_none, rank == last);
    CHECK(e.find("on rank " + std::to_string(last) + ", the gradient of 'conv.weight'") !=
          std::string::npos);
    CHECK(test::same_on_every_rank(digest_builder(1).add(e).value()));
  }
  SUBCASE("a gradient assigned a new tensor") {
    const auto e = step_error([&](net& m) {
      loss_of(m, 0, rank).backward();
      m->fc1->weight.mutable_grad() = torch::zeros_like(m->fc1->weight);
    });
    CHECK(e.find("the gradient of 'fc1.weight' is not the bound buffer") != std::string::npos);
  }
  SUBCASE("the module converted after setup") {
    const auto e = step_error([&](net& m) {
      m->to(torch::kDouble);
      loss_of(m, 0, rank, torch::kDouble).backward();
    });
    CHECK(e.find("'conv.weight' is not the bound buffer: the module was moved or converted") !=
          std::string::npos);
  }
  SUBCASE("two backward passes outside no_sync") {
    const auto e = step_error([&](net& m) {
      loss_of(m, 0, rank).backward();
      loss_of(m, 1, rank).backward();
    });
    CHECK(e.find("a gradient was written twice in one step") != std::string::npos);
  }
  SUBCASE("impossible options: refused before the module is bound") {
    auto m = make_net();
    const auto* before = m->fc1->weight.data_ptr();
    CHECK(error_of([&] { dp_t dp(*m, world(), {.pruning = {.sparsity = 0.5}}); }) ==
          "pactrain: data_parallel: pruning needs total_steps (the run's optimizer steps)");
    CHECK(error_of([&] { dp_t dp(*m, world(), {.optimizer = adam_options{.beta1 = 1}}); }) ==
          "pactrain: adam: beta1 and beta2 must lie in [0, 1)");
    CHECK(m->fc1->weight.data_ptr() == before);
  }
  SUBCASE("a step without zero_grad") {
    auto m = make_net();
    dp_t dp(*m, world());
    CHECK(error_of([&] { dp.step(); }).find("no step is open (call zero_grad() before backward)") !=
          std::string::npos);
  }
}

TEST_CASE("data_parallel: accumulation under no_sync() is one pass over the whole batch") {
  // Integer weights and inputs and a sum loss: every gradient is an exact integer sum, so the
  // two batch halves accumulated equal the whole batch to the bit (and so do the steps, with a
  // power-of-two learning rate and rank count).
  const int rank = world_rank();
  const auto make = [] {
    torch::nn::Linear l(torch::nn::LinearOptions(6, 3).bias(false));
    torch::NoGradGuard g;
    l->weight.copy_(torch::arange(18, torch::kFloat32).reshape({3, 6}) - 9);
    return l;
  };
  const auto x = (torch::arange(48, torch::kFloat32).reshape({8, 6}) + rank) - 20;
  const auto loss = [](torch::nn::Linear& l, const torch::Tensor& in) {
    return (l->forward(in) * torch::tensor({1.0f, -2.0f, 3.0f})).sum();
  };
  auto whole = make();
  auto split = make();
  dp_t a(*whole, world(), {.optimizer = sgd_options{.lr = 0.5}});
  dp_t b(*split, world(), {.optimizer = sgd_options{.lr = 0.5}});
  for (int step = 0; step < 2; ++step) {
    a.zero_grad();
    loss(whole, x).backward();
    a.step();
    b.zero_grad();
    {
      auto hold = b.no_sync();
      loss(split, x.narrow(0, 0, 3)).backward();
      loss(split, x.narrow(0, 3, 2)).backward();
    }
    loss(split, x.narrow(0, 5, 3)).backward();
    b.step();
    CHECK(same_bits(a.params().grads(), b.params().grads()));
    CHECK(same_bits(a.params().values(), b.params().values()));
    CHECK(b.stats().collectives == a.stats().collectives);
  }
}

namespace {

// With AdamW, a pruned weight stays +0 only if its moments were zeroed with it.
void prune_and_skip(bool with_adam) {
  const int rank = world_rank();
  auto m = make_net();
  const std::variant<sgd_options, adam_options> opt =
      with_adam ? std::variant<sgd_options, adam_options>(adamw_options(0.01))
                : sgd_options{.lr = 0.01, .momentum = 0.9};
  dp_t dp(*m, world(),
          {.optimizer = opt,
           .pruning = {.sparsity = 0.5, .total_steps = 4, .start = 0, .end = 0.5, .updates = 2}});
  for (std::uint64_t step = 0; step < 6; ++step) {
    dp.zero_grad();
    loss_of(m, step, rank).backward();
    dp.step();
  }
  const auto& layout = dp.params().layout();
  const auto values = dp.params().values();
  for (std::size_t t = 0; t < layout.tensor_count(); ++t) {
    const auto& info = layout.tensor(t);
    std::size_t zeros = 0;
    for (std::size_t k = 0; k < info.size; ++k) zeros += values[info.offset + k] == 0.0f;
    CHECK(zeros == (dp.params().prunable()[t] ? info.size / 2 : 0));
  }
  // A NaN in rank 0's gradient makes the mean non-finite on every rank: no optimizer step.
  // (Written before backward, which adds to it: a bucket leaves as backward completes it.)
  const std::vector<float> before(values.begin(), values.end());
  dp.zero_grad();
  if (rank == 0) {
    dp.params().grads()[layout.tensor(1).offset] = std::numeric_limits<float>::quiet_NaN();
  }
  loss_of(m, 9, rank).backward();
  dp.step();
  CHECK(dp.stats().nonfinite_buckets == 1);
  CHECK(dp.skipped_steps() == 1);
  CHECK(same_bits(dp.params().values(), before));
}

}  // namespace

TEST_CASE("data_parallel: pruning from the options, and no step after a non-finite one") {
  SUBCASE("sgd") { prune_and_skip(false); }
  SUBCASE("adamw") { prune_and_skip(true); }
}

TEST_CASE("data_parallel: a checkpoint resumes bit for bit, and a bad one changes nothing") {
  const int rank = world_rank();
  const int last = world_size() - 1;
  // AdamW, ternary lanes with error feedback (residuals differ by rank), masks updated before
  // and after the checkpoint.
  const data_parallel_options o{
      .optimizer = adamw_options(1e-2),
      .pruning = {.sparsity = 0.5, .total_steps = 8, .start = 0, .end = 0.75, .updates = 4}};
  const auto codec = [] { return error_feedback{ternary_codec{{.seed = 3}}}; };
  auto a = make_net();
  data_parallel dp(*a, world(), o, codec());
  const auto train = [&](auto& d, net& m, std::uint64_t step) {
    d.zero_grad();
    loss_of(m, step, rank).backward();
    d.step();
  };
  for (std::uint64_t step = 0; step < 3; ++step) train(dp, a, step);
  const auto saved = dp.save();
  std::vector<std::vector<float>> want;
  for (std::uint64_t step = 3; step < 7; ++step) {
    train(dp, a, step);
    want.emplace_back(dp.params().values().begin(), dp.params().values().end());
  }
  auto b = make_net();
  data_parallel resumed(*b, world(), o, codec());
  resumed.load(saved);
  for (std::uint64_t step = 3; step < 7; ++step) {
    train(resumed, b, step);
    CHECK(same_bits(resumed.params().values(), want[step - 3]));
  }
  CHECK((resumed.engine().masks() == dp.engine().masks()));
  CHECK(same_bits(resumed.second_moment(), dp.second_moment()));
  CHECK(resumed.engine().step() == dp.engine().step());

  // One rank's checkpoint corrupt: every rank throws the same error, and nothing changes.
  auto bad = saved;
  if (rank == last) bad[bad.size() / 2] ^= std::byte{1};
  const std::vector<float> before(resumed.params().values().begin(),
                                  resumed.params().values().end());
  const auto e = error_of([&] { resumed.load(bad); });
  CHECK(e == "pactrain: data_parallel::load: rank " + std::to_string(last) +
                 "'s checkpoint is corrupt or truncated");
  CHECK(test::same_on_every_rank(digest_builder(1).add(e).value()));
  CHECK(same_bits(resumed.params().values(), before));
  CHECK(error_of([&] { resumed.load(std::span<const std::byte>(saved).first(20)); }) ==
        "pactrain: data_parallel::load: rank " + std::to_string(last) +
            "'s checkpoint is corrupt or truncated");
  // Another optimizer, or no pruning.
  auto c = make_net();
  data_parallel other(*c, world(), {.pruning = o.pruning}, codec());
  CHECK(error_of([&] { other.load(saved); }).ends_with("was saved with another optimizer"));
  data_parallel dense(*c, world(), {.optimizer = o.optimizer}, codec());
  CHECK(error_of([&] { dense.load(saved); }).ends_with("was saved with another pruning setting"));
}
