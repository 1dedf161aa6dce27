// Compaction: dense gradient -> payload of kept entries (gather), and back (scatter).
//
// A compactor turns a mask into a plan once (per mask version) and then runs gather and
// scatter with that plan every step. Payload entry k is the k-th kept entry in index order,
// so ranks holding the same mask produce payloads that add up elementwise.
#pragma once

#include <pactrain/concepts.hpp>
#include <pactrain/detail/buffer_checks.hpp>
#include <pactrain/detail/config.hpp>
#include <pactrain/detail/cpu.hpp>
#include <pactrain/detail/host_kernels.hpp>
#include <pactrain/error.hpp>
#include <pactrain/mask.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace pactrain {

/// Instruction sets of the host kernels. `automatic` takes the widest the CPU supports.
enum class host_isa { automatic, portable, avx2, avx512 };

/// How a host plan stores the kept entries: bitmap (one bit per entry; mid densities), runs
/// (maximal kept runs; structured masks) or indices (one 32-bit index each; very low densities).
/// `automatic` picks per mask from its density and mean run length (see options).
enum class plan_format { automatic, bitmap, runs, indices };

inline const char* to_string(host_isa isa) noexcept {
  switch (isa) {
    case host_isa::automatic: return "automatic";
    case host_isa::portable: return "portable";
    case host_isa::avx2: return "avx2";
    case host_isa::avx512: return "avx512";
  }
  return "?";
}

inline const char* to_string(plan_format f) noexcept {
  switch (f) {
    case plan_format::automatic: return "automatic";
    case plan_format::bitmap: return "bitmap";
    case plan_format::runs: return "runs";
    case plan_format::indices: return "indices";
  }
  return "?";
}

/// True when this CPU can run the kernels of `isa`.
inline bool isa_supported(host_isa isa) noexcept {
  switch (isa) {
    case host_isa::automatic:
    case host_isa::portable: return true;
    case host_isa::avx2: return detail::cpu().avx2;
    case host_isa::avx512: return detail::cpu().avx512;
  }
  return false;
}

/// The compactor for buffers in host memory.
class host_compactor {
 public:
  static constexpr memory_space memory = memory_space::host;

  struct options {
    host_isa isa = host_isa::automatic;
    plan_format format = plan_format::automatic;
    /// automatic format: runs when the mean run length reaches this many entries.
    std::size_t min_mean_run = 16;
    /// automatic format: indices when fewer than one entry in this many is kept.
    std::size_t sparse_ratio = 32;
    /// scatter writes a bitmap plan's output of at least this many bytes with non-temporal
    /// stores (AVX2: 16-byte aligned output; AVX-512: 64-byte). They bypass the caches:
    /// faster for outputs larger than the caches, slower for a small output read again soon.
    /// SIZE_MAX: never.
    std::size_t nontemporal_min_bytes = std::size_t{4} << 20;
  };

  /// A compaction plan for one tensor. Plans are plain values: copyable, independent of the
  /// mask they were built from, and usable by any host_compactor.
  class plan_type {
   public:
    plan_type() = default;
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] std::size_t count() const noexcept { return count_; }
    [[nodiscard]] plan_format format() const noexcept { return format_; }

   private:
    friend class host_compactor;
    struct run {
      std::size_t begin;
      std::size_t length;
    };
    std::size_t size_ = 0;
    std::size_t count_ = 0;
    plan_format format_ = plan_format::runs;
    std::vector<std::uint64_t> words_;    // bitmap; indices plans for a non-temporal scatter too
    std::vector<run> runs_;               // runs
    std::vector<std::uint32_t> indices_;  // indices
  };

  host_compactor() : host_compactor(options{}) {}

  /// Throws pactrain::error when the requested ISA is not available on this CPU.
  explicit host_compactor(options opt) : opt_(opt) {
    if (opt_.isa == host_isa::automatic) {
      opt_.isa = isa_supported(host_isa::avx512) ? host_isa::avx512
                 : isa_supported(host_isa::avx2) ? host_isa::avx2
                                                 : host_isa::portable;
    }
    PACTRAIN_EXPECTS(isa_supported(opt_.isa), std::string("host_compactor: this CPU does not "
                                                          "support the ") +
                                                  to_string(opt_.isa) + " kernels");
    PACTRAIN_EXPECTS(opt_.min_mean_run > 0 && opt_.sparse_ratio > 0,
                     "host_compactor: format thresholds must be positive");
  }

  /// The instruction set in use (never automatic).
  [[nodiscard]] host_isa isa() const noexcept { return opt_.isa; }
  [[nodiscard]] const options& config() const noexcept { return opt_; }

  template <gradient_mask Mask>
  [[nodiscard]] plan_type make_plan(const Mask& mask) const {
    plan_type p;
    p.size_ = mask.size();
    p.count_ = mask.count();
    const std::size_t runs = detail::run_count(mask);
    p.format_ = choose_format(p.size_, p.count_, runs);
    switch (p.format_) {
      case plan_format::bitmap:
        p.words_.reserve(detail::words_for(p.size_));
        detail::for_each_word(mask, [&](std::uint64_t w) { p.words_.push_back(w); });
        break;
      case plan_format::runs:
        p.runs_.reserve(runs);
        mask.for_each_run([&](std::size_t b, std::size_t len) { p.runs_.push_back({b, len}); });
        break;
      case plan_format::indices:
        p.indices_.reserve(p.count_);
        mask.for_each_run([&](std::size_t b, std::size_t len) {
          for (std::size_t i = b; i < b + len; ++i)
            p.indices_.push_back(static_cast<std::uint32_t>(i));
        });
        // An output large enough for non-temporal stores scatters faster through the bitmap
        // kernel, so such a plan keeps the words as well (n / 8 bytes).
        if (nontemporal_bytes(p.size_ * sizeof(float))) {
          p.words_.reserve(detail::words_for(p.size_));
          detail::for_each_word(mask, [&](std::uint64_t w) { p.words_.push_back(w); });
        }
        break;
      case plan_format::automatic: break;
    }
    return p;
  }

  /// payload[k] = dense[k-th kept index]. Throws pactrain::error (touching nothing) unless
  /// dense.size() == plan.size(), payload.size() == plan.count(), the buffers do not
  /// overlap and neither is null with a nonzero size.
  template <gradient_value T>
  void gather(const plan_type& plan, std::span<const T> dense, std::span<T> payload) const {
    check_buffers(plan, dense.data(), dense.size(), payload.data(), payload.size(), "gather");
    const T* in = dense.data();
    T* out = payload.data();
    switch (plan.format_) {
      case plan_format::runs: {
        std::size_t k = 0;
        for (const auto& r : plan.runs_) {
          std::memcpy(out + k, in + r.begin, r.length * sizeof(T));
          k += r.length;
        }
        break;
      }
      case plan_format::indices: {
        const std::uint32_t* idx = plan.indices_.data();
        for (std::size_t k = 0; k < plan.count_; ++k) out[k] = in[idx[k]];
        break;
      }
      case plan_format::bitmap: {
        const std::size_t full = plan.size_ / 64;
        std::size_t k = 0;
        switch (opt_.isa) {
#if PACTRAIN_HAS_X86_KERNELS
          case host_isa::avx512:
            // Below one kept entry per word on average the portable loop wins here too
            // (bench/results/measurements.md).
            k = plan.count_ * 64 < plan.size_
                    ? detail::gather_words_portable(plan.words_.data(), full, in, out, plan.count_)
                    : detail::gather_words_avx512(plan.words_.data(), full, in, out, plan.count_);
            break;
          case host_isa::avx2:
            // The AVX2 kernel permutes every byte of a word without branching. Below 1/8
            // density the portable loop wins: it skips zero words without loading them.
            k = plan.count_ * 8 < plan.size_
                    ? detail::gather_words_portable(plan.words_.data(), full, in, out, plan.count_)
                    : detail::gather_words_avx2(plan.words_.data(), full, in, out, plan.count_);
            break;
#endif
          default:
            k = detail::gather_words_portable(plan.words_.data(), full, in, out, plan.count_);
        }
        if (full < plan.words_.size())
          detail::gather_word(plan.words_[full], in + 64 * full, out + k);
        break;
      }
      case plan_format::automatic: break;
    }
  }

  /// dense[i] = factor * payload[rank(i)] at kept entries and +0 at pruned ones; every entry
  /// of dense is written. Preconditions as for gather.
  template <gradient_value T>
  void scatter(const plan_type& plan, std::span<const T> payload, std::span<T> dense,
               T factor) const {
    check_buffers(plan, dense.data(), dense.size(), payload.data(), payload.size(), "scatter");
    const T* p = payload.data();
    T* out = dense.data();
    switch (plan.format_) {
      case plan_format::runs: {
        std::size_t k = 0;
        std::size_t pos = 0;
        for (const auto& r : plan.runs_) {
          std::fill(out + pos, out + r.begin, T(0));
          copy_times(p + k, out + r.begin, r.length, factor);
          k += r.length;
          pos = r.begin + r.length;
        }
        std::fill(out + pos, out + plan.size_, T(0));
        break;
      }
      case plan_format::indices: {
        if (!plan.words_.empty() && nontemporal<T>(plan, out, nontemporal_alignment())) {
          scatter_bitmap(plan, p, out, factor);
          break;
        }
        const std::uint32_t* idx = plan.indices_.data();
        std::size_t pos = 0;
        for (std::size_t k = 0; k < plan.count_; ++k) {
          std::fill(out + pos, out + idx[k], T(0));
          out[idx[k]] = p[k] * factor;
          pos = std::size_t{idx[k]} + 1;
        }
        std::fill(out + pos, out + plan.size_, T(0));
        break;
      }
      case plan_format::bitmap: scatter_bitmap(plan, p, out, factor); break;
      case plan_format::automatic: break;
    }
  }

 private:
  [[nodiscard]] plan_format choose_format(std::size_t size, std::size_t count,
                                          std::size_t runs) const noexcept {
    const bool indices_fit = size <= std::size_t{std::numeric_limits<std::uint32_t>::max()} + 1;
    if (opt_.format != plan_format::automatic) {
      return opt_.format == plan_format::indices && !indices_fit ? plan_format::bitmap
                                                                 : opt_.format;
    }
    if (runs <= 1 || count >= opt_.min_mean_run * runs) return plan_format::runs;
    if (indices_fit && count * opt_.sparse_ratio < size) return plan_format::indices;
    return plan_format::bitmap;
  }

  // The AVX2 and AVX-512 scatters write a large enough output with non-temporal stores when it
  // is aligned to them: 16 bytes for AVX2's, 64 for AVX-512's.
  [[nodiscard]] bool nontemporal_bytes(std::size_t bytes) const noexcept {
    return (opt_.isa == host_isa::avx2 || opt_.isa == host_isa::avx512) &&
           bytes >= opt_.nontemporal_min_bytes;
  }
  // The alignment from which an output takes non-temporal stores: AVX-512's want 64 bytes, but
  // on Intel an output aligned to 16 only takes them through the AVX2 kernel (see
  // scatter_bitmap).
  [[nodiscard]] std::size_t nontemporal_alignment() const noexcept {
    return opt_.isa == host_isa::avx512 && !detail::cpu().intel ? 64 : 16;
  }
  template <class T>
  [[nodiscard]] bool nontemporal(const plan_type& plan, const T* out,
                                 std::size_t align) const noexcept {
    return nontemporal_bytes(plan.size_ * sizeof(T)) &&
           reinterpret_cast<std::uintptr_t>(out) % align == 0;
  }

  // Scatter over plan.words_ (a bitmap plan, or an indices plan that kept its words).
  template <class T>
  void scatter_bitmap(const plan_type& plan, const T* p, T* out, T factor) const noexcept {
    const std::size_t full = plan.size_ / 64;
    std::size_t k = 0;
    switch (opt_.isa) {
#if PACTRAIN_HAS_X86_KERNELS
      case host_isa::avx512: {
        // On Intel a large output aligned to 16 bytes but not 64 (std::vector's large
        // buffers are) takes non-temporal stores through the AVX2 kernel, which every AVX-512 CPU
        // runs: there each plain 512-bit store spans two cache lines, which more than doubled the
        // time on an Intel Xeon. On an AMD EPYC the AVX-512 kernel measured faster than the AVX2
        // one on the same kind of buffers, so other CPUs keep it (bench/results/measurements.md).
        const bool wide = nontemporal(plan, out, 64);  // AVX-512's own non-temporal stores
        if (!wide && nontemporal(plan, out, nontemporal_alignment())) {
          k = detail::scatter_words_avx2(plan.words_.data(), full, p, out, factor, plan.count_,
                                         true);
        } else {
          k = detail::scatter_words_avx512(plan.words_.data(), full, p, out, factor, plan.count_,
                                           wide);
        }
        break;
      }
      case host_isa::avx2:
        k = detail::scatter_words_avx2(plan.words_.data(), full, p, out, factor, plan.count_,
                                       nontemporal(plan, out, 16));
        break;
#endif
      default:
        k = detail::scatter_words_portable(plan.words_.data(), full, p, out, factor, plan.count_);
    }
    if (full < plan.words_.size()) {
      detail::scatter_word(plan.words_[full], plan.size_ - 64 * full, p + k, out + 64 * full,
                           factor);
    }
  }

  template <class T>
  static void copy_times(const T* src, T* dst, std::size_t n, T factor) noexcept {
    if (factor == T(1)) {
      std::memcpy(dst, src, n * sizeof(T));
    } else {
      for (std::size_t i = 0; i < n; ++i) dst[i] = src[i] * factor;
    }
  }

  template <class T>
  static void check_buffers(const plan_type& plan, const T* dense, std::size_t dense_size,
                            const T* payload, std::size_t payload_size, const char* op) {
    detail::check_compaction_buffers("host_compactor", op, plan.size_, plan.count_, dense,
                                     dense_size, payload, payload_size);
  }

  options opt_;
};

static_assert(compactor_for<host_compactor, bitmap_mask, float>);
static_assert(compactor_for<host_compactor, index_mask, double>);
static_assert(compactor_for<host_compactor, block_mask<32>, float>);

}  // namespace pactrain
