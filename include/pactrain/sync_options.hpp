// The sync engine's settings and statistics, shared by the host and device engines.
#pragma once

#include <pactrain/strategy.hpp>

#include <cstddef>
#include <cstdint>

namespace pactrain {

struct sync_options {
  /// The strategy of every bucket until set_strategies changes it.
  bucket_strategy strategy = bucket_strategy::sparse;
  /// Checked steps (host engine): before a step's first collective, one small allreduce
  /// agrees that every rank's arguments are valid and that every rank submitted the same
  /// buckets in the same order; otherwise every rank throws the same pactrain::error and no
  /// buffer changes. All of the step's work then runs in finish_step (no overlap). The same on
  /// every rank (checked at construction).
  bool checked = false;
};

/// What the last step did on this rank, and totals since construction. The device engine's
/// *_seconds are host time spent queueing each phase (its device work is asynchronous).
struct sync_stats {
  std::uint64_t steps = 0;  // steps completed (non-finite ones too)
  /// Last step: buckets whose result holds an Inf or a NaN, the same count on every rank. When
  /// it is not 0 the step left the engine's state as it was (see guarantees).
  std::size_t nonfinite_buckets = 0;
  std::uint64_t nonfinite_steps = 0;  // steps with nonfinite_buckets != 0
  std::size_t collectives = 0;        // last step: allreduce collectives issued (scale rounds too)
  std::size_t bytes_sent = 0;         // last step: wire bytes handed to the allreduces (scales too)
  std::size_t dense_bytes = 0;        // last step: bytes a dense allreduce would hand over
  double gather_seconds = 0;          // last step: compaction into payloads, and encoding
  double allreduce_seconds = 0;       // last step: starting and waiting for the collectives
  double scatter_seconds = 0;         // last step: decoding, expansion, scaling and masking
  std::uint64_t total_bytes_sent = 0;
  double total_seconds = 0;
};

}  // namespace pactrain
