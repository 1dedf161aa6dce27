// The Fashion-MNIST example's MLP (examples/fmnist/mlp.hpp): layout, gradients against finite
// differences, the SGD step, and results that do not depend on where buffers sit in memory.
//
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_unit_fmnist_mlp_test
//   build/examples/fmnist/tests/unit/fmnist_mlp_test
#include <doctest/doctest.h>

#include "fmnist/mlp.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace fm = pactrain::fmnist;

namespace {

struct batch {
  std::vector<float> x;
  std::vector<std::uint8_t> y;
};

batch random_batch(std::size_t n, std::size_t features, std::size_t classes, std::uint64_t seed) {
  batch b;
  std::uint64_t s = seed;
  for (std::size_t i = 0; i < n * features; ++i) b.x.push_back(2.0f * fm::uniform01(s) - 1.0f);
  for (std::size_t i = 0; i < n; ++i)
    b.y.push_back(static_cast<std::uint8_t>(fm::splitmix64(s) % classes));
  return b;
}

}  // namespace

TEST_CASE("the layout names weights and biases per layer") {
  const fm::mlp m({784, 32, 16, 10});
  const auto& l = m.layout();
  REQUIRE(l.tensor_count() == 6);
  CHECK(l.tensor(0).name == "fc1.weight");
  CHECK(l.tensor(0).rows == 32);
  CHECK(l.tensor(0).cols == 784);
  CHECK(l.tensor(1).name == "fc1.bias");
  CHECK(l.tensor(1).rows == 0);
  CHECK(l.tensor(1).size == 32);
  CHECK(l.tensor(4).name == "fc3.weight");
  CHECK(l.tensor(5).size == 10);
  CHECK(l.total_size() == 784 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10);
  CHECK(m.params().size() == l.total_size());
  CHECK(m.grads().size() == l.total_size());
  CHECK_THROWS_AS(fm::mlp({784}), pactrain::error);
  CHECK_THROWS_AS(fm::mlp({784, 0, 10}), pactrain::error);
}

TEST_CASE("init depends on the seed alone") {
  fm::mlp a({20, 8, 3});
  fm::mlp b({20, 8, 3});
  a.init(5);
  b.init(5);
  CHECK(std::memcmp(a.params().data(), b.params().data(), a.params().size() * sizeof(float)) == 0);
  b.init(6);
  CHECK(std::memcmp(a.params().data(), b.params().data(), a.params().size() * sizeof(float)) != 0);
  // He-uniform bound sqrt(6 / fan_in), zero biases.
  const auto& w = a.layout().tensor(0);
  for (std::size_t i = 0; i < w.size; ++i)
    CHECK(std::abs(a.params()[w.offset + i]) <= std::sqrt(6.0f / 20.0f));
  const auto& bias = a.layout().tensor(1);
  for (std::size_t i = 0; i < bias.size; ++i) CHECK(a.params()[bias.offset + i] == 0.0f);
}

TEST_CASE("gradients match finite differences of the loss") {
  fm::mlp m({6, 5, 4, 3});
  m.init(3);
  // Nonzero biases, so that the bias gradients pass through ReLUs that are on and off.
  for (std::size_t t = 1; t < m.layout().tensor_count(); t += 2) {
    const auto& b = m.layout().tensor(t);
    for (std::size_t i = 0; i < b.size; ++i)
      m.params()[b.offset + i] = 0.1f * static_cast<float>(i % 3) - 0.05f;
  }
  const batch b = random_batch(7, 6, 3, 11);
  m.train_batch(b.x.data(), b.y.data(), 7);
  const std::vector<float> g(m.grads().begin(), m.grads().end());

  const float h = 1e-2f;
  std::size_t checked = 0;
  for (std::size_t i = 0; i < m.params().size(); ++i) {
    const float w = m.params()[i];
    m.params()[i] = w + h;
    const double up = m.train_batch(b.x.data(), b.y.data(), 7);
    m.params()[i] = w - h;
    const double down = m.train_batch(b.x.data(), b.y.data(), 7);
    m.params()[i] = w;
    const double numeric = (up - down) / (2.0 * h);
    CHECK_MESSAGE(std::abs(numeric - g[i]) <= 2e-3 + 2e-2 * std::abs(numeric), "parameter " << i);
    ++checked;
  }
  CHECK(checked == m.params().size());
}

TEST_CASE("the loss of uniform logits is log(classes)") {
  fm::mlp m({4, 3});  // one layer; all-zero weights and biases give equal logits
  const batch b = random_batch(5, 4, 3, 2);
  CHECK(m.train_batch(b.x.data(), b.y.data(), 5) == doctest::Approx(std::log(3.0)).epsilon(1e-6));
  CHECK(m.count_correct(b.x.data(), b.y.data(), 0) == 0);
}

TEST_CASE("sgd_momentum follows v = mu v + g + wd w; w -= lr v") {
  fm::sgd_momentum opt(2, 0.5f, 0.25f);
  std::vector<float> w{1.0f, -2.0f};
  const std::vector<float> g{0.5f, 1.0f};
  opt.step(w, g, 0.5f);  // v = (0.75, 0.5), w = (0.625, -2.25)
  CHECK(opt.velocity()[0] == 0.75f);
  CHECK(opt.velocity()[1] == 0.5f);
  CHECK(w[0] == 0.625f);
  CHECK(w[1] == -2.25f);
  opt.step(w, g, 0.5f);  // v = 0.375 + 0.5 + 0.15625 = 1.03125; w = 0.625 - 0.515625
  CHECK(opt.velocity()[0] == 1.03125f);
  CHECK(w[0] == 0.109375f);
  std::vector<float> short_buffer(1);
  CHECK_THROWS_AS(opt.step(short_buffer, g, 0.1f), pactrain::error);
}

TEST_CASE("training does not depend on where the buffers are in memory") {
  // Eigen sums some vectors in packets or one by one depending on their address; the model
  // must give the same bits wherever its input and parameters live, so that runs repeat.
  const batch b = random_batch(64, 40, 10, 9);
  std::vector<std::vector<float>> results;
  std::vector<fm::mlp> keep;  // shifts where the next model's buffers are allocated
  for (std::size_t shift : {0, 1, 3, 8, 16}) {
    std::vector<float> input(b.x.size() + shift);
    std::memcpy(input.data() + shift, b.x.data(), b.x.size() * sizeof(float));
    keep.emplace_back(std::vector<std::size_t>{40 + shift, 3});
    fm::mlp m({40, 33, 17, 10});
    m.init(1);
    fm::sgd_momentum opt(m.params().size(), 0.9f, 1e-4f);
    for (int step = 0; step < 5; ++step) {
      m.train_batch(input.data() + shift, b.y.data(), 64);
      opt.step(m.params(), m.grads(), 0.05f);
    }
    results.emplace_back(m.params().begin(), m.params().end());
  }
  for (std::size_t i = 1; i < results.size(); ++i) {
    CHECK(std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)) ==
          0);
  }
}
