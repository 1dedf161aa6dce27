// ternary_codec: homomorphic ternary lanes with stochastic rounding and a shared scale.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/detail/config.hpp>
#include <pactrain/detail/cpu.hpp>
#include <pactrain/detail/finite.hpp>
#include <pactrain/detail/random.hpp>
#include <pactrain/detail/ternary_lane.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>

#if PACTRAIN_HAS_X86_KERNELS
#define PACTRAIN_CODEC_AVX2 __attribute__((target("avx2"))) PACTRAIN_VECTORIZE
#endif

namespace pactrain {

/// A scaled codec's shared scale: current_max, this step's max |g| (one small MAX allreduce
/// before encoding); previous_max, the last step's (no round before encoding; current_max on
/// the first step after construction or a commit). Values above the scale clip.
enum class scale_source : std::uint8_t { current_max, previous_max };

inline const char* to_string(scale_source s) noexcept {
  return s == scale_source::current_max ? "current_max" : "previous_max";
}

struct ternary_options {
  /// Seeds the stochastic rounding. Give every rank the same seed (the engine checks).
  std::uint64_t seed = 0;
  scale_source scale = scale_source::current_max;
  /// Bits per lane. 0 (default) takes the least that cannot carry, ceil(log2(2P + 1)); a
  /// smaller value is refused, a larger one (up to 32) wastes bits.
  unsigned lane_bits = 0;
  /// 0 (default): one scale per bucket. B > 0: one scale per block of B consecutive entries
  /// of a bucket's codec input (its kept entries, in order, for a sparse bucket), all reduced
  /// in the bucket's one scale round. Gradients differ by orders of magnitude between layers
  /// and between the rows of one matrix; a shared scale far above most entries rounds them
  /// to 0 or the full scale, and that noise slows training. Each scale costs a word per round.
  std::size_t scale_block = 0;
};

/// Stochastic ternary values in integer lanes that sum over P ranks without carrying: decode is
/// an unbiased mean for |g| <= the shared scale s (beyond it, values clip to +-s). Results
/// depend only on the seed, rank, step, bucket and entry, not on threads or call order.
class ternary_codec {
 public:
  using value_type = float;
  using wire_type = std::uint32_t;
  static constexpr bool uses_scale = true;

  ternary_codec() noexcept = default;
  /// Throws pactrain::error if lane_bits is above 32.
  explicit ternary_codec(ternary_options o) : opt_(o) {
    PACTRAIN_EXPECTS(o.lane_bits <= 32, "ternary_codec: lane_bits " + std::to_string(o.lane_bits) +
                                            " does not fit a 32-bit word");
  }

  [[nodiscard]] const ternary_options& options() const noexcept { return opt_; }
  [[nodiscard]] bool scale_from_previous_step() const noexcept {
    return opt_.scale == scale_source::previous_max;
  }

  /// ceil(log2(2P + 1)): the fewest bits that hold a lane sum of up to 2P.
  [[nodiscard]] static unsigned required_lane_bits(int p) {
    detail::check_ranks("ternary_codec", p);
    return static_cast<unsigned>(std::bit_width(2 * static_cast<std::uint64_t>(p)));
  }

  /// Throws pactrain::error when lanes summed over P ranks could carry into each other.
  void validate(int p) const { (void)lane_bits(p); }

  /// Bits per lane for P ranks (validated).
  [[nodiscard]] unsigned lane_bits(int p) const {
    const unsigned need = required_lane_bits(p);
    PACTRAIN_EXPECTS(need <= 32, "ternary_codec: " + std::to_string(p) + " ranks need lanes of " +
                                     std::to_string(need) + " bits, more than a 32-bit word");
    if (opt_.lane_bits == 0) return need;
    PACTRAIN_EXPECTS(opt_.lane_bits >= need,
                     "ternary_codec: lanes of " + std::to_string(opt_.lane_bits) +
                         " bits would carry: " + std::to_string(p) + " ranks sum to up to " +
                         std::to_string(2 * static_cast<std::uint64_t>(p)) + ", which needs " +
                         std::to_string(need) + " bits");
    return opt_.lane_bits;
  }

  [[nodiscard]] unsigned lanes_per_word(int p) const { return 32u / lane_bits(p); }

  [[nodiscard]] std::size_t wire_size(std::size_t n, int p) const {
    const std::size_t l = lanes_per_word(p);
    return n / l + (n % l != 0);
  }

  /// The largest |g|, and NaN or Inf when `in` holds one (a NaN ranks above an Inf), so the
  /// engine's MAX over ranks makes it s and a non-finite s tells every rank alike.
  [[nodiscard]] static float local_scale(std::span<const float> in) noexcept {
    return std::bit_cast<float>(detail::largest_magnitude_bits(in));
  }

  /// Scales of a codec input of n entries: 1, or ceil(n / scale_block) (at least 1).
  [[nodiscard]] std::size_t scale_count(std::size_t n) const noexcept {
    return opt_.scale_block == 0 || n == 0 ? 1 : (n - 1) / opt_.scale_block + 1;
  }

  /// local_scale of each block: out[k] for entries [k B, (k + 1) B). Throws pactrain::error
  /// unless out has scale_count(in.size()) entries.
  void local_scales(std::span<const float> in, std::span<float> out) const {
    PACTRAIN_EXPECTS(out.size() == scale_count(in.size()),
                     "ternary_codec::local_scales: " + std::to_string(in.size()) + " values have " +
                         std::to_string(scale_count(in.size())) + " scales, " +
                         std::to_string(out.size()) + " given");
    const std::size_t b = opt_.scale_block == 0 ? in.size() : opt_.scale_block;
    for (std::size_t k = 0; k < out.size(); ++k) {
      const std::size_t at = k * b;
      out[k] = local_scale(in.subspan(at, std::min(b, in.size() - at)));
    }
  }

  void encode(std::span<const float> in, std::span<std::uint32_t> wire,
              const codec_context& c) const {
    encode_impl<residual_mode::none>(in, wire, nullptr, nullptr, c);
  }

  /// encode, and residual[k] = in[k] - decode_local(wire)[k] in the same pass (bit-identical
  /// to the separate calls). residual must have in.size() entries and not overlap in.
  void encode_residual(std::span<const float> in, std::span<std::uint32_t> wire,
                       std::span<float> residual, const codec_context& c) const {
    encode_with<residual_mode::set>("encode_residual", in, wire, residual, residual, c);
  }

  /// Encodes x = in + residual and sets residual = x - decode_local(wire), bit-identical to
  /// encode_residual on x, without writing x. Throws pactrain::error unless residual has
  /// in.size() entries; residual must not overlap in.
  void encode_feedback(std::span<const float> in, std::span<std::uint32_t> wire,
                       std::span<float> residual, const codec_context& c) const {
    encode_with<residual_mode::accumulate>("encode_feedback", in, wire, residual, residual, c);
  }
  /// As above, reading the residuals from `residual_in` and writing them to `residual_out`
  /// (the same buffer, or one that overlaps neither it nor `in`), so the old ones survive.
  void encode_feedback(std::span<const float> in, std::span<std::uint32_t> wire,
                       std::span<const float> residual_in, std::span<float> residual_out,
                       const codec_context& c) const {
    if (residual_in.data() == residual_out.data()) {
      encode_with<residual_mode::accumulate>("encode_feedback", in, wire, residual_in, residual_out,
                                             c);
      return;
    }
    const std::less<const float*> before;
    PACTRAIN_EXPECTS(residual_in.empty() || residual_out.empty() ||
                         !before(residual_out.data(), residual_in.data() + residual_in.size()) ||
                         !before(residual_in.data(), residual_out.data() + residual_out.size()),
                     "ternary_codec::encode_feedback: the residual buffers overlap");
    encode_with<residual_mode::accumulate_from>("encode_feedback", in, wire, residual_in,
                                                residual_out, c);
  }

  void decode(std::span<const std::uint32_t> wire, std::span<float> out,
              const codec_context& c) const {
    unpack(wire, out, c, c.size);
  }

  void decode_local(std::span<const std::uint32_t> wire, std::span<float> out,
                    const codec_context& c) const {
    unpack(wire, out, c, 1);
  }

  /// Identifies the settings, for the engine's check that all ranks agree.
  /// Scale blocks count only when in use, so states saved before they existed still load.
  [[nodiscard]] std::uint64_t digest() const noexcept {
    digest_builder d(0x7465726e);  // "tern"
    d.add(opt_.seed).add(static_cast<std::uint64_t>(opt_.scale)).add(std::uint64_t{opt_.lane_bits});
    if (opt_.scale_block != 0) d.add(static_cast<std::uint64_t>(opt_.scale_block));
    return d.value();
  }

 private:
  struct shape {
    std::size_t words;
    unsigned bits;
  };

  // What encode does with a residual buffer: nothing; set it to what the encoding missed; or
  // add it to the input first (x = in + r) and then set it to what the encoding of x missed,
  // in place or from a separate input buffer (a mode of its own: a loop that may alias r_in
  // with r would fail the vectoriser's overlap check and run scalar).
  enum class residual_mode : std::uint8_t { none, set, accumulate, accumulate_from };

  template <residual_mode Mode>
  void encode_with(const char* op, std::span<const float> in, std::span<std::uint32_t> wire,
                   std::span<const float> residual_in, std::span<float> residual,
                   const codec_context& c) const {
    for (const std::size_t n : {residual_in.size(), residual.size()}) {
      if (n != in.size()) {
        PACTRAIN_FAIL(std::string("ternary_codec::") + op + ": " + std::to_string(in.size()) +
                      " values but " + std::to_string(n) + " residuals");
      }
    }
    PACTRAIN_EXPECTS(
        (residual.data() != nullptr && residual_in.data() != nullptr) || residual.empty(),
        std::string("ternary_codec::") + op + ": null residual buffer");
    encode_impl<Mode>(in, wire, residual_in.data(), residual.data(), c);
  }

  template <residual_mode Mode>
  void encode_impl(std::span<const float> in, std::span<std::uint32_t> wire,
                   const float* residual_in, float* residual, const codec_context& c) const {
    const shape sh = shape_of(in.size(), c.size);
    detail::check_codec_spans("ternary_codec", "encode", in.data(), in.size(), wire.data(),
                              wire.size(), sh.words);
    if (sh.words == 0) return;
    check_scales(c, in.size());
    std::memset(wire.data(), 0, wire.size_bytes());
    // Not a structured binding: Clang 14 cannot capture one in the lambda below.
    const std::pair<std::uint32_t, std::uint32_t> key = detail::ternary_keys(opt_.seed, c);
    const std::uint32_t k0 = key.first;
    const std::uint32_t k1 = key.second;
    // Words in blocks that stay in cache while each lane plane is ORed into them.
    constexpr std::size_t block = 4096;
    for (std::size_t w0 = 0; w0 < sh.words; w0 += block) {
      const std::size_t w1 = std::min(sh.words, w0 + block);
      for (std::size_t j = 0; j * sh.words + w0 < in.size(); ++j) {
        const std::size_t start = j * sh.words + w0;  // payload index of word w0's lane j
        const std::size_t n = std::min(w1 - w0, in.size() - start);
        for_each_scale(c, start, n, [&](std::size_t first, std::size_t count, float s) {
          // A zero, negative, NaN or infinite scale sends t = 0 (and never divides).
          const plane pl{.g = in.data() + first,
                         .r_in = residual_in == nullptr ? nullptr : residual_in + first,
                         .r = residual == nullptr ? nullptr : residual + first,
                         .inv = detail::ternary_inverse(s),
                         .scale = s,
                         .k0 = k0,
                         .k1 = k1,
                         .shift = static_cast<unsigned>(j) * sh.bits};
          encode_plane<Mode>(pl, wire.data() + w0 + (first - start), count, first);
        });
      }
    }
  }

  // Throws unless c gives the scales an input of `size` entries needs: one per block, or
  // none (c.scale serves every block). Before any output is written.
  void check_scales(const codec_context& c, std::size_t size) const {
    if (opt_.scale_block == 0 || c.scales.empty()) return;
    PACTRAIN_EXPECTS(c.scales.size() == scale_count(size),
                     "ternary_codec: " + std::to_string(size) + " values need " +
                         std::to_string(scale_count(size)) + " scales, " +
                         std::to_string(c.scales.size()) + " given");
  }

  // Calls f(first, count, scale) for the runs of entries [start, start + n) that share a
  // scale: c.scales[k] for block k, or c.scale for all (one scale per bucket, or a caller
  // that gives one scale). check_scales has passed.
  template <class F>
  void for_each_scale(const codec_context& c, std::size_t start, std::size_t n, F&& f) const {
    if (opt_.scale_block == 0 || c.scales.empty()) {
      f(start, n, c.scale);
      return;
    }
    const std::size_t b = opt_.scale_block;
    for (std::size_t at = start, end = start + n; at < end;) {
      const std::size_t k = at / b;
      const std::size_t stop = std::min(end, (k + 1) * b);
      f(at, stop - at, c.scales[k]);
      at = stop;
    }
  }

  [[nodiscard]] shape shape_of(std::size_t n, int p) const {
    const unsigned b = lane_bits(p);
    const std::size_t l = 32u / b;
    return {n / l + (n % l != 0), b};
  }

  // One lane plane of encode: values g (payload indices first..), their residuals read from
  // r_in and written to r (or null; r_in may be r), and the step's keys.
  struct plane {
    const float* g;
    const float* r_in;
    float* r;
    float inv;
    float scale;
    std::uint32_t k0;
    std::uint32_t k1;
    unsigned shift;
  };

  // ORs the lanes of `count` values at `shift` into w, and handles their residuals as Mode
  // says. The loops keep 32-bit counters (split where the index crosses a multiple of 2^32)
  // so that they vectorise; each mode is an instantiation of its own, not a branch per entry.
  template <residual_mode Mode>
  static void encode_plane(plane p, std::uint32_t* w, std::size_t count,
                           std::size_t first) noexcept {
#if PACTRAIN_HAS_X86_KERNELS
    if (detail::cpu().avx2) return encode_plane_avx2<Mode>(p, w, count, first);
#endif
    encode_plane_body<Mode>(p, w, count, first);
  }
#if PACTRAIN_HAS_X86_KERNELS
  // The same loop with 8 lanes and native 32-bit multiplies: about twice as fast.
  template <residual_mode Mode>
  PACTRAIN_CODEC_AVX2 static void encode_plane_avx2(plane p, std::uint32_t* w, std::size_t count,
                                                    std::size_t first) noexcept {
    encode_plane_body<Mode>(p, w, count, first);
  }
#endif
  template <residual_mode Mode>
  PACTRAIN_ALWAYS_INLINE static void encode_plane_body(plane p, std::uint32_t* w, std::size_t count,
                                                       std::size_t first) noexcept {
    const float* g = p.g;
    const float* r_in = p.r_in;
    float* r = p.r;
    while (count != 0) {
      const auto lo0 = static_cast<std::uint32_t>(first);
      const auto hi_key =
          static_cast<std::uint32_t>(static_cast<std::uint64_t>(first) >> 32) ^ p.k1;
      const std::size_t m = std::min<std::size_t>(count, (std::uint64_t{1} << 32) - lo0);
      for (std::size_t i = 0; i < m; ++i) {
        const auto lo = lo0 + static_cast<std::uint32_t>(i);
        float x = g[i];
        if constexpr (Mode == residual_mode::accumulate) x += r[i];
        if constexpr (Mode == residual_mode::accumulate_from) x += r_in[i];
        const std::uint32_t u =
            detail::ternary_lane(x, p.inv, detail::ternary_random(lo, hi_key, p.k0));
        w[i] |= u << p.shift;
        if constexpr (Mode != residual_mode::none) r[i] = detail::ternary_residual(x, u, p.scale);
      }
      g += m;
      w += m;
      if constexpr (Mode != residual_mode::none) r += m;
      if constexpr (Mode == residual_mode::accumulate_from) r_in += m;
      first += m;
      count -= m;
    }
  }

  void unpack(std::span<const std::uint32_t> wire, std::span<float> out, const codec_context& c,
              int bias) const {
    const shape sh = shape_of(out.size(), c.size);
    detail::check_codec_spans("ternary_codec", "decode", out.data(), out.size(), wire.data(),
                              wire.size(), sh.words);
    check_scales(c, out.size());
    const std::uint32_t mask = sh.bits == 32 ? ~0u : (1u << sh.bits) - 1u;
    for (std::size_t j = 0; j * sh.words < out.size(); ++j) {
      const std::size_t base = j * sh.words;
      const std::size_t count = std::min(sh.words, out.size() - base);
      const unsigned shift = static_cast<unsigned>(j) * sh.bits;
      for_each_scale(c, base, count, [&](std::size_t first, std::size_t n, float s) {
        unpack_run(wire.data() + (first - base), out.data() + first, n, shift, mask,
                   static_cast<std::uint32_t>(bias), s / static_cast<float>(bias));
      });
    }
  }

  // Lane values (u - bias) * f of n words at `shift`.
  PACTRAIN_VECTORIZE static void unpack_run(const std::uint32_t* w, float* o, std::size_t n,
                                            unsigned shift, std::uint32_t mask, std::uint32_t ub,
                                            float f) noexcept {
    for (std::size_t i = 0; i < n; ++i) {
      // lane - bias lies in [-P, P] for a valid wire; modular, so no overflow otherwise.
      const auto v = static_cast<std::int32_t>(((w[i] >> shift) & mask) - ub);
      o[i] = static_cast<float>(v) * f;
    }
  }

  ternary_options opt_;
};

template <>
struct codec_traits<ternary_codec> {
  static constexpr bool is_linear = true;  // in lane space: lane sums decode to sums of s t
  static constexpr bool is_identity = false;
};

static_assert(bucket_codec<ternary_codec>);

}  // namespace pactrain

#undef PACTRAIN_CODEC_AVX2
