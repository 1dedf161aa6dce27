// auto: the planner and the tuner choose the codec and the bucket methods.
#include "engine.hpp"

#include <cstdio>
#include <limits>

namespace sync_bench {

/// auto: one engine per codec (fp16, and ternary lanes with error feedback). The link is
/// calibrated once; each engine's local work is calibrated and pactrain::candidate_strategies
/// gives its plans worth timing (the ternary engine's with a coded bucket only: its plain
/// plans are the fp16 engine's). Plans predicted more than 3x slower than the best are
/// dropped; pactrain::step_tuner times the rest in turn, 3 syncs each on this run's
/// gradient (after a barrier, the slowest rank's time, as the timed syncs), and the fastest
/// engine and plan are kept. Every rank keeps the same. `base` is this rank's gradient.
std::unique_ptr<method> make_auto(const method_args& a) {
  const auto& [comm, o, n, base] = a;
  using fp16_engine = engine_method<pactrain::fp16_codec>;
  using ternary_engine = engine_method<pactrain::error_feedback<pactrain::ternary_codec>>;
  pactrain::mpi_communicator link_comm{comm};
  const auto link = pactrain::calibrate_link(link_comm, calibration(o));
  auto fp16 = std::make_unique<fp16_engine>(comm, o, n, pactrain::fp16_codec{});
  auto ternary =
      std::make_unique<ternary_engine>(comm, o, n, pactrain::ternary_codec{{.seed = o.seed}});
  struct candidate {
    int engine;  // 0 fp16, 1 ternary
    pactrain::strategy_choice plan;
  };
  std::vector<candidate> c;
  for (auto& p : fp16->candidates(o, link)) c.push_back({0, std::move(p)});
  for (auto& p : ternary->candidates(o, link)) {
    const bool coded = std::any_of(p.strategies.begin(), p.strategies.end(),
                                   [](auto s) { return !pactrain::is_plain(s); });
    if (coded) c.push_back({1, std::move(p)});
  }
  double best = std::numeric_limits<double>::infinity();
  for (const auto& x : c) best = std::min(best, x.plan.predicted_seconds);
  // candidate_strategies' cut-off, applied again across the two engines.
  const double keep = pactrain::candidate_options{}.keep_within;
  std::erase_if(c, [&](const auto& x) { return x.plan.predicted_seconds > keep * best; });

  pactrain::step_tuner tuner(c.size(), 3);
  method* engines[2] = {fp16.get(), ternary.get()};
  auto use = [&](const candidate& x) {
    if (x.engine == 0) fp16->use(x.plan);
    if (x.engine == 1) ternary->use(x.plan);
  };
  gradient g(n);
  while (tuner.tuning()) {
    const auto& x = c[tuner.current()];
    use(x);
    g = base;
    MPI_Barrier(comm);
    const auto t0 = clock_type::now();
    engines[x.engine]->sync(g);
    tuner.record(link_comm, seconds_since(t0));
  }
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0 && !o.csv) {
    for (std::size_t i = 0; i < c.size(); ++i) {
      std::printf("  auto candidate %zu: %s, predicted %.6f s, timed %.6f s%s\n", i,
                  plan_text(c[i].engine == 0 ? "fp16" : "ternary", c[i].plan.strategies).c_str(),
                  c[i].plan.predicted_seconds, tuner.median(i), i == tuner.best() ? " (kept)" : "");
    }
  }
  const auto& kept = c[tuner.best()];
  use(kept);
  if (kept.engine == 0) return fp16;
  return ternary;
}

}  // namespace sync_bench
