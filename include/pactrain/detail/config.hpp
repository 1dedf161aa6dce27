// Version and feature checks shared by every pactrain header.
#pragma once

#define PACTRAIN_VERSION_MAJOR 0
#define PACTRAIN_VERSION_MINOR 1
#define PACTRAIN_VERSION_PATCH 0

#if __cplusplus < 202002L
#error "pactrain needs C++20"
#endif

// Run-time selected SIMD kernels use function target attributes, a GCC/Clang extension.
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define PACTRAIN_HAS_X86_KERNELS 1
#else
#define PACTRAIN_HAS_X86_KERNELS 0
#endif

// Forces inlining, so that a plain loop body can be compiled again inside a function with a
// wider target attribute (and vectorised for it).
#if defined(__GNUC__) || defined(__clang__)
#define PACTRAIN_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define PACTRAIN_ALWAYS_INLINE inline
#endif

// Functions shared by host code and CUDA kernels (the ternary codec's lanes and mixers).
#if defined(__CUDACC__)
#define PACTRAIN_HOST_DEVICE __host__ __device__
#else
#define PACTRAIN_HOST_DEVICE
#endif

// Hot loops with run-time trip counts: GCC 12 at -O2 (the cheap vectoriser cost model)
// leaves them scalar, several times slower than at -O3. This asks for the -O3 model in those
// functions only, so that a user's -O2 build gets the same kernels. Clang vectorises them at -O2.
#if defined(__GNUC__) && !defined(__clang__)
#define PACTRAIN_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define PACTRAIN_VECTORIZE
#endif

namespace pactrain {

/// The library version as "major.minor.patch".
inline constexpr const char* version_string() noexcept { return "0.1.0"; }

}  // namespace pactrain
