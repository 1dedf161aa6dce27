#!/usr/bin/env bash
# The end-to-end training grid behind bench/results/e2e.md: the Fashion-MNIST MLP and the
# LibTorch CNN trained with each method (pactrain's and the baselines', see bench/e2e/main.cpp
# and cnn_main.cpp) on the bandwidth-shaped testbed (bench/netbed), one JSON point per run in
# bench/results/e2e/, then the report and plots (bench/e2e/report.py).
#
#   bench/e2e/run.sh          # as root, from anywhere; resumable: points already there are kept
#
# Environment (defaults in brackets):
#   PACTRAIN_BUILD_DIR     build directory [build]
#   PACTRAIN_E2E_TRAINERS  mlp (pactrain_e2e), cnn (pactrain_e2e_cnn, needs LibTorch) [mlp cnn]
#   PACTRAIN_E2E_LINKS     link rates [100mbit 1gbit none]
#   PACTRAIN_E2E_RANKS     rank counts [4 2]
#   PACTRAIN_E2E_METHODS   [dense sparse ternary auto topk powersgd4 powersgdM fp16; the CNN
#                          skips auto, which its LibTorch loop does not have]
#   PACTRAIN_E2E_EPOCHS    epochs of every run [6]
#   PACTRAIN_E2E_RESULTS   where the points go [bench/results/e2e]
#   PACTRAIN_E2E_MACHINE   the machine line of the report [this machine's CPU and cores]
#   PACTRAIN_REPORT_ONLY=1 only rebuild the report and plots from the points present
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${PACTRAIN_BUILD_DIR:-build}
results=${PACTRAIN_E2E_RESULTS:-bench/results/e2e}
read -r -a trainers <<< "${PACTRAIN_E2E_TRAINERS:-mlp cnn}"
read -r -a links <<< "${PACTRAIN_E2E_LINKS:-100mbit 1gbit none}"
read -r -a ranks_list <<< "${PACTRAIN_E2E_RANKS:-4 2}"
read -r -a methods <<< "${PACTRAIN_E2E_METHODS:-dense sparse ternary auto topk powersgd4 powersgdM fp16}"
epochs=${PACTRAIN_E2E_EPOCHS:-6}

link_bits() {
  case "$1" in
    100mbit) echo 100000000 ;;
    500mbit) echo 500000000 ;;
    1gbit) echo 1000000000 ;;
    2gbit) echo 2000000000 ;;
    *) echo 0 ;;
  esac
}

method_args() {  # the pactrain_e2e arguments of a method's name
  case "$1" in
    powersgd4) echo "--method powersgd --powersgd-rank 4" ;;
    powersgdM) echo "--method powersgd --powersgd-rank match" ;;
    *) echo "--method $1" ;;
  esac
}

# The program and point prefix of a trainer.
trainer_program() {
  case "$1" in
    mlp) echo pactrain_e2e ;;
    cnn) echo pactrain_e2e_cnn ;;
    *) echo "e2e/run.sh: unknown trainer '$1' (mlp or cnn)" >&2; exit 1 ;;
  esac
}

if [[ "${PACTRAIN_REPORT_ONLY:-0}" != 1 ]]; then
  # shellcheck source=../lib.sh
  source bench/lib.sh
  programs=()
  for t in "${trainers[@]}"; do programs+=("$(trainer_program "$t")"); done
  pactrain_bench_prepare e2e/run.sh "${programs[@]}"
  mkdir -p "$results"
  trap 'bench/netbed/teardown.sh' EXIT
  total=0
  for t in "${trainers[@]}"; do
    for m in "${methods[@]}"; do
      [[ $t == cnn && $m == auto ]] || total=$((total + ${#links[@]} * ${#ranks_list[@]}))
    done
  done
  i=0
  start=$SECONDS
  for link in "${links[@]}"; do
    testbed=0
    for t in "${trainers[@]}"; do
      exe=$(cd "$build/bench" && pwd)/$(trainer_program "$t")
      for np in "${ranks_list[@]}"; do
        for m in "${methods[@]}"; do
          [[ $t == cnn && $m == auto ]] && continue
          i=$((i + 1))
          out=$results/fmnist_${t}_${link}_np${np}_${m}.json
          if [[ -f $out ]]; then
            echo "[$i/$total] $t, $link, $np ranks, $m: kept from an earlier run"
            continue
          fi
          if [[ $testbed == 0 ]]; then
            bench/netbed/setup.sh 4 "$link"
            testbed=1
          fi
          echo "[$i/$total] $t, $link, $np ranks, $m ($((SECONDS - start)) s so far)"
          # shellcheck disable=SC2046 # method_args prints separate words
          if pactrain_netbed_run 1800 "$np" -- "$exe" $(method_args "$m") --epochs "$epochs" \
               --link "$link" --link-bits "$(link_bits "$link")" --out "$out.part"; then
            mv "$out.part" "$out"
          else
            rm -f "$out.part"
            echo "e2e/run.sh: FAILED at $t, $link, $np ranks, $m" >&2
          fi
        done
      done
    done
  done
  bench/netbed/teardown.sh
  trap - EXIT
fi

machine=${PACTRAIN_E2E_MACHINE:-}
if [[ -z $machine ]]; then
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  isa=AVX2
  grep -qw avx512f /proc/cpuinfo && isa=AVX-512
  machine="$(nproc) cores of $cpu ($isa), $(. /etc/os-release && echo "$PRETTY_NAME"), one rank per testbed host"
fi
/usr/bin/python3 bench/e2e/report.py --results "$results" --machine "$machine" \
  --out "${results%/*}/e2e.md"
