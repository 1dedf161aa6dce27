// Run-time CPU feature detection for the host kernels.
#pragma once

#include <pactrain/detail/config.hpp>

#if PACTRAIN_HAS_X86_KERNELS
#include <cpuid.h>
#endif

namespace pactrain::detail {

struct cpu_features {
  bool avx2 = false;
  bool avx512 = false;  // AVX-512 F: 512-bit compress and expand of float and double
  bool f16c = false;    // AVX + F16C: 8 float <-> binary16 conversions per instruction
  // GenuineIntel: its cores store 512 bits at once, so a 512-bit store into an output that is
  // 16- but not 64-byte aligned always spans two cache lines (the compactor avoids them).
  bool intel = false;
};

inline cpu_features detect_cpu() noexcept {
  cpu_features f;
#if PACTRAIN_HAS_X86_KERNELS
  // libgcc's and compiler-rt's checks include the OS's XSAVE support for the wider registers.
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f");
  f.intel = __builtin_cpu_is("intel");
  // Clang 14 has no "f16c" for __builtin_cpu_supports: CPUID leaf 1, ECX bit 29, read
  // directly; "avx" covers the OS's support of the YMM registers it needs.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  f.f16c = __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 &&
           (ecx & bit_F16C) != 0;
#endif
  return f;
}

inline const cpu_features& cpu() noexcept {
  static const cpu_features f = detect_cpu();
  return f;
}

}  // namespace pactrain::detail
