// Buffers on transparent huge pages, for gradients and the engine's own workspaces.
//
//   std::vector<float, pactrain::huge_page_allocator<float>> grads(n);   // a drop-in
//   pactrain::huge_vector<float> grads(n);                                // the same
//
// A sync streams every gradient byte through the cache at least twice (gather and scatter).
// With 4 KiB pages that is a TLB miss every 4 KiB; a 2 MiB page covers 512 times more.
// Linux gives anonymous memory huge pages when its transparent huge pages are "always", or
// "madvise" (Debian's default) and the range is advised with MADV_HUGEPAGE, which is what
// this allocator does for allocations of at least 2 MiB (aligned to 2 MiB, so that whole
// pages fit). Smaller allocations, and other systems, get plain aligned memory: the advice
// is only advice, and a failure to take it changes nothing but speed.
#pragma once

#include <cstddef>
#include <limits>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace pactrain {

/// A std::allocator replacement: allocations of huge_page_bytes or more are 2 MiB-aligned,
/// rounded up to whole 2 MiB pages and advised onto transparent huge pages (Linux).
template <class T>
class huge_page_allocator {
 public:
  using value_type = T;
  static constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

  huge_page_allocator() noexcept = default;
  template <class U>
  huge_page_allocator(const huge_page_allocator<U>&) noexcept {}  // NOLINT: rebinding

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > (std::numeric_limits<std::size_t>::max() - huge_page_bytes) / sizeof(T)) {
      throw std::bad_array_new_length();
    }
    const std::size_t bytes = n * sizeof(T);
    if (bytes < huge_page_bytes) return std::allocator<T>{}.allocate(n);
    const std::size_t rounded = round_up(bytes);
    void* p = ::operator new (rounded, std::align_val_t{huge_page_bytes});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)::madvise(p, rounded, MADV_HUGEPAGE);  // advice: a refusal only costs speed
#endif
    return static_cast<T*>(p);
  }

  void deallocate(T* p, std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < huge_page_bytes) {
      std::allocator<T>{}.deallocate(p, n);
      return;
    }
    // The unsized form: Clang before 19 does not declare sized deallocation by default.
    ::operator delete (p, std::align_val_t{huge_page_bytes});
  }

  template <class U>
  bool operator==(const huge_page_allocator<U>&) const noexcept {
    return true;
  }

 private:
  static constexpr std::size_t round_up(std::size_t bytes) noexcept {
    return (bytes + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes;
  }
};

/// A std::vector on huge_page_allocator.
template <class T>
using huge_vector = std::vector<T, huge_page_allocator<T>>;

}  // namespace pactrain
