// ternary_codec on device buffers: the per-entry functors and the device engine's scale and
// residual state. Internal.
//
// Every entry is rounded by the same arithmetic as the host codec (detail/ternary_lane.hpp),
// so a device step equals a host step bit for bit. Work items:
//   max_magnitude_op   one strided share of a scale block: max |x| as bits (NaN above Inf),
//                      merged with an atomic max into the block's word;
//   ternary_encode_op  one wire word: its lanes j hold entries j * words + w;
//   ternary_decode_op  one entry: (lane - P) * s / P, NaN where the scale is not finite.
// Scales travel as words holding float bits, reduced with MAX over ranks, as on the host.
// Error feedback keeps two residual buffers and a selector on the device: a step reads one and
// writes the other, and the selector flips at the end of the step only if every scale it used
// was finite, so a non-finite step leaves the residuals as they were without the host
// waiting to learn it. previous_max scales live on the device the same way: a step encodes
// with the last finite step's scales, its own round of local scales runs with its sums, and
// those become the next step's scales only if every one is finite. Whether any are valid yet
// (the first step after a commit falls back to current_max) is known on the host: a
// synchronous step learns it from its verdicts, a queued step counts as finite.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/codec/ternary.hpp>
#include <pactrain/cuda/detail/device_words.hpp>
#include <pactrain/detail/sync/workspace.hpp>
#include <pactrain/detail/ternary_lane.hpp>

#include <cuda/std/bit>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace pactrain::detail {

/// out[k] = max(out[k], the largest magnitude bits in block k). Item i: share i % shares of block
/// i / shares, entries strided by `shares` (adjacent items read adjacent entries).
struct max_magnitude_op {
  const float* in;
  std::size_t n;
  std::size_t block;   // entries per block (n for one scale)
  std::size_t shares;  // items per block
  std::uint64_t* out;

  _CCCL_HOST_DEVICE void operator()(std::size_t i) const noexcept {
    const std::size_t k = i / shares;
    const std::size_t first = k * block;
    const std::size_t end = first + block < n ? first + block : n;
    std::uint32_t m = 0;
    for (std::size_t e = first + i % shares; e < end; e += shares) {
      const std::uint32_t bits = cuda::std::bit_cast<std::uint32_t>(in[e]) & 0x7fffffffu;
      m = bits > m ? bits : m;
    }
    if (m != 0) atomic_max(out + k, m);
  }
};

/// Wire word w of a codec input of n entries: each lane is 1 + t, t in {-1, 0, 1}, rounded
/// stochastically from x = in (+ the residual read from residual[*select] with feedback, the
/// new one written to residual[1 - *select]).
struct ternary_encode_op {
  const float* in;
  std::uint32_t* wire;
  std::size_t n;
  std::size_t words;
  unsigned bits;
  scale_words scales;
  std::uint32_t k0;
  std::uint32_t k1;
  float* residual[2];  // null without feedback; the bucket's first codec input
  const int* select;

  _CCCL_HOST_DEVICE void operator()(std::size_t w) const noexcept {
    const int sel = residual[0] == nullptr ? 0 : *select;
    const float* r_in = residual[sel];
    float* r_out = residual[1 - sel];
    std::uint32_t word = 0;
    unsigned shift = 0;
    for (std::size_t e = w; e < n; e += words, shift += bits) {
      const float s = scales.of(e);
      float x = in[e];
      if (r_in != nullptr) x += r_in[e];
      const auto hi_key = static_cast<std::uint32_t>(static_cast<std::uint64_t>(e) >> 32) ^ k1;
      const std::uint32_t u = ternary_lane(
          x, ternary_inverse(s), ternary_random(static_cast<std::uint32_t>(e), hi_key, k0));
      word |= u << shift;
      if (r_out != nullptr) r_out[e] = ternary_residual(x, u, s);
    }
    wire[w] = word;
  }
};

/// out[e] = (lane - P) * (s / P): the mean of the ranks' ternary values; NaN at every entry
/// when the bucket's largest scale (`verdict`) is not finite (some rank's gradient held an Inf
/// or a NaN), as the host engine poisons the whole bucket.
struct ternary_decode_op {
  const std::uint32_t* wire;
  float* out;
  std::size_t words;
  unsigned bits;
  std::uint32_t ranks;
  scale_words scales;
  const std::uint64_t* verdict;

  _CCCL_HOST_DEVICE void operator()(std::size_t e) const noexcept {
    const std::uint32_t mask = bits == 32 ? ~0u : (1u << bits) - 1u;
    const auto lane = (wire[e % words] >> (static_cast<unsigned>(e / words) * bits)) & mask;
    const auto v = static_cast<std::int32_t>(lane - ranks);
    out[e] = finite_word(*verdict)
                 ? static_cast<float>(v) * (scales.of(e) / static_cast<float>(ranks))
                 : cuda::std::bit_cast<float>(0x7fc00000u);
  }
};

/// The step's verdict on the device: *ok = every bucket's scales finite (and, for a
/// synchronous step, every result); then flips the residual selector, if any, when it is.
/// One item: the words are one per bucket (its scale, or with scale blocks its largest one).
struct end_step_op {
  const std::uint64_t* words;  // per bucket (zero where it has no scale this step)
  std::size_t word_count;
  const std::uint64_t* round;  // finish_step's round (one scale per bucket), or none
  std::size_t round_count;
  const std::uint64_t* verdicts;  // a synchronous step's per-bucket flags (non-zero: not
  std::size_t verdict_count;      // finite), or none
  int* ok;
  int* select;  // null without feedback

  _CCCL_HOST_DEVICE void operator()(std::size_t) const noexcept {
    *ok = 0;
    for (std::size_t k = 0; k < word_count; ++k) {
      if (!finite_word(words[k])) return;
    }
    for (std::size_t k = 0; k < round_count; ++k) {
      if (!finite_word(round[k])) return;
    }
    for (std::size_t k = 0; k < verdict_count; ++k) {
      if (verdicts[k] != 0) return;
    }
    *ok = 1;
    if (select != nullptr) *select = 1 - *select;
  }
};

/// The device engine's ternary state for one commit: every bucket's scale words (submitted
/// buckets reduce theirs in place; finish_step packs the others into one round), with
/// feedback the two residual buffers and their selector, and with previous_max the last
/// finite step's scales.
template <class Exec>
class device_ternary {
 public:
  using stream_type = typename Exec::stream_type;
  template <class T>
  using buffer = typename Exec::template buffer<T>;

  device_ternary() = default;
  /// Zeroed state for workspace `w`, on `home`. May throw.
  device_ternary(const Exec& exec, const ternary_codec& codec, const workspace_layout& w,
                 bool feedback, stream_type home)
      : block_(codec.options().scale_block), keep_(codec.scale_from_previous_step()) {
    const std::size_t buckets = w.buckets();
    first_.assign(buckets + 1, 0);
    for (std::size_t b = 0; b < buckets; ++b) {
      first_[b + 1] = first_[b] + codec.scale_count(w.codec_input_of(b));
    }
    slot_.assign(buckets, nullptr);
    words_ = buffer<std::uint64_t>(first_.back(), home);
    if (block_ != 0) largest_ = buffer<std::uint64_t>(buckets, home);
    round_ = buffer<std::uint64_t>(first_.back(), home);
    if (feedback) {
      for (auto& r : residual_) {
        r = buffer<float>(w.codec_input_size(), home);
        exec.zero(r.data(), r.size(), home);
      }
      select_ = buffer<int>(1, home);
      exec.zero(select_.data(), 1, home);
    }
    if (keep_) {
      previous_ = buffer<std::uint64_t>(first_.back(), home);
      exec.zero(previous_.data(), previous_.size(), home);
    }
    if (feedback || keep_) ok_ = buffer<int>(1, home);
  }

  /// Bucket b's scale words.
  [[nodiscard]] std::size_t count(std::size_t b) const noexcept {
    return first_[b + 1] - first_[b];
  }

  /// A step opens: no bucket has scales yet, and finish_step's round is empty.
  void begin_step(const Exec& exec, stream_type s) {
    exec.zero(words_.data(), words_.size(), s);
    exec.zero(largest_.data(), largest_.size(), s);
    round_used_ = 0;
    std::fill(slot_.begin(), slot_.end(), nullptr);
    reuse_ = keep_ && ready_;
  }
  /// previous_max in force this step: every bucket encodes with the last finite step's scales
  /// and takes its own words (the next step's round, after the sums).
  [[nodiscard]] bool reusing() const noexcept { return reuse_; }
  /// The next step's round: every bucket's words.
  [[nodiscard]] std::span<std::uint64_t> next_round() noexcept {
    return {words_.data(), words_.size()};
  }
  /// Bucket b's scales of this step: its own words (submit_bucket reduces them alone), or the
  /// next ones of finish_step's round. Returns them.
  std::span<std::uint64_t> own(std::size_t b) noexcept {
    slot_[b] = words_.data() + first_[b];
    return {slot_[b], count(b)};
  }
  std::span<std::uint64_t> in_round(std::size_t b) noexcept {
    slot_[b] = round_.data() + round_used_;
    round_used_ += count(b);
    return {slot_[b], count(b)};
  }
  /// finish_step's round: every word in_round gave out.
  [[nodiscard]] std::span<std::uint64_t> round() noexcept { return {round_.data(), round_used_}; }
  [[nodiscard]] std::span<std::uint64_t> slots(std::size_t b) noexcept {
    return {slot_[b], count(b)};
  }

  /// slot[k] = max |in| over block k of the n entries.
  void local_scales(const Exec& exec, const float* in, std::size_t n, std::span<std::uint64_t> slot,
                    stream_type s) const {
    const std::size_t slots = slot.size();
    exec.zero(slot.data(), slots, s);
    const std::size_t block = block_ == 0 ? n : block_;
    constexpr std::size_t per_item = 256;
    const std::size_t shares = (block + per_item - 1) / per_item;
    exec.for_each(slots * shares, max_magnitude_op{in, n, block, shares, slot.data()}, s);
  }

  /// The scales bucket b encodes and decodes with this step: its reduced words, or the last
  /// finite step's (previous_max).
  [[nodiscard]] const std::uint64_t* used(std::size_t b) const noexcept {
    return reuse_ ? previous_.data() + first_[b] : slot_[b];
  }
  /// Once bucket b's words are reduced: the word decode's verdict reads (with scale blocks,
  /// their largest).
  void note_verdict(const Exec& exec, std::size_t b, stream_type s) {
    if (block_ != 0) exec.for_each(count(b), max_word_op{slot_[b], largest_.data() + b}, s);
  }

  /// Encodes n entries of `in` (bucket c.bucket's codec input, from codec input `at` on) with
  /// the scales it uses this step.
  void encode(const Exec& exec, const ternary_codec& codec, const codec_context& c, const float* in,
              std::size_t n, std::size_t at, std::uint32_t* wire, stream_type s) {
    const std::uint64_t* slot = used(c.bucket);
    const std::size_t words = codec.wire_size(n, c.size);
    const auto [k0, k1] = ternary_keys(codec.options().seed, c);
    ternary_encode_op op{in,
                         wire,
                         n,
                         words,
                         codec.lane_bits(c.size),
                         {slot, block_},
                         k0,
                         k1,
                         {nullptr, nullptr},
                         select_.data()};
    if (!residual_[0].empty()) {
      op.residual[0] = residual_[0].data() + at;
      op.residual[1] = residual_[1].data() + at;
    }
    exec.for_each(words, op, s);
  }

  /// out = the mean of bucket b's n entries from the summed wire; NaN at every entry when its
  /// words of this step are not finite.
  void decode(const Exec& exec, const ternary_codec& codec, int ranks, std::size_t b,
              const std::uint32_t* wire, float* out, std::size_t n, stream_type s) const {
    const ternary_decode_op op{wire,
                               out,
                               codec.wire_size(n, ranks),
                               codec.lane_bits(ranks),
                               static_cast<std::uint32_t>(ranks),
                               {used(b), block_},
                               block_ == 0 ? slot_[b] : largest_.data() + b};
    exec.for_each(n, op, s);
  }

  // --- the state across a resume (sync::save_state, load_state): error feedback's residuals
  // and previous_max's scales ---

  /// Residual entries (codec input order; none without feedback), and scale words.
  [[nodiscard]] std::size_t residual_count() const noexcept { return residual_[0].size(); }
  [[nodiscard]] std::size_t scale_word_count() const noexcept {
    return first_.empty() ? 0 : first_.back();
  }
  /// The residuals and scales the next step reads (zeros without previous_max, as the host
  /// engine saves), and whether the scales are valid; the last step must have finished.
  void download_state(const Exec& exec, std::span<float> residuals, std::span<float> scales,
                      bool& ready, stream_type s) const {
    std::fill(scales.begin(), scales.end(), 0.0f);
    ready = keep_ && ready_;
    if (!residual_[0].empty()) {
      int sel = 0;
      exec.download(&sel, select_.data(), 1, s);
      exec.download(residuals.data(), residual_[sel].data(), residuals.size(), s);
    }
    if (keep_) {
      std::vector<std::uint64_t> words(scales.size());
      exec.download(words.data(), previous_.data(), words.size(), s);
      for (std::size_t k = 0; k < words.size(); ++k) scales[k] = scale_of_word(words[k]);
    }
  }
  /// A loaded state in buffers of its own, and the residual buffer of the two it replaces.
  struct staged_state {
    buffer<float> residuals;
    int select = 0;
    buffer<std::uint64_t> scales;
    bool ready = false;
  };
  /// The state uploaded for install_state; the last step must have finished. May throw.
  [[nodiscard]] staged_state stage_state(const Exec& exec, std::span<const float> residuals,
                                         std::span<const float> scales, bool ready,
                                         stream_type s) const {
    staged_state r;
    if (!residual_[0].empty()) {
      exec.download(&r.select, select_.data(), 1, s);
      r.residuals = buffer<float>(residuals.size(), s);
      exec.upload(r.residuals.data(), residuals.data(), residuals.size(), s);
    }
    if (keep_) {
      std::vector<std::uint64_t> words(scales.size());
      for (std::size_t k = 0; k < words.size(); ++k) {
        words[k] = cuda::std::bit_cast<std::uint32_t>(scales[k]);
      }
      r.scales = buffer<std::uint64_t>(words.size(), s);
      exec.upload(r.scales.data(), words.data(), words.size(), s);
      r.ready = ready;
    }
    exec.synchronize(s);
    return r;
  }
  void install_state(staged_state&& r) noexcept {
    if (!residual_[0].empty()) residual_[r.select] = std::move(r.residuals);
    if (keep_) {
      previous_ = std::move(r.scales);
      ready_ = r.ready;
    }
  }

  /// Closes the step on the device: error feedback keeps the new residuals, and previous_max
  /// the step's scales, if all its scales were finite. `verdicts`: a synchronous step's
  /// per-bucket flags, which also see plain buckets; `next`: the next step's round ran (it
  /// does where any bucket has codec input).
  void end_step(const Exec& exec, stream_type s, std::span<const std::uint64_t> verdicts,
                bool next) {
    if (ok_.empty()) return;
    const bool blocks = block_ != 0;
    exec.for_each(1,
                  end_step_op{blocks ? largest_.data() : words_.data(),
                              blocks ? largest_.size() : words_.size(), round_.data(),
                              blocks ? 0 : round_used_, verdicts.data(), verdicts.size(),
                              ok_.data(), residual_[0].empty() ? nullptr : select_.data()},
                  s);
    if (!keep_) return;
    if (reuse_) {
      if (!next) return;
      exec.for_each(words_.size(), keep_scales_op{words_.data(), previous_.data(), ok_.data()}, s);
      return;
    }
    for (std::size_t b = 0; b < slot_.size(); ++b) {  // the buckets that had scales
      if (slot_[b] != nullptr) {
        exec.for_each(count(b), keep_scales_op{slot_[b], previous_.data() + first_[b], ok_.data()},
                      s);
      }
    }
  }
  /// After the step, on the host: previous_max's scales are valid from now on if the step was
  /// finite (`finite`: a synchronous step's verdict; a queued step counts as finite).
  void settle(bool finite) noexcept {
    if (keep_ && finite) ready_ = true;
  }

 private:
  std::size_t block_ = 0;
  bool keep_ = false;                 // previous_max
  bool ready_ = false;                // previous_ holds a finite step's scales
  bool reuse_ = false;                // this step encodes with them
  std::vector<std::size_t> first_;    // per bucket + 1: scale words before it
  std::vector<std::uint64_t*> slot_;  // per bucket: its scale words in this step, or null
  buffer<std::uint64_t> words_;
  buffer<std::uint64_t> round_;
  buffer<std::uint64_t> largest_;  // scale blocks: per bucket, its largest scale this step
  std::size_t round_used_ = 0;
  buffer<float> residual_[2];
  buffer<int> select_;
  buffer<std::uint64_t> previous_;  // previous_max: the last finite step's scale words
  buffer<int> ok_;                  // the step's verdict on the device
};

}  // namespace pactrain::detail
