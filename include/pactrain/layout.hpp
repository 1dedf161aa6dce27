// param_layout: the ordered, named tensors of a model's gradient, and their buckets.
#pragma once

#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pactrain {

/// One tensor of a layout: `size` entries at `offset` in the flat gradient buffer, with an
/// optional rows x cols shape (row-major) for structured pruning.
struct tensor_info {
  std::string name;
  std::size_t offset = 0;
  std::size_t size = 0;
  std::size_t rows = 0;  // 0 when the tensor has no matrix shape
  std::size_t cols = 0;
  std::size_t bucket = 0;  // index of the bucket holding it
};

/// A contiguous run of whole tensors synchronised by one collective.
struct bucket_info {
  std::size_t first_tensor = 0;
  std::size_t tensor_count = 0;
  std::size_t offset = 0;  // of its first entry in the flat buffer
  std::size_t size = 0;    // entries
};

/// A gradient's tensors in order, back to back in one flat buffer, grouped greedily into buckets
/// of at most `bucket_capacity()` entries (tensors are never split; a larger one gets a bucket of
/// its own). Every rank must build the same layout; the sync engine checks digest().
class param_layout {
 public:
  /// Default bucket capacity: 4 Mi entries (16 MiB of float).
  static constexpr std::size_t default_bucket_capacity = std::size_t{1} << 22;

  param_layout() = default;
  explicit param_layout(std::size_t bucket_capacity) { set_bucket_capacity(bucket_capacity); }

  /// Appends a 1-D tensor. Throws pactrain::error for an empty or duplicate name.
  param_layout& add(std::string name, std::size_t size) {
    return add_impl(std::move(name), size, 0, 0);
  }

  /// Appends a rows x cols (row-major) tensor.
  param_layout& add(std::string name, std::size_t rows, std::size_t cols) {
    PACTRAIN_EXPECTS(cols == 0 || rows <= static_cast<std::size_t>(-1) / cols,
                     "param_layout: tensor '" + name + "' shape overflows");
    return add_impl(std::move(name), rows * cols, rows, cols);
  }

  /// Sets the bucket capacity in entries (> 0) and regroups the tensors.
  param_layout& set_bucket_capacity(std::size_t entries) {
    PACTRAIN_EXPECTS(entries > 0, "param_layout: bucket capacity must be positive");
    capacity_ = entries;
    rebucket();
    return *this;
  }

  [[nodiscard]] std::size_t bucket_capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t tensor_count() const noexcept { return tensors_.size(); }
  [[nodiscard]] std::size_t total_size() const noexcept { return total_; }
  [[nodiscard]] const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const std::vector<bucket_info>& buckets() const noexcept { return buckets_; }
  [[nodiscard]] const tensor_info& tensor(std::size_t i) const {
    PACTRAIN_EXPECTS(i < tensors_.size(), "param_layout: tensor index " + std::to_string(i) +
                                              " out of range (" + std::to_string(tensors_.size()) +
                                              " tensors)");
    return tensors_[i];
  }

  /// Index of the tensor called `name`, if any.
  [[nodiscard]] std::optional<std::size_t> find(std::string_view name) const noexcept {
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].name == name) return i;
    }
    return std::nullopt;
  }

  /// Equal for equal layouts (names, shapes, order, bucketing) on every machine.
  [[nodiscard]] std::uint64_t digest() const {
    digest_builder d(0x6c61796f);  // "layo"
    d.add(static_cast<std::uint64_t>(capacity_)).add(static_cast<std::uint64_t>(tensors_.size()));
    for (const auto& t : tensors_) {
      d.add(t.name).add(static_cast<std::uint64_t>(t.size));
      d.add(static_cast<std::uint64_t>(t.rows)).add(static_cast<std::uint64_t>(t.cols));
    }
    return d.value();
  }

  friend bool operator==(const param_layout& a, const param_layout& b) noexcept {
    if (a.capacity_ != b.capacity_ || a.tensors_.size() != b.tensors_.size()) return false;
    for (std::size_t i = 0; i < a.tensors_.size(); ++i) {
      const auto& x = a.tensors_[i];
      const auto& y = b.tensors_[i];
      if (x.name != y.name || x.size != y.size || x.rows != y.rows || x.cols != y.cols)
        return false;
    }
    return true;
  }

 private:
  param_layout& add_impl(std::string name, std::size_t size, std::size_t rows, std::size_t cols) {
    PACTRAIN_EXPECTS(!name.empty(), "param_layout: tensor names must not be empty");
    PACTRAIN_EXPECTS(!find(name), "param_layout: duplicate tensor name '" + name + "'");
    PACTRAIN_EXPECTS(size <= static_cast<std::size_t>(-1) / 16 - total_,
                     "param_layout: total size overflows");
    tensors_.push_back({std::move(name), total_, size, rows, cols, 0});
    total_ += size;
    rebucket();
    return *this;
  }

  void rebucket() {
    buckets_.clear();
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      auto& t = tensors_[i];
      if (buckets_.empty() ||
          (t.size > 0 && buckets_.back().size > 0 && buckets_.back().size + t.size > capacity_)) {
        buckets_.push_back({i, 0, t.offset, 0});
      }
      auto& b = buckets_.back();
      ++b.tensor_count;
      b.size += t.size;
      t.bucket = buckets_.size() - 1;
    }
  }

  std::size_t capacity_ = default_bucket_capacity;
  std::size_t total_ = 0;
  std::vector<tensor_info> tensors_;
  std::vector<bucket_info> buckets_;
};

}  // namespace pactrain
