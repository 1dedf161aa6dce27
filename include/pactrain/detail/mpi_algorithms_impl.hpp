// The bodies of pactrain/mpi_algorithms.hpp: Open MPI 4.1's allreduce decision rules
// (coll/tuned's fixed decision, coll/libnbc's automatic choice), the control variables read
// through MPI_T, and the one warning. Included at the end of that header, never on its own.
#pragma once

#include <pactrain/mpi_algorithms.hpp>

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace pactrain {

namespace detail {

inline constexpr std::size_t largest_power_of_two_at_most(std::size_t n) noexcept {
  std::size_t p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}

// Open MPI 4.1 coll/tuned's fixed decision for commutative operations: by communicator size,
// the first band whose message-size bound (bytes, exclusive) exceeds the message; 0 ends a row.
struct tuned_band {
  std::size_t bytes;
  int algorithm;  // coll_tuned_allreduce_algorithm's numbering
};
struct tuned_row {
  int below_ranks;  // the row applies to communicators of fewer ranks (0: any)
  tuned_band bands[7];
};
inline constexpr tuned_row tuned_fixed_rows[] = {
    {4, {{8, 4}, {4096, 3}, {8192, 4}, {16384, 3}, {65536, 4}, {262144, 5}, {0, 6}}},
    {8, {{16, 4}, {8192, 3}, {0, 6}}},
    {16, {{8192, 3}, {0, 6}}},
    {32, {{64, 5}, {4096, 3}, {0, 6}}},
    {64, {{128, 5}, {0, 6}}},
    {128, {{262144, 3}, {0, 6}}},
    {256, {{131072, 2}, {262144, 3}, {0, 6}}},
    {512, {{4096, 2}, {0, 6}}},
    {2048, {{2048, 2}, {16384, 3}, {0, 6}}},
    {4096, {{2048, 2}, {4096, 5}, {16384, 3}, {0, 6}}},
    {0, {{2048, 2}, {16384, 5}, {32768, 3}, {0, 6}}},
};

inline int tuned_fixed_algorithm(std::size_t bytes, int ranks) noexcept {
  for (const tuned_row& row : tuned_fixed_rows) {
    if (row.below_ranks != 0 && ranks >= row.below_ranks) continue;
    for (const tuned_band& b : row.bands)
      if (b.bytes == 0 || bytes < b.bytes) return b.algorithm;
  }
  return 6;
}

// What coll/base runs for coll/tuned's algorithm number `a`, with its fallbacks for counts too
// small to split (ring: fewer elements than ranks; rabenseifner: fewer than the largest power
// of two <= ranks; segmented ring: no segment size or fewer than ranks x segment elements).
inline allreduce_algorithm tuned_algorithm(int a, std::size_t count, std::size_t element_size,
                                           int ranks, int segment_bytes) noexcept {
  const auto p = static_cast<std::size_t>(ranks);
  switch (a) {
    case 1: return allreduce_algorithm::basic_linear;
    case 2: return allreduce_algorithm::nonoverlapping;
    case 3: return allreduce_algorithm::recursive_doubling;
    case 4: return count < p ? allreduce_algorithm::recursive_doubling : allreduce_algorithm::ring;
    case 5: {
      const auto seg = static_cast<std::size_t>(segment_bytes > 0 ? segment_bytes : 0);
      std::size_t seg_count = count;
      if (element_size != 0 && seg >= element_size && seg < element_size * count) {
        seg_count = seg / element_size;
        if (seg - seg_count * element_size > element_size / 2) ++seg_count;
      }
      if (count < p * seg_count) return tuned_algorithm(4, count, element_size, ranks, 0);
      return allreduce_algorithm::segmented_ring;
    }
    case 6:
      return count < largest_power_of_two_at_most(p) ? allreduce_algorithm::basic_linear
                                                     : allreduce_algorithm::rabenseifner;
    default: return allreduce_algorithm::unknown;
  }
}

// The index and datatype of a control variable through MPI_T (which must be initialised);
// false if this MPI has no variable of that name.
inline bool mpit_find(const char* name, int& index, MPI_Datatype& type) {
  if (MPI_T_cvar_get_index(name, &index) != MPI_SUCCESS) return false;
  char cname[256];
  int name_len = sizeof cname;
  char desc[8];
  int desc_len = sizeof desc;
  int verbosity = 0, binding = 0, scope = 0;
  MPI_T_enum enumtype = MPI_T_ENUM_NULL;
  return MPI_T_cvar_get_info(index, cname, &name_len, &verbosity, &type, &enumtype, desc, &desc_len,
                             &binding, &scope) == MPI_SUCCESS;
}

// One control variable read through MPI_T (which must be initialised); false if this MPI has
// no variable of that name or it is not of the kind asked for.
inline bool mpit_read_int(const char* name, int& out) {
  int index = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  if (!mpit_find(name, index, type)) return false;
  const bool is_int = type == MPI_INT || type == MPI_UNSIGNED;
  const bool is_bool = type == MPI_C_BOOL;
  if (!is_int && !is_bool) return false;
  MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
  int count = 0;
  if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) != MPI_SUCCESS) return false;
  alignas(8) unsigned char buf[16] = {};
  const bool ok = count == 1 && MPI_T_cvar_read(handle, buf) == MPI_SUCCESS;
  MPI_T_cvar_handle_free(&handle);
  if (!ok) return false;
  if (is_bool) {
    bool b = false;
    std::memcpy(&b, buf, sizeof b);
    out = b ? 1 : 0;
  } else {
    std::memcpy(&out, buf, sizeof out);
  }
  return true;
}

inline bool mpit_read_string(const char* name, std::string& out) {
  int index = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  if (!mpit_find(name, index, type) || type != MPI_CHAR) return false;
  MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
  int count = 0;
  if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) != MPI_SUCCESS) return false;
  // Open MPI copies the whole string (strcpy) and reports a count of 2048: leave room for a
  // longer one, a path for instance.
  std::vector<char> buf(static_cast<std::size_t>(count > 0 ? count : 0) + 65536, '\0');
  const bool ok = MPI_T_cvar_read(handle, buf.data()) == MPI_SUCCESS;
  MPI_T_cvar_handle_free(&handle);
  if (!ok) return false;
  buf.back() = '\0';
  out = buf.data();
  return true;
}

// Whether Open MPI's `coll` selection string ("a,b" includes only those, "^a,b" excludes
// those; empty: all) lets `component` run.
inline bool coll_selected(std::string_view list, std::string_view component) {
  if (list.empty()) return true;
  const bool exclude = list.front() == '^';
  if (exclude) list.remove_prefix(1);
  bool named = false;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    named = named || item == component;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return exclude ? !named : named;
}

inline std::string tuned_forced_name(int a) {
  switch (a) {
    case 1: return "basic_linear";
    case 2: return "nonoverlapping";
    case 3: return "recursive_doubling";
    case 4: return "ring";
    case 5: return "segmented_ring";
    case 6: return "rabenseifner";
    default: return "algorithm " + std::to_string(a);
  }
}

inline std::string libnbc_forced_name(int a) {
  switch (a) {
    case 1: return "ring";
    case 2: return "binomial";
    case 3: return "rabenseifner";
    case 4: return "recursive_doubling";
    default: return "algorithm " + std::to_string(a);
  }
}

}  // namespace detail

inline allreduce_algorithm mpi_allreduce_config::blocking(std::size_t count,
                                                          std::size_t element_size,
                                                          int ranks) const noexcept {
  if (ranks <= 1) return allreduce_algorithm::single_rank;
  if (!readable || !tuned_serves) return allreduce_algorithm::unknown;
  if (blocking_rules_file) return allreduce_algorithm::rules_file;
  if (blocking_forced != 0) {
    return detail::tuned_algorithm(blocking_forced, count, element_size, ranks,
                                   blocking_segment_bytes);
  }
  // The fixed decision passes no segment size: its segmented ring is the plain ring.
  return detail::tuned_algorithm(detail::tuned_fixed_algorithm(count * element_size, ranks), count,
                                 element_size, ranks, 0);
}

inline allreduce_algorithm mpi_allreduce_config::nonblocking(std::size_t count,
                                                             std::size_t element_size, int ranks,
                                                             bool in_place) const noexcept {
  if (ranks <= 1) return allreduce_algorithm::single_rank;
  if (!readable || !libnbc_serves) return allreduce_algorithm::unknown;
  const std::size_t pof2 = detail::largest_power_of_two_at_most(static_cast<std::size_t>(ranks));
  switch (nonblocking_forced) {
    case 0:
      // nbc_allreduce_init: a binomial tree for fewer than 4 ranks, under 64 KiB, a
      // non-commutative operation, or any in-place call; otherwise Rabenseifner's where the
      // count splits, else the ring.
      if (ranks < 4 || count * element_size < 65536 || in_place)
        return allreduce_algorithm::binomial;
      return count >= pof2 ? allreduce_algorithm::rabenseifner : allreduce_algorithm::ring;
    case 2: return allreduce_algorithm::binomial;
    case 3: return count >= pof2 ? allreduce_algorithm::rabenseifner : allreduce_algorithm::ring;
    case 4: return allreduce_algorithm::recursive_doubling;
    default: return allreduce_algorithm::ring;  // 1, and libnbc's fallback for any other value
  }
}

inline mpi_allreduce_config mpi_allreduce_algorithms() {
  mpi_allreduce_config c;
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(version, &len) == MPI_SUCCESS) {
    c.library.assign(version, static_cast<std::size_t>(len > 0 ? len : 0));
    c.library = c.library.substr(0, c.library.find_first_of("\n,"));
    while (!c.library.empty() && (c.library.back() == ' ' || c.library.back() == '\0'))
      c.library.pop_back();
  }
  c.open_mpi = c.library.find("Open MPI") != std::string::npos;
  if (!c.open_mpi) return c;

  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return c;
  int nbc = 0;
  c.readable = detail::mpit_read_int("coll_libnbc_iallreduce_algorithm", nbc);
  if (c.readable) {
    c.nonblocking_forced = nbc;
    int dynamic = 0;
    int forced = 0;
    if (detail::mpit_read_int("coll_tuned_use_dynamic_rules", dynamic) && dynamic != 0) {
      std::string rules;
      c.blocking_rules_file =
          detail::mpit_read_string("coll_tuned_dynamic_rules_filename", rules) && !rules.empty();
      if (detail::mpit_read_int("coll_tuned_allreduce_algorithm", forced))
        c.blocking_forced = forced;
      int seg = 0;
      if (detail::mpit_read_int("coll_tuned_allreduce_algorithm_segmentsize", seg))
        c.blocking_segment_bytes = seg;
    }
    std::string coll;
    if (detail::mpit_read_string("coll", coll)) {
      c.tuned_serves = detail::coll_selected(coll, "tuned");
      c.libnbc_serves = detail::coll_selected(coll, "libnbc");
    }
    int tuned_priority = 30;
    int han_priority = 0;
    detail::mpit_read_int("coll_tuned_priority", tuned_priority);
    // coll/han takes MPI_Allreduce where its priority is higher and it is selected.
    if (detail::mpit_read_int("coll_han_priority", han_priority) && han_priority > tuned_priority &&
        (coll.empty() || detail::coll_selected(coll, "han")))
      c.tuned_serves = false;
    if (tuned_priority <= 0) c.tuned_serves = false;
  }
  MPI_T_finalize();
  return c;
}

inline std::string to_string(const mpi_allreduce_config& c) {
  std::string s = c.library.empty() ? std::string("an MPI library") : c.library;
  if (!c.open_mpi) return s + ": allreduce algorithms unknown (not Open MPI)";
  if (!c.readable) return s + ": allreduce algorithms unknown (MPI_T could not read them)";
  s += ": MPI_Allreduce ";
  if (!c.tuned_serves) {
    s += "not served by coll/tuned (unknown)";
  } else if (c.blocking_rules_file) {
    s += "coll/tuned rules file";
  } else if (c.blocking_forced != 0) {
    s += "coll/tuned forced " + detail::tuned_forced_name(c.blocking_forced);
  } else {
    s += "coll/tuned fixed decision (by size and ranks)";
  }
  s += "; MPI_Iallreduce ";
  if (!c.libnbc_serves) {
    s += "not served by coll/libnbc (unknown)";
  } else if (c.nonblocking_forced != 0) {
    s += "coll/libnbc forced " + detail::libnbc_forced_name(c.nonblocking_forced);
  } else {
    s += "coll/libnbc automatic (binomial tree for in-place calls, as pactrain's)";
  }
  return s;
}

inline std::string mpi_algorithm_warning(const mpi_allreduce_config& c, int ranks) {
  if (ranks < 2 || !c.binomial_nonblocking()) return {};
  return "pactrain: Open MPI's MPI_Iallreduce (coll/libnbc, coll_libnbc_iallreduce_algorithm "
         "0) runs every in-place call as a binomial tree, and pactrain's sync engine allreduces "
         "in place: large buckets then move through rank 0, slower than around a ring. Set "
         "OMPI_MCA_coll_libnbc_iallreduce_algorithm=1 (ring) in the environment of every rank; "
         "see pactrain's docs/guide/engine.md. PACTRAIN_MPI_ALGORITHM_WARNING=0 silences this.\n";
}

namespace detail {

// Prints mpi_algorithm_warning once per process, on rank 0 of MPI_COMM_WORLD, unless
// PACTRAIN_MPI_ALGORITHM_WARNING=0. Local; never throws.
inline void warn_mpi_algorithms_once(int ranks) noexcept {
  static std::atomic<bool> done{false};
  if (ranks < 2 || done.exchange(true)) return;
  try {
    const char* env = std::getenv("PACTRAIN_MPI_ALGORITHM_WARNING");
    if (env != nullptr && std::string_view(env) == "0") return;
    int world_rank = 0;
    if (MPI_Comm_rank(MPI_COMM_WORLD, &world_rank) != MPI_SUCCESS || world_rank != 0) return;
    const std::string text = mpi_algorithm_warning(mpi_allreduce_algorithms(), ranks);
    if (!text.empty()) std::fputs(text.c_str(), stderr);
  } catch (...) {  // a warning must not fail the construction it accompanies
  }
}

}  // namespace detail

}  // namespace pactrain
