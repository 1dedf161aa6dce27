// PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019) over MPI, as PyTorch's
// powerSGD_hook does it: each weight matrix M (gradient plus the error left by the last step)
// is approximated by P Q^T of rank r with one step of power iteration, warm-started from the
// last step's Q. One allreduce carries every P together with the tensors left uncompressed
// (vectors, and matrices that rank r would not shrink at least 2x), a second every Q; both
// nonblocking and waited for, as the dense baseline's (sync_bench::allreduce_in_place).
//
//   P = M Q; allreduce P; orthogonalise P's columns; Q = M^T P; allreduce Q, / ranks;
//   result = P Q^T; error = M - result.
//
// As the hook's start_powerSGD_iter, the first `dense_steps` exchanges may be a plain
// allreduce of the whole gradient (its mean); compression starts after them with the error
// empty and Q as drawn at construction (the hook draws it at its first compressed step: the
// same, since nothing reads or changes Q before).
//
// Bench code (not the library): bench/e2e's PowerSGD baseline. The methods are in
// powersgd.cpp, so that its Eigen products are compiled once.
#pragma once

#include "../sync/harness.hpp"

#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>

#include <mpi.h>
#include <Eigen/Dense>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace e2e {

class powersgd {
 public:
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using map = Eigen::Map<matrix>;

  /// Compresses the row-major matrices of `layout` to rank `rank`; `seed` draws the first Q
  /// (the same on every rank). The first `dense_steps` exchanges send the whole gradient.
  powersgd(MPI_Comm comm, const pactrain::param_layout& layout, std::size_t rank,
           std::uint64_t seed = 1, std::uint64_t dense_steps = 0);

  /// Collective: replaces `grads` (flat, in the layout) with the rank-r approximation of the
  /// mean gradient (plain tensors: their mean); in the first dense_steps exchanges, with the
  /// mean itself.
  void exchange(std::span<float> grads);

  /// Payload bytes this rank handed to the allreduces in the last exchange.
  [[nodiscard]] std::size_t bytes_sent() const noexcept {
    return last_dense_ ? n_ * sizeof(float) : (first_.size() + second_.size()) * sizeof(float);
  }
  /// Allreduces in the last exchange: one where dense; else the first (P and the plain
  /// tensors) and the second (Q), where they carry anything.
  [[nodiscard]] std::size_t collectives() const noexcept {
    if (last_dense_) return 1;
    return (first_.empty() ? 0 : 1) + (second_.empty() ? 0 : 1);
  }
  /// How many matrices are compressed.
  [[nodiscard]] std::size_t compressed() const noexcept { return blocks_.size(); }

  /// The rank whose bytes per exchange come nearest `bytes` (at least 1), for `layout`.
  static std::size_t rank_for_bytes(const pactrain::param_layout& layout, std::size_t bytes);

 private:
  struct block {
    std::size_t offset, rows, cols, p_at;
    matrix q;      // cols x r, warm-started
    matrix error;  // rows x cols, what the last approximation left out
  };
  struct plain {
    std::size_t offset, size, at;
  };

  void allreduce(std::span<float> v) {
    if (v.empty()) return;
    sync_bench::allreduce_in_place(v.data(), v.size(), sizeof(float), MPI_FLOAT, MPI_SUM, comm_);
  }

  // Gram-Schmidt on the columns, as PyTorch's _orthogonalize (a tiny epsilon keeps a zero
  // column from dividing by 0).
  static void orthogonalise(map& p);

  MPI_Comm comm_;
  std::size_t rank_;
  std::size_t n_;  // entries of the gradient
  std::uint64_t dense_steps_;
  std::uint64_t step_ = 0;
  bool last_dense_ = false;
  int ranks_ = 1;
  std::vector<block> blocks_;
  std::vector<plain> plain_;
  std::vector<float> first_;   // plain tensors, then every P
  std::vector<float> second_;  // every Q
};

}  // namespace e2e
