// bucket_table<Exec>: what the device engine launches per bucket. Internal.
//
// At commit the engine uploads one table of every bucket's tensors (detail::bucket_tensor:
// plan pointers, tensor index, offset in the flat gradient buffer, payload slot, first work
// item), so that a bucket's gather and scatter are one launch each, whatever its tensors. A
// tensor's work items cover its quads for any alignment of its first entry, so the table does
// not depend on where the gradients are: each launch takes a dense_source (one buffer, or a
// device table of per-tensor pointers). Index-plan tensors write only kept entries: the
// scatter zeroes them first, one memset each.
#pragma once

#include <pactrain/compactor.hpp>
#include <pactrain/cuda/detail/device_compactor.hpp>
#include <pactrain/cuda/detail/device_ops.hpp>
#include <pactrain/detail/sync/workspace.hpp>
#include <pactrain/layout.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace pactrain::detail {

template <class Exec>
class bucket_table {
 public:
  using stream_type = typename Exec::stream_type;
  using plan_type = typename basic_device_compactor<Exec>::plan_type;

  bucket_table() = default;

  /// The table of `layout`'s buckets under the new `plans` and workspace `w`, uploaded on
  /// `stream` (ready for work queued after it there). May throw.
  bucket_table(const Exec& exec, const param_layout& layout, const workspace_layout& w,
               std::span<const plan_type> plans, stream_type stream) {
    using compactor = basic_device_compactor<Exec>;
    const auto& buckets = layout.buckets();
    std::vector<bucket_tensor> table;
    table.reserve(layout.tensor_count());
    launches_.resize(buckets.size());
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      auto& l = launches_[b];
      const auto& bk = buckets[b];
      l.first_entry = table.size();
      for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
        const auto& t = layout.tensors()[i];
        if (plans[i].format() == plan_format::indices && t.size != 0) {
          l.zero.push_back({i, t.offset, t.size});
        }
        const std::size_t items = compactor::bucket_items(plans[i]);
        if (items == 0) continue;  // empty tensor, or an index plan keeping nothing
        table.push_back(compactor::bucket_entry(
            plans[i], i, t.offset, w.tensor_payload[i] - w.bucket_payload[b], l.items));
        l.items += items;
      }
      l.entries = table.size() - l.first_entry;
    }
    table_ = typename Exec::template buffer<bucket_tensor>(table.size(), stream);
    // From pageable memory the copy is staged before this returns, so `table` may go away.
    exec.upload(table_.data(), table.data(), table.size(), stream);
  }

  /// Bucket b's kept entries of `grads` into `payload` (the bucket's first slot): one launch.
  template <class T, class W>
  void gather(const Exec& exec, std::size_t b, dense_source<T> grads, W* payload,
              stream_type stream) const {
    const auto& l = launches_[b];
    exec.for_each(l.items,
                  bucket_gather_op<T, W>{table_.data() + l.first_entry, l.entries, grads, payload},
                  stream);
  }

  /// `grads` = factor * payload at bucket b's kept entries, +0 at pruned ones: one launch,
  /// after a memset per index-plan tensor. `host_tensors`: the pointers of grads.tensors as
  /// the host knows them (empty for one buffer).
  template <class T, class W>
  void scatter(const Exec& exec, std::size_t b, const W* payload, dense_source<T> grads,
               std::span<T* const> host_tensors, T factor, stream_type stream) const {
    const auto& l = launches_[b];
    for (const auto& z : l.zero) {
      T* p = host_tensors.empty() ? grads.base + (z.offset - grads.origin) : host_tensors[z.tensor];
      exec.zero(p, z.size, stream);
    }
    exec.for_each(
        l.items,
        bucket_scatter_op<T, W>{table_.data() + l.first_entry, l.entries, payload, grads, factor},
        stream);
  }

 private:
  // Bucket b's tensors in the table, the work items of its launches, and the index-plan
  // tensors its scatter zeroes first.
  struct zeroed_tensor {
    std::size_t tensor;
    std::size_t offset;  // in the flat buffer
    std::size_t size;
  };
  struct bucket_launch {
    std::size_t first_entry = 0;
    std::size_t entries = 0;
    std::size_t items = 0;
    std::vector<zeroed_tensor> zero;
  };

  typename Exec::template buffer<bucket_tensor> table_;  // every bucket's, bucket after bucket
  std::vector<bucket_launch> launches_;
};

}  // namespace pactrain::detail
