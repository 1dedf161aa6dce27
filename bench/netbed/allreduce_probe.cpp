// pactrain_allreduce_probe: how long one allreduce of S bytes takes on the testbed after an
// idle gap, against what serialisation at the link's rate alone needs. The testbed's table in
// bench/netbed/README.md comes from it (bench/netbed/probe.sh runs the sweep).
//
//   cmake --build build --target pactrain_allreduce_probe
//   bench/netbed/setup.sh 4 100mbit
//   bench/netbed/launch.sh build/bench/pactrain_allreduce_probe --link-bits 100000000
//
// Each repetition: a barrier, an idle gap (--gap-ms, a training step's compute; it refills
// tbf's bucket as compute does), then one float MPI_Allreduce (blocking) and one in-place
// MPI_Iallreduce + MPI_Wait (what pactrain's engine issues), each timed on every rank; the
// slowest rank's time counts. Rank 0 prints one CSV row per size and call: median, min and
// max over --reps, and the ring's serialisation time 2 (P - 1) / P * S * 8 / rate.
//
// Options: --bytes LIST (k M = 10^3, 10^6; Ki Mi = 2^10, 2^20) [4k,64k,256k,3.5M,100M]
//          --reps N [5]   --gap-ms G [15]   --link-bits N (0: no theory column) [0]
//          --csv-header   print the header line and exit
#include "common/run_main.hpp"

#include <pactrain/error.hpp>
#include <pactrain/mpi.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

struct options {
  std::vector<std::size_t> bytes{4000, 64000, 256000, 3500000, 100000000};
  int reps = 5;
  int gap_ms = 15;
  double link_bits = 0;
};

std::size_t parse_size(const std::string& s) {
  std::size_t end = 0;
  double v = 0;
  try {
    v = std::stod(s, &end);
  } catch (const std::exception&) {
    throw pactrain::error("--bytes: '" + s + "' is not a size");
  }
  const std::string unit = s.substr(end);
  double m = 1;
  if (unit == "k")
    m = 1e3;
  else if (unit == "M")
    m = 1e6;
  else if (unit == "G")
    m = 1e9;
  else if (unit == "Ki")
    m = 1024;
  else if (unit == "Mi")
    m = 1024.0 * 1024;
  else if (!unit.empty())
    throw pactrain::error("--bytes: unknown unit in '" + s + "'");
  const double b = v * m;
  if (!(b >= 4 && b <= 4e9)) throw pactrain::error("--bytes: '" + s + "' is not in 4 B .. 4 GB");
  return static_cast<std::size_t>(b);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw pactrain::error(a + ": missing value (or unknown option)");
    const std::string v = argv[++i];
    if (a == "--bytes") {
      o.bytes.clear();
      for (std::size_t at = 0; at <= v.size();) {
        const std::size_t comma = std::min(v.find(',', at), v.size());
        o.bytes.push_back(parse_size(v.substr(at, comma - at)));
        at = comma + 1;
      }
    } else if (a == "--reps") {
      o.reps = std::atoi(v.c_str());
      if (o.reps < 1 || o.reps > 1000) throw pactrain::error("--reps: must be in 1..1000");
    } else if (a == "--gap-ms") {
      o.gap_ms = std::atoi(v.c_str());
      if (o.gap_ms < 0 || o.gap_ms > 10000) throw pactrain::error("--gap-ms: must be in 0..10000");
    } else if (a == "--link-bits") {
      o.link_bits = std::atof(v.c_str());
      if (!(o.link_bits >= 0)) throw pactrain::error("--link-bits: must be >= 0");
    } else {
      throw pactrain::error("unknown option '" + a + "'");
    }
  }
  return o;
}

constexpr const char* header =
    "ranks,bytes,call,median_ms,min_ms,max_ms,theory_ms,median_over_theory";

// The slowest rank's time of one call after a barrier and an idle gap.
template <class Call>
double timed(const options& o, Call call) {
  MPI_Barrier(MPI_COMM_WORLD);
  std::this_thread::sleep_for(std::chrono::milliseconds(o.gap_ms));
  const auto t0 = std::chrono::steady_clock::now();
  call();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--csv-header") {
    std::puts(header);
    return 0;
  }
  return examples::run_main(argc, argv, "pactrain_allreduce_probe", [&] {
    const auto [rank, ranks] = examples::world();
    const options o = parse(argc, argv);
    if (rank == 0) std::puts(header);
    for (const std::size_t bytes : o.bytes) {
      std::vector<float> data(bytes / sizeof(float), 1.0f);
      const int n = static_cast<int>(data.size());
      const struct {
        const char* name;
        void (*run)(std::vector<float>&, int);
      } calls[] = {
          {"allreduce",
           [](std::vector<float>& d, int c) {
             MPI_Allreduce(MPI_IN_PLACE, d.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
           }},
          {"iallreduce",
           [](std::vector<float>& d, int c) {
             MPI_Request r = MPI_REQUEST_NULL;
             MPI_Iallreduce(MPI_IN_PLACE, d.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
             MPI_Wait(&r, MPI_STATUS_IGNORE);
           }},
      };
      for (const auto& call : calls) {
        timed(o, [&] { call.run(data, n); });  // warm-up: connections, buffers
        std::vector<double> t;
        for (int r = 0; r < o.reps; ++r) t.push_back(timed(o, [&] { call.run(data, n); }));
        std::sort(t.begin(), t.end());
        if (rank != 0) continue;
        const double p = ranks;
        const double theory = o.link_bits > 0 && ranks > 1
                                  ? 2.0 * (p - 1) / p * static_cast<double>(n) * 4 * 8 / o.link_bits
                                  : 0.0;
        const double median = t[t.size() / 2];
        std::printf("%d,%zu,%s,%.3f,%.3f,%.3f,%.3f,%.3f\n", ranks, static_cast<std::size_t>(n) * 4,
                    call.name, median * 1e3, t.front() * 1e3, t.back() * 1e3, theory * 1e3,
                    theory > 0 ? median / theory : 0.0);
        std::fflush(stdout);
      }
    }
    return 0;
  });
}
