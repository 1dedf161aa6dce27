#!/usr/bin/env bash
# Measures the testbed against serialisation theory: one blocking and one nonblocking float
# allreduce of each size after a 15 ms idle gap (a training step's compute), at each rate and
# rank count, with pactrain_allreduce_probe; writes bench/results/netbed.csv and prints the
# markdown table bench/netbed/README.md publishes.
#
#   bench/netbed/probe.sh        # as root, from anywhere: about 6 minutes on 2 cores
#
# Environment (defaults in brackets):
#   PACTRAIN_BUILD_DIR        build directory [build]
#   PACTRAIN_PROBE_RATES      [100mbit 1gbit]
#   PACTRAIN_PROBE_RANKS      [4 2]
#   PACTRAIN_PROBE_BYTES      [4k,64k,256k,3.5M]; 100M runs on its own with fewer repetitions
#   PACTRAIN_PROBE_OUT        [bench/results/netbed.csv]
#   PACTRAIN_NETBED_BUCKET    as setup.sh reads it (legacy: the old bucket, for comparison)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${PACTRAIN_BUILD_DIR:-build}
read -r -a rates <<< "${PACTRAIN_PROBE_RATES:-100mbit 1gbit}"
read -r -a ranks_list <<< "${PACTRAIN_PROBE_RANKS:-4 2}"
sizes=${PACTRAIN_PROBE_BYTES:-4k,64k,256k,3.5M}
out=${PACTRAIN_PROBE_OUT:-bench/results/netbed.csv}

# shellcheck source=bench/lib.sh
source bench/lib.sh
# shellcheck source=bench/netbed/common.sh
source bench/netbed/common.sh
pactrain_bench_prepare netbed/probe.sh pactrain_allreduce_probe
probe=$(cd "$build/bench" && pwd)/pactrain_allreduce_probe

trap 'bench/netbed/teardown.sh' EXIT
mkdir -p "$(dirname "$out")"
echo "rate,bucket,$("$probe" --csv-header)" > "$out"
for rate in "${rates[@]}"; do
  bench/netbed/setup.sh 4 "$rate"
  read -r _ _ bucket < "$PACTRAIN_NETBED_STATE/config"
  for np in "${ranks_list[@]}"; do
    echo "probe: $rate, $np ranks"
    for args in "--bytes $sizes --reps 7" "--bytes 100M --reps 2"; do
      # shellcheck disable=SC2086 # args holds separate words
      pactrain_netbed_run 900 "$np" -- "$probe" $args --link-bits "$(pactrain_link_bits "$rate")" |
        grep -v '^ranks,' | sed "s/^/$rate,$bucket,/" | tee -a "$out"
    done
  done
done
bench/netbed/teardown.sh
trap - EXIT

# The markdown table: median (min-max) against theory, blocking and nonblocking.
/usr/bin/python3 - "$out" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def size(b):
    b = int(b)
    return f"{b / 1e6:g} MB" if b >= 1e6 else f"{b / 1e3:g} kB"
print("| link | ranks | bytes | serialisation | MPI_Allreduce | MPI_Iallreduce |")
print("|---|---|---|---|---|---|")
keys = sorted({(r["rate"], int(r["ranks"]), int(r["bytes"])) for r in rows},
              key=lambda k: (k[0] != "100mbit", -k[1], k[2]))
for rate, ranks, b in keys:
    cell = {}
    for r in rows:
        if (r["rate"], int(r["ranks"]), int(r["bytes"])) == (rate, ranks, b):
            cell[r["call"]] = r
    th = float(next(iter(cell.values()))["theory_ms"])
    def fmt(r):
        if r is None:
            return "—"
        return (f"{float(r['median_ms']):.1f} ms ({float(r['min_ms']):.1f}-{float(r['max_ms']):.1f}),"
                f" {float(r['median_over_theory']):.2f}x")
    print(f"| {rate} | {ranks} | {size(b)} | {th:.1f} ms | {fmt(cell.get('allreduce'))} |"
          f" {fmt(cell.get('iallreduce'))} |")
PY
