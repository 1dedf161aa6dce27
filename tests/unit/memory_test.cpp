// huge_page_allocator: large allocations 2 MiB-aligned and usable, small ones plain, and an
// impossible size refused.
#include <doctest/doctest.h>

#include <pactrain/huge_pages.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <numeric>
#include <vector>

using namespace pactrain;

TEST_CASE("large allocations are aligned to 2 MiB and hold their values") {
  constexpr std::size_t page = huge_page_allocator<float>::huge_page_bytes;
  for (const std::size_t n : {page / 4, page / 4 + 1, 3 * page / 4 + 17}) {
    CAPTURE(n);
    huge_vector<float> v(n);
    CHECK(reinterpret_cast<std::uintptr_t>(v.data()) % page == 0);
    std::iota(v.begin(), v.end(), 0.0f);
    CHECK(v.front() == 0.0f);
    CHECK(v.back() == static_cast<float>(n - 1));
    v.resize(2 * n);  // reallocation moves the values to a new huge allocation
    CHECK(reinterpret_cast<std::uintptr_t>(v.data()) % page == 0);
    CHECK(v[n - 1] == static_cast<float>(n - 1));
  }
  // Small ones come from the ordinary allocator, aligned for the type.
  huge_vector<double> small(7, 1.5);
  CHECK(reinterpret_cast<std::uintptr_t>(small.data()) % alignof(double) == 0);
  CHECK(small[6] == 1.5);
  huge_vector<float> empty;
  CHECK(empty.empty());
}

TEST_CASE("an impossible size is refused with the standard exception") {
  huge_page_allocator<float> a;
  CHECK_THROWS_AS((void)a.allocate(std::numeric_limits<std::size_t>::max() / 2), std::bad_alloc);
  // Allocators of any type compare equal: memory from one frees through another.
  CHECK(a == huge_page_allocator<double>{});
  huge_page_allocator<double> b(a);
  double* p = b.allocate(1 << 20);
  p[0] = 2.0;
  huge_page_allocator<double>{}.deallocate(p, 1 << 20);
}
