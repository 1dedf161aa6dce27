// The LibTorch language model as a task of examples::torch_train (common/torch_train.hpp): a
// small decoder-only transformer over bytes, the English text of Debian's `fortunes` split
// into training and validation fortunes, and each rank's windows of it. Used by
// pactrain_torch_lm (main.cpp) and by bench/e2e's pactrain_e2e_torch (lm).
#pragma once

#include <pactrain/torch.hpp>  // first: LibTorch's glog macros must not meet others

#include "common/cli.hpp"
#include "common/run_report.hpp"
#include "common/torch_train.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

namespace examples::torch_lm {

inline constexpr const char* default_data_dir = "/usr/share/games/fortunes";

struct model_config {
  std::int64_t layers = 2;
  std::int64_t dim = 128;
  std::int64_t heads = 4;
  std::int64_t context = 64;
};

/// Pre-norm transformer block: x + attention(ln(x)), then x + mlp(ln(x)), the MLP 4x wide with
/// GELU.
struct block_impl : torch::nn::Module {
  block_impl(std::int64_t dim, std::int64_t heads)
      : heads(heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        qkv(register_module("qkv", torch::nn::Linear(dim, 3 * dim))),
        proj(register_module("proj", torch::nn::Linear(dim, dim))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc1(register_module("fc1", torch::nn::Linear(dim, 4 * dim))),
        fc2(register_module("fc2", torch::nn::Linear(4 * dim, dim))) {}

  /// x [b, t, d]; `future` [t, t] is true where a position would see a later one.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& future) {
    const std::int64_t b = x.size(0);
    const std::int64_t t = x.size(1);
    const std::int64_t d = x.size(2);
    const std::int64_t hd = d / heads;
    // [3, b, heads, t, hd]
    const torch::Tensor q_k_v =
        qkv->forward(ln1->forward(x)).view({b, t, 3, heads, hd}).permute({2, 0, 3, 1, 4});
    torch::Tensor att =
        torch::matmul(q_k_v[0], q_k_v[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    att = torch::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
    const torch::Tensor y = torch::matmul(att, q_k_v[2]).transpose(1, 2).reshape({b, t, d});
    const torch::Tensor h = x + proj->forward(y);
    return h + fc2->forward(torch::gelu(fc1->forward(ln2->forward(h))));
  }

  std::int64_t heads;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv;
  torch::nn::Linear proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};
TORCH_MODULE_IMPL(block, block_impl);

/// Byte embedding + learned positions -> blocks -> layer norm -> logits over 256 bytes.
struct lm_impl : torch::nn::Module {
  explicit lm_impl(const model_config& c)
      : tok(register_module("tok", torch::nn::Embedding(256, c.dim))),
        pos(register_parameter("pos", torch::zeros({c.context, c.dim}))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        head(register_module("head", torch::nn::Linear(c.dim, 256))),
        future(torch::ones({c.context, c.context}, torch::kBool).triu(1)) {
    for (std::int64_t i = 0; i < c.layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), block(c.dim, c.heads)));
    // GPT-2's initialisation: N(0, 0.02) weights, zero biases, and the projections that
    // write into the residual stream scaled down by sqrt(2 x layers).
    torch::NoGradGuard no_grad;
    const double resid = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
    for (auto& p : named_parameters()) {
      const std::string& name = p.key();
      if (p.value().dim() < 2) {
        if (name.ends_with(".bias")) p.value().zero_();
        continue;
      }
      const bool writes_residual = name.ends_with("proj.weight") || name.ends_with("fc2.weight");
      p.value().normal_(0.0, writes_residual ? resid : 0.02);
    }
  }

  /// bytes [b, t] (int64) -> logits [b, t, 256].
  torch::Tensor forward(const torch::Tensor& bytes) {
    const std::int64_t t = bytes.size(1);
    torch::Tensor x = tok->forward(bytes) + pos.narrow(0, 0, t);
    const torch::Tensor f = future.narrow(0, 0, t).narrow(1, 0, t);
    for (auto& b : blocks) x = b->forward(x, f);
    return head->forward(ln_f->forward(x));
  }

  torch::nn::Embedding tok;
  torch::Tensor pos;
  std::vector<block> blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head;
  torch::Tensor future;
};
TORCH_MODULE_IMPL(lm, lm_impl);

/// The fortune files of `dir` split into fortunes (lines holding only "%" separate them);
/// every tenth fortune is held out for validation. Each fortune keeps its text and its
/// separator, so both splits read like the files.
struct corpus {
  std::string train;
  std::string valid;
  std::size_t files = 0;
  std::size_t fortunes = 0;
};

inline corpus read_fortunes(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    // The .dat indexes are binary; the .u8 names are links to the text files.
    const auto ext = e.path().extension();
    if (e.is_symlink() || !e.is_regular_file() || ext == ".dat" || ext == ".u8") continue;
    files.push_back(e.path());
  }
  if (ec) throw pactrain::error("cannot read the folder " + dir + ": " + ec.message());
  if (files.empty()) {
    throw pactrain::error("no fortune files in " + dir +
                          " (apt-get install fortunes, or pass --data DIR)");
  }
  std::sort(files.begin(), files.end());
  corpus c;
  c.files = files.size();
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw pactrain::error("cannot open " + f.string());
    std::string fortune;
    std::string line;
    while (std::getline(in, line)) {
      fortune += line;
      fortune += '\n';
      if (line != "%") continue;
      (c.fortunes % 10 == 9 ? c.valid : c.train) += fortune;
      ++c.fortunes;
      fortune.clear();
    }
    if (!fortune.empty()) {
      (c.fortunes % 10 == 9 ? c.valid : c.train) += fortune + "%\n";
      ++c.fortunes;
    }
  }
  return c;
}

/// The language model's task for examples::torch_train. An epoch cuts the training text into
/// windows of context + 1 bytes from a random offset and shuffles them, the same on every
/// rank; rank r takes windows r, r + P, ... A window's loss is the mean cross-entropy of its
/// last `context` bytes given those before. Validation reads the held-out text in disjoint
/// windows shared among the ranks and sums the loss over every predicted byte.
class lm_task {
 public:
  lm_task(const corpus& c, const model_config& m, int rank, int ranks, std::uint64_t seed)
      : config_(m),
        train_(bytes_of(c.train)),
        valid_(bytes_of(c.valid)),
        rank_(rank),
        ranks_(ranks),
        seed_(seed) {
    const auto n = static_cast<std::int64_t>(c.train.size());
    // The same count for every offset in [0, context): n / context - 1 windows fit.
    windows_ = std::max<std::int64_t>(0, n / m.context - 1);
    span_ = torch::arange(m.context + 1, torch::kInt64);
  }

  [[nodiscard]] lm model() const { return lm(config_); }
  [[nodiscard]] std::size_t local_samples() const {
    const std::int64_t mine = windows_ > rank_ ? (windows_ - rank_ + ranks_ - 1) / ranks_ : 0;
    return static_cast<std::size_t>(mine);
  }

  void begin_epoch(int epoch) {
    std::mt19937_64 rng(seed_ * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(epoch));
    const auto offset =
        static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(config_.context));
    std::vector<std::int64_t> order(static_cast<std::size_t>(windows_));
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::int64_t> starts;
    for (std::size_t i = static_cast<std::size_t>(rank_); i < order.size();
         i += static_cast<std::size_t>(ranks_)) {
      starts.push_back(offset + order[i] * config_.context);
    }
    starts_ = torch::tensor(starts, torch::kInt64);
  }

  torch::Tensor loss(lm& model, std::int64_t at, std::int64_t n) {
    const torch::Tensor rows = train_.index({starts_.narrow(0, at, n).unsqueeze(1) + span_});
    return cross_entropy(model, rows, /*sum=*/false);
  }

  void evaluate(lm& model, examples::epoch_record& rec, MPI_Comm comm) const {
    const std::int64_t t = config_.context;
    const std::int64_t windows = (valid_.size(0) - 1) / t;
    double sums[2] = {0, 0};  // nats, bytes predicted
    std::vector<std::int64_t> starts;
    for (std::int64_t w = rank_; w < windows; w += ranks_) starts.push_back(w * t);
    for (std::size_t at = 0; at < starts.size(); at += 64) {
      const std::size_t n = std::min<std::size_t>(64, starts.size() - at);
      const torch::Tensor s = torch::tensor(
          std::vector<std::int64_t>(starts.begin() + static_cast<std::ptrdiff_t>(at),
                                    starts.begin() + static_cast<std::ptrdiff_t>(at + n)),
          torch::kInt64);
      const torch::Tensor rows = valid_.index({s.unsqueeze(1) + span_});
      sums[0] += cross_entropy(model, rows, /*sum=*/true).item<double>();
      sums[1] += static_cast<double>(n) * static_cast<double>(t);
    }
    MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, comm);
    rec.val_loss = sums[0] / sums[1];
    rec.val_bpb = rec.val_loss / std::numbers::ln2;
  }

 private:
  static torch::Tensor bytes_of(const std::string& s) {
    std::vector<std::int64_t> v(s.begin(), s.end());
    for (auto& b : v) b &= 0xff;  // char may be signed
    return torch::tensor(v, torch::kInt64);
  }

  /// rows [n, context + 1]: the cross-entropy of bytes 1.. given the bytes before each, the
  /// mean over the bytes or (`sum`) their sum.
  [[nodiscard]] torch::Tensor cross_entropy(lm& model, const torch::Tensor& rows, bool sum) const {
    namespace F = torch::nn::functional;
    const std::int64_t t = config_.context;
    const torch::Tensor logits = model->forward(rows.narrow(1, 0, t)).reshape({-1, 256});
    const torch::Tensor target = rows.narrow(1, 1, t).reshape({-1});
    if (sum)
      return F::cross_entropy(logits, target, F::CrossEntropyFuncOptions().reduction(torch::kSum));
    return F::cross_entropy(logits, target);
  }

  model_config config_;
  torch::Tensor train_;
  torch::Tensor valid_;
  std::int64_t rank_;
  std::int64_t ranks_;
  std::uint64_t seed_;
  std::int64_t windows_ = 0;
  torch::Tensor span_;
  torch::Tensor starts_;
};

/// Reads the model's option `a` with value `v` into `m`; false if `a` is not one of
/// --layers, --dim, --heads, --context.
inline bool parse_model_option(const std::string& a, const std::string& v, model_config& m) {
  if (a == "--layers") {
    m.layers = static_cast<std::int64_t>(to_count(a, v));
  } else if (a == "--dim") {
    m.dim = static_cast<std::int64_t>(to_count(a, v));
  } else if (a == "--heads") {
    m.heads = static_cast<std::int64_t>(to_count(a, v));
  } else if (a == "--context") {
    m.context = static_cast<std::int64_t>(to_count(a, v));
  } else {
    return false;
  }
  return true;
}

/// The usage lines of parse_model_option's options.
inline constexpr const char* model_usage = "[--layers N] [--dim D] [--heads H] [--context T]";

/// Throws pactrain::error unless `m` describes a model that can be built.
inline void check_model(const model_config& m) {
  if (m.layers < 1 || m.dim < 1 || m.heads < 1 || m.context < 1 || m.dim % m.heads != 0)
    throw pactrain::error(
        "need positive --layers, --dim, --heads and --context, --dim a multiple of --heads");
}

/// The model in words.
inline std::string describe(const model_config& m) {
  return "byte-level decoder-only transformer: " + std::to_string(m.layers) + " layers, width " +
         std::to_string(m.dim) + ", " + std::to_string(m.heads) + " heads, context " +
         std::to_string(m.context);
}

/// The language model's recipe: 3 epochs of 16 windows per rank, lr 0.4 (5% warm-up, cosine
/// to 0), momentum 0.9, no weight decay, the averaged gradient clipped to norm 1, the matrices
/// pruned to 80% by one global ranking over 30% to 90% of the steps, 128 kept entries per
/// ternary scale.
inline void default_recipe(torch_cli& c) {
  torch_run_options& r = c.run;
  r.epochs = 3;
  r.batch = 16;
  r.lr = 0.4;
  r.shape.warmup = 0.05;
  r.momentum = 0.9;
  r.weight_decay = 0.0;
  r.clip = 1.0;
  r.prune_start = 0.3;
  r.prune_end = 0.9;
  r.scope = pactrain::pruning_scope::global;
  c.sparsity = 0.8;
  c.ternary_block = 128;
}

/// Collective: the corpus read from `dir` on every rank (the first `train_limit` and
/// `val_limit` bytes of each split; 0: all), checked against the model's context; the ranks
/// agree on the outcome before any other collective (a failure is printed once, on rank 0,
/// after `program`).
inline bool load(const std::string& dir, std::size_t train_limit, std::size_t val_limit,
                 const model_config& m, corpus& c, MPI_Comm comm, const char* program) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string failure;
  try {
    c = read_fortunes(dir);
    if (train_limit > 0 && c.train.size() > train_limit) c.train.resize(train_limit);
    if (val_limit > 0 && c.valid.size() > val_limit) c.valid.resize(val_limit);
    const auto need = static_cast<std::size_t>(m.context) + 1;
    if (c.valid.size() < need || c.train.size() < 2 * need)
      throw pactrain::error("the text is too short for --context " + std::to_string(m.context));
  } catch (const std::exception& e) {
    failure = e.what();
  }
  int failed = failure.empty() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, comm);
  if (failed != 0 && rank == 0) {
    std::fprintf(stderr, "%s: %s\n", program,
                 failure.empty() ? "another rank could not read the text" : failure.c_str());
  }
  return failed == 0;
}

}  // namespace examples::torch_lm
