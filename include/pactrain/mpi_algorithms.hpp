// Which algorithms the MPI library's allreduces will run, read from Open MPI's control variables
// through the MPI tool interface (MPI_T, MPI-3), and the one warning pactrain gives about them.
//
// Needs MPI (link pactrain::mpi). pactrain's engine allreduces its buckets with in-place
// MPI_Iallreduce. Open MPI 4.1's coll/libnbc, left to choose (coll_libnbc_iallreduce_algorithm
// 0, the default), runs every in-place call as a binomial tree (reduce to rank 0, then
// broadcast), whatever the size: docs/guide/engine.md#open-mpis-allreduce-algorithms.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace pactrain {

/// An allreduce algorithm, as Open MPI's coll/tuned and coll/libnbc name them.
enum class allreduce_algorithm : std::uint8_t {
  unknown,             // not Open MPI, its settings unreadable, or another component serves it
  single_rank,         // one rank: nothing travels
  ring,                // reduce-scatter and allgather around a ring
  segmented_ring,      // the ring, pipelined in segments (coll/tuned only)
  binomial,            // reduce to rank 0 along a binomial tree, then broadcast (coll/libnbc)
  rabenseifner,        // recursive-halving reduce-scatter, then recursive-doubling allgather
  recursive_doubling,  // log2(P) exchanges of the whole vector
  basic_linear,        // reduce to rank 0, then broadcast, linearly (coll/tuned)
  nonoverlapping,      // MPI_Reduce, then MPI_Bcast (coll/tuned)
  rules_file,          // coll/tuned's dynamic rules file decides, per size
};

/// "ring", "binomial", ... (the names Open MPI's MCA parameters use, with '_' for ' ').
inline const char* to_string(allreduce_algorithm a) noexcept {
  constexpr const char* names[] = {
      "unknown",      "single_rank",        "ring",         "segmented_ring", "binomial",
      "rabenseifner", "recursive_doubling", "basic_linear", "nonoverlapping", "rules_file"};
  return names[static_cast<int>(a)];
}

/// How the MPI library picks its allreduce algorithms: for Open MPI, the control variables of
/// coll/tuned (MPI_Allreduce) and coll/libnbc (MPI_Iallreduce) as this process sees them.
/// blocking() and nonblocking() apply Open MPI 4.1's decision rules to one call
/// (ompi_coll_tuned_allreduce_intra_dec_fixed and nbc_allreduce_init), for commutative
/// operations (all of pactrain's).
struct mpi_allreduce_config {
  std::string library;  // the first line of MPI_Get_library_version
  bool open_mpi = false;
  bool readable = false;  // Open MPI, and the control variables below were read through MPI_T
  // coll_libnbc_iallreduce_algorithm: 0 automatic; 1 ring, 2 binomial, 3 rabenseifner,
  // 4 recursive doubling.
  int nonblocking_forced = 0;
  // coll_tuned_allreduce_algorithm where coll_tuned_use_dynamic_rules is true, else 0 (the
  // fixed decision): 1 basic linear, 2 nonoverlapping, 3 recursive doubling, 4 ring,
  // 5 segmented ring, 6 rabenseifner.
  int blocking_forced = 0;
  int blocking_segment_bytes = 0;    // coll_tuned_allreduce_algorithm_segmentsize
  bool blocking_rules_file = false;  // dynamic rules with coll_tuned_dynamic_rules_filename
  bool tuned_serves = true;          // coll/tuned is neither excluded nor outranked by coll/han
  bool libnbc_serves = true;         // coll/libnbc is not excluded

  /// The algorithm of an MPI_Allreduce of `count` elements of `element_size` bytes on `ranks`.
  [[nodiscard]] allreduce_algorithm blocking(std::size_t count, std::size_t element_size,
                                             int ranks) const noexcept;
  /// The algorithm of an MPI_Iallreduce; pactrain's are in place.
  [[nodiscard]] allreduce_algorithm nonblocking(std::size_t count, std::size_t element_size,
                                                int ranks, bool in_place = true) const noexcept;
  /// True where a large in-place MPI_Iallreduce on 2 or more ranks runs a binomial tree:
  /// Open MPI with coll_libnbc_iallreduce_algorithm left at 0.
  [[nodiscard]] bool binomial_nonblocking() const noexcept {
    return readable && libnbc_serves && nonblocking_forced == 0;
  }
};

/// Reads how the MPI library will pick its allreduce algorithms. Local (not collective); MPI
/// must be initialised. Never throws for an MPI without MPI_T or these variables: the fields
/// it cannot read stay at their defaults and `readable` is false.
inline mpi_allreduce_config mpi_allreduce_algorithms();

/// One line: the library, then how MPI_Allreduce and MPI_Iallreduce choose.
inline std::string to_string(const mpi_allreduce_config& c);

/// The warning the MPI communicator prints once, on rank 0 of MPI_COMM_WORLD, for a
/// communicator of `ranks` ranks; empty where there is nothing to warn of. The environment
/// variable PACTRAIN_MPI_ALGORITHM_WARNING=0 silences it (the text is still returned).
inline std::string mpi_algorithm_warning(const mpi_allreduce_config& c, int ranks);

}  // namespace pactrain

// The decision rules of Open MPI 4.1 and the MPI_T reads behind the declarations above.
#include <pactrain/detail/mpi_algorithms_impl.hpp>
