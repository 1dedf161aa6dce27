// distributed_sampler: equal shares that cover the dataset, one permutation per epoch shared by
// every rank, the padding, the unshuffled order and the errors.
#include <doctest/doctest.h>

#include <pactrain/sampler.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

using namespace pactrain;

namespace {

// Every rank's share of one epoch, rank after rank.
std::vector<std::vector<std::size_t>> shares(std::size_t n, int ranks, std::uint64_t seed,
                                             std::uint64_t epoch) {
  std::vector<std::vector<std::size_t>> s;
  for (int r = 0; r < ranks; ++r)
    s.push_back(distributed_sampler(n, r, ranks, seed).indices(epoch));
  return s;
}

}  // namespace

TEST_CASE("distributed_sampler: equal shares covering the dataset, padded by the first samples") {
  for (const int ranks : {1, 2, 4}) {
    for (const std::size_t n :
         {std::size_t{1}, std::size_t{10}, std::size_t{64}, std::size_t{67}}) {
      const auto s = shares(n, ranks, 5, 3);
      const std::size_t per =
          (n + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
      std::vector<std::size_t> all;
      for (const auto& share : s) {
        CHECK(share.size() == per);
        all.insert(all.end(), share.begin(), share.end());
      }
      // Dealt round robin: position k of the epoch's order went to rank k % ranks.
      std::vector<std::size_t> order(all.size());
      for (std::size_t k = 0; k < order.size(); ++k) {
        order[k] = s[k % static_cast<std::size_t>(ranks)][k / static_cast<std::size_t>(ranks)];
      }
      std::vector<std::size_t> head(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n));
      std::sort(head.begin(), head.end());
      for (std::size_t i = 0; i < n; ++i) CHECK(head[i] == i);  // a permutation of 0..n-1
      for (std::size_t k = n; k < order.size(); ++k) CHECK(order[k] == order[k - n]);  // padding
    }
  }
}

TEST_CASE("distributed_sampler: one order per (seed, epoch) on every rank, another each epoch") {
  CHECK(shares(100, 4, 7, 0) == shares(100, 4, 7, 0));
  CHECK(shares(100, 4, 7, 0) != shares(100, 4, 7, 1));
  CHECK(shares(100, 4, 7, 0) != shares(100, 4, 8, 0));
  // Unshuffled: the samples in order, dealt round robin.
  CHECK(distributed_sampler(7, 1, 3, 0, false).indices(4) == std::vector<std::size_t>{1, 4, 0});
  CHECK(distributed_sampler(0, 0, 2).size() == 0);
  CHECK(distributed_sampler(0, 1, 2).indices(0).empty());
}

TEST_CASE("distributed_sampler: a rank outside the world is refused") {
  CHECK_THROWS_WITH_AS(distributed_sampler(10, 2, 2),
                       "pactrain: distributed_sampler: rank 2 of 2 ranks", error);
  CHECK_THROWS_AS(distributed_sampler(10, -1, 2), error);
  CHECK_THROWS_AS(distributed_sampler(10, 0, 0), error);
}
