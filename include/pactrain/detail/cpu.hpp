// Run-time CPU feature detection for the host kernels.
#pragma once

#include <pactrain/detail/config.hpp>

namespace pactrain::detail {

struct cpu_features {
  bool avx2 = false;
  bool avx512 = false;  // AVX-512 F: 512-bit compress and expand of float and double
  bool f16c = false;    // AVX + F16C: 8 float <-> binary16 conversions per instruction
};

inline cpu_features detect_cpu() noexcept {
  cpu_features f;
#if PACTRAIN_HAS_X86_KERNELS
  // libgcc's and compiler-rt's checks include the OS's XSAVE support for the wider registers.
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f");
  f.f16c = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
#endif
  return f;
}

inline const cpu_features& cpu() noexcept {
  static const cpu_features f = detect_cpu();
  return f;
}

}  // namespace pactrain::detail
