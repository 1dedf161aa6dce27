// PowerSGD's methods (see powersgd.hpp).
#include "powersgd.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>

namespace e2e {

powersgd::powersgd(MPI_Comm comm, const pactrain::param_layout& layout, std::size_t rank,
                   std::uint64_t seed, std::uint64_t dense_steps)
    : comm_(comm), rank_(rank), n_(layout.total_size()), dense_steps_(dense_steps) {
  PACTRAIN_EXPECTS(rank > 0, "powersgd: the rank must be positive");
  MPI_Comm_size(comm_, &ranks_);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal;
  std::size_t at = 0;  // in the first allreduce's buffer
  for (const auto& t : layout.tensors()) {
    // PyTorch's min_compression_rate: compress only where (rows + cols) r <= rows cols / 2.
    if (t.rows > 0 && (t.rows + t.cols) * rank * 2 <= t.size) {
      block b{t.offset, t.rows, t.cols, 0, matrix(t.cols, rank), matrix::Zero(t.rows, t.cols)};
      for (Eigen::Index i = 0; i < b.q.size(); ++i) b.q.data()[i] = normal(gen);
      blocks_.push_back(std::move(b));
    } else {
      plain_.push_back({t.offset, t.size, at});
      at += t.size;
    }
  }
  for (auto& b : blocks_) {
    b.p_at = at;
    at += b.rows * rank;
  }
  first_.resize(at);
  std::size_t q = 0;
  for (const auto& b : blocks_) q += b.cols * rank;
  second_.resize(q);
  PACTRAIN_EXPECTS(first_.size() <= INT32_MAX && second_.size() <= INT32_MAX &&
                       (dense_steps_ == 0 || n_ <= INT32_MAX),
                   "powersgd: more than 2^31 entries in one allreduce");
}

void powersgd::exchange(std::span<float> grads) {
  PACTRAIN_EXPECTS(grads.size() == n_, "powersgd: the gradient does not match the layout");
  const float inv = 1.0f / static_cast<float>(ranks_);
  last_dense_ = step_ < dense_steps_;
  ++step_;
  if (last_dense_) {  // start_powerSGD_iter: the plain mean, no error kept
    allreduce(grads);
    for (float& v : grads) v *= inv;
    return;
  }
  for (const auto& p : plain_) std::copy_n(grads.data() + p.offset, p.size, first_.data() + p.at);
  for (auto& b : blocks_) {
    map m(grads.data() + b.offset, static_cast<Eigen::Index>(b.rows),
          static_cast<Eigen::Index>(b.cols));
    m += b.error;  // error feedback
    map(first_.data() + b.p_at, static_cast<Eigen::Index>(b.rows), static_cast<Eigen::Index>(rank_))
        .noalias() = m * b.q;
  }
  allreduce(first_);
  for (const auto& p : plain_) {
    float* g = grads.data() + p.offset;
    for (std::size_t i = 0; i < p.size; ++i) g[i] = first_[p.at + i] * inv;
  }
  std::size_t q_at = 0;
  for (auto& b : blocks_) {
    map p(first_.data() + b.p_at, static_cast<Eigen::Index>(b.rows),
          static_cast<Eigen::Index>(rank_));
    orthogonalise(p);
    map m(grads.data() + b.offset, static_cast<Eigen::Index>(b.rows),
          static_cast<Eigen::Index>(b.cols));
    map(second_.data() + q_at, static_cast<Eigen::Index>(b.cols), static_cast<Eigen::Index>(rank_))
        .noalias() = m.transpose() * p;
    q_at += b.cols * rank_;
  }
  allreduce(second_);
  q_at = 0;
  for (auto& b : blocks_) {
    const map p(first_.data() + b.p_at, static_cast<Eigen::Index>(b.rows),
                static_cast<Eigen::Index>(rank_));
    b.q = map(second_.data() + q_at, static_cast<Eigen::Index>(b.cols),
              static_cast<Eigen::Index>(rank_)) *
          inv;
    q_at += b.cols * rank_;
    map m(grads.data() + b.offset, static_cast<Eigen::Index>(b.rows),
          static_cast<Eigen::Index>(b.cols));
    b.error = m;
    m.noalias() = p * b.q.transpose();
    b.error -= m;
  }
}

std::size_t powersgd::rank_for_bytes(const pactrain::param_layout& layout, std::size_t bytes) {
  std::size_t best = 1;
  double best_gap = -1;
  for (std::size_t r = 1; r <= 4096; ++r) {
    std::size_t entries = 0;
    for (const auto& t : layout.tensors()) {
      const bool c = t.rows > 0 && (t.rows + t.cols) * r * 2 <= t.size;
      entries += c ? (t.rows + t.cols) * r : t.size;
    }
    const double gap =
        std::fabs(static_cast<double>(entries * sizeof(float)) - static_cast<double>(bytes));
    if (best_gap < 0 || gap < best_gap) {
      best = r;
      best_gap = gap;
    }
  }
  return best;
}

void powersgd::orthogonalise(map& p) {
  for (Eigen::Index c = 0; c < p.cols(); ++c) {
    auto col = p.col(c);
    col /= col.norm() + 1e-8f;
    for (Eigen::Index d = c + 1; d < p.cols(); ++d) {
      auto other = p.col(d);
      other -= col.dot(other) * col;
    }
  }
}

}  // namespace e2e
