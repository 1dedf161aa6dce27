// distributed_sampler: which samples each rank reads in an epoch, as PyTorch's
// DistributedSampler deals them: every rank the same number, disjoint but for the padding,
// reshuffled each epoch from a seed every rank shares (no bytes sent).
#pragma once

#include <pactrain/detail/random.hpp>
#include <pactrain/error.hpp>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace pactrain {

class distributed_sampler {
 public:
  /// `n` samples over `ranks` ranks, for `rank`. With `shuffle`, each epoch's order is a
  /// permutation drawn from (seed, epoch); without, the samples in order.
  distributed_sampler(std::size_t n, int rank, int ranks, std::uint64_t seed = 0,
                      bool shuffle = true)
      : n_(n), rank_(rank), ranks_(ranks), seed_(seed), shuffle_(shuffle) {
    PACTRAIN_EXPECTS(ranks > 0 && rank >= 0 && rank < ranks, "distributed_sampler: rank " +
                                                                 std::to_string(rank) + " of " +
                                                                 std::to_string(ranks) + " ranks");
  }

  /// Samples per rank and epoch: n / ranks rounded up (a dataset that does not divide evenly
  /// is padded with its epoch's first samples, so that every rank takes as many steps).
  [[nodiscard]] std::size_t size() const noexcept {
    return n_ == 0 ? 0
                   : (n_ + static_cast<std::size_t>(ranks_) - 1) / static_cast<std::size_t>(ranks_);
  }

  /// This rank's samples in epoch `epoch`: positions rank, rank + ranks, ... of the epoch's
  /// order (padded).
  [[nodiscard]] std::vector<std::size_t> indices(std::uint64_t epoch) const {
    std::vector<std::size_t> order(n_);
    std::iota(order.begin(), order.end(), std::size_t{0});
    if (shuffle_) {  // Fisher-Yates over one splitmix64 stream per (seed, epoch)
      const std::uint64_t base = detail::splitmix64(seed_ ^ detail::splitmix64(epoch));
      for (std::size_t i = n_; i > 1; --i) {
        const std::uint64_t r = detail::splitmix64(base + i);
        std::swap(order[i - 1], order[static_cast<std::size_t>(r % i)]);
      }
    }
    std::vector<std::size_t> mine;
    mine.reserve(size());
    const auto step = static_cast<std::size_t>(ranks_);
    for (std::size_t k = static_cast<std::size_t>(rank_); k < size() * step; k += step) {
      mine.push_back(order[k % n_]);
    }
    return mine;
  }

 private:
  std::size_t n_;
  int rank_;
  int ranks_;
  std::uint64_t seed_;
  bool shuffle_;
};

}  // namespace pactrain
