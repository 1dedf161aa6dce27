// A fully connected ReLU network (MLP) on Eigen with softmax cross-entropy and SGD with
// momentum, over one flat parameter buffer laid out by a pactrain::param_layout.
//
// Header-only; used by examples/fmnist/main.cpp and by the tests. Build and run the trainer
// that uses it (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_fmnist
//   export OMPI_MCA_mpi_yield_when_idle=1
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/examples/pactrain_fmnist
//
// Layer k (1-based) is "fcK.weight", out x in, row-major (as in PyTorch), followed by
// "fcK.bias" (1-D, out). Gradients live in a second flat buffer with the same layout, which
// is what the sync engine averages.
#pragma once

#include <pactrain/detail/random.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#if defined(__SSE__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

namespace pactrain::fmnist {

/// Sets flush-to-zero and denormals-are-zero for this thread (x86 MXCSR bits 15 and 6).
/// Momentum of pruned or dead units decays into denormals, which are very slow on x86.
inline void enable_flush_to_zero() noexcept {
#if defined(__SSE__) || defined(_M_X64)
  _mm_setcsr(_mm_getcsr() | 0x8040u);
#endif
}

/// splitmix64: a small, portable generator, so that every rank and machine draws the same
/// numbers from the same seed.
inline std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  state += 0x9e3779b97f4a7c15ULL;
  return pactrain::detail::mix64(state);
}

/// Uniform in [0, 1) with 24 random bits.
inline float uniform01(std::uint64_t& state) noexcept {
  return static_cast<float>(splitmix64(state) >> 40) * (1.0f / 16777216.0f);
}

/// Fisher-Yates shuffle driven by splitmix64 (std::shuffle's result depends on the library).
template <class T>
void shuffle(std::vector<T>& v, std::uint64_t seed) {
  std::uint64_t state = seed;
  for (std::size_t i = v.size(); i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(splitmix64(state) % i);
    std::swap(v[i - 1], v[j]);
  }
}

/// The MLP. sizes = {inputs, hidden..., classes}, e.g. {784, 1024, 512, 10}.
class mlp {
 public:
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using matrix_map = Eigen::Map<matrix>;
  using const_matrix_map = Eigen::Map<const matrix>;
  using row_map = Eigen::Map<Eigen::RowVectorXf>;
  using const_row_map = Eigen::Map<const Eigen::RowVectorXf>;

  explicit mlp(std::vector<std::size_t> sizes) : sizes_(std::move(sizes)) {
    PACTRAIN_EXPECTS(sizes_.size() >= 2, "mlp: need at least an input and an output size");
    for (auto s : sizes_) PACTRAIN_EXPECTS(s > 0, "mlp: layer sizes must be positive");
    for (std::size_t k = 0; k + 1 < sizes_.size(); ++k) {
      const std::string n = "fc" + std::to_string(k + 1);
      layout_.add(n + ".weight", sizes_[k + 1], sizes_[k]).add(n + ".bias", sizes_[k + 1]);
    }
    params_.assign(layout_.total_size(), 0.0f);
    grads_.assign(layout_.total_size(), 0.0f);
    z_.resize(layers());
    a_.resize(layers());
  }

  [[nodiscard]] const std::vector<std::size_t>& sizes() const noexcept { return sizes_; }
  [[nodiscard]] std::size_t layers() const noexcept { return sizes_.size() - 1; }
  [[nodiscard]] std::size_t inputs() const noexcept { return sizes_.front(); }
  [[nodiscard]] std::size_t classes() const noexcept { return sizes_.back(); }
  [[nodiscard]] const param_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] std::span<float> params() noexcept { return params_; }
  [[nodiscard]] std::span<const float> params() const noexcept { return params_; }
  [[nodiscard]] std::span<float> grads() noexcept { return grads_; }
  [[nodiscard]] std::span<const float> grads() const noexcept { return grads_; }

  /// He-uniform weights (bound sqrt(6 / fan_in), for ReLU) and zero biases, from `seed`
  /// alone: equal seeds give bit-identical parameters on every rank.
  void init(std::uint64_t seed) {
    for (std::size_t k = 0; k < layers(); ++k) {
      const auto& w = layout_.tensor(2 * k);
      const float bound = std::sqrt(6.0f / static_cast<float>(w.cols));
      std::uint64_t state = seed * 0x100000001b3ULL + k;
      for (std::size_t i = 0; i < w.size; ++i) {
        params_[w.offset + i] = (2.0f * uniform01(state) - 1.0f) * bound;
      }
      const auto& b = layout_.tensor(2 * k + 1);
      std::fill_n(params_.begin() + static_cast<std::ptrdiff_t>(b.offset), b.size, 0.0f);
    }
  }

  /// Forward and backward on a batch of n samples (x: n x inputs(), row-major; labels in
  /// 0..classes()-1). Writes the gradient of the mean loss into grads() and returns the mean
  /// softmax cross-entropy. `layer_done(k)` is called as soon as layer k's weight and bias
  /// gradients are final (last layer first), so a trainer can start their sync while the
  /// earlier layers' gradients are computed.
  template <class LayerDone = void (*)(std::size_t)>
  float train_batch(
      const float* x, const std::uint8_t* labels, std::size_t n,
      LayerDone&& layer_done = [](std::size_t) {}) {
    PACTRAIN_EXPECTS(n > 0, "mlp::train_batch: empty batch");
    forward(x, n);
    const std::size_t last = layers() - 1;
    // dZ of the output layer: (softmax - onehot) / n; z_[last] holds softmax afterwards.
    matrix& d = z_[last];
    double loss = 0;
    const float inv_n = 1.0f / static_cast<float>(n);
    for (std::size_t r = 0; r < n; ++r) {
      auto row = d.row(static_cast<Eigen::Index>(r));
      const float m = row.maxCoeff();
      row.array() -= m;
      row = row.array().exp().matrix();
      const float sum = row.sum();
      const auto y = static_cast<Eigen::Index>(labels[r]);
      loss -= std::log(static_cast<double>(row(y)) / static_cast<double>(sum));
      row *= inv_n / sum;
      row(y) -= inv_n;
    }
    for (std::size_t k = last + 1; k-- > 0;) {
      const_matrix_map in = input_of(k, x, n);
      weight_map(grads_, k).noalias() = z_[k].transpose() * in;
      column_sums(z_[k], bias_map(grads_, k));
      layer_done(k);
      if (k == 0) break;
      // dA_{k-1} = dZ_k W_k, then through the ReLU: zero where the activation was zero.
      z_[k - 1].noalias() = z_[k] * weight_map(params_, k);
      z_[k - 1] = (a_[k - 1].array() > 0.0f).select(z_[k - 1], 0.0f);
    }
    return static_cast<float>(loss / static_cast<double>(n));
  }

  /// Number of the n samples whose arg-max class is their label.
  std::size_t count_correct(const float* x, const std::uint8_t* labels, std::size_t n) {
    if (n == 0) return 0;
    forward(x, n);
    const matrix& out = z_[layers() - 1];
    std::size_t correct = 0;
    for (std::size_t r = 0; r < n; ++r) {
      Eigen::Index best = 0;
      out.row(static_cast<Eigen::Index>(r)).maxCoeff(&best);
      correct += static_cast<std::size_t>(best) == labels[r];
    }
    return correct;
  }

 private:
  matrix_map weight_map(std::vector<float>& buf, std::size_t k) {
    const auto& t = layout_.tensor(2 * k);
    return {buf.data() + t.offset, static_cast<Eigen::Index>(t.rows),
            static_cast<Eigen::Index>(t.cols)};
  }
  row_map bias_map(std::vector<float>& buf, std::size_t k) {
    const auto& t = layout_.tensor(2 * k + 1);
    return {buf.data() + t.offset, static_cast<Eigen::Index>(t.size)};
  }
  const_matrix_map input_of(std::size_t k, const float* x, std::size_t n) const {
    if (k == 0) {
      return {x, static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(inputs())};
    }
    return {a_[k - 1].data(), a_[k - 1].rows(), a_[k - 1].cols()};
  }

  // out = the column sums of m, each summed over the rows in order. Eigen's colwise().sum()
  // sums some columns in packets (grouped in fours) and others one by one, depending on the
  // destination's address, so the bits of the result would change from run to run.
  static void column_sums(const matrix& m, row_map out) {
    out.setZero();
    for (Eigen::Index r = 0; r < m.rows(); ++r) out += m.row(r);
  }

  // z_[k] = in_k W_k^T + b_k; a_[k] = relu(z_[k]) for hidden layers (the last keeps logits).
  void forward(const float* x, std::size_t n) {
    for (std::size_t k = 0; k < layers(); ++k) {
      const_matrix_map in = input_of(k, x, n);
      const auto& t = layout_.tensor(2 * k);
      const_matrix_map w(params_.data() + t.offset, static_cast<Eigen::Index>(t.rows),
                         static_cast<Eigen::Index>(t.cols));
      const_row_map b(params_.data() + layout_.tensor(2 * k + 1).offset,
                      static_cast<Eigen::Index>(t.rows));
      z_[k].resize(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(t.rows));
      z_[k].noalias() = in * w.transpose();
      z_[k].rowwise() += b;
      if (k + 1 < layers()) a_[k] = z_[k].cwiseMax(0.0f);
    }
  }

  std::vector<std::size_t> sizes_;
  param_layout layout_;
  std::vector<float> params_;
  std::vector<float> grads_;
  std::vector<matrix> z_;  // pre-activations, reused for their gradients in backward
  std::vector<matrix> a_;  // ReLU outputs of the hidden layers
};

/// SGD with momentum (PyTorch's form): v = momentum * v + (g + weight_decay * w);
/// w -= lr * v. The velocity has the parameters' layout, so the same masks apply to it.
class sgd_momentum {
 public:
  sgd_momentum(std::size_t size, float momentum, float weight_decay)
      : momentum_(momentum), weight_decay_(weight_decay), velocity_(size, 0.0f) {}

  void step(std::span<float> params, std::span<const float> grads, float lr) {
    PACTRAIN_EXPECTS(params.size() == velocity_.size() && grads.size() == velocity_.size(),
                     "sgd_momentum: buffer sizes differ from the optimizer's");
    float* v = velocity_.data();
    float* w = params.data();
    const float* g = grads.data();
    const float mu = momentum_;
    const float wd = weight_decay_;
    for (std::size_t i = 0; i < velocity_.size(); ++i) {
      v[i] = mu * v[i] + (g[i] + wd * w[i]);
      w[i] -= lr * v[i];
    }
  }

  [[nodiscard]] std::span<float> velocity() noexcept { return velocity_; }

 private:
  float momentum_;
  float weight_decay_;
  std::vector<float> velocity_;
};

}  // namespace pactrain::fmnist
