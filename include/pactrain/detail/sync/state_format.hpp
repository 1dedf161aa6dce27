// The byte format of sync::save_state and load_state. Integers little-endian:
//   "PTRNSYNC", version (u32), bytes per value (u32), fit digest (u64: layout, masks,
//   strategies, codec settings and rank count), step (u64), flags (u64, bit 0: the scales
//   are valid), residual count r (u64), scale count s (u64), the saving rank (u32) and rank
//   count (u32), r values, s floats (u32 bits), checksum (u64) of everything before it.
// Version 1 had no rank fields; its bytes are refused (they could be another rank's).
#pragma once

#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>
#include <pactrain/huge_pages.hpp>
#include <pactrain/serialize.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace pactrain::detail {

/// What one engine's state holds besides its masks and strategies.
template <class T>
struct engine_state {
  std::uint64_t fit = 0;  // the digest of what the state was saved with
  std::uint64_t step = 0;
  bool scales_ready = false;
  huge_vector<T> residuals;
  std::vector<float> scales;
};

// What a saved state must have been saved with: layout, rank count, masks, strategies and
// codec settings.
template <class Layout, class Strategies, class Codec>
[[nodiscard]] std::uint64_t state_fit_digest(const Layout& layout, int ranks,
                                             const std::vector<std::uint64_t>& mask_digests,
                                             const Strategies& strategies, const Codec& codec) {
  digest_builder d(0x66697473);  // "fits"
  d.add(layout.digest()).add(static_cast<std::uint64_t>(ranks));
  d.add(mask_digests);
  for (const auto s : strategies) d.add(s.code());
  if constexpr (requires { codec.digest(); }) d.add(codec.digest());
  return d.value();
}

// What ranks that load a state must agree on, beyond its fit: their strategies, the step
// counter and the scales.
template <class T, class Strategies>
[[nodiscard]] std::uint64_t loaded_state_digest(const Strategies& strategies,
                                                const engine_state<T>& st) {
  digest_builder d(0x73746174);  // "stat"
  for (const auto s : strategies) d.add(s.code());
  d.add(st.step).add(std::uint64_t{st.scales_ready});
  for (const float f : st.scales) d.add(std::uint64_t{std::bit_cast<std::uint32_t>(f)});
  return d.value();
}

template <class T>
class state_format {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8,
                "pactrain::sync: save_state stores values of 2, 4 or 8 bytes");
  using bits_type =
      std::conditional_t<sizeof(T) == 2, std::uint16_t,
                         std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;

 public:
  static constexpr char magic[9] = "PTRNSYNC";
  static constexpr std::uint32_t version = 2;
  static constexpr std::size_t header_bytes = 64;

  [[nodiscard]] static std::vector<std::byte> write(std::uint64_t fit, int rank, int ranks,
                                                    std::uint64_t step, bool scales_ready,
                                                    std::span<const T> residuals,
                                                    std::span<const float> scales) {
    std::vector<std::byte> out;
    out.reserve(header_bytes + residuals.size_bytes() + scales.size_bytes() + 8);
    for (char c : std::string_view(magic)) out.push_back(static_cast<std::byte>(c));
    put_u32(out, version);
    put_u32(out, sizeof(T));
    put_u64(out, fit);
    put_u64(out, step);
    put_u64(out, scales_ready ? 1 : 0);
    put_u64(out, residuals.size());
    put_u64(out, scales.size());
    put_u32(out, static_cast<std::uint32_t>(rank));
    put_u32(out, static_cast<std::uint32_t>(ranks));
    for (const T r : residuals) put_value(out, r);
    for (const float f : scales) put_u32(out, std::bit_cast<std::uint32_t>(f));
    put_u64(out, checksum(out));
    return out;
  }

  /// Parses `in`, checking it against what the engine holds: its fit digest, its rank and
  /// rank count, and the sizes of its residuals and scales. Throws pactrain::error naming the
  /// first problem.
  [[nodiscard]] static engine_state<T> read(std::span<const std::byte> in, std::uint64_t fit,
                                            int rank, int ranks, std::size_t residuals,
                                            std::size_t scales) {
    const std::string what = "state rejected: ";
    PACTRAIN_EXPECTS(in.size() >= header_bytes + 8,
                     what + "truncated: " + std::to_string(in.size()) + " bytes");
    PACTRAIN_EXPECTS(std::memcmp(in.data(), magic, 8) == 0, what + "bad magic");
    const std::uint32_t v = get_u32(in, 8);
    PACTRAIN_EXPECTS(v == version, what + "unsupported format version " + std::to_string(v) +
                                       (v == 1 ? " (it does not record the saving rank)" : ""));
    const std::uint64_t r = get_u64(in, 40);
    const std::uint64_t s = get_u64(in, 48);
    const std::uint64_t room = (in.size() - header_bytes - 8);
    PACTRAIN_EXPECTS(r <= room / sizeof(T) && s <= room / 4 &&
                         in.size() == header_bytes + r * sizeof(T) + 4 * s + 8,
                     what + "length " + std::to_string(in.size()) + " bytes does not match " +
                         std::to_string(r) + " residuals and " + std::to_string(s) +
                         " scales (truncated or trailing bytes)");
    PACTRAIN_EXPECTS(get_u64(in, in.size() - 8) == checksum(in.first(in.size() - 8)),
                     what + "checksum mismatch");
    PACTRAIN_EXPECTS(get_u32(in, 12) == sizeof(T),
                     what + "values of " + std::to_string(get_u32(in, 12)) +
                         " bytes, this engine's have " + std::to_string(sizeof(T)));
    const std::uint32_t saved_rank = get_u32(in, 56);
    const std::uint32_t saved_ranks = get_u32(in, 60);
    PACTRAIN_EXPECTS(saved_ranks == static_cast<std::uint32_t>(ranks),
                     what + "saved by a job of " + std::to_string(saved_ranks) +
                         " ranks, this one has " + std::to_string(ranks));
    PACTRAIN_EXPECTS(saved_rank == static_cast<std::uint32_t>(rank),
                     what + "saved by rank " + std::to_string(saved_rank) + ", this is rank " +
                         std::to_string(rank) + " (each rank loads the state it saved)");
    PACTRAIN_EXPECTS(get_u64(in, 16) == fit,
                     what +
                         "saved with other masks, strategies, codec settings, layout or "
                         "rank count than this engine has");
    PACTRAIN_EXPECTS(r == residuals && s == scales,
                     what + std::to_string(r) + " residuals and " + std::to_string(s) +
                         " scales, this engine has " + std::to_string(residuals) + " and " +
                         std::to_string(scales));
    const std::uint64_t flags = get_u64(in, 32);
    PACTRAIN_EXPECTS(flags <= 1, what + "unknown flags " + std::to_string(flags));
    engine_state<T> st;
    st.fit = fit;
    st.step = get_u64(in, 24);
    st.scales_ready = flags == 1;
    st.residuals.resize(r);
    st.scales.resize(s);
    std::size_t at = header_bytes;
    // The engine never keeps an Inf or a NaN (see the non-finite policy), nor a negative scale.
    for (std::size_t k = 0; k < st.residuals.size(); ++k) {
      st.residuals[k] = get_value(in, at);
      PACTRAIN_EXPECTS(std::isfinite(st.residuals[k]),
                       what + "residual " + std::to_string(k) + " is not finite");
      at += sizeof(T);
    }
    for (std::size_t k = 0; k < st.scales.size(); ++k) {
      st.scales[k] = std::bit_cast<float>(get_u32(in, at));
      PACTRAIN_EXPECTS(std::isfinite(st.scales[k]) && !std::signbit(st.scales[k]),
                       what + "scale " + std::to_string(k) + " is not finite and >= +0");
      at += 4;
    }
    return st;
  }

 private:
  static void put_value(std::vector<std::byte>& out, T v) {
    const auto bits = std::bit_cast<bits_type>(v);
    for (std::size_t k = 0; k < sizeof(v); ++k) {
      out.push_back(static_cast<std::byte>((bits >> (8 * k)) & 0xff));
    }
  }
  static T get_value(std::span<const std::byte> in, std::size_t at) {
    bits_type bits = 0;
    for (std::size_t k = 0; k < sizeof(T); ++k) {
      bits = static_cast<bits_type>(
          bits | static_cast<bits_type>(static_cast<bits_type>(in[at + k]) << (8 * k)));
    }
    return std::bit_cast<T>(bits);
  }
};

}  // namespace pactrain::detail
