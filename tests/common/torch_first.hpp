// The LibTorch tests' first include: LibTorch, then doctest. LibTorch pulls in glog, whose
// CHECK and CHECK_EQ... macros doctest's must replace; a bitwise comparison of floats, and the
// tests' tiny convolutional model with its per-rank batches.
#pragma once

#include <pactrain/torch.hpp>
#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

namespace pactrain::test {

/// Equal to the bit: the same sizes and the same bytes.
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

struct net_impl : torch::nn::Module {
  net_impl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)))),
        fc1(register_module("fc1", torch::nn::Linear(4 * 4 * 4, 16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 3))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv->forward(x), 2));
    return fc2->forward(torch::relu(fc1->forward(x.flatten(1))));
  }
  torch::nn::Conv2d conv;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE_IMPL(net, net_impl);

/// The same model on every rank (seeded).
inline net make_net() {
  torch::manual_seed(7);
  return net();
}
/// This rank's batch of a step: 5 images of 10 x 10 and their labels, inputs in `dtype`.
inline std::pair<torch::Tensor, torch::Tensor> batch(std::uint64_t step, int rank,
                                                     torch::Dtype dtype = torch::kFloat32) {
  torch::manual_seed(static_cast<std::uint64_t>(1000 * step) + static_cast<std::uint64_t>(rank));
  auto x = torch::randn({5, 1, 10, 10}).to(dtype);
  return {x, torch::randint(0, 3, {5})};
}
inline torch::Tensor loss_of(net& m, std::uint64_t step, int rank,
                             torch::Dtype dtype = torch::kFloat32) {
  const auto [x, y] = batch(step, rank, dtype);
  return torch::nn::functional::cross_entropy(m->forward(x), y);
}

}  // namespace pactrain::test
