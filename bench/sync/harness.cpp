// pactrain_sync_bench: time one gradient synchronisation across MPI ranks, for pactrain's
// compacted allreduce and the alternatives a user would otherwise pick.
//
// Build and run (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_sync_bench
//   mpiexec -n 2 build/bench/pactrain_sync_bench --bytes 16M --density 0.1 --method sparse
//   bench/netbed/setup.sh 4 1gbit
//   bench/netbed/launch.sh build/bench/pactrain_sync_bench --bytes 100M --density 0.1 --method
//   topk --csv
//
// Options:
//   --bytes N        dense gradient bytes (float32; suffixes k M G = 10^3.., Ki Mi Gi = 2^10..)
//   --density D      kept fraction, 0 < D <= 1 (sparse, topk; reported for all)
//   --method S[,S...]  dense | sparse | topk | fp16 | sparse-fp16 | sparse-ternary | auto |
//                    sparse-checked | sparse-ternary-checked;
//                    several, comma-separated, are timed side by side in one run: all are
//                    set up first, then the timed syncs take turns (one sync of each, in the
//                    order given, per iteration), and each prints its own row
//   --iters N        timed synchronisations (default 10)
//   --warmup N       untimed synchronisations first (default 2)
//   --tensor N       entries per tensor of the synthetic layout (default 4Mi; one bucket each)
//   --seed N         gradient and mask seed (default 1)
//   --pages P        huge (default): the gradient buffers on transparent huge pages
//                    (pactrain::huge_page_allocator), as a trainer that streams 100 MB per
//                    step would allocate them; small: plain std::allocator (4 KiB pages
//                    under Debian's default "madvise" setting)
//   --netdev IF      count the bytes IF really transmitted (from /sys/class/net) per sync
//   --verify         check the first synchronisation's result against a reference; exit 1
//                    on a mismatch
//   --csv            print one CSV row (rank 0) instead of the readable summary
//   --csv-header     print the CSV header line and exit (no MPI needed)
//
// Methods (what each rank sends per sync, n = dense entries, k = kept entries):
//   dense   one MPI_Allreduce (MPI_SUM, MPI_FLOAT, in place) of the whole gradient, then a
//           scale by 1/P: the plain dense baseline. It uses whatever allreduce algorithm Open
//           MPI picks or is told to (the testbed launcher forces ring). 4n bytes handed to the
//           collective.
//   sparse  pactrain::sync<mpi_communicator> (bitmap masks, host_compactor) with a random mask
//           of exactly k = round(D n) kept entries per tensor (random_pruning, the same seed on
//           every rank): compaction, one MPI_Iallreduce of k floats per bucket, expansion.
//           4k bytes.
//   topk    DGC-style Top-k: per rank, a = g + residual; select the k entries of largest |a|
//           (k the same as sparse's; the threshold is estimated on a 1% sample, then refined
//           exactly with std::nth_element over the candidates, ties broken by lower index);
//           MPI_Allgather of k (uint32 index, float value) pairs; accumulate every rank's pairs
//           into the dense result and scale by 1/P; error feedback: residual = a with the sent
//           entries zeroed. 8k bytes.
//   sparse-fp16     as sparse, the kept entries sent as IEEE half (pactrain::fp16_codec): 2k.
//   sparse-ternary  as sparse, the kept entries sent as ternary lanes with error feedback
//           (pactrain::ternary_codec, scale from a MAX allreduce per bucket): about k/2 bytes
//           at 4 ranks (8 lanes per 32-bit word), plus 8 bytes of scale per bucket.
//   sparse-checked, sparse-ternary-checked  as sparse and sparse-ternary with checked steps
//           (pactrain::sync_options::checked): one more agreement allreduce of 11 words per
//           step, before the step's first collective; the same bytes otherwise.
//   auto    the planner and the tuner: pactrain::calibrate_link times two allreduces once;
//           then, for an engine with the fp16 codec and one with ternary lanes and error
//           feedback, pactrain::calibrate_local times compaction and the codec at the size of
//           one bucket and the run's density, and pactrain::candidate_strategies gives the plans
//           worth timing from that cost model (the planner's per-bucket choice, and every
//           bucket on one bucket strategy). Those predicted within 3x of the best are timed
//           by pactrain::step_tuner, 3 syncs each in turn, and the fastest engine and plan
//           are kept (the readable summary lists them). The `plan` column names the codec and
//           the chosen bucket strategies, `predicted_s` the planner's prediction for it (empty
//           for the fixed methods).
//   fp16    as PyTorch's fp16_compress_hook: g / P rounded to IEEE half (round to nearest
//           even), one MPI_Allreduce of n 16-bit values with a user MPI_Op that adds two halves
//           in float and rounds the sum back to half (so every hop of the ring carries 2 bytes
//           per entry), then widened back to float. 2n bytes.
//
// Times: every timed sync starts after an MPI_Barrier; its time is the slowest rank's. The row
// gives the median, min and max over --iters. compute_s is the median (slowest rank) of the
// local work inside the sync: compaction and expansion for sparse, selection, packing and
// accumulation for topk, conversions for fp16, the scale for dense. compute_p_s is the part
// of it that grows with the number of ranks (topk's accumulation of P k pairs; 0 otherwise).
// wire_bytes (with --netdev) is the mean over ranks of what the interface transmitted per
// timed sync, headers and retransmissions included; bytes_sent is what a rank hands to the
// collective. `allreduce` is the algorithm the MPI library runs for the method's collective
// (pactrain::mpi_allreduce_algorithms(): coll/tuned's for dense and fp16's MPI_Allreduce,
// coll/libnbc's for the engines' in-place MPI_Iallreduce, "allgather" for topk; "unknown" where
// the MPI is not Open MPI); `allreduce_choice` says whether an MCA setting forced it ("forced")
// or the library chose ("library"). The readable summary starts with the settings' line.
#include "harness.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <string_view>
#include <utility>

namespace sync_bench {
namespace {

constexpr const char* csv_header =
    "method,ranks,bytes,density,median_s,min_s,max_s,bytes_sent,wire_bytes,compute_s,"
    "compute_p_s,iters,allreduce,plan,predicted_s,pages,allreduce_choice";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct method_entry {
  std::string_view name;
  std::unique_ptr<method> (*make)(const method_args&);
};

/// Every method, in the order of --method's help.
constexpr method_entry registry[] = {
    {"dense", make_dense},
    {"sparse", make_sparse},
    {"topk", make_topk},
    {"fp16", make_fp16},
    {"sparse-fp16", make_sparse_fp16},
    {"sparse-ternary", make_sparse_ternary},
    {"auto", make_auto},
    {"sparse-checked", make_sparse_checked},
    {"sparse-ternary-checked", make_sparse_ternary_checked},
};

const method_entry* find_method(std::string_view name) {
  for (const auto& m : registry) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

std::uint64_t parse_count(std::string_view opt, std::string_view s) {
  std::uint64_t mult = 1;
  std::string_view num = s;
  struct suffix {
    std::string_view text;
    std::uint64_t mult;
  };
  constexpr suffix suffixes[] = {{"Ki", 1ull << 10},  {"Mi", 1ull << 20}, {"Gi", 1ull << 30},
                                 {"k", 1000ull},      {"K", 1000ull},     {"M", 1000000ull},
                                 {"G", 1000000000ull}};
  for (const auto& sf : suffixes) {
    if (num.size() > sf.text.size() && num.ends_with(sf.text)) {
      mult = sf.mult;
      num.remove_suffix(sf.text.size());
      break;
    }
  }
  if (num.empty() || num.find_first_not_of("0123456789") != std::string_view::npos ||
      num.size() > 12) {
    throw usage_error(std::string(opt) + ": '" + std::string(s) +
                      "' is not a non-negative integer (with an optional k, M, G, Ki, Mi, Gi)");
  }
  return std::stoull(std::string(num)) * mult;
}

options parse(int argc, char** argv) {
  options o;
  auto value = [&](int& i) -> std::string_view {
    if (i + 1 >= argc) throw usage_error(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--bytes") {
      o.bytes = parse_count(a, value(i));
    } else if (a == "--density") {
      const std::string v(value(i));
      char* end = nullptr;
      o.density = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(o.density > 0.0 && o.density <= 1.0)) {
        throw usage_error("--density: '" + v + "' is not a number in (0, 1]");
      }
    } else if (a == "--method") {
      o.methods.clear();
      std::string_view list = value(i);
      for (;;) {
        const std::size_t comma = list.find(',');
        const std::string name(list.substr(0, comma));
        if (find_method(name) == nullptr) {
          throw usage_error(
              "--method: '" + name +
              "' is not dense, sparse, topk, fp16, sparse-fp16, sparse-ternary, auto, "
              "sparse-checked or sparse-ternary-checked");
        }
        if (std::find(o.methods.begin(), o.methods.end(), name) != o.methods.end()) {
          throw usage_error("--method: '" + name + "' is listed twice");
        }
        o.methods.push_back(name);
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
      }
    } else if (a == "--iters") {
      const auto n = parse_count(a, value(i));
      if (n < 1 || n > 1000000) throw usage_error("--iters: must be in 1..1000000");
      o.iters = static_cast<int>(n);
    } else if (a == "--warmup") {
      const auto n = parse_count(a, value(i));
      if (n > 1000000) throw usage_error("--warmup: must be in 0..1000000");
      o.warmup = static_cast<int>(n);
    } else if (a == "--tensor") {
      o.tensor = parse_count(a, value(i));
      if (o.tensor < 1) throw usage_error("--tensor: must be positive");
    } else if (a == "--pages") {
      const std::string_view v = value(i);
      if (v != "huge" && v != "small") throw usage_error("--pages: expected huge or small");
      o.huge_pages = v == "huge";
    } else if (a == "--seed") {
      o.seed = parse_count(a, value(i));
    } else if (a == "--netdev") {
      o.netdev = value(i);
      if (o.netdev.empty() || o.netdev.find('/') != std::string::npos || o.netdev[0] == '.') {
        throw usage_error("--netdev: '" + o.netdev + "' is not an interface name");
      }
    } else if (a == "--verify") {
      o.verify = true;
    } else if (a == "--csv") {
      o.csv = true;
    } else {
      throw usage_error("unknown option '" + std::string(a) + "'");
    }
  }
  if (o.methods.empty()) throw usage_error("--method is required");
  if (o.bytes == 0) throw usage_error("--bytes is required and must be positive");
  if (o.bytes % sizeof(float) != 0) {
    throw usage_error("--bytes: " + std::to_string(o.bytes) + " is not a multiple of 4 (float32)");
  }
  if (o.bytes / sizeof(float) > 0xffffffffull) {
    throw usage_error("--bytes: at most 2^32 entries (topk sends 32-bit indices)");
  }
  if (o.density < 0) {
    for (const auto& name : o.methods) {
      if (name == "sparse" || name == "topk") {
        throw usage_error("--density is required for --method " + name);
      }
    }
    o.density = 1.0;
  }
  return o;
}

std::uint64_t read_tx_bytes(const std::string& dev) {
  if (dev.empty()) return 0;
  std::ifstream f("/sys/class/net/" + dev + "/statistics/tx_bytes");
  std::uint64_t v = 0;
  if (!(f >> v)) throw std::runtime_error("--netdev: cannot read tx_bytes of '" + dev + "'");
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

int run(const options& o) {
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  const std::size_t n = o.bytes / sizeof(float);
  // What the MPI library's allreduces run (Open MPI's settings, read through MPI_T).
  const pactrain::mpi_allreduce_config mpi_algorithms = pactrain::mpi_allreduce_algorithms();
  if (rank == 0 && !o.csv) std::printf("%s\n", pactrain::to_string(mpi_algorithms).c_str());

  gradient base(n), g(n);
  fill_gradient(base, o.seed, rank);
  int bad = 0;
  {
    // Every method is built before any is timed, and the timed syncs take turns (one of
    // each, then the next round), so that a drift of the machine weighs on all alike.
    struct entry {
      std::string name;
      std::unique_ptr<method> s;
      std::vector<double> times, locals, growing;
      std::uint64_t tx = 0;  // bytes the interface sent during this method's timed syncs
    };
    std::vector<entry> list;
    for (const auto& name : o.methods) {
      auto s = find_method(name)->make({comm, o, n, base});
      list.push_back({name, std::move(s), {}, {}, {}, 0});
    }

    if (o.verify) {
      for (auto& e : list) {
        g = base;
        e.s->sync(g);
        const auto ref = e.s->reference(o, ranks);
        const double tol = e.s->tolerance(ranks);
        std::size_t mismatches = 0;
        double worst = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double d = std::fabs(static_cast<double>(g[i]) - ref[i]);
          worst = std::max(worst, d);
          if (d > tol || (tol == 0 && std::memcmp(&g[i], &ref[i], 4) != 0)) ++mismatches;
        }
        int wrong = mismatches != 0;
        if (wrong) {
          std::fprintf(stderr, "rank %d: verify %s: %zu of %zu entries differ (worst %.3g)\n", rank,
                       e.name.c_str(), mismatches, n, worst);
        }
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_MAX, comm);
        bad = bad || wrong;
        if (rank == 0 && !o.csv) {
          std::printf("verify %s: %s\n", e.name.c_str(), wrong ? "FAILED" : "ok");
        }
      }
    }

    for (int w = 0; w < o.warmup; ++w) {
      for (auto& e : list) {
        g = base;
        e.s->sync(g);
      }
    }
    for (int it = 0; it < o.iters; ++it) {
      for (auto& e : list) {
        g = base;
        const std::uint64_t tx0 = read_tx_bytes(o.netdev);
        MPI_Barrier(comm);
        const auto t0 = clock_type::now();
        double local = e.s->sync(g);
        double dt = seconds_since(t0);
        MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, comm);
        double grow = e.s->rank_dependent_seconds();
        MPI_Allreduce(MPI_IN_PLACE, &local, 1, MPI_DOUBLE, MPI_MAX, comm);
        MPI_Allreduce(MPI_IN_PLACE, &grow, 1, MPI_DOUBLE, MPI_MAX, comm);
        e.tx += read_tx_bytes(o.netdev) - tx0;
        e.times.push_back(dt);
        e.locals.push_back(local);
        e.growing.push_back(grow);
      }
    }
    for (auto& e : list) {
      std::string wire;
      if (!o.netdev.empty()) {
        double tx = static_cast<double>(e.tx) / o.iters;
        MPI_Allreduce(MPI_IN_PLACE, &tx, 1, MPI_DOUBLE, MPI_SUM, comm);
        wire = std::to_string(static_cast<std::uint64_t>(tx / ranks));
      }
      if (rank != 0) continue;
      const auto& s = e.s;
      const collective_choice coll = s->collective(mpi_algorithms, ranks);
      const double med = median(e.times);
      const double lo = *std::min_element(e.times.begin(), e.times.end());
      const double hi = *std::max_element(e.times.begin(), e.times.end());
      if (o.csv) {
        const std::string predicted =
            s->predicted_seconds() < 0 ? "" : std::to_string(s->predicted_seconds());
        std::printf("%s,%d,%zu,%g,%.6f,%.6f,%.6f,%zu,%s,%.6f,%.6f,%d,%s,%s,%s,%s,%s\n",
                    e.name.c_str(), ranks, o.bytes, o.density, med, lo, hi, s->bytes_sent(),
                    wire.c_str(), median(e.locals), median(e.growing), o.iters,
                    coll.algorithm.c_str(), s->plan().c_str(), predicted.c_str(),
                    o.huge_pages ? "huge" : "small", coll.forced ? "forced" : "library");
      } else {
        std::printf(
            "%s: %d ranks, %zu bytes, density %g: median %.6f s per sync (min %.6f, max %.6f) "
            "over %d, local work %.6f s; %zu bytes sent per rank%s%s; collective %s (%s)%s%s; "
            "%s pages\n",
            e.name.c_str(), ranks, o.bytes, o.density, med, lo, hi, o.iters, median(e.locals),
            s->bytes_sent(), wire.empty() ? "" : ", on the wire ", wire.c_str(),
            coll.algorithm.c_str(), coll.forced ? "forced" : "the library's choice",
            s->plan().empty() ? "" : "; buckets ", s->plan().c_str(),
            o.huge_pages ? "huge" : "small");
        if (s->predicted_seconds() >= 0) {
          std::printf("  the planner predicted %.6f s per sync\n", s->predicted_seconds());
        }
      }
      std::fflush(stdout);
    }
  }
  MPI_Comm_free(&comm);
  return bad;
}

}  // namespace
}  // namespace sync_bench

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--csv-header") {
      std::printf("%s\n", sync_bench::csv_header);
      return 0;
    }
  }
  sync_bench::options o;
  try {
    o = sync_bench::parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "pactrain_sync_bench: %s\nusage: pactrain_sync_bench --bytes N --method "
                 "dense|sparse|topk|fp16 [--density D] [--iters N] [--warmup N] [--tensor N] "
                 "[--seed N] [--pages huge|small] [--netdev IF] [--verify] [--csv] | "
                 "--csv-header\n",
                 e.what());
    return 2;
  }
  sync_bench::gradients_on_huge_pages = o.huge_pages;
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    rc = sync_bench::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pactrain_sync_bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
