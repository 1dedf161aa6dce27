// A versioned binary format for masks, for checkpoints and for sending masks between ranks.
//
// Layout (every integer unsigned, little-endian, independent of the host):
//   offset  size  field
//   0       8     magic "PTRNMASK"
//   8       4     format version (1)
//   12      4     mask_kind (1 bitmap, 2 index, 3 block)
//   16      8     size: entries of the tensor
//   24      8     count: kept entries
//   32      8     block size B (1 unless kind is block)
//   40      8     n: number of 64-bit items that follow
//   48      8n    items: bitmap words, sorted indices, or block bitmap words
//   48+8n   8     checksum: digest of bytes [0, 48+8n)
// The reader validates every field and throws pactrain::error naming the first problem; it
// never reads out of bounds and never returns a mask that differs from what was written.
#pragma once

#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>
#include <pactrain/mask.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace pactrain {

inline constexpr std::uint32_t mask_format_version = 1;

/// The largest size (entries) deserialize accepts by default: 2^36, a tensor of 256 GiB of
/// floats. An index mask's bytes do not bound its size, yet digest() and mask_cast to a bitmap
/// take time and memory in proportion to it.
inline constexpr std::size_t default_max_mask_size = std::size_t{1} << 36;

namespace detail {

inline constexpr char mask_magic[8] = {'P', 'T', 'R', 'N', 'M', 'A', 'S', 'K'};
inline constexpr std::size_t mask_header_bytes = 48;

inline void put_u64(std::vector<std::byte>& out, std::uint64_t v) {
  for (int k = 0; k < 8; ++k) out.push_back(static_cast<std::byte>((v >> (8 * k)) & 0xff));
}
inline void put_u32(std::vector<std::byte>& out, std::uint32_t v) {
  for (int k = 0; k < 4; ++k) out.push_back(static_cast<std::byte>((v >> (8 * k)) & 0xff));
}
inline std::uint64_t get_u64(std::span<const std::byte> in, std::size_t at) noexcept {
  std::uint64_t v = 0;
  for (int k = 0; k < 8; ++k) v |= static_cast<std::uint64_t>(in[at + k]) << (8 * k);
  return v;
}
inline std::uint32_t get_u32(std::span<const std::byte> in, std::size_t at) noexcept {
  std::uint32_t v = 0;
  for (int k = 0; k < 4; ++k) v |= static_cast<std::uint32_t>(in[at + k]) << (8 * k);
  return v;
}

inline std::uint64_t checksum(std::span<const std::byte> bytes) {
  return digest_builder(0x63686b73).add_bytes(bytes).value();  // "chks"
}

template <gradient_mask Mask>
constexpr std::uint64_t block_size_of() noexcept {
  if constexpr (Mask::kind == mask_kind::block) {
    return Mask::block_size;
  } else {
    return 1;
  }
}

[[noreturn]] inline void corrupt(const std::string& what) {
  PACTRAIN_FAIL("serialized mask rejected: " + what);
}

}  // namespace detail

/// Writes `m` in the format described above.
template <gradient_mask Mask>
std::vector<std::byte> serialize(const Mask& m) {
  std::span<const std::uint64_t> items;
  if constexpr (Mask::kind == mask_kind::bitmap) {
    items = m.words();
  } else if constexpr (Mask::kind == mask_kind::index) {
    items = m.indices();
  } else {
    items = m.blocks().words();
  }
  std::vector<std::byte> out;
  out.reserve(detail::mask_header_bytes + 8 * items.size() + 8);
  for (char c : detail::mask_magic) out.push_back(static_cast<std::byte>(c));
  detail::put_u32(out, mask_format_version);
  detail::put_u32(out, static_cast<std::uint32_t>(Mask::kind));
  detail::put_u64(out, m.size());
  detail::put_u64(out, m.count());
  detail::put_u64(out, detail::block_size_of<Mask>());
  detail::put_u64(out, items.size());
  for (std::uint64_t v : items) detail::put_u64(out, v);
  detail::put_u64(out, detail::checksum(out));
  return out;
}

/// Reads a mask written by serialize<Mask>. Throws pactrain::error naming the first problem if
/// the bytes are truncated, too long, corrupt, of another version, mask kind or block size, or
/// claim more than `max_size` entries: pass the tensor's size where it is known (every check:
/// docs/ARCHITECTURE.md).
template <gradient_mask Mask>
Mask deserialize(std::span<const std::byte> in, std::size_t max_size = default_max_mask_size) {
  using detail::corrupt;
  if (in.size() < detail::mask_header_bytes + 8) {
    corrupt("truncated: " + std::to_string(in.size()) + " bytes is shorter than the header");
  }
  for (std::size_t k = 0; k < 8; ++k) {
    if (in[k] != static_cast<std::byte>(detail::mask_magic[k])) corrupt("bad magic");
  }
  const std::uint32_t version = detail::get_u32(in, 8);
  if (version != mask_format_version) {
    corrupt("unsupported format version " + std::to_string(version) + " (this build reads " +
            std::to_string(mask_format_version) + ")");
  }
  const std::uint32_t kind = detail::get_u32(in, 12);
  if (kind != static_cast<std::uint32_t>(Mask::kind)) {
    corrupt("mask kind " + std::to_string(kind) + " where kind " +
            std::to_string(static_cast<std::uint32_t>(Mask::kind)) + " was expected");
  }
  const std::uint64_t size = detail::get_u64(in, 16);
  const std::uint64_t count = detail::get_u64(in, 24);
  const std::uint64_t block = detail::get_u64(in, 32);
  const std::uint64_t n = detail::get_u64(in, 40);
  if (block != detail::block_size_of<Mask>()) {
    corrupt("block size " + std::to_string(block) + " where " +
            std::to_string(detail::block_size_of<Mask>()) + " was expected");
  }
  const std::uint64_t max_items = (in.size() - detail::mask_header_bytes - 8) / 8;
  if (n > max_items || in.size() != detail::mask_header_bytes + 8 * n + 8) {
    corrupt("length " + std::to_string(in.size()) + " bytes does not match " + std::to_string(n) +
            " items (truncated or trailing bytes)");
  }
  const std::size_t body = detail::mask_header_bytes + 8 * static_cast<std::size_t>(n);
  if (detail::get_u64(in, body) != detail::checksum(in.first(body))) corrupt("checksum mismatch");
  if (size > std::numeric_limits<std::size_t>::max() / 2) corrupt("size does not fit");
  if (size > max_size) {
    corrupt("size " + std::to_string(size) + " exceeds the largest accepted, " +
            std::to_string(max_size) + " entries");
  }
  if (count > size) corrupt("count exceeds size");

  std::vector<std::uint64_t> items(static_cast<std::size_t>(n));
  for (std::size_t k = 0; k < items.size(); ++k) {
    items[k] = detail::get_u64(in, detail::mask_header_bytes + 8 * k);
  }
  const auto sz = static_cast<std::size_t>(size);
  Mask m;
  try {
    if constexpr (Mask::kind == mask_kind::bitmap) {
      if (n != detail::words_for(sz)) corrupt("word count does not match size");
      m = Mask(sz, std::move(items));
    } else if constexpr (Mask::kind == mask_kind::index) {
      if (n != count) corrupt("index count does not match count");
      m = Mask(sz, std::move(items));
    } else {
      const std::size_t blocks = Mask::block_count(sz);
      if (n != detail::words_for(blocks)) corrupt("word count does not match size");
      m = Mask(sz, bitmap_mask(blocks, std::move(items)));
    }
  } catch (const error& e) {
    std::string what = e.what();
    const std::string prefix = "pactrain: ";
    if (what.starts_with(prefix)) what.erase(0, prefix.size());
    corrupt(what);
  }
  if (m.count() != count) corrupt("count does not match the items");
  return m;
}

}  // namespace pactrain
