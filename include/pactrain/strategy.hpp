// How a bucket is synchronised: two independent choices, which entries are sent and whether
// they pass through the engine's codec.
#pragma once

#include <cstdint>

namespace pactrain {

/// Which entries of a bucket its collective covers.
enum class payload_kind : std::uint8_t {
  sparse,  // the kept entries, compacted into a payload
  dense,   // every entry of the bucket, pruned ones as +0
};

/// How the entries travel.
enum class encoding_kind : std::uint8_t {
  coded,  // encoded by the engine's codec (for the identity codec: as they are)
  plain,  // as value_type, bypassing the codec: exact, and no encoding work
};

/// A bucket's strategy. Under the identity codec the encoding has no effect: both encodings
/// send value_type. The plain encodings let an engine with a codec leave some buckets uncoded
/// (small ones, or where encoding costs more than it saves on the link).
struct bucket_strategy {
  payload_kind payload = payload_kind::sparse;
  encoding_kind encoding = encoding_kind::coded;

  static const bucket_strategy sparse;        // kept entries, coded
  static const bucket_strategy dense;         // whole bucket, coded
  static const bucket_strategy sparse_plain;  // kept entries as value_type
  static const bucket_strategy dense_plain;   // a plain allreduce of the whole bucket

  friend constexpr bool operator==(bucket_strategy, bucket_strategy) noexcept = default;

  /// 0 sparse, 1 dense, 2 sparse_plain, 3 dense_plain: the number digests and saved state use.
  [[nodiscard]] constexpr std::uint64_t code() const noexcept {
    return (payload == payload_kind::dense ? 1u : 0u) +
           (encoding == encoding_kind::plain ? 2u : 0u);
  }
  /// True when both axes hold one of their named values (a strategy built by a cast may not).
  [[nodiscard]] constexpr bool valid() const noexcept {
    return static_cast<unsigned>(payload) <= 1u && static_cast<unsigned>(encoding) <= 1u;
  }
};

inline constexpr bucket_strategy bucket_strategy::sparse{payload_kind::sparse,
                                                         encoding_kind::coded};
inline constexpr bucket_strategy bucket_strategy::dense{payload_kind::dense, encoding_kind::coded};
inline constexpr bucket_strategy bucket_strategy::sparse_plain{payload_kind::sparse,
                                                               encoding_kind::plain};
inline constexpr bucket_strategy bucket_strategy::dense_plain{payload_kind::dense,
                                                              encoding_kind::plain};

/// True for the strategies that send only the kept entries.
constexpr bool is_sparse(bucket_strategy s) noexcept { return s.payload == payload_kind::sparse; }

/// True for the strategies that bypass the codec.
constexpr bool is_plain(bucket_strategy s) noexcept { return s.encoding == encoding_kind::plain; }

inline const char* to_string(bucket_strategy s) noexcept {
  if (!s.valid()) return "unknown";
  constexpr const char* names[] = {"sparse", "dense", "sparse_plain", "dense_plain"};
  return names[s.code()];
}

}  // namespace pactrain
