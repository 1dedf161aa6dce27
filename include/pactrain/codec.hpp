// Codecs: how payload values are represented on the wire.
//
// A compacted allreduce is correct only when decode(sum of encode(x_r)) == sum of x_r, i.e.
// when the codec is linear under the reduction; codec_traits<K>::is_linear states it, and
// the sync engine refuses, at compile time, a codec that does not.
#pragma once

#include <pactrain/compactor.hpp>

#include <type_traits>

namespace pactrain {

/// Sends payload values as they are.
template <gradient_value T>
struct identity_codec {
  using value_type = T;  // gradients and payload
  using wire_type = T;   // what the allreduce sums
};

/// Properties of a codec. Specialise for new codecs; the primary template claims nothing.
template <class Codec>
struct codec_traits {
  static constexpr bool is_linear = false;
  static constexpr bool is_identity = false;
};

template <gradient_value T>
struct codec_traits<identity_codec<T>> {
  static constexpr bool is_linear = true;
  static constexpr bool is_identity = true;
};

/// A payload representation: value_type (gradient entries), wire_type (summed elements).
template <class K>
concept gradient_codec = gradient_value<typename K::value_type> && requires {
  typename K::wire_type;
  { codec_traits<K>::is_linear } -> std::convertible_to<bool>;
};

}  // namespace pactrain
