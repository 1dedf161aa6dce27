// Codecs on their own (round trips, ternary lanes emulated exactly for P = 1..64, refusal
// of lanes that could carry, unbiased stochastic rounding) and in the sync engine on one
// rank (results, bytes on the wire, error feedback).
#include <doctest/doctest.h>

#include <pactrain/pactrain.hpp>

#include "common/test_data.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

using namespace pactrain;

namespace {

// What an integer SUM allreduce does to P wires: elementwise uint32 sums (mod 2^32).
std::vector<std::uint32_t> lane_sum(const std::vector<std::vector<std::uint32_t>>& wires) {
  std::vector<std::uint32_t> s(wires.empty() ? 0 : wires[0].size(), 0);
  for (const auto& w : wires) {
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += w[i];
  }
  return s;
}

std::vector<std::uint32_t> encode(const ternary_codec& c, const std::vector<float>& g,
                                  const codec_context& ctx) {
  std::vector<std::uint32_t> w(c.wire_size(g.size(), ctx.size));
  c.encode(std::span<const float>(g), std::span<std::uint32_t>(w), ctx);
  return w;
}

std::vector<float> decode(const ternary_codec& c, const std::vector<std::uint32_t>& w,
                          std::size_t n, const codec_context& ctx) {
  std::vector<float> out(n);
  c.decode(std::span<const std::uint32_t>(w), std::span<float>(out), ctx);
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("identity, fp16 and bf16 codecs round-trip representable values", K,
                   identity_codec<float>, fp16_codec, bf16_codec) {
  const std::vector<float> g{0.0f, -0.0f, 1.0f, -2.5f, 0.125f, 96.0f, -0.75f};
  const K k{};
  for (int p : {1, 3, 4}) {
    codec_context ctx{.rank = 0, .size = p};
    std::vector<typename K::wire_type> w(k.wire_size(g.size(), p));
    CHECK(w.size() == g.size());
    k.encode(std::span<const float>(g), std::span<typename K::wire_type>(w), ctx);
    std::vector<float> local(g.size());
    std::vector<float> mean(g.size());
    k.decode_local(std::span<const typename K::wire_type>(w), std::span<float>(local), ctx);
    k.decode(std::span<const typename K::wire_type>(w), std::span<float>(mean), ctx);
    for (std::size_t i = 0; i < g.size(); ++i) {
      CHECK(std::bit_cast<std::uint32_t>(local[i]) == std::bit_cast<std::uint32_t>(g[i]));
      CHECK(mean[i] == g[i] * (1.0f / static_cast<float>(p)));
    }
  }
}

TEST_CASE("fp16 and bf16 codecs round to nearest even on encode") {
  const std::vector<float> g{1.0f / 3.0f, 1e-8f, 70000.0f, -1e-3f};
  std::vector<half> h(g.size());
  fp16_codec::encode(std::span<const float>(g), std::span<half>(h), {});
  std::vector<bfloat16> b(g.size());
  bf16_codec::encode(std::span<const float>(g), std::span<bfloat16>(b), {});
  for (std::size_t i = 0; i < g.size(); ++i) {
    CHECK(h[i].bits() == half(g[i]).bits());
    CHECK(b[i].bits() == bfloat16(g[i]).bits());
  }
  CHECK(h[2].bits() == 0x7c00);  // beyond the half range: inf
}

TEST_CASE("codec spans of the wrong size are rejected") {
  std::vector<float> g(10, 1.0f);
  std::vector<half> h(9);
  CHECK_THROWS_WITH_AS(fp16_codec::encode(std::span<const float>(g), std::span<half>(h), {}),
                       doctest::Contains("10 values need 10 wire elements, 9 given"), error);
  const ternary_codec t;
  std::vector<std::uint32_t> w(3);  // P = 4: 8 lanes per word, 10 values need 2 words
  CHECK_THROWS_WITH_AS(
      t.encode(std::span<const float>(g), std::span<std::uint32_t>(w), {.size = 4}),
      doctest::Contains("need 2 wire elements, 3 given"), error);
  CHECK_THROWS_WITH_AS(
      t.decode(std::span<const std::uint32_t>(w), std::span<float>(g), {.size = 4}),
      doctest::Contains("need 2 wire elements"), error);
  CHECK(std::all_of(g.begin(), g.end(), [](float v) { return v == 1.0f; }));  // untouched
}

TEST_CASE("ternary lane widths follow ceil(log2(2P + 1))") {
  const ternary_codec c;
  struct row {
    int p;
    unsigned bits;
    unsigned lanes;
  };
  for (const row r : {row{1, 2, 16}, row{2, 3, 10}, row{3, 3, 10}, row{4, 4, 8}, row{7, 4, 8},
                      row{8, 5, 6}, row{15, 5, 6}, row{16, 6, 5}, row{31, 6, 5}, row{32, 7, 4},
                      row{63, 7, 4}, row{64, 8, 4}, row{1 << 30, 32, 1}}) {
    CAPTURE(r.p);
    CHECK(ternary_codec::required_lane_bits(r.p) == r.bits);
    CHECK(c.lane_bits(r.p) == r.bits);
    CHECK(c.lanes_per_word(r.p) == r.lanes);
  }
  CHECK(c.wire_size(0, 4) == 0);
  CHECK(c.wire_size(1, 4) == 1);
  CHECK(c.wire_size(8, 4) == 1);
  CHECK(c.wire_size(9, 4) == 2);
  CHECK(c.wire_size(1000, 64) == 250);
  CHECK(ternary_codec{{.lane_bits = 8}}.lanes_per_word(4) == 4);  // wider than needed: fine
}

TEST_CASE(
    "ternary lanes never carry: P = 1..64, all-max, all-min and mixed lanes, decoded exactly") {
  const ternary_codec c{{.seed = 5}};
  for (int p = 1; p <= 64; ++p) {
    CAPTURE(p);
    const std::size_t l = c.lanes_per_word(p);
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, l - 1, l, l + 1, 3 * l + 2, std::size_t{200}}) {
      CAPTURE(n);
      // With s = P, g = +-P rounds to +-1 and g = 0 to 0 whatever the random numbers, so the
      // lane sums are known exactly, and decode's (lane - P) * (s / P) is (lane - P) exactly.
      const auto s = static_cast<float>(p);
      for (int pattern = 0; pattern < 3; ++pattern) {
        std::vector<std::vector<std::uint32_t>> wires;
        std::vector<float> want(n, 0.0f);
        for (int r = 0; r < p; ++r) {
          std::vector<float> g(n);
          for (std::size_t k = 0; k < n; ++k) {
            const int t = pattern == 0 ? 1 : pattern == 1 ? -1 : static_cast<int>((k + r) % 3) - 1;
            g[k] = static_cast<float>(t) * s;
            want[k] += static_cast<float>(t);
          }
          wires.push_back(encode(c, g, {.rank = r, .size = p, .step = 7, .scale = s}));
        }
        const auto sum = lane_sum(wires);
        CHECK(sum.size() == c.wire_size(n, p));
        const auto got = decode(c, sum, n, {.rank = 0, .size = p, .step = 7, .scale = s});
        std::size_t bad = 0;
        for (std::size_t k = 0; k < n; ++k) bad += got[k] != want[k];
        CHECK(bad == 0);
        // All-max lanes: every used lane holds exactly 2P; no bit leaked into a neighbour.
        if (pattern == 0 && n > 0) {
          const unsigned b = c.lane_bits(p);
          const std::size_t words = sum.size();
          for (std::size_t j = 0; j * words < n; ++j) {
            const std::size_t used = std::min(words, n - j * words);
            for (std::size_t w = 0; w < used; ++w) {
              CHECK(((sum[w] >> (j * b)) & ((b == 32 ? 0u : 1u << b) - 1u)) ==
                    static_cast<std::uint32_t>(2 * p));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("ternary encode_residual matches encode, decode_local and a subtraction bit for bit") {
  const ternary_codec c{{.seed = 11}};
  for (const std::size_t n : test::sizes) {
    for (const float s : {0.75f, 0.0f, INFINITY, NAN, -1.0f}) {
      CAPTURE(n);
      CAPTURE(s);
      std::vector<float> g(n);
      for (std::size_t k = 0; k < n; ++k) {
        g[k] = static_cast<float>(static_cast<int>(test::hash3(n, k, 3) % 2001) - 1000) / 997.0f;
      }
      if (n > 2) g[1] = NAN;  // passed over by the rounding: t = 0
      const codec_context ctx{.rank = 2, .size = 4, .step = 9, .bucket = 1, .scale = s};
      const auto want_wire = encode(c, g, ctx);
      std::vector<float> want(n);
      c.decode_local(std::span<const std::uint32_t>(want_wire), std::span<float>(want), ctx);
      for (std::size_t k = 0; k < n; ++k) want[k] = g[k] - want[k];

      std::vector<std::uint32_t> wire(want_wire.size(), 0xdeadbeefu);
      std::vector<float> r(n, -7.0f);
      c.encode_residual(std::span<const float>(g), std::span<std::uint32_t>(wire),
                        std::span<float>(r), ctx);
      CHECK(wire == want_wire);
      std::size_t bad = 0;
      for (std::size_t k = 0; k < n; ++k) {
        bad += std::bit_cast<std::uint32_t>(r[k]) != std::bit_cast<std::uint32_t>(want[k]);
      }
      CHECK(bad == 0);
    }
  }
  // A residual buffer of the wrong size is refused before anything is written.
  std::vector<float> g(10, 1.0f);
  std::vector<float> r(9, 5.0f);
  std::vector<std::uint32_t> wire(c.wire_size(10, 4), 3u);
  CHECK_THROWS_WITH_AS(c.encode_residual(std::span<const float>(g), std::span<std::uint32_t>(wire),
                                         std::span<float>(r), {.size = 4, .scale = 1.0f}),
                       doctest::Contains("10 values but 9 residuals"), error);
  CHECK(wire == std::vector<std::uint32_t>(wire.size(), 3u));
  CHECK(r == std::vector<float>(9, 5.0f));
}

TEST_CASE("encode_with_feedback equals adding the residual, then encode_residual, bit for bit") {
  const ternary_codec t{{.seed = 5}};
  const fp16_codec h;  // no fused form: the sum goes through the payload
  using test::same_bits;
  const auto same_half = [](half a, half b) { return a.bits() == b.bits(); };
  for (const std::size_t n : test::sizes) {
    for (const float s : {0.75f, 0.0f, INFINITY, NAN}) {
      CAPTURE(n);
      CAPTURE(s);
      std::vector<float> g(n), r0(n);
      for (std::size_t k = 0; k < n; ++k) {
        g[k] = static_cast<float>(static_cast<int>(test::hash3(n, k, 4) % 2001) - 1000) / 997.0f;
        r0[k] = static_cast<float>(static_cast<int>(test::hash3(n, k, 5) % 401) - 200) / 1009.0f;
      }
      if (n > 2) r0[2] = NAN;  // x is NaN: t = 0, and the residual stays NaN either way
      const codec_context ctx{.rank = 1, .size = 4, .step = 3, .bucket = 2, .scale = s};
      // Reference: x = g + r written out, then encode_residual.
      std::vector<float> x(n), want_r(n);
      for (std::size_t k = 0; k < n; ++k) x[k] = g[k] + r0[k];
      std::vector<std::uint32_t> want_wire(t.wire_size(n, 4));
      t.encode_residual(std::span<const float>(x), std::span<std::uint32_t>(want_wire),
                        std::span<float>(want_r), ctx);

      std::vector<float> in = g, r = r0;
      std::vector<std::uint32_t> wire(want_wire.size(), 0xdeadbeefu);
      encode_with_feedback(t, std::span<float>(in), std::span<std::uint32_t>(wire),
                           std::span<float>(r), ctx);
      CHECK(wire == want_wire);
      CHECK(same_bits(r, want_r));
      CHECK(same_bits(in, g));  // the fused pass leaves the payload alone

      // fp16 takes the generic path: the payload holds x afterwards.
      std::vector<half> hwant(n), hwire(n, half(-3.0f));
      std::vector<float> hr_want(n), hin = g, hr = r0;
      encode_with_residual(h, std::span<const float>(x), std::span<half>(hwant),
                           std::span<float>(hr_want), ctx);
      encode_with_feedback(h, std::span<float>(hin), std::span<half>(hwire), std::span<float>(hr),
                           ctx);
      CHECK(std::equal(hwire.begin(), hwire.end(), hwant.begin(), hwant.end(), same_half));
      CHECK(same_bits(hr, hr_want));
      CHECK(same_bits(hin, x));
    }
  }
  // Residuals of the wrong size are refused before anything is written, on both paths.
  std::vector<float> g(10, 1.0f), r(9, 5.0f);
  std::vector<std::uint32_t> wire(t.wire_size(10, 4), 3u);
  CHECK_THROWS_WITH_AS(encode_with_feedback(t, std::span<float>(g), std::span<std::uint32_t>(wire),
                                            std::span<float>(r), {.size = 4, .scale = 1.0f}),
                       doctest::Contains("encode_feedback: 10 values but 9 residuals"), error);
  CHECK(wire == std::vector<std::uint32_t>(wire.size(), 3u));
  std::vector<half> hwire(10, half(3.0f));
  CHECK_THROWS_WITH_AS(encode_with_feedback(h, std::span<float>(g), std::span<half>(hwire),
                                            std::span<float>(r), {.size = 4, .scale = 1.0f}),
                       doctest::Contains("10 values but 9 residuals"), error);
  CHECK(g == std::vector<float>(10, 1.0f));
  CHECK(r == std::vector<float>(9, 5.0f));
  CHECK(std::all_of(hwire.begin(), hwire.end(), [&](half v) { return same_half(v, half(3.0f)); }));
}

TEST_CASE("ternary configurations whose lanes could carry are refused") {
  CHECK_THROWS_WITH_AS(ternary_codec{{.lane_bits = 33}}, doctest::Contains("does not fit"), error);
  CHECK_THROWS_WITH_AS(ternary_codec{{.lane_bits = 3}}.validate(4),
                       doctest::Contains("lanes of 3 bits would carry: 4 ranks sum to up to 8, "
                                         "which needs 4 bits"),
                       error);
  CHECK_THROWS_WITH_AS(ternary_codec{{.lane_bits = 1}}.validate(1),
                       doctest::Contains("would carry"), error);
  CHECK_THROWS_WITH_AS(ternary_codec{}.validate(0), doctest::Contains("at least one"), error);
  CHECK_NOTHROW(ternary_codec{{.lane_bits = 4}}.validate(7));
  CHECK_THROWS_AS(ternary_codec{{.lane_bits = 4}}.validate(8), error);
  // The engine refuses at construction (P = 1 needs 2-bit lanes).
  using sync_t = pactrain::sync<loopback_communicator, ternary_codec>;
  CHECK_THROWS_WITH_AS(
      (sync_t{loopback_communicator{}, test::small_layout(), ternary_codec{{.lane_bits = 1}}}),
      doctest::Contains("would carry"), error);
}

TEST_CASE("stochastic rounding is unbiased: means of 1e5 draws lie within 4 sigma") {
  // E[s t] = g and Var[s t] = s |g| - g^2 for |g| <= s. Over N independent draws the mean's
  // standard deviation is sqrt((s |g| - g^2) / N); the check allows 4 of them (a fixed seed,
  // so the outcome is deterministic; a failure means a bias, not bad luck).
  const ternary_codec c{{.seed = 12345}};
  const float s = 2.0f;
  constexpr std::size_t n = 100000;
  for (float g : {-1.8f, -0.6f, 0.02f, 0.5f, 1.0f, 1.54f}) {
    CAPTURE(g);
    const double sigma = std::sqrt((s * std::fabs(g) - g * g) / n);
    // Across entries of one encoding.
    const std::vector<float> in(n, g);
    const codec_context ctx{.rank = 2, .size = 4, .step = 3, .bucket = 1, .scale = s};
    const auto w = encode(c, in, ctx);
    std::vector<float> local(n);
    c.decode_local(std::span<const std::uint32_t>(w), std::span<float>(local), ctx);
    double sum = 0;
    for (float v : local) {
      CHECK_UNARY(v == 0.0f || v == s || v == -s);
      sum += v;
    }
    CHECK(std::fabs(sum / n - g) < 4 * sigma);
    // Across steps for one entry.
    double sum_steps = 0;
    const std::vector<float> one{g};
    for (std::uint64_t step = 0; step < n; ++step) {
      const codec_context cs{.rank = 1, .size = 2, .step = step, .scale = s};
      std::vector<float> v(1);
      c.decode_local(std::span<const std::uint32_t>(encode(c, one, cs)), std::span<float>(v), cs);
      sum_steps += v[0];
    }
    CHECK(std::fabs(sum_steps / n - g) < 4 * sigma);
  }
  // Beyond the scale values clip to +-s; a zero scale sends zeros.
  const std::vector<float> big{5.0f, -3.0f, 0.0f};
  const codec_context ctx{.size = 3, .scale = 1.0f};
  std::vector<float> out(3);
  c.decode_local(std::span<const std::uint32_t>(encode(c, big, ctx)), std::span<float>(out), ctx);
  CHECK(out == std::vector<float>{1.0f, -1.0f, 0.0f});
  const codec_context zero{.size = 3, .scale = 0.0f};
  c.decode_local(std::span<const std::uint32_t>(encode(c, big, zero)), std::span<float>(out), zero);
  CHECK(out == std::vector<float>{0.0f, 0.0f, 0.0f});
}

TEST_CASE("ternary random numbers depend on seed, rank, step, bucket and index only") {
  const ternary_codec c{{.seed = 9}};
  const auto g = test::values<float>(1000, 1);
  const codec_context a{.rank = 1, .size = 4, .step = 2, .bucket = 3, .scale = 125.0f};
  CHECK(encode(c, g, a) == encode(c, g, a));
  CHECK(encode(ternary_codec{{.seed = 9}}, g, a) == encode(c, g, a));
  for (codec_context b :
       {codec_context{.rank = 2, .size = 4, .step = 2, .bucket = 3, .scale = 125},
        codec_context{.rank = 1, .size = 4, .step = 3, .bucket = 3, .scale = 125},
        codec_context{.rank = 1, .size = 4, .step = 2, .bucket = 4, .scale = 125}}) {
    CHECK(encode(c, g, a) != encode(c, g, b));
  }
  CHECK(encode(ternary_codec{{.seed = 10}}, g, a) != encode(c, g, a));
  // An entry's random number does not depend on the length of the span around it.
  std::vector<float> prefix(g.begin(), g.begin() + 100);
  const auto w = encode(c, prefix, a);
  std::vector<float> out(100);
  c.decode_local(std::span<const std::uint32_t>(w), std::span<float>(out), a);
  const auto w_all = encode(c, g, a);
  std::vector<float> out_all(1000);
  c.decode_local(std::span<const std::uint32_t>(w_all), std::span<float>(out_all), a);
  CHECK(std::equal(out.begin(), out.end(), out_all.begin()));
}

TEST_CASE_TEMPLATE("one rank: fp16 and bf16 syncs return the masked gradient", K, fp16_codec,
                   bf16_codec) {
  const auto l = test::small_layout();
  using sync_t = pactrain::sync<loopback_communicator, K>;
  sync_t s{loopback_communicator{}, l};
  for (double d : test::densities) {
    CAPTURE(d);
    const auto masks = test::masks_for<bitmap_mask>(l, d, 17);
    s.set_masks(masks);
    for (auto strategy : {bucket_strategy::sparse, bucket_strategy::dense}) {
      s.set_strategies(std::vector<bucket_strategy>(l.buckets().size(), strategy));
      auto g = test::values<float>(l.total_size(), 3);
      for (auto& v : g) v = static_cast<float>(typename K::wire_type(v));  // representable
      const auto want = test::masked(l, masks, g);
      s.allreduce(std::span<float>(g));
      CHECK(g == want);
      std::size_t sent = 0;
      for (std::size_t b = 0; b < l.buckets().size(); ++b) sent += s.wire_size(b) * 2;
      std::size_t kept = 0;
      for (const auto& m : masks) kept += m.count();
      CHECK(s.stats().bytes_sent == sent);
      CHECK(sent == (strategy == bucket_strategy::sparse ? kept : l.total_size()) * 2);
    }
  }
}

TEST_CASE("one rank: ternary sync sends t * s at kept entries and +0 elsewhere") {
  const auto l = test::small_layout();
  using sync_t = pactrain::sync<loopback_communicator, ternary_codec>;
  // One scale per bucket (either source), and one per block of 16 codec inputs.
  for (const std::size_t block : {std::size_t{0}, std::size_t{16}}) {
    for (auto source : {scale_source::current_max, scale_source::previous_max}) {
      CAPTURE(block);
      sync_t s{loopback_communicator{}, l,
               ternary_codec{{.seed = 3, .scale = source, .scale_block = block}}};
      for (double d : test::densities) {
        CAPTURE(d);
        const auto masks = test::masks_for<bitmap_mask>(l, d, 21);
        s.set_masks(masks);
        for (auto strategy : {bucket_strategy::sparse, bucket_strategy::dense}) {
          s.set_strategies(std::vector<bucket_strategy>(l.buckets().size(), strategy));
          for (int step = 0; step < 2; ++step) {
            auto g = test::values<float>(l.total_size(), 5 + step);
            const auto m = test::masked(l, masks, g);
            s.allreduce(std::span<float>(g));
            std::size_t bad = 0;
            std::size_t scale_words = 0;  // current_max: the scales of the buckets with input
            std::size_t all_words = 0;    // previous_max: every bucket's scales
            for (std::size_t b = 0; b < l.buckets().size(); ++b) {
              const auto& bk = l.buckets()[b];
              // The bucket's codec input: kept entries in order (sparse), or all (dense); each
              // block of it has its max |g| as scale (the whole input is one block with block 0).
              std::vector<std::size_t> at;
              for (std::size_t i = bk.offset; i < bk.offset + bk.size; ++i) {
                if (strategy == bucket_strategy::dense || m[i] != 0.0f) at.push_back(i);
              }
              const std::size_t n = block == 0 ? std::max<std::size_t>(at.size(), 1) : block;
              scale_words += (at.size() + n - 1) / n;
              all_words += std::max<std::size_t>((at.size() + n - 1) / n, 1);
              for (std::size_t k = 0; k < at.size(); ++k) {
                float mx = 0;
                for (std::size_t j = k / n * n; j < std::min(at.size(), k / n * n + n); ++j)
                  mx = std::max(mx, std::fabs(m[at[j]]));
                const float v = g[at[k]];
                if (source == scale_source::current_max)
                  bad += !(v == 0.0f || v == mx * (m[at[k]] < 0 ? -1.0f : 1.0f));
              }
              for (std::size_t i = bk.offset; i < bk.offset + bk.size; ++i) {
                if (m[i] == 0.0f) bad += std::bit_cast<std::uint32_t>(g[i]) != 0;  // +0
              }
            }
            CHECK(bad == 0);
            std::size_t words = 0;
            for (std::size_t b = 0; b < l.buckets().size(); ++b) words += s.wire_size(b);
            std::size_t kept = 0;
            for (const auto& mk : masks) kept += mk.count();
            const std::size_t entries = strategy == bucket_strategy::sparse ? kept : l.total_size();
            CHECK(words ==
                  (strategy == bucket_strategy::sparse
                       ? (s.payload_size(0) + 15) / 16 + (s.payload_size(1) + 15) / 16 +
                             (s.payload_size(2) + 15) / 16
                       : (l.buckets()[0].size + 15) / 16 + (l.buckets()[1].size + 15) / 16 +
                             (l.buckets()[2].size + 15) / 16));
            // Scales: a word per scale of each bucket with input, reduced before encoding;
            // previous_max reduces every bucket's word alongside the data once it has last
            // step's scales.
            const bool reused = source == scale_source::previous_max && step == 1;
            const std::size_t scale_bytes =
                entries == 0 ? 0 : 8 * (reused ? all_words : scale_words);
            CHECK(s.stats().bytes_sent == words * 4 + scale_bytes);
          }
        }
      }
      CHECK(s.step() == 5 * 2 * 2);
    }
  }
}

TEST_CASE("ternary scale blocks: one scale per block of the codec input") {
  const ternary_codec k{{.seed = 9, .scale_block = 4}};
  CHECK(ternary_codec{}.scale_count(1000) == 1);
  for (const auto& [n, want] : std::vector<std::pair<std::size_t, std::size_t>>{
           {0, 1}, {1, 1}, {4, 1}, {5, 2}, {8, 2}, {9, 3}}) {
    CHECK(k.scale_count(n) == want);
  }
  const std::vector<float> g = {1, -3, 2, 0.5f, 8, -1, 0, 0, -0.25f};
  std::vector<float> s(3);
  k.local_scales(g, s);
  CHECK(s == std::vector<float>{3, 8, 0.25f});
  std::vector<float> one(1);
  ternary_codec{}.local_scales(g, one);
  CHECK(one[0] == 8.0f);
  std::vector<float> bad = g;
  bad[5] = std::numeric_limits<float>::quiet_NaN();
  k.local_scales(bad, s);
  CHECK((s[0] == 3.0f && std::isnan(s[1]) && s[2] == 0.25f));
  std::vector<float> two(2);
  CHECK_THROWS_WITH_AS(k.local_scales(g, two), doctest::Contains("9 values have 3 scales, 2 given"),
                       error);
  CHECK(k.digest() != ternary_codec{{.seed = 9}}.digest());

  // The same scale in every block encodes as one scale for the bucket, bit for bit; the
  // blocks' own scales decode each entry to 0 or its block's scale.
  const auto values = test::values<float>(1000, 4);
  const ternary_codec blocks{{.seed = 9, .scale_block = 100}};
  const ternary_codec whole{{.seed = 9}};
  const std::vector<float> same(10, 3.5f);
  const codec_context c1{.rank = 1, .size = 4, .step = 2, .bucket = 3, .scale = 3.5f};
  codec_context cb = c1;
  cb.scales = same;
  std::vector<std::uint32_t> w1(whole.wire_size(values.size(), 4));
  std::vector<std::uint32_t> wb(w1.size());
  whole.encode(values, w1, c1);
  blocks.encode(values, wb, cb);
  CHECK(w1 == wb);
  std::vector<float> scales(blocks.scale_count(values.size()));
  blocks.local_scales(values, scales);
  cb.scales = scales;
  std::vector<float> residual(values.size());
  blocks.encode_residual(values, wb, residual, cb);
  std::vector<float> out(values.size());
  blocks.decode_local(wb, out, cb);
  std::size_t wrong = 0;
  std::size_t hits = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float si = scales[i / 100];
    wrong += !(out[i] == 0.0f || std::fabs(out[i]) == si);
    wrong += residual[i] != values[i] - out[i];
    hits += out[i] != 0.0f;
  }
  CHECK(wrong == 0);
  CHECK(hits > 0);
  // Scales of the wrong count are refused.
  cb.scales = std::span<const float>(scales).first(3);
  CHECK_THROWS_WITH_AS(blocks.encode(values, wb, cb),
                       doctest::Contains("1000 values need 10 scales, 3 given"), error);
}

TEST_CASE("error feedback shrinks the accumulated error of a repeated gradient") {
  param_layout l;
  l.add("w", 40, 50);
  const auto masks = std::vector<bitmap_mask>{test::random_mask(2000, 0.5, 4)};
  std::vector<float> g0(2000);
  for (std::size_t i = 0; i < g0.size(); ++i) {
    g0[i] = static_cast<float>(test::mix(i) % 2001) / 1000.0f - 1.0f;
  }
  g0 = test::masked(l, masks, g0);
  constexpr int steps = 200;
  // |sum over steps of the outputs - steps * g|, the error a training run accumulates.
  const auto accumulated_error = [&](auto& s) {
    s.set_masks(masks);
    std::vector<double> acc(g0.size(), 0.0);
    for (int k = 0; k < steps; ++k) {
      auto g = g0;
      s.allreduce(std::span<float>(g));
      for (std::size_t i = 0; i < g.size(); ++i) acc[i] += g[i];
    }
    double e = 0;
    for (std::size_t i = 0; i < g0.size(); ++i) {
      const double d = acc[i] - steps * static_cast<double>(g0[i]);
      e += d * d;
    }
    return std::sqrt(e);
  };
  using plain_t = pactrain::sync<loopback_communicator, ternary_codec>;
  using fb_t = pactrain::sync<loopback_communicator, error_feedback<ternary_codec>>;
  for (auto source : {scale_source::current_max, scale_source::previous_max}) {
    const ternary_codec c{{.seed = 8, .scale = source}};
    plain_t plain{loopback_communicator{}, l, c};
    fb_t fb{loopback_communicator{}, l, c};
    const double e_plain = accumulated_error(plain);
    const double e_fb = accumulated_error(fb);
    CAPTURE(e_plain);
    CAPTURE(e_fb);
    // Without feedback the error grows like sqrt(steps); with it, it is the last residual.
    CHECK(e_fb < 0.2 * e_plain);
    double r2 = 0;
    for (float r : fb.residuals()) r2 += static_cast<double>(r) * r;
    CHECK(std::fabs(std::sqrt(r2) - e_fb) < 1e-3 * e_plain);
    CHECK(plain.residuals().empty());
    fb.set_masks(masks);  // a commit resets the residuals
    CHECK(std::all_of(fb.residuals().begin(), fb.residuals().end(),
                      [](float r) { return r == 0.0f; }));
  }
  // fp16: a value half cannot hold, repeated; feedback carries the rounding error along.
  using fp16_plain = pactrain::sync<loopback_communicator, fp16_codec>;
  using fp16_fb = pactrain::sync<loopback_communicator, error_feedback<fp16_codec>>;
  fp16_plain hp{loopback_communicator{}, l};
  fp16_fb hf{loopback_communicator{}, l};
  for (auto& v : g0) v = v * 1e-3f + 1e-7f;
  g0 = test::masked(l, masks, g0);
  const double e_hp = accumulated_error(hp);
  const double e_hf = accumulated_error(hf);
  CAPTURE(e_hp);
  CAPTURE(e_hf);
  CHECK(e_hf < 0.1 * e_hp);
}

TEST_CASE("feedback and step counters of the identity codec") {
  const auto l = test::small_layout();
  pactrain::sync<loopback_communicator, error_feedback<identity_codec<float>>> s{
      loopback_communicator{}, l};
  auto g = test::values<float>(l.total_size(), 1);
  const auto want = g;
  s.allreduce(std::span<float>(g));
  CHECK(g == want);
  CHECK(s.residuals().empty());  // identity delivers everything: feedback is off
  CHECK(s.step() == 1);
  s.set_step(41);
  s.allreduce(std::span<float>(g));
  CHECK(s.step() == 42);
  CHECK(s.stats().bytes_sent == l.total_size() * sizeof(float));
}

TEST_CASE("codecs over tensors in separate buffers (the dense workspace path)") {
  const auto l = test::small_layout();
  const auto masks = test::masks_for<bitmap_mask>(l, 0.5, 31);
  const auto flat = test::values<float>(l.total_size(), 9);
  // One buffer per tensor, so no bucket is contiguous.
  const auto split = [&](const std::vector<float>& g) {
    std::vector<std::vector<float>> b;
    for (const auto& t : l.tensors()) {
      b.emplace_back(g.begin() + static_cast<std::ptrdiff_t>(t.offset),
                     g.begin() + static_cast<std::ptrdiff_t>(t.offset + t.size));
    }
    return b;
  };
  const auto views_of = [](std::vector<std::vector<float>>& b) {
    std::vector<std::span<float>> v;
    for (auto& x : b) v.emplace_back(x);
    return v;
  };
  pactrain::sync<loopback_communicator, fp16_codec> h{loopback_communicator{}, l};
  pactrain::sync<loopback_communicator, error_feedback<ternary_codec>> t{loopback_communicator{},
                                                                         l};
  h.set_masks(masks);
  t.set_masks(masks);
  const auto want = test::masked(l, masks, flat);  // dyadic: representable in half
  for (auto strategy : {bucket_strategy::sparse, bucket_strategy::dense}) {
    h.set_strategies(std::vector<bucket_strategy>(l.buckets().size(), strategy));
    t.set_strategies(std::vector<bucket_strategy>(l.buckets().size(), strategy));
    auto bh = split(flat);
    auto vh = views_of(bh);
    h.allreduce(std::span<const std::span<float>>(vh));
    CHECK(bh == split(want));
    for (int step = 0; step < 3; ++step) {
      auto bt = split(flat);
      auto vt = views_of(bt);
      t.allreduce(std::span<const std::span<float>>(vt));
      const auto w = split(want);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < bt.size(); ++i) {
        for (std::size_t j = 0; j < bt[i].size(); ++j) {
          // Pruned: +0; kept: 0 or +-s (s = 125 at most; residuals make |g'| exceed it).
          bad += w[i][j] == 0.0f ? std::bit_cast<std::uint32_t>(bt[i][j]) != 0
                                 : std::fabs(bt[i][j]) > 125.0f;
        }
      }
      CHECK(bad == 0);
    }
  }
}
