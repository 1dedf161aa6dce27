// The agreement's check: do all ranks hold the same layout, masks and bucket strategies?
//
// One allreduce(MAX) of a few words on the common path; a second round and a broadcast only
// when something disagrees, to name the first mismatching tensor identically on every rank.
// A rank that rejected its own input takes part all the same, so no rank is left waiting in
// a collective and every rank throws; when several ranks reject theirs, the message of the
// highest-numbered one is reported.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace pactrain::detail {

/// The input checks of a mask or strategy commit, shared by the host and device engines:
/// one mask per tensor, each of its tensor's size, and one strategy per bucket. Throws
/// pactrain::error; the caller turns it into the agreement's local error.
template <class Mask>
void check_commit_sizes(const param_layout& layout, const std::vector<Mask>& masks,
                        std::size_t strategies) {
  PACTRAIN_EXPECTS(masks.size() == layout.tensor_count(),
                   std::to_string(masks.size()) + " masks given for " +
                       std::to_string(layout.tensor_count()) + " tensors");
  PACTRAIN_EXPECTS(strategies == layout.buckets().size(),
                   std::to_string(strategies) + " strategies given for " +
                       std::to_string(layout.buckets().size()) + " buckets");
  for (std::size_t i = 0; i < masks.size(); ++i) {
    const auto& t = layout.tensors()[i];
    PACTRAIN_EXPECTS(masks[i].size() == t.size,
                     "mask of tensor '" + t.name + "' has " + std::to_string(masks[i].size()) +
                         " entries, the tensor " + std::to_string(t.size));
  }
}

struct agreement_input {
  const param_layout* layout = nullptr;  // nullptr: the call agrees on no layout (calibration)
  std::span<const std::uint64_t> mask_digests;    // one per tensor; unused when local_error is set
  std::uint64_t config_digest = 0;                // e.g. the bucket strategies
  const char* config_name = "bucket strategies";  // what config_digest covers, for messages
  std::uint64_t codec_digest = 0;                 // the codec's settings
  std::string local_error;                        // non-empty: this rank rejected its input
  const char* operation = "";                     // for messages, e.g. "set_masks"
};

inline std::uint64_t tensor_digest(const tensor_info& t) {
  return digest_builder(0x74656e73)  // "tens"
      .add(t.name)
      .add(static_cast<std::uint64_t>(t.size))
      .add(static_cast<std::uint64_t>(t.rows))
      .add(static_cast<std::uint64_t>(t.cols))
      .value();
}

// A fixed-size text buffer sent from `root` to everyone.
template <communicator Comm>
std::string broadcast_text(Comm& comm, int root, const std::string& text) {
  std::array<std::byte, 1024> buf{};
  if (comm.rank() == root) {
    std::memcpy(buf.data(), text.data(), std::min(text.size(), buf.size() - 1));
  }
  comm.broadcast(std::span<std::byte>(buf), root);
  const char* s = reinterpret_cast<const char*>(buf.data());
  return std::string(s, std::find(s, s + buf.size(), '\0'));
}

inline std::string strip_prefix(std::string s) {
  const std::string prefix = "pactrain: ";
  if (s.starts_with(prefix)) s.erase(0, prefix.size());
  return s;
}

/// Words of the agreement's common-path round (one allreduce, MAX).
inline constexpr std::size_t agreement_words = 11;

/// Throws the same pactrain::error on every rank unless all ranks agree. Collective.
template <communicator Comm>
void agree(Comm& comm, const agreement_input& in) {
  static const param_layout none;
  const param_layout& layout = in.layout != nullptr ? *in.layout : none;
  const bool failed = !in.local_error.empty();
  const std::uint64_t tensors = layout.tensor_count();
  const std::uint64_t ld = layout.digest();
  const std::uint64_t md = failed ? 0 : digest_builder(0x616c6c6d).add(in.mask_digests).value();
  const std::uint64_t cd = in.config_digest;
  const std::uint64_t kd = in.codec_digest;
  // max over ranks of x and of ~x gives max and ~min: all equal iff max == min.
  std::array<std::uint64_t, agreement_words> v = {
      failed ? static_cast<std::uint64_t>(comm.rank()) + 1 : 0,
      tensors,
      ~tensors,
      ld,
      ~ld,
      md,
      ~md,
      cd,
      ~cd,
      kd,
      ~kd};
  comm.allreduce(std::span<std::uint64_t>(v), reduce_op::max);
  const std::string op = in.operation;
  if (v[0] != 0) {
    const int root = static_cast<int>(v[0] - 1);
    const std::string msg = broadcast_text(comm, root, strip_prefix(in.local_error));
    PACTRAIN_FAIL(op + " rejected on rank " + std::to_string(root) + ": " + msg);
  }
  const auto same = [&](std::size_t i) { return v[i] == ~v[i + 1]; };
  if (!same(1)) {
    PACTRAIN_FAIL(op + ": layouts differ across ranks: between " + std::to_string(~v[2]) + " and " +
                  std::to_string(v[1]) + " tensors");
  }
  if (!same(3) || !same(5)) {
    std::vector<std::uint64_t> w(4 * tensors);
    for (std::size_t i = 0; i < tensors; ++i) {
      const std::uint64_t t = tensor_digest(layout.tensors()[i]);
      w[4 * i] = t;
      w[4 * i + 1] = ~t;
      w[4 * i + 2] = in.mask_digests[i];
      w[4 * i + 3] = ~in.mask_digests[i];
    }
    comm.allreduce(std::span<std::uint64_t>(w), reduce_op::max);
    for (std::size_t i = 0; i < tensors; ++i) {
      const bool layout_same = w[4 * i] == ~w[4 * i + 1];
      const bool mask_same = w[4 * i + 2] == ~w[4 * i + 3];
      if (layout_same && mask_same) continue;
      const std::string name = broadcast_text(comm, 0, layout.tensors()[i].name);
      PACTRAIN_FAIL(op + ": " + (layout_same ? "masks" : "layouts") +
                    " differ across ranks, first at tensor " + std::to_string(i) + " '" + name +
                    "' (name as on rank 0)");
    }
    PACTRAIN_FAIL(op + ": layouts differ across ranks: bucket capacities differ");
  }
  if (!same(7)) PACTRAIN_FAIL(op + ": " + in.config_name + " differ across ranks");
  if (!same(9)) {
    PACTRAIN_FAIL(op +
                  ": codec settings differ across ranks (codec options, value type or feedback)");
  }
}

}  // namespace pactrain::detail
