// pactrain/torch_data_parallel.hpp: data_parallel, the LibTorch adapter's common case in one
// object (part of <pactrain/torch.hpp>; CMake target pactrain::torch).
//
//   pactrain::data_parallel dp(*model, pactrain::mpi_communicator{MPI_COMM_WORLD},
//                              {.optimizer = pactrain::sgd_options{.lr = 0.05, .momentum = 0.9}});
//   for (...) {
//     dp.zero_grad();        // instead of optimizer.zero_grad()
//     loss.backward();       // each bucket leaves as soon as its gradients are written
//     dp.step();             // instead of optimizer.step(): averaged, checked, then SGD
//   }
//
// Named data_parallel in namespace pactrain, not pactrain::torch: a namespace of that name
// would hide LibTorch's ::torch inside namespace pactrain.
#pragma once

#include <pactrain/adam.hpp>
#include <pactrain/codec.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/error.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/pruning/policies.hpp>
#include <pactrain/pruning/pruner.hpp>
#include <pactrain/pruning/schedule.hpp>
#include <pactrain/serialize.hpp>
#include <pactrain/sgd.hpp>
#include <pactrain/sync.hpp>
#include <pactrain/sync_options.hpp>
#include <pactrain/torch_overlap.hpp>
#include <pactrain/torch_params.hpp>

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace pactrain {

/// Gradual magnitude pruning for data_parallel: the pruned fraction of the prunable tensors
/// (torch_options::prunable) grows from 0 to `sparsity` between the fractions `start` and
/// `end` of `total_steps`, in `updates` mask updates (gradual_schedule::over_run).
struct data_parallel_pruning {
  double sparsity = 0;  // 0: no pruning (dense)
  std::uint64_t total_steps = 0;
  double start = 0.1;
  double end = 0.6;
  std::uint64_t updates = 20;
  pruning_scope scope = pruning_scope::per_tensor;
};

/// What data_parallel takes besides the module, the communicator and the codec.
struct data_parallel_options {
  torch_options params = {};  // buckets, which tensors may be pruned
  /// The optimizer: pactrain::sgd or pactrain::adam (torch::optim::SGD's, Adam's and AdamW's
  /// arithmetic; adamw_options() for AdamW).
  std::variant<sgd_options, adam_options> optimizer = sgd_options{};
  data_parallel_pruning pruning = {};  // none by default
  sync_options sync = {};              // the engine's
  /// Each step every rank checks that the module's weights and gradients are still the
  /// buffers bound at construction, and one 8-byte MAX allreduce brings any rank's finding to
  /// every rank, which all throw the same pactrain::error. Off: no collective, and a rank that
  /// finds one throws alone (its peers then wait in their next collective).
  bool check_bindings = true;
};

/// A LibTorch module trained data-parallel: binds its parameters and gradients to flat buffers
/// (torch_params), broadcasts rank 0's weights, sends each bucket from backward's hooks
/// (torch_overlap) through a sync engine, and owns the optimizer step and the pruner. Not
/// copyable or movable; the module must outlive it.
template <communicator Comm, class Codec = identity_codec<float>>
class data_parallel {
 public:
  using engine_type = sync<Comm, Codec>;

  /// Collective: every rank builds the same model and passes the same options.
  data_parallel(::torch::nn::Module& module, Comm comm, data_parallel_options o = {},
                Codec codec = {})
      : params_(module, checked(o).params),
        sync_(std::move(comm), params_.layout(), std::move(codec), o.sync),
        overlap_(params_, sync_),
        opt_(make_optimizer(o.optimizer)),
        rank_(sync_.get_communicator().rank()),
        ranks_(sync_.get_communicator().size()),
        check_(o.check_bindings) {
    if (const auto& pr = o.pruning; pr.sparsity > 0) {
      pruner_.emplace(
          magnitude_pruning{.scope = pr.scope},
          gradual_schedule::over_run(pr.total_steps, pr.start, pr.end, pr.sparsity, pr.updates),
          params_.prunable());
    }
    if (std::holds_alternative<adam>(opt_)) second_.assign(params_.values().size(), 0.0f);
    params_.broadcast(sync_.get_communicator());
    for (const auto& p : params_.parameters()) {
      weights_.push_back(p.data_ptr());
      grads_.push_back(p.grad().data_ptr());
    }
  }
  data_parallel(const data_parallel&) = delete;
  data_parallel& operator=(const data_parallel&) = delete;

  /// Local: zeroes the gradients in place and opens the step (instead of the optimizer's
  /// zero_grad, which would unbind them).
  void zero_grad() { overlap_.begin_step(); }

  /// Local: while the returned guard lives, backward passes only add into the gradients; the
  /// next pass sends them (DDP's no_sync). zero_grad(), passes under no_sync(), one last pass,
  /// step(): one sync of the accumulated gradients.
  [[nodiscard]] auto no_sync() { return overlap_.no_sync(); }

  /// Collective: completes the step's sync (the mean over ranks, +0 at pruned entries), then
  /// the optimizer step (skipped after a non-finite step, as GradScaler does: see
  /// skipped_steps()), then the pruner. Throws pactrain::error, every rank alike, when a
  /// gradient or weight is no longer the bound buffer or a gradient was written twice; the
  /// weights are then unchanged.
  void step() {
    PACTRAIN_EXPECTS(sync_.step_open(),
                     "data_parallel::step: no step is open (call zero_grad() before backward)");
    std::uint64_t fault = local_fault();
    sync_.finish_step();
    if (check_) {
      sync_.get_communicator().allreduce(std::span<std::uint64_t>(&fault, 1), reduce_op::max);
    }
    if (fault != 0) PACTRAIN_FAIL(describe(fault));
    if (sync_.stats().nonfinite_buckets != 0) {
      ++skipped_;
    } else {
      if (auto* a = std::get_if<adam>(&opt_)) {
        a->step(params_.values(), params_.grads(), params_.momentum(), second_);
      } else {
        std::get<sgd>(opt_).step(params_.values(), params_.grads(), params_.momentum());
      }
    }
    if (pruner_ && pruner_->step(sync_, params_.values_const())) {
      params_.apply_masks(sync_.masks());  // the weights and the momentum (Adam's first moment)
      if (!second_.empty()) apply_masks(params_.layout(), sync_.masks(), std::span<float>(second_));
    }
  }

  /// Local, between steps: this rank's checkpoint, for load(): weights, the optimizer's
  /// state and steps, the pruner's masks and schedule position, and the engine's state (its
  /// step counter, error feedback's residuals, saved scales), versioned and checksummed.
  /// Every rank saves its own (residuals differ by rank).
  [[nodiscard]] std::vector<std::byte> save() {
    const auto head = std::as_bytes(std::span<const char>(magic));
    std::vector<std::byte> out(head.begin(), head.end());
    detail::put_u32(out, version);
    detail::put_u32(out, static_cast<std::uint32_t>(ranks_));
    detail::put_u32(out, static_cast<std::uint32_t>(rank_));
    detail::put_u32(out, static_cast<std::uint32_t>(opt_.index()));
    detail::put_u64(out, params_.layout().digest());
    detail::put_u64(out, std::visit([](const auto& o) { return o.steps(); }, opt_));
    detail::put_u64(out, skipped_);
    put_floats(out, params_.values());
    put_floats(out, params_.momentum());
    put_floats(out, second_);
    put_bytes(out, pruner_ ? pruner_->save(sync_) : std::vector<std::byte>{});
    put_bytes(out, sync_.save_state());
    detail::put_u64(out, detail::checksum(out));
    return out;
  }
  /// Collective, between steps: resumes from this rank's save(), bit for bit: the next steps
  /// compute what the saved run's next steps computed. A checkpoint that is corrupt, of
  /// another rank, rank count, model, optimizer or pruning setting makes every rank throw the
  /// same pactrain::error, naming the rank, before anything changes.
  void load(std::span<const std::byte> in) {
    std::uint64_t fault = check_checkpoint(in);
    sync_.get_communicator().allreduce(std::span<std::uint64_t>(&fault, 1), reduce_op::max);
    if (fault != 0) {
      PACTRAIN_FAIL("data_parallel::load: rank " + std::to_string((fault >> 32) & 0xffffff) +
                    "'s checkpoint " + checkpoint_fault(fault >> 56));
    }
    reader r{in, header_bytes};
    const std::uint64_t steps = detail::get_u64(in, 32);
    const std::uint64_t skipped = detail::get_u64(in, 40);
    const auto values = r.bytes();
    const auto momentum = r.bytes();
    const auto second = r.bytes();
    const auto pruner_bytes = r.bytes();
    const auto state = r.bytes();
    if (pruner_) pruner_->load(sync_, pruner_bytes);  // collective; checks its own bytes
    sync_.load_state(state);                          // collective; after the masks
    std::memcpy(params_.values().data(), values.data(), values.size());
    std::memcpy(params_.momentum().data(), momentum.data(), momentum.size());
    if (!second_.empty()) std::memcpy(second_.data(), second.data(), second.size());
    std::visit([&](auto& o) { o.set_steps(steps); }, opt_);
    skipped_ = skipped;
  }

  [[nodiscard]] engine_type& engine() noexcept { return sync_; }
  [[nodiscard]] torch_params& params() noexcept { return params_; }
  /// The optimizer (pactrain::sgd or pactrain::adam) and its state: SGD's momentum or Adam's
  /// first moment is params().momentum(); Adam's second moment is second_moment().
  [[nodiscard]] std::variant<sgd, adam>& optimizer() noexcept { return opt_; }
  [[nodiscard]] std::span<const float> second_moment() const noexcept { return second_; }
  /// A new learning rate for the next steps (e.g. from a schedule).
  void set_lr(double lr) {
    std::visit([&](auto& o) { o.set_lr(lr); }, opt_);
  }
  /// The last step's statistics (bytes sent, collectives, phase times): engine().stats().
  [[nodiscard]] const sync_stats& stats() const noexcept { return sync_.stats(); }
  /// Steps whose optimizer step was skipped because a bucket came back non-finite.
  [[nodiscard]] std::uint64_t skipped_steps() const noexcept { return skipped_; }

 private:
  // A fault word: its kind, the rank and the parameter, so that MAX over ranks picks one
  // finding that every rank can describe (names are the same everywhere).
  enum fault_kind : std::uint64_t { twice = 1, grad_unset, grad_other, weight_other };
  static std::uint64_t fault_word(fault_kind k, int rank, std::size_t param) noexcept {
    return (static_cast<std::uint64_t>(k) << 56) |
           (static_cast<std::uint64_t>(rank & 0xffffff) << 32) | (param & 0xffffffffu);
  }

  // Pointer compares only: a few nanoseconds a parameter.
  [[nodiscard]] std::uint64_t local_fault() const {
    const int rank = rank_;
    const auto& ps = params_.parameters();
    for (std::size_t i = 0; i < ps.size(); ++i) {
      if (ps[i].data_ptr() != weights_[i]) return fault_word(weight_other, rank, i);
      const auto& g = ps[i].grad();
      if (!g.defined()) return fault_word(grad_unset, rank, i);
      if (g.data_ptr() != grads_[i]) return fault_word(grad_other, rank, i);
    }
    return overlap_.written_twice() ? fault_word(twice, rank, 0) : 0;
  }

  [[nodiscard]] std::string describe(std::uint64_t fault) const {
    const auto kind = static_cast<fault_kind>(fault >> 56);
    const std::string rank = std::to_string((fault >> 32) & 0xffffff);
    const std::string name = params_.names()[fault & 0xffffffffu];
    const std::string head = "data_parallel::step: on rank " + rank + ", ";
    switch (kind) {
      case twice:
        return head +
               "a gradient was written twice in one step (one backward pass per step, or "
               "all but the last under no_sync())";
      case grad_unset:
        return head + "the gradient of '" + name +
               "' is undefined: it was set to none (Module::zero_grad() and "
               "Optimizer::zero_grad() do so by default); call data_parallel::zero_grad()";
      case grad_other:
        return head + "the gradient of '" + name +
               "' is not the bound buffer: set to none and recreated by backward "
               "(Module::zero_grad(), Optimizer::zero_grad()) or assigned a new tensor "
               "(mutable_grad() = ...); call data_parallel::zero_grad() only";
      case weight_other:
        return head + "'" + name +
               "' is not the bound buffer: the module was moved or converted (to(), "
               "set_data) after data_parallel was built; build it after such calls";
    }
    return head + "unknown fault";
  }

  // The options' own checks, before the module's parameters are bound.
  static const data_parallel_options& checked(const data_parallel_options& o) {
    if (const auto& pr = o.pruning; pr.sparsity > 0) {
      PACTRAIN_EXPECTS(pr.total_steps > 0,
                       "data_parallel: pruning needs total_steps (the run's optimizer steps)");
      (void)gradual_schedule::over_run(pr.total_steps, pr.start, pr.end, pr.sparsity, pr.updates);
    }
    (void)make_optimizer(o.optimizer);
    return o;
  }

  static constexpr char magic[8] = {'P', 'T', 'R', 'N', 'D', 'P', 'C', 'K'};
  static constexpr std::uint32_t version = 1;
  static constexpr std::size_t header_bytes = 48;  // magic, 4 u32, digest, steps, skipped

  static void put_bytes(std::vector<std::byte>& out, std::span<const std::byte> b) {
    detail::put_u64(out, b.size());
    out.insert(out.end(), b.begin(), b.end());
  }
  static void put_floats(std::vector<std::byte>& out, std::span<const float> f) {
    put_bytes(out, std::as_bytes(f));
  }
  // Length-prefixed sections, read in order; empty once a length runs past the end.
  struct reader {
    std::span<const std::byte> in;
    std::size_t at;
    bool ok = true;
    std::span<const std::byte> bytes() {
      if (!ok || in.size() - at < 8) return fail();
      const std::uint64_t n = detail::get_u64(in, at);
      at += 8;
      if (in.size() - at < n) return fail();
      const auto b = in.subspan(at, static_cast<std::size_t>(n));
      at += static_cast<std::size_t>(n);
      return b;
    }
    std::span<const std::byte> fail() {
      ok = false;
      return {};
    }
  };

  // 0, or a fault word (kind << 56 | rank << 32) for this rank's checkpoint.
  [[nodiscard]] std::uint64_t check_checkpoint(std::span<const std::byte> in) {
    const auto word = [&](std::uint64_t kind) {
      return (kind << 56) | (static_cast<std::uint64_t>(rank_ & 0xffffff) << 32);
    };
    if (in.size() < header_bytes + 8 || std::memcmp(in.data(), magic, sizeof magic) != 0 ||
        detail::get_u32(in, 8) != version ||
        detail::checksum(in.first(in.size() - 8)) != detail::get_u64(in, in.size() - 8)) {
      return word(1);
    }
    if (detail::get_u32(in, 12) != static_cast<std::uint32_t>(ranks_) ||
        detail::get_u32(in, 16) != static_cast<std::uint32_t>(rank_)) {
      return word(2);
    }
    if (detail::get_u64(in, 24) != params_.layout().digest()) return word(3);
    if (detail::get_u32(in, 20) != static_cast<std::uint32_t>(opt_.index())) return word(4);
    reader r{in.first(in.size() - 8), header_bytes};
    const std::size_t n = params_.values().size() * sizeof(float);
    const bool sizes = r.bytes().size() == n && r.bytes().size() == n &&
                       r.bytes().size() == second_.size() * sizeof(float);
    const bool pruning = !r.bytes().empty() == pruner_.has_value();
    (void)r.bytes();
    if (!r.ok || !sizes || r.at != in.size() - 8) return word(1);
    if (!pruning) return word(5);
    return 0;
  }
  static std::string checkpoint_fault(std::uint64_t kind) {
    switch (kind) {
      case 2: return "was saved by another rank or with another number of ranks";
      case 3: return "was saved from another model (its parameters' layout differs)";
      case 4: return "was saved with another optimizer";
      case 5: return "was saved with another pruning setting";
      default: return "is corrupt or truncated";
    }
  }

  static std::variant<sgd, adam> make_optimizer(const std::variant<sgd_options, adam_options>& o) {
    if (const auto* a = std::get_if<adam_options>(&o)) return adam(*a);
    return sgd(std::get<sgd_options>(o));
  }

  torch_params params_;
  engine_type sync_;
  torch_overlap<engine_type> overlap_;
  std::variant<sgd, adam> opt_;
  std::vector<float> second_;  // Adam's second moment, laid out as the parameters
  std::optional<pruner<magnitude_pruning, gradual_schedule>> pruner_;
  std::vector<const void*> weights_;  // per parameter: its bound data and gradient
  std::vector<const void*> grads_;
  int rank_ = 0;
  int ranks_ = 1;
  bool check_ = true;
  std::uint64_t skipped_ = 0;
};

}  // namespace pactrain
