// Codecs over MPI: 16-bit reductions of mpi_communicator, and every codec path of the sync
// engine against a reference computed from the same quantised values. fp16 and bf16 use
// values whose every partial sum is representable, so results are exact whatever MPI's
// order; for ternary every rank recomputes every rank's encoding (the random numbers are a
// function of seed, rank, step, bucket and index) and sums the lanes itself.
//
// Every rank runs every test case; CHECK (not REQUIRE) before collectives.
#include <doctest/doctest.h>

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include "common/mpi_helpers.hpp"
#include "common/test_data.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace pactrain;

namespace {

using test::error_of;
using test::world_rank;
using test::world_size;

param_layout test_layout(std::size_t capacity) {
  param_layout l(capacity);
  l.add("conv.weight", 16, 75).add("conv.bias", 16).add("fc1.weight", 120, 33);
  l.add("unused", 0).add("fc1.bias", 120).add("fc2.weight", 10, 121).add("fc2.bias", 10);
  return l;
}

std::size_t bad_entries(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t bad = a.size() != b.size();
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    bad += std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i]);
  }
  return bad;
}

// The codec input of bucket b on one rank: the kept entries in payload order (sparse), or
// the whole bucket with pruned entries zeroed (dense).
std::vector<float> bucket_input(const param_layout& l, const std::vector<bitmap_mask>& masks,
                                const std::vector<float>& g, std::size_t b, bucket_strategy st) {
  const auto& bk = l.buckets()[b];
  std::vector<float> in;
  for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
    const auto& t = l.tensor(i);
    for (std::size_t j = 0; j < t.size; ++j) {
      if (masks[i].test(j)) {
        in.push_back(g[t.offset + j]);
      } else if (!is_sparse(st)) {
        in.push_back(0.0f);
      }
    }
  }
  return in;
}

// Writes a bucket's decoded codec output back to the flat buffer (+0 at pruned entries).
void scatter_bucket(const param_layout& l, const std::vector<bitmap_mask>& masks,
                    const std::vector<float>& out, std::size_t b, bucket_strategy st,
                    std::vector<float>& g) {
  const auto& bk = l.buckets()[b];
  std::size_t k = 0;
  for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
    const auto& t = l.tensor(i);
    for (std::size_t j = 0; j < t.size; ++j) {
      const bool kept = masks[i].test(j);
      g[t.offset + j] = kept ? out[k] : 0.0f;
      k += kept || !is_sparse(st);
    }
  }
}

// The ternary reference: every rank's steps emulated on this rank, residuals included.
struct ternary_reference {
  const param_layout& l;
  const ternary_codec& codec;
  bool feedback;
  int p = world_size();
  std::vector<std::vector<std::vector<float>>> residual;  // [rank][bucket]
  std::vector<std::vector<float>> previous_scales;        // [bucket][block]

  std::vector<float> step(const std::vector<bitmap_mask>& masks, bucket_strategy st,
                          std::uint64_t at, std::uint64_t seed, bool first) {
    return step(masks, std::vector<bucket_strategy>(l.buckets().size(), st), at, seed, first);
  }

  // Per-bucket strategies: plain buckets are the exact mean of the masked values, which
  // test::values makes exactly summable.
  std::vector<float> step(const std::vector<bitmap_mask>& masks,
                          const std::vector<bucket_strategy>& strategies, std::uint64_t step,
                          std::uint64_t seed, bool first) {
    const std::size_t nb = l.buckets().size();
    if (first) {
      residual.assign(p, std::vector<std::vector<float>>(nb));
      previous_scales.assign(nb, {});
    }
    std::vector<float> result(l.total_size(), 0.0f);
    for (std::size_t b = 0; b < nb; ++b) {
      const bucket_strategy st = strategies[b];
      if (is_plain(st)) {
        std::vector<float> sum;
        for (int r = 0; r < p; ++r) {
          const auto in = bucket_input(l, masks, test::values<float>(l.total_size(), seed, r), b,
                                       bucket_strategy::sparse);
          sum.resize(in.size(), 0.0f);
          for (std::size_t k = 0; k < in.size(); ++k) sum[k] += in[k];
        }
        for (auto& v : sum) v *= 1.0f / static_cast<float>(p);
        scatter_bucket(l, masks, sum, b, bucket_strategy::sparse, result);
        continue;
      }
      std::vector<std::vector<float>> in(p);
      std::vector<float> mx;  // per block: the largest local scale over the ranks
      for (int r = 0; r < p; ++r) {
        in[r] = bucket_input(l, masks, test::values<float>(l.total_size(), seed, r), b, st);
        std::vector<float> local(codec.scale_count(in[r].size()));
        codec.local_scales(in[r], std::span<float>(local));
        mx.resize(local.size(), 0.0f);
        for (std::size_t k = 0; k < local.size(); ++k) mx[k] = std::max(mx[k], local[k]);
        if (residual[r][b].empty()) residual[r][b].assign(in[r].size(), 0.0f);
      }
      const bool reuse = codec.scale_from_previous_step() && !first;
      const std::vector<float> s = reuse ? previous_scales[b] : mx;
      previous_scales[b] = mx;
      if (in[0].empty()) {
        scatter_bucket(l, masks, {}, b, st, result);
        continue;
      }
      std::vector<std::uint32_t> sum(codec.wire_size(in[0].size(), p), 0);
      for (int r = 0; r < p; ++r) {
        const codec_context ctx{
            .rank = r, .size = p, .step = step, .bucket = b, .scale = s[0], .scales = s};
        if (feedback) {
          for (std::size_t k = 0; k < in[r].size(); ++k) in[r][k] += residual[r][b][k];
        }
        std::vector<std::uint32_t> w(sum.size());
        codec.encode(in[r], std::span<std::uint32_t>(w), ctx);
        if (feedback) {
          std::vector<float> local(in[r].size());
          codec.decode_local(w, std::span<float>(local), ctx);
          for (std::size_t k = 0; k < local.size(); ++k) residual[r][b][k] = in[r][k] - local[k];
        }
        for (std::size_t i = 0; i < w.size(); ++i) sum[i] += w[i];
      }
      std::vector<float> out(in[0].size());
      codec.decode(
          sum, std::span<float>(out),
          {.rank = world_rank(), .size = p, .step = step, .bucket = b, .scale = s[0], .scales = s});
      scatter_bucket(l, masks, out, b, st, result);
    }
    return result;
  }
};

// Three steps of `s` (masks and strategies committed, so residuals start at zero) against the
// reference, bit for bit; step k's gradients come from seed0 + k.
template <class Sync>
void check_steps(Sync& s, ternary_reference& ref, const std::vector<bitmap_mask>& masks,
                 const std::vector<bucket_strategy>& st, std::uint64_t seed0) {
  for (std::uint64_t k = 0; k < 3; ++k) {
    const auto want = ref.step(masks, st, s.step(), seed0 + k, k == 0);
    auto g = test::values<float>(ref.l.total_size(), seed0 + k, world_rank());
    s.allreduce(std::span<float>(g));
    CHECK(bad_entries(g, want) == 0);
  }
}

template <class K>
void check_cast_codec(int limit) {
  for (std::size_t capacity : {std::size_t{2000}, std::size_t{1}}) {
    const auto l = test_layout(capacity);
    pactrain::sync<mpi_communicator, K> s{mpi_communicator{MPI_COMM_WORLD}, l};
    for (double d : test::densities) {
      CAPTURE(d);
      const auto masks = test::masks_for<bitmap_mask>(l, d, 100);
      s.set_masks(masks);
      std::size_t kept = 0;
      for (const auto& m : masks) kept += m.count();
      for (auto strategy : {bucket_strategy::sparse, bucket_strategy::dense}) {
        s.set_strategies(std::vector<bucket_strategy>(l.buckets().size(), strategy));
        auto g = test::small_values(l.total_size(), 40, world_rank(), limit);
        // Reference: the dense float sum of the masked (already representable) values.
        auto want = test::masked(l, masks, g);
        MPI_Allreduce(MPI_IN_PLACE, want.data(), static_cast<int>(want.size()), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
        for (auto& v : want) v *= 1.0f / static_cast<float>(world_size());
        s.allreduce(std::span<float>(g));
        CHECK(bad_entries(g, want) == 0);
        const std::size_t entries = strategy == bucket_strategy::sparse ? kept : l.total_size();
        CHECK(s.stats().bytes_sent == entries * 2);  // 16 bits per value on the wire
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("mpi_communicator reduces 16-bit floats", T, half, bfloat16) {
  mpi_communicator c{MPI_COMM_WORLD};
  const int p = c.size();
  std::vector<T> v;
  for (int i = 0; i < 3000; ++i) v.push_back(T(static_cast<float>((i + c.rank()) % 16) / 4.0f));
  auto sum = v;
  auto mx = v;
  auto mn = v;
  c.allreduce(std::span<T>(sum), reduce_op::sum);
  auto req = c.allreduce_async(std::span<T>(mx), reduce_op::max);
  req.wait();
  c.allreduce(std::span<T>(mn), reduce_op::min);
  std::size_t bad = 0;
  for (int i = 0; i < 3000; ++i) {
    float s = 0;
    float hi = 0;
    float lo = 100;
    for (int r = 0; r < p; ++r) {
      const float x = static_cast<float>((i + r) % 16) / 4.0f;
      s += x;
      hi = std::max(hi, x);
      lo = std::min(lo, x);
    }
    bad += static_cast<float>(sum[i]) != s || static_cast<float>(mx[i]) != hi ||
           static_cast<float>(mn[i]) != lo;
  }
  CHECK(bad == 0);
  // Moving keeps the reductions working; the moved-from communicator owns nothing.
  mpi_communicator moved = std::move(c);
  std::vector<T> one{T(1.0f)};
  moved.allreduce(std::span<T>(one), reduce_op::sum);
  CHECK(static_cast<float>(one[0]) == static_cast<float>(p));
}

TEST_CASE("fp16 sync equals the float sum of the same values, bit for bit") {
  check_cast_codec<fp16_codec>(255);
}

TEST_CASE("bf16 sync equals the float sum of the same values, bit for bit") {
  check_cast_codec<bf16_codec>(15);
}

TEST_CASE("ternary sync equals the lane sums of every rank's encoding, bit for bit") {
  const auto l = test_layout(2000);
  // One scale per bucket, and one per block of 64 codec inputs (buckets of up to 2000 entries:
  // several blocks, the last one short), there with error feedback and previous_max, the
  // source with the most bookkeeping (the unit tests check current_max's block values).
  for (const std::size_t block : {std::size_t{0}, std::size_t{64}}) {
    for (bool feedback : {false, true}) {
      for (auto source : {scale_source::current_max, scale_source::previous_max}) {
        if (block != 0 && (!feedback || source == scale_source::current_max)) continue;
        CAPTURE(block);
        CAPTURE(feedback);
        CAPTURE(to_string(source));
        const ternary_codec codec{{.seed = 77, .scale = source, .scale_block = block}};
        pactrain::sync<mpi_communicator, ternary_codec> plain{mpi_communicator{MPI_COMM_WORLD}, l,
                                                              codec};
        pactrain::sync<mpi_communicator, error_feedback<ternary_codec>> fb{
            mpi_communicator{MPI_COMM_WORLD}, l, codec};
        for (double d : {0.0, 0.1, 1.0}) {
          CAPTURE(d);
          const auto masks = test::masks_for<bitmap_mask>(l, d, 200);
          for (auto strategy : {bucket_strategy::sparse, bucket_strategy::dense}) {
            const std::vector<bucket_strategy> st(l.buckets().size(), strategy);
            ternary_reference ref{l, codec, feedback, world_size(), {}, {}};
            const auto run = [&](auto& s) {
              s.set_masks(masks);
              s.set_strategies(st);
              check_steps(s, ref, masks, st, 50);
              std::size_t words = 0;
              for (std::size_t b = 0; b < l.buckets().size(); ++b) words += s.wire_size(b);
              // The last step's scales: previous_max reduces every bucket's words alongside the
              // data; current_max the words of each bucket with input, before encoding.
              std::size_t with_input = 0;
              std::size_t all = 0;
              for (std::size_t b = 0; b < l.buckets().size(); ++b) {
                const std::size_t n =
                    strategy == bucket_strategy::sparse ? s.payload_size(b) : l.buckets()[b].size;
                with_input += n != 0 ? codec.scale_count(n) : 0;
                all += codec.scale_count(n);
              }
              const std::size_t scale_words = with_input == 0                        ? 0
                                              : source == scale_source::previous_max ? all
                                                                                     : with_input;
              CHECK(s.stats().bytes_sent == words * 4 + 8 * scale_words);
            };
            if (feedback) {
              run(fb);
            } else {
              run(plain);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("ternary bytes on the wire: about 1/8 of fp32 at 4 ranks") {
  param_layout l(1 << 20);
  l.add("w", 1000, 1000);
  pactrain::sync<mpi_communicator, ternary_codec> s{mpi_communicator{MPI_COMM_WORLD}, l};
  s.set_masks({test::random_mask(l.total_size(), 0.1, 3)});
  auto g = test::values<float>(l.total_size(), 1, world_rank());
  s.allreduce(std::span<float>(g));
  const std::size_t kept = s.payload_size(0);
  const std::size_t lanes = 32 / ternary_codec::required_lane_bits(world_size());
  CHECK(s.stats().bytes_sent == (kept + lanes - 1) / lanes * 4 + 8);
  // 8 lanes per word, plus at most one partial word and the 8-byte scale.
  if (world_size() == 4) CHECK(s.stats().bytes_sent * 8 <= kept * sizeof(float) + 8 * (4 + 8));
}

TEST_CASE("codec settings that differ across ranks are rejected on every rank") {
  if (world_size() < 2) return;
  const auto l = test_layout(2000);
  using sync_t = pactrain::sync<mpi_communicator, ternary_codec>;
  const std::string msg = error_of([&] {
    sync_t s{mpi_communicator{MPI_COMM_WORLD}, l,
             ternary_codec{{.seed = world_rank() == 1 ? 2u : 1u}}};
  });
  CHECK(msg.find("codec settings differ across ranks") != std::string::npos);
  // A configuration that could carry is refused on every rank with the same message.
  const std::string carry = error_of([&] {
    sync_t s{mpi_communicator{MPI_COMM_WORLD}, l, ternary_codec{{.lane_bits = 2}}};
  });
  CHECK(carry.find("would carry") != std::string::npos);
}

TEST_CASE("a codec engine mixes plain and coded buckets, each exact against its reference") {
  const auto l = test_layout(2000);
  const std::size_t nb = l.buckets().size();
  const bucket_strategy cycle[] = {bucket_strategy::sparse_plain, bucket_strategy::sparse,
                                   bucket_strategy::dense_plain, bucket_strategy::dense};
  for (auto source : {scale_source::current_max, scale_source::previous_max}) {
    CAPTURE(to_string(source));
    const ternary_codec codec{{.seed = 5, .scale = source}};
    pactrain::sync<mpi_communicator, error_feedback<ternary_codec>> s{
        mpi_communicator{MPI_COMM_WORLD}, l, codec};
    for (double d : {0.0, 0.3, 1.0}) {
      CAPTURE(d);
      for (std::size_t shift = 0; shift < 4; ++shift) {
        std::vector<bucket_strategy> st(nb);
        for (std::size_t b = 0; b < nb; ++b) st[b] = cycle[(b + shift) % 4];
        const auto masks = test::masks_for<bitmap_mask>(l, d, 300 + shift);
        s.set_masks(masks);
        s.set_strategies(st);
        ternary_reference ref{l, codec, true, world_size(), {}, {}};
        check_steps(s, ref, masks, st, 90);
        // Plain buckets send value_type entries, coded ones wire words.
        std::size_t bytes = 0;
        std::size_t coded_with_input = 0;
        for (std::size_t b = 0; b < nb; ++b) {
          bytes += s.wire_bytes(b, st[b]);
          if (!is_plain(st[b])) {
            coded_with_input += (is_sparse(st[b]) ? s.payload_size(b) : l.buckets()[b].size) != 0;
            CHECK(s.wire_bytes(b, st[b]) == s.wire_size(b) * 4);
          } else {
            CHECK(s.wire_bytes(b, st[b]) == s.wire_size(b) * sizeof(float));
          }
        }
        const std::size_t scale_words = coded_with_input == 0                  ? 0
                                        : source == scale_source::previous_max ? nb
                                                                               : coded_with_input;
        CHECK(s.stats().bytes_sent == bytes + 8 * scale_words);
      }
    }
  }
}

// The three-phase step against allreduce(): buckets handed over one by one, in reverse order
// (as backward produces them), some left for finish_step, give the same bits.
template <class Codec>
void check_submission_orders(Codec codec) {
  const auto l = test_layout(700);
  const std::size_t nb = l.buckets().size();
  using sync_t = pactrain::sync<mpi_communicator, Codec>;
  sync_t whole{mpi_communicator{MPI_COMM_WORLD}, l, codec};
  sync_t parts{mpi_communicator{MPI_COMM_WORLD}, l, codec};
  for (double d : {0.0, 0.2, 1.0}) {
    CAPTURE(d);
    const auto masks = test::masks_for<bitmap_mask>(l, d, 400);
    std::vector<bucket_strategy> st(nb, bucket_strategy::sparse);
    for (std::size_t b = 1; b < nb; b += 3) st[b] = bucket_strategy::dense;
    for (auto* s : {&whole, &parts}) {
      s->set_masks(masks);
      s->set_strategies(st);
    }
    for (int k = 0; k < 4; ++k) {
      CAPTURE(k);
      auto g =
          test::values<float>(l.total_size(), 500 + static_cast<std::uint64_t>(k), world_rank());
      auto h = g;
      whole.allreduce(std::span<float>(g));
      parts.begin_step(std::span<float>(h));
      CHECK(parts.step_open());
      // Reverse order; every third bucket is left to finish_step.
      for (std::size_t b = nb; b-- > 0;) {
        if (b % 3 != static_cast<std::size_t>(k) % 3) parts.submit_bucket(b);
      }
      parts.finish_step();
      CHECK_FALSE(parts.step_open());
      CHECK(bad_entries(g, h) == 0);
      CHECK(parts.stats().steps == whole.stats().steps);
      CHECK(parts.step() == whole.step());
    }
  }
}

TEST_CASE("buckets submitted one by one give the bits of allreduce") {
  check_submission_orders<identity_codec<float>>({});
  check_submission_orders<fp16_codec>({});
  for (auto source : {scale_source::current_max, scale_source::previous_max}) {
    CAPTURE(to_string(source));
    check_submission_orders<error_feedback<ternary_codec>>(
        ternary_codec{{.seed = 8, .scale = source}});
  }
}
