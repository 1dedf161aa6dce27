// The LibTorch CNN on Fashion-MNIST as a task of examples::torch_train (common/torch_train.hpp):
// the model, and each rank's shard of the data. Used by pactrain_torch_cnn (main.cpp) and by
// bench/e2e's pactrain_e2e_torch (cnn).
#pragma once

#include <pactrain/torch.hpp>  // first: LibTorch's glog macros must not meet others

#include "common/run_report.hpp"
#include "common/torch_train.hpp"
#include "fmnist/idx.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace examples::torch_cnn {

namespace fm = pactrain::fmnist;

/// conv(1->16, 5x5) -> relu -> maxpool 2 -> conv(16->32, 5x5) -> relu -> maxpool 2 ->
/// fc(512->128) -> relu -> fc(128->10).
struct cnn_impl : torch::nn::Module {
  cnn_impl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(512, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    x = torch::relu(fc1->forward(x.flatten(1)));
    return fc2->forward(x);
  }

  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};
TORCH_MODULE_IMPL(cnn, cnn_impl);

inline constexpr const char* model_name =
    "conv5x5(1-16)-pool-conv5x5(16-32)-pool-fc(512-128)-fc(128-10)";

/// The CNN's recipe: 15 epochs of batch 32 per rank, lr 0.05 (5% warm-up, cosine to 0, a
/// second cycle after the last mask update), momentum 0.9, weight decay 5e-4, the weights
/// pruned to 90% by one global ranking over 10% to 50% of the steps, 128 kept entries per
/// ternary scale.
inline void default_recipe(torch_cli& c) {
  torch_run_options& r = c.run;
  r.epochs = 15;
  r.batch = 32;
  r.lr = 0.05;
  r.shape.warmup = 0.05;
  r.shape.rewind = 1.0;
  r.momentum = 0.9;
  r.weight_decay = 5e-4;
  r.prune_start = 0.1;
  r.prune_end = 0.5;
  r.scope = pactrain::pruning_scope::global;
  c.sparsity = 0.9;
  c.ternary_block = 128;
}

/// The CNN's task for examples::torch_train: rank r's samples (r, r + P, ...) as normalised
/// images [n, 1, 28, 28] and labels [n], shuffled each epoch with the same seeded permutation
/// on every rank; the test accuracy summed over the ranks' shards of the test set.
class cnn_task {
 public:
  cnn_task(const fm::dataset& train, const fm::dataset& test, int rank, int ranks,
           std::uint64_t seed)
      : train_(make_shard(train, rank, ranks)),
        test_(make_shard(test, rank, ranks)),
        test_count_(test.count),
        seed_(seed) {}

  [[nodiscard]] cnn model() const { return cnn(); }
  [[nodiscard]] std::size_t local_samples() const {
    return static_cast<std::size_t>(train_.x.size(0));
  }

  void begin_epoch(int epoch) {
    std::vector<std::int64_t> order(local_samples());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
    std::mt19937_64 rng(seed_ * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), rng);
    perm_ = torch::tensor(order, torch::kInt64);
  }

  torch::Tensor loss(cnn& model, std::int64_t at, std::int64_t n) {
    const torch::Tensor rows = perm_.narrow(0, at, n);
    return torch::nn::functional::cross_entropy(model->forward(train_.x.index_select(0, rows)),
                                                train_.y.index_select(0, rows));
  }

  void evaluate(cnn& model, examples::epoch_record& rec, MPI_Comm comm) const {
    long long correct = 0;
    const std::int64_t n = test_.x.size(0);
    for (std::int64_t at = 0; at < n; at += 1000) {
      const std::int64_t m = std::min<std::int64_t>(1000, n - at);
      const torch::Tensor pred = model->forward(test_.x.narrow(0, at, m)).argmax(1);
      correct += pred.eq(test_.y.narrow(0, at, m)).sum().item<std::int64_t>();
    }
    MPI_Allreduce(MPI_IN_PLACE, &correct, 1, MPI_LONG_LONG, MPI_SUM, comm);
    rec.test_accuracy = static_cast<double>(correct) / static_cast<double>(test_count_);
  }

 private:
  struct shard {
    torch::Tensor x;
    torch::Tensor y;
  };

  static shard make_shard(const fm::dataset& d, int rank, int ranks) {
    std::vector<std::int64_t> rows;
    for (std::size_t i = static_cast<std::size_t>(rank); i < d.count;
         i += static_cast<std::size_t>(ranks)) {
      rows.push_back(static_cast<std::int64_t>(i));
    }
    const auto n = static_cast<std::int64_t>(d.count);
    const auto side = static_cast<std::int64_t>(d.rows);
    const torch::Tensor all = torch::from_blob(const_cast<std::uint8_t*>(d.pixels.data()),
                                               {n, 1, side, side}, torch::kUInt8);
    const torch::Tensor labels =
        torch::from_blob(const_cast<std::uint8_t*>(d.labels.data()), {n}, torch::kUInt8);
    const torch::Tensor index = torch::tensor(rows, torch::kInt64);
    constexpr double mean = 0.2860;  // of the Fashion-MNIST training pixels
    constexpr double std_dev = 0.3530;
    return {(all.index_select(0, index).to(torch::kFloat32) / 255.0 - mean) / std_dev,
            labels.index_select(0, index).to(torch::kInt64)};
  }

  shard train_;
  shard test_;
  std::size_t test_count_;
  std::uint64_t seed_;
  torch::Tensor perm_;
};

}  // namespace examples::torch_cnn
