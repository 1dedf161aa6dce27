// pactrain::sgd on exactly representable values (every product and sum below is exact), its
// momentum start, and its errors. Bit-identity with torch::optim::SGD is tested where LibTorch
// is installed (tests/torch/torch_adapter_test.cpp).
#include <doctest/doctest.h>

#include <pactrain/sgd.hpp>

#include <limits>
#include <string>
#include <vector>

using namespace pactrain;

TEST_CASE("sgd: plain, momentum, Nesterov and weight decay on exact values") {
  SUBCASE("plain") {
    sgd opt({.lr = 0.5});
    std::vector<float> p = {1.0f, -2.0f, 0.0f}, g = {0.5f, 1.0f, -4.0f};
    opt.step(p, g, {});
    CHECK(p == std::vector<float>{0.75f, -2.5f, 2.0f});
    CHECK(opt.steps() == 1);
  }
  SUBCASE("momentum: the first step takes the gradient as the buffer") {
    sgd opt({.lr = 0.5, .momentum = 0.5});
    std::vector<float> p = {1.0f}, g = {0.5f}, buf = {123.0f};  // the old buffer is ignored
    opt.step(p, g, buf);
    CHECK(buf[0] == 0.5f);
    CHECK(p[0] == 0.75f);
    opt.step(p, g, buf);  // buf = 0.5 * 0.5 + 0.5
    CHECK(buf[0] == 0.75f);
    CHECK(p[0] == 0.375f);
  }
  SUBCASE("Nesterov and weight decay") {
    sgd opt({.lr = 0.25, .momentum = 0.5, .weight_decay = 0.5, .nesterov = true});
    std::vector<float> p = {2.0f}, g = {1.0f}, buf = {0.0f};
    opt.step(p, g, buf);  // d = 1 + 0.5 * 2 = 2; buf = 2; d = 2 + 0.5 * 2 = 3; p = 2 - 0.75
    CHECK(buf[0] == 2.0f);
    CHECK(p[0] == 1.25f);
  }
  SUBCASE("dampening") {
    sgd opt({.lr = 1.0, .momentum = 0.5, .dampening = 0.5});
    std::vector<float> p = {0.0f}, g = {1.0f}, buf = {0.0f};
    opt.step(p, g, buf);  // buf = 1 (no dampening on the first step)
    opt.step(p, g, buf);  // buf = 0.5 * 1 + 0.5 * 1
    CHECK(buf[0] == 1.0f);
    CHECK(p[0] == -2.0f);
  }
  SUBCASE("sizes not a multiple of the vector width, and empty buffers") {
    for (const std::size_t n : {0u, 1u, 7u, 9u, 17u, 1000u}) {
      sgd opt({.lr = 0.5, .momentum = 0.5});
      std::vector<float> p(n, 1.0f), g(n, 0.5f), buf(n);
      opt.step(p, g, buf);
      for (const float x : p) CHECK(x == 0.75f);
    }
  }
}

TEST_CASE("sgd: bad settings and buffers throw and change nothing") {
  CHECK_THROWS_WITH_AS(sgd({.lr = -1.0}), doctest::Contains("must be finite and >= 0"), error);
  CHECK_THROWS_WITH_AS(sgd({.lr = 0.1, .nesterov = true}),
                       doctest::Contains("Nesterov momentum requires"), error);
  sgd opt({.lr = 0.5, .momentum = 0.9});
  std::vector<float> p = {1.0f, 2.0f}, g = {1.0f}, buf = {0.0f, 0.0f};
  CHECK_THROWS_WITH_AS(opt.step(p, g, buf),
                       doctest::Contains("2 parameters, 1 gradients and 2 momentum entries"),
                       error);
  CHECK(p == std::vector<float>{1.0f, 2.0f});
  CHECK(opt.steps() == 0);
  g.push_back(1.0f);
  CHECK_THROWS_AS(opt.step(p, g, {}), error);  // momentum needs its buffer
  CHECK_THROWS_AS(opt.set_lr(std::numeric_limits<double>::infinity()), error);
}
