#!/usr/bin/env bash
# The codec and planner grid: at each link rate, rank count and density, times dense ring,
# sparse, sparse-fp16, sparse-ternary and auto (the planner and tuner over an fp16 and a
# ternary engine) on the namespace testbed, writes bench/results/codecs.csv and bench/results/codecs.md (a table with
# each method's speedup over dense ring and auto's distance from the best fixed method).
#
#   bench/sync/run_codecs.sh              # as root, from anywhere; about 8 minutes on 2 cores
#
# Environment (defaults in brackets):
#   PACTRAIN_BUILD_DIR   build directory [build]
#   PACTRAIN_RATES       link rates, `none` is unshaped [1gbit none]
#   PACTRAIN_RANKS       rank counts [4]
#   PACTRAIN_BYTES       dense gradient bytes [100M]
#   PACTRAIN_DENSITIES   densities [0.01 0.1 0.5]
#   PACTRAIN_ITERS, PACTRAIN_WARMUP   timed and untimed syncs per run [5, 1]
#   PACTRAIN_ROUNDS      runs per point [3]. Each run times the four methods side by side
#                        in one process (their syncs take turns), each round starting the
#                        turn at another method; the table takes each method's median over
#                        the rounds, and auto's distance from the best fixed method per round
#                        (within one run) before the median. Runs of one configuration on this 2-core machine vary by
#                        up to 40%, so methods timed in separate runs cannot be compared
#                        to 5%.
#   PACTRAIN_REPORT_ONLY=1   only rebuild codecs.md from codecs.csv
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${PACTRAIN_BUILD_DIR:-build}
results=bench/results
read -r -a rates <<< "${PACTRAIN_RATES:-1gbit none}"
read -r -a ranks_list <<< "${PACTRAIN_RANKS:-4}"
bytes=${PACTRAIN_BYTES:-100M}
read -r -a densities <<< "${PACTRAIN_DENSITIES:-0.01 0.1 0.5}"
iters=${PACTRAIN_ITERS:-5}
warmup=${PACTRAIN_WARMUP:-1}
rounds=${PACTRAIN_ROUNDS:-3}
methods=(sparse sparse-fp16 sparse-ternary auto)
csv=$results/codecs.csv

if [[ "${PACTRAIN_REPORT_ONLY:-0}" != 1 ]]; then
  # shellcheck source=bench/lib.sh
  source bench/lib.sh
  pactrain_bench_prepare run_codecs.sh pactrain_sync_bench
  mkdir -p "$results"
  echo "link,round,$("$bench_exe" --csv-header)" > "$csv"
  trap 'bench/netbed/teardown.sh' EXIT
  total=$(( ${#rates[@]} * ${#ranks_list[@]} * (1 + ${#densities[@]}) * rounds ))
  done_runs=0
  run() {  # run <rate> <round> <ranks> <bench args...>
    local rate=$1 round=$2 np=$3 row
    shift 3
    done_runs=$((done_runs + 1))
    echo "[$done_runs/$total] $rate, $np ranks: $*" >&2
    if ! row=$(pactrain_netbed_run 600 "$np" -- "$bench_exe" --netdev eth0 --csv "$@"); then
      echo "run_codecs.sh: FAILED at $rate, $np ranks: $*" >&2
      return 0
    fi
    sed "s/^/$rate,$round,/" <<< "$row" >> "$csv"
  }
  for rate in "${rates[@]}"; do
    bench/netbed/setup.sh 4 "$rate"
    for np in "${ranks_list[@]}"; do
      for ((round = 1; round <= rounds; round++)); do
        run "$rate" "$round" "$np" --bytes "$bytes" --method dense --iters "$iters" \
          --warmup "$warmup"
      done
      for d in "${densities[@]}"; do
        for ((round = 1; round <= rounds; round++)); do
          # One process times all four side by side; each round starts the turn elsewhere.
          order=("${methods[@]:round % 4}" "${methods[@]:0:round % 4}")
          run "$rate" "$round" "$np" --bytes "$bytes" --density "$d" \
            --method "$(IFS=,; echo "${order[*]}")" --iters "$iters" --warmup "$warmup"
        done
      done
    done
  done
  bench/netbed/teardown.sh
  trap - EXIT
fi

/usr/bin/python3 - "$csv" "$results/codecs.md" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for r in rows:  # CSVs written before the column was renamed
    if "method" not in r:
        r["method"] = r.pop("strategy")
fixed = ("sparse", "sparse-fp16", "sparse-ternary")
runs = {}  # (link, ranks, density, method) -> the rows of every round
for r in rows:
    density = "" if r["method"] == "dense" else r["density"]
    runs.setdefault((r["link"], r["ranks"], density, r["method"]), []).append(r)
def med(key):
    return statistics.median(float(r["median_s"]) for r in runs[key])
dense = {(l, n): med((l, n, d, s)) for (l, n, d, s) in runs if s == "dense"}
points = sorted({(l, n, d) for (l, n, d, s) in runs if s != "dense"},
                key=lambda p: (p[0], int(p[1]), float(p[2])))
n_rounds = max((len(v) for v in runs.values()), default=0)
out = ["| link | ranks | density | " + " | ".join(fixed) +
       " | auto | auto predicted | auto's buckets | auto vs best fixed |",
       "|---|---|---|" + "---|" * (len(fixed) + 4)]
worst = None
for (link, ranks, density) in points:
    base = dense.get((link, ranks))
    def cell(s):
        if (link, ranks, density, s) not in runs:
            return "-"
        t = med((link, ranks, density, s))
        return f"{t:.3f} s" + (f" ({base / t:.1f}x)" if base else "")
    verdict, plan, predicted = "-", "-", "-"
    auto = runs.get((link, ranks, density, "auto"))
    if auto:
        plan = " / ".join(sorted({r["plan"] for r in auto}))
        p = [float(r["predicted_s"]) for r in auto if r.get("predicted_s")]
        predicted = f"{statistics.median(p):.3f} s" if p else "-"
        # Per round, auto against the best fixed method of the same run (timed side by
        # side, so a drift of the machine between rounds cancels); the median over rounds.
        rels = []
        for r in auto:
            same = [float(x["median_s"]) for s in fixed
                    for x in runs.get((link, ranks, density, s), []) if x["round"] == r["round"]]
            if same:
                rels.append(float(r["median_s"]) / min(same) - 1)
        if rels:
            rel = statistics.median(rels)
            worst = rel if worst is None else max(worst, rel)
            verdict = f"{100 * rel:+.1f}% ({'within' if rel <= 0.05 else 'OUTSIDE'} 5%)"
    out.append(f"| {link} | {ranks} | {density} | " + " | ".join(cell(s) for s in fixed) +
               f" | {cell('auto')} | {predicted} | {plan} | {verdict} |")
size = ", ".join(sorted({f"{int(r['bytes']) / 1e6:g} MB" for r in rows}))
lines = [f"Seconds per sync of {size} of float gradients: each run's median over its syncs, then "
         f"the median over {n_rounds} interleaved rounds (speedup over dense ring allreduce at "
         "the same link and rank count in brackets). `auto vs best fixed` is the median over "
         "rounds of auto's time over the best fixed method's in the same run, minus one. "
         "`none` is the unshaped testbed. Generated by `bench/sync/run_codecs.sh` from `codecs.csv`.",
         ""]
lines += ["Dense ring: " + ", ".join(f"{l}, {n} ranks: {t:.3f} s"
                                     for (l, n), t in sorted(dense.items())), ""]
if worst is not None:
    out += ["", f"Largest distance of auto from the best fixed method: {100 * worst:+.1f}%."]
lines += out
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
