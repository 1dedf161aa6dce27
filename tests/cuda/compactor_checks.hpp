// The device compactor's expectations, shared by every backend: compactor_cuda_test.cu runs
// them on the GPU (cuda_compactor and its striding loops), thrust_cpu_test.cpp on the CPU
// (thrust_compactor on Thrust's CPP system, label cuda-host). Each result equals host_compactor's
// bit for bit: every mask type, size, density, value type and scale of the host test, tensors at
// any offset in their buffer, 16-bit payloads with rounding (ties, subnormals, overflow), and bad
// sizes rejected before anything runs.
#pragma once

#include <doctest/doctest.h>

#include <pactrain/compactor.hpp>
#include <pactrain/cuda/detail/device_compactor.hpp>
#include <pactrain/half.hpp>
#include <pactrain/mask.hpp>

#include "common/device_array.hpp"
#include "common/test_data.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace pactrain::test {

template <class Compactor>
struct compactor_checks {
  using exec = typename Compactor::exec_type;
  template <class T>
  using array = basic_device_array<T, exec>;

  Compactor dc;

  // Device gather and scatter of `mask` equal the host compactor's, for every scale; `offset`
  // shifts the dense tensor by that many entries in its device buffer (full quads then start
  // at another entry, and the first and last quads are partial).
  template <class T, class Mask>
  void mask(const Mask& m, std::uint64_t seed, std::size_t offset = 0) const {
    const std::size_t n = m.size();
    const auto dense = values<T>(n, seed);
    const host_compactor hc;
    const auto hplan = hc.make_plan(m);
    std::vector<T> want_payload(hplan.count());
    hc.gather(hplan, std::span<const T>(dense), std::span<T>(want_payload));

    const auto plan = dc.make_plan(m);
    REQUIRE(plan.size() == n);
    REQUIRE(plan.count() == m.count());

    std::vector<T> padded(n + offset + 2, T(55));
    std::copy(dense.begin(), dense.end(), padded.begin() + static_cast<std::ptrdiff_t>(offset));
    array<T> d_dense(padded);
    const std::span<T> d_view = d_dense.span().subspan(offset, n);
    array<T> d_payload(plan.count());
    d_payload.fill_bytes(0x7f);
    dc.gather(plan, std::span<const T>(d_view), d_payload.span());
    CHECK(bad_entries(d_payload.host(), want_payload) == 0);

    for (const T scale : {T(1), T(0.25), T(-3)}) {
      CAPTURE(scale);
      std::vector<T> want_dense(n, T(77));
      hc.scatter(hplan, std::span<const T>(want_payload), std::span<T>(want_dense), scale);
      d_dense.fill_bytes(0x7f);  // every entry must be written
      dc.scatter(plan, d_payload.cspan(), d_view, scale);
      const auto got = d_dense.host();
      CHECK(bad_entries(std::vector<T>(got.begin() + static_cast<std::ptrdiff_t>(offset),
                                       got.begin() + static_cast<std::ptrdiff_t>(offset + n)),
                        want_dense) == 0);
      // Nothing written outside the view.
      std::vector<T> bytes7f(1);
      std::memset(static_cast<void*>(bytes7f.data()), 0x7f, sizeof(T));
      for (std::size_t i = 0; i < offset; ++i) CHECK(same_bits(std::vector<T>{got[i]}, bytes7f));
      for (std::size_t i = offset + n; i < got.size(); ++i) {
        CHECK(same_bits(std::vector<T>{got[i]}, bytes7f));
      }
    }
  }

  template <class T, class Mask>
  void all_offsets(const Mask& m, std::uint64_t seed) const {
    for (std::size_t offset : {0, 1, 2, 3}) {
      CAPTURE(offset);
      mask<T>(m, seed, offset);
    }
  }

  template <class T>
  void bitmap_and_index_masks() const {
    for (std::size_t n : sizes) {
      for (double d : densities) {
        CAPTURE(n);
        CAPTURE(d);
        const auto m = random_mask(n, d, n * 31 + 1);
        all_offsets<T>(m, 5);
        all_offsets<T>(mask_cast<index_mask>(m), 6);
      }
    }
  }

  template <class T>
  void block_masks() const {
    for (std::size_t n : sizes) {
      for (double d : densities) {
        CAPTURE(n);
        CAPTURE(d);
        all_offsets<T>(random_block_mask<3>(n, d, n + 2), 7);
        all_offsets<T>(random_block_mask<4>(n, d, n + 3), 7);
        all_offsets<T>(random_block_mask<48>(n, d, n + 4), 8);
      }
    }
  }

  void word_patterns() const {
    const auto m = word_pattern_mask();
    all_offsets<float>(m, 9);
    mask<float>(random_mask((std::size_t{1} << 20) + 77, 0.1, 4), 11, 1);
    mask<double>(mask_cast<index_mask>(random_mask((std::size_t{1} << 18) + 5, 0.01, 5)), 12);
  }

  // Floats that round in every way a 16-bit format can: ties to even (up and down), values
  // just off a tie, fp16 subnormals and underflow, overflow to infinity, NaN, signed zeros,
  // and values with many mantissa bits.
  static std::vector<float> rounding_values(std::size_t n) {
    const float specials[] = {
        1.0f + 0x1p-11f,             // fp16 tie, rounds down to even
        1.0f + 3 * 0x1p-11f,         // fp16 tie, rounds up to even
        1.0f + 0x1p-11f + 0x1p-20f,  // just above the tie
        1.0f + 0x1p-8f,              // bf16 tie, down
        1.0f + 3 * 0x1p-8f,          // bf16 tie, up
        0x1p-20f,                    // fp16 subnormal
        0x1p-26f,                    // fp16: underflows to 0
        -0x1.8p-25f,                 // fp16: rounds to the smallest subnormal, negative
        65520.0f,                    // fp16 overflow: inf
        -70000.0f,                   // fp16 overflow: -inf
        3.0e38f,                     // bf16 stays finite
        0.0f,
        -0.0f,
        __builtin_nanf(""),
    };
    std::vector<float> v(n);
    const auto spread = spread_values(n, 21, 22);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t k = i % 32;
      v[i] = k < std::size(specials) ? specials[k] : spread[i] * 1.7e3f;
    }
    return v;
  }

  // The fp16/bf16 codecs' encode fused into the gather and the decode into the scatter: each
  // stored value rounds like pactrain::half / pactrain::bfloat16 on the host.
  template <class W>
  void sixteen_bit_payloads() const {
    for (std::size_t n : {std::size_t{0}, std::size_t{65}, std::size_t{4099}}) {
      CAPTURE(n);
      const auto m = random_mask(n, 0.5, n);
      const auto dense = rounding_values(n);
      const auto hplan = host_compactor{}.make_plan(m);
      std::vector<float> kept(hplan.count());
      host_compactor{}.gather(hplan, std::span<const float>(dense), std::span<float>(kept));
      std::vector<std::uint16_t> want_bits;
      std::vector<float> widened;
      for (float v : kept) {
        want_bits.push_back(W(v).bits());  // the host codec's rounding
        widened.push_back(float(W(v)));
      }
      std::vector<float> want_dense(n);
      host_compactor{}.scatter(hplan, std::span<const float>(widened), std::span<float>(want_dense),
                               0.25f);
      for (const auto& plan : {dc.make_plan(m), dc.make_plan(mask_cast<index_mask>(m))}) {
        array<float> d_dense(dense);
        array<W> d_wire(plan.count());
        dc.gather(plan, d_dense.cspan(), d_wire.span());
        std::vector<std::uint16_t> got_bits;
        for (W w : d_wire.host()) got_bits.push_back(w.bits());
        CHECK(got_bits == want_bits);
        dc.scatter(plan, d_wire.cspan(), d_dense.span(), 0.25f);
        // A NaN times the scale is a NaN whose payload is the hardware's: compare NaN-ness.
        const auto got = d_dense.host();
        REQUIRE(got.size() == want_dense.size());
        std::size_t bad = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          bad += want_dense[i] != want_dense[i]
                     ? got[i] == got[i]
                     : std::memcmp(&got[i], &want_dense[i], sizeof(float)) != 0;
        }
        CHECK(bad == 0);
      }
    }
  }

  void word_ranks() const {
    for (std::size_t n : sizes) {
      const auto m = random_mask(n, 0.3, n);
      const auto plan = dc.make_plan(m);
      const auto ranks = plan.device_ranks();
      std::vector<std::uint64_t> got(ranks.size());
      exec{}.download(got.data(), ranks.data(), got.size(), {});
      const auto want = m.rank_prefix();
      CHECK(std::vector<std::uint64_t>(want.begin(), want.end() - 1) == got);
    }
  }

  // Wrong sizes, null buffers and overlap are refused before anything runs; empty plans take
  // empty (even null) buffers.
  void bad_sizes() const {
    const auto m = random_mask(100, 0.5, 3);
    const auto plan = dc.make_plan(m);
    const auto dense0 = values<float>(100, 1);
    const std::vector<float> payload0(plan.count(), 5.0f);
    array<float> dense(dense0);
    array<float> payload(payload0);
    auto untouched = [&] {
      CHECK(dense.host() == dense0);
      CHECK(payload.host() == payload0);
    };
    array<float> short_dense(99);
    CHECK_THROWS_WITH_AS(dc.gather(plan, short_dense.cspan(), payload.span()),
                         doctest::Contains("dense buffer has 99 entries, the plan 100"), error);
    untouched();
    CHECK_THROWS_WITH_AS(dc.gather(plan, dense.cspan(), payload.span().first(3)),
                         doctest::Contains("payload buffer has 3 entries"), error);
    untouched();
    CHECK_THROWS_WITH_AS(dc.scatter(plan, payload.cspan().first(3), dense.span(), 1.0f),
                         doctest::Contains("payload buffer has 3 entries"), error);
    untouched();
    CHECK_THROWS_WITH_AS(
        dc.gather(plan, std::span<const float>(static_cast<const float*>(nullptr), 100),
                  payload.span()),
        doctest::Contains("null dense buffer"), error);
    CHECK_THROWS_WITH_AS(dc.gather(plan, dense.cspan(), dense.span().subspan(10, plan.count())),
                         doctest::Contains("overlap"), error);
    untouched();
    const auto empty = dc.make_plan(bitmap_mask::none(0));
    dc.gather(empty, std::span<const float>(), std::span<float>());
    dc.scatter(empty, std::span<const float>(), std::span<float>(), 1.0f);
    const auto nothing_kept = dc.make_plan(index_mask::none(100));
    dc.gather(nothing_kept, dense.cspan(), std::span<float>());
    dc.scatter(nothing_kept, std::span<const float>(), dense.span(), 2.0f);
    CHECK(same_bits(dense.host(), std::vector<float>(100, 0.0f)));
  }

  void all() const {
    SUBCASE("bitmap and index masks, float") { bitmap_and_index_masks<float>(); }
    SUBCASE("bitmap and index masks, double") { bitmap_and_index_masks<double>(); }
    SUBCASE("block masks, sizes not a multiple of the block") {
      block_masks<float>();
      block_masks<double>();
    }
    SUBCASE("word patterns and large tensors") { word_patterns(); }
    SUBCASE("fp16 payloads") { sixteen_bit_payloads<pactrain::half>(); }
    SUBCASE("bf16 payloads") { sixteen_bit_payloads<pactrain::bfloat16>(); }
    SUBCASE("word ranks") { word_ranks(); }
    SUBCASE("bad sizes") { bad_sizes(); }
  }
};

}  // namespace pactrain::test
