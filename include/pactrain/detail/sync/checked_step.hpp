// Checked steps (sync_options::checked): a rank's mistakes in a step are recorded, not thrown,
// until finish_step's agreement, which every rank reaches. begin records bad arguments, submit
// the order of submission (and bad bucket numbers).
#pragma once

#include <pactrain/detail/agreement.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/layout.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pactrain::detail {

class checked_step {
 public:
  /// A new step over `buckets` buckets (no allocation once sized).
  void open(std::size_t buckets) {
    error_.clear();
    order_.clear();
    order_.reserve(buckets);
    requested_.assign(buckets, 0);
  }

  /// Records this rank's first mistake of the step.
  void fail(std::string what) {
    if (error_.empty()) error_ = std::move(what);
  }

  /// submit_bucket(b): remembered in order, or recorded as a mistake.
  void request(std::size_t b) {
    if (!error_.empty()) return;
    if (b >= requested_.size()) {
      fail("sync::submit_bucket: bucket " + std::to_string(b) + " of " +
           std::to_string(requested_.size()));
    } else if (requested_[b] != 0) {
      fail("sync::submit_bucket: bucket " + std::to_string(b) +
           " was already submitted in this step");
    } else {
      requested_[b] = 1;
      order_.push_back(b);
    }
  }

  /// The buckets submitted, in order.
  [[nodiscard]] std::span<const std::uint64_t> order() const noexcept { return order_; }

  /// finish_step's agreement round: this rank's verdict (`open`: whether a step is open) and
  /// its submission order, with what is committed. Hands over the recorded mistake.
  [[nodiscard]] agreement_input agreement(const param_layout& layout, bool open,
                                          std::uint64_t codec_digest,
                                          std::span<const std::uint64_t> mask_digests) {
    agreement_input a;
    a.layout = &layout;
    a.operation = "finish_step";
    a.config_name = "bucket submission orders";
    a.local_error =
        open ? std::move(error_) : "sync::finish_step: no step is open (call begin_step)";
    error_.clear();
    a.config_digest = digest_builder(0x6f726472).add(order()).value();  // "ordr"
    a.codec_digest = codec_digest;
    a.mask_digests = mask_digests;
    return a;
  }

 private:
  std::string error_;                    // this rank's first mistake in the step
  std::vector<std::uint64_t> order_;     // buckets in order of submit_bucket
  std::vector<std::uint8_t> requested_;  // per bucket
};

}  // namespace pactrain::detail
