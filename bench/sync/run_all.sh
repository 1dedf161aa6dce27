#!/usr/bin/env bash
# Regenerates every sync benchmark result in one command: builds pactrain_sync_bench, sets up
# the bandwidth-shaped testbed at each link rate, runs the sweep on 2 and 4 ranks, and writes
# bench/results/*.csv, the gnuplot PNGs, the cost model and bench/RESULTS.md.
#
#   bench/sync/run_all.sh                 # as root, from anywhere; about 15 minutes on 2 cores
#
# Environment (defaults in brackets):
#   PACTRAIN_BUILD_DIR   build directory [build]
#   PACTRAIN_RATES       link rates [500mbit 1gbit; 2gbit is more than 2 cores can shape
#                        packet by packet: bench/netbed/README.md]
#   PACTRAIN_RANKS       rank counts [2 4]
#   PACTRAIN_BYTES       dense gradient bytes [100M]
#   PACTRAIN_DENSITIES   densities of sparse and topk [0.01 0.05 0.1 0.2 0.5]
#   PACTRAIN_ITERS, PACTRAIN_WARMUP   timed and untimed syncs per run [5, 1]
#   PACTRAIN_DDP=0       skip the PyTorch DDP runs (otherwise Debian's python3-torch is
#                        installed if missing)
#   PACTRAIN_DDP_RATES   link rates of the DDP runs [1gbit]
#   PACTRAIN_CODECS=1    also run sparse-fp16, sparse-ternary and auto at every density (about
#                        doubles the sweep)
#   PACTRAIN_SYNC=0      skip the pactrain_sync_bench runs (append DDP rows to the CSV)
#   PACTRAIN_REPORT_ONLY=1   only rebuild plots and RESULTS.md from the CSVs present
#   PACTRAIN_RESULTS_DIR, PACTRAIN_RESULTS_MD   where they go [bench/results, bench/RESULTS.md]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${PACTRAIN_BUILD_DIR:-build}
results=${PACTRAIN_RESULTS_DIR:-bench/results}
read -r -a rates <<< "${PACTRAIN_RATES:-500mbit 1gbit}"
codec_methods=()
[[ ${PACTRAIN_CODECS:-0} == 1 ]] && codec_methods=(sparse-fp16 sparse-ternary auto)
read -r -a ddp_rates <<< "${PACTRAIN_DDP_RATES:-1gbit}"
read -r -a ranks_list <<< "${PACTRAIN_RANKS:-2 4}"
bytes=${PACTRAIN_BYTES:-100M}
read -r -a densities <<< "${PACTRAIN_DENSITIES:-0.01 0.05 0.1 0.2 0.5}"
iters=${PACTRAIN_ITERS:-5}
warmup=${PACTRAIN_WARMUP:-1}

if [[ "${PACTRAIN_REPORT_ONLY:-0}" != 1 ]]; then
  # shellcheck source=bench/lib.sh
  source bench/lib.sh
  pactrain_bench_prepare run_all.sh pactrain_sync_bench pactrain_policy_bench
  if [[ "${PACTRAIN_DDP:-1}" != 0 ]]; then
    pactrain_install_deps python3-torch  # for the PyTorch DDP rows; large, so only here
  fi

  mkdir -p "$results"
  csv=$results/sync.csv
  sync_runs=${PACTRAIN_SYNC:-1}
  if [[ $sync_runs != 0 || ! -f "$csv" ]]; then
    echo "link,$("$bench_exe" --csv-header)" > "$csv"
  fi
  ddp=0
  if [[ "${PACTRAIN_DDP:-1}" != 0 ]] && /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
    ddp=1  # its rows go into the same CSV, methods ddp_allreduce, ddp_fp16, ddp_powersgd
  fi
  trap 'bench/netbed/teardown.sh' EXIT

  run() {  # run <rate> <ranks> [env...] -- <bench args>
    local rate=$1 np=$2
    shift 2
    local envs=()
    while [[ $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    local row
    if ! row=$(pactrain_netbed_run 600 "$np" "${envs[@]}" -- "$bench_exe" --netdev eth0 --csv "$@"); then
      echo "run_all.sh: FAILED at $rate, $np ranks: $*" >&2
      return 0
    fi
    echo "$rate,$row" | tee -a "$csv"
  }

  for rate in "${rates[@]}"; do
    bench/netbed/setup.sh 4 "$rate"
    for np in "${ranks_list[@]}"; do
      [[ $sync_runs == 0 ]] && continue
      # Latency point: a tiny dense allreduce, for the cost model's alpha.
      run "$rate" "$np" -- --bytes 4K --method dense --iters 50 --warmup 5
      run "$rate" "$np" -- --bytes "$bytes" --method dense --iters "$iters" --warmup "$warmup"
      run "$rate" "$np" PACTRAIN_NETBED_ALLREDUCE=default -- \
        --bytes "$bytes" --method dense --iters "$iters" --warmup "$warmup"
      run "$rate" "$np" -- --bytes "$bytes" --method fp16 --iters "$iters" --warmup "$warmup"
      # pactrain's engine under Open MPI's own algorithm choice (what a user gets who sets
      # nothing): libnbc runs its in-place MPI_Iallreduce as a binomial tree.
      run "$rate" "$np" PACTRAIN_NETBED_ALLREDUCE=default PACTRAIN_MPI_ALGORITHM_WARNING=0 -- \
        --bytes "$bytes" --density 0.1 --method sparse --iters "$iters" --warmup "$warmup"
      for d in "${densities[@]}"; do
        for s in sparse topk "${codec_methods[@]}"; do
          run "$rate" "$np" -- --bytes "$bytes" --density "$d" --method "$s" \
            --iters "$iters" --warmup "$warmup"
        done
      done
    done
    for np in "${ranks_list[@]}"; do
      if [[ $ddp == 1 && " ${ddp_rates[*]} " == *" $rate "* ]]; then
        for hook in allreduce fp16 powersgd; do
          # A limit, in case a gloo collective stalls (ddp_bench.py also passes gloo a timeout).
          if ! row=$(pactrain_netbed_run 150 "$np" PACTRAIN_NETBED_ALLREDUCE=default -- \
                       /usr/bin/python3 "$root/bench/sync/ddp_bench.py" --bytes "$bytes" \
                       --hook "$hook" --netdev eth0 --iters "$iters" --warmup "$warmup" --csv \
                       | tail -n 1) || [[ -z "$row" ]]; then
            echo "run_all.sh: FAILED: DDP $hook at $rate, $np ranks" >&2
            continue
          fi
          echo "$rate,$row" | tee -a "$csv"
        done
      fi
    done
  done
  bench/netbed/teardown.sh
  trap - EXIT
  [[ $sync_runs == 0 ]] || date -u '+%Y-%m-%d %H:%M UTC' > "$results/sync.date"

  # Microbenchmarks (no network): pruning policies, digest and serialization per 1Mi weights.
  if [[ $sync_runs != 0 ]]; then
    "$build/bench/pactrain_policy_bench" --benchmark_repetitions=5 --benchmark_min_time=0.2 \
      --benchmark_report_aggregates_only=true --benchmark_format=json > "$results/policy.json"
    # Keep the results free of local paths and host names.
    /usr/bin/python3 -c 'import json, sys
p = sys.argv[1]; d = json.load(open(p))
for k in ("executable", "host_name"): d["context"].pop(k, None)
json.dump(d, open(p, "w"), indent=1)' "$results/policy.json"
  fi
fi

/usr/bin/python3 bench/sync/report.py --results "$results" --out "${PACTRAIN_RESULTS_MD:-bench/RESULTS.md}"
