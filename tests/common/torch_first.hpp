// The LibTorch tests' first include: LibTorch, then doctest. LibTorch pulls in glog, whose
// CHECK and CHECK_EQ... macros doctest's must replace; and a bitwise comparison of floats.
#pragma once

#include <pactrain/torch.hpp>
#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#include <doctest/doctest.h>

#include <cstring>
#include <span>

namespace pactrain::test {

/// Equal to the bit: the same sizes and the same bytes.
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

}  // namespace pactrain::test
