#!/usr/bin/env bash
# The end-to-end training grid behind bench/results/e2e.md: the Fashion-MNIST MLP, the LibTorch
# CNN and the LibTorch language model trained with each method (pactrain's and the baselines',
# see bench/e2e/main.cpp and torch_main.cpp) on the bandwidth-shaped testbed (bench/netbed),
# one JSON point per run in bench/results/e2e/, then the report and plots (bench/e2e/report.py).
#
#   bench/e2e/run.sh          # as root, from anywhere; resumable: points already there are kept
#
# Environment (defaults in brackets):
#   PACTRAIN_BUILD_DIR     build directory [build]
#   PACTRAIN_E2E_TRAINERS  mlp (pactrain_e2e), cnn and lm (pactrain_e2e_torch; the
#                          last two need LibTorch) [mlp cnn lm]
#   PACTRAIN_E2E_LINKS     link rates [100mbit 1gbit none]
#   PACTRAIN_E2E_RANKS     rank counts [4 2]
#   PACTRAIN_E2E_SEEDS     seeds of each point [1 2 3 on 4 ranks at 100mbit and 1gbit (the
#                          cells that get verdicts), 1 elsewhere]
#   PACTRAIN_E2E_METHODS   [dense sparse ternary ternary_restart auto dgc999 dgc99 powersgd1
#                          powersgd2 powersgd4 powersgd8 powersgdM powersgd4_start fp16; see
#                          method_args below; the CNN and the language model skip auto, which
#                          the LibTorch loop does not have]
#   PACTRAIN_E2E_EPOCHS    epochs of every run [each program's: 6, 6 and 4]
#   PACTRAIN_E2E_RESULTS   where the points go [bench/results/e2e]
#   PACTRAIN_E2E_MACHINE   the machine recorded in the points it runs [this machine's CPU and
#                          cores]
#   PACTRAIN_REPORT_ONLY=1 only rebuild the report and plots from the points present
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${PACTRAIN_BUILD_DIR:-build}
results=${PACTRAIN_E2E_RESULTS:-bench/results/e2e}
read -r -a trainers <<< "${PACTRAIN_E2E_TRAINERS:-mlp cnn lm}"
read -r -a links <<< "${PACTRAIN_E2E_LINKS:-100mbit 1gbit none}"
read -r -a ranks_list <<< "${PACTRAIN_E2E_RANKS:-4 2}"
read -r -a methods <<< "${PACTRAIN_E2E_METHODS:-dense sparse ternary ternary_restart auto dgc999 dgc99 powersgd1 powersgd2 powersgd4 powersgd8 powersgdM powersgd4_start fp16}"
epochs=()
[[ -n ${PACTRAIN_E2E_EPOCHS:-} ]] && epochs=(--epochs "$PACTRAIN_E2E_EPOCHS")

# The seeds of a cell: three where the grid gives verdicts (4 ranks at 100 Mbit/s and 1 Gbit/s),
# one elsewhere (labelled so in the report).
cell_seeds() {  # <link> <ranks>
  if [[ -n ${PACTRAIN_E2E_SEEDS:-} ]]; then
    echo "$PACTRAIN_E2E_SEEDS"
  elif [[ $2 == 4 && ($1 == 100mbit || $1 == 1gbit) ]]; then
    echo "1 2 3"
  else
    echo 1
  fi
}

method_args() {  # the programs' arguments of a method's name (its label in the points)
  case "$1" in
    ternary_restart) echo "--method ternary --lr-rewind 1" ;;
    dgc999) echo "--method topk --dgc-sparsity 0.999" ;;
    dgc99) echo "--method topk --dgc-sparsity 0.99" ;;
    powersgdM) echo "--method powersgd --powersgd-rank match" ;;
    powersgd4_start) echo "--method powersgd --powersgd-rank 4 --powersgd-start 0.1" ;;
    powersgd[0-9]*) echo "--method powersgd --powersgd-rank ${1#powersgd}" ;;
    *) echo "--method $1" ;;
  esac
}

# The program of a trainer, its first arguments, and the trainer's name in the points.
trainer_program() {
  case "$1" in
    mlp) echo pactrain_e2e ;;
    cnn | lm) echo pactrain_e2e_torch ;;
    *) echo "e2e/run.sh: unknown trainer '$1' (mlp, cnn or lm)" >&2; exit 1 ;;
  esac
}
trainer_args() {
  [[ $1 == mlp ]] || echo "$1"
}
trainer_name() {
  case "$1" in
    lm) echo fortunes_lm ;;
    *) echo "fmnist_$1" ;;
  esac
}
# Whether a trainer has a method: the LibTorch loop has no strategy tuner (auto), and the
# language model's recipe never restarts its learning rate (ternary_restart).
has_method() {
  case "$2" in
    auto) [[ $1 == mlp ]] ;;
    ternary_restart) [[ $1 != lm ]] ;;
    *) true ;;
  esac
}

# This machine, recorded in each point it runs; the report names each point's machine (and
# this one for points that lack it).
machine=${PACTRAIN_E2E_MACHINE:-}
if [[ -z $machine ]]; then
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  isa=AVX2
  grep -qw avx512f /proc/cpuinfo && isa=AVX-512
  # Family and model too: virtual machines of different CPU generations can report one model
  # name, and their floating-point results differ.
  family=$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  model=$(sed -n 's/^model[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  machine="$(nproc) cores of $cpu ($isa, family $family model $model), $(. /etc/os-release && echo "$PRETTY_NAME"), one rank per testbed host"
fi

if [[ "${PACTRAIN_REPORT_ONLY:-0}" != 1 ]]; then
  # shellcheck source=bench/lib.sh
  source bench/lib.sh
  programs=()
  for t in "${trainers[@]}"; do programs+=("$(trainer_program "$t")"); done
  pactrain_bench_prepare e2e/run.sh "${programs[@]}"
  mkdir -p "$results"
  trap 'bench/netbed/teardown.sh' EXIT
  total=0
  for link in "${links[@]}"; do
    for np in "${ranks_list[@]}"; do
      read -r -a seeds <<< "$(cell_seeds "$link" "$np")"
      for t in "${trainers[@]}"; do
        for m in "${methods[@]}"; do
          ! has_method "$t" "$m" || total=$((total + ${#seeds[@]}))
        done
      done
    done
  done
  i=0
  start=$SECONDS
  for link in "${links[@]}"; do
    testbed=0
    for t in "${trainers[@]}"; do
      exe=$(cd "$build/bench" && pwd)/$(trainer_program "$t")
      for np in "${ranks_list[@]}"; do
        read -r -a seeds <<< "$(cell_seeds "$link" "$np")"
        for seed in "${seeds[@]}"; do
          for m in "${methods[@]}"; do
            has_method "$t" "$m" || continue
            i=$((i + 1))
            out=$results/$(trainer_name "$t")_${link}_np${np}_${m}_s${seed}.json
            if [[ -f $out ]]; then
              echo "[$i/$total] $t, $link, $np ranks, $m, seed $seed: kept from an earlier run"
              continue
            fi
            if [[ $testbed == 0 ]]; then
              bench/netbed/setup.sh 4 "$link"
              testbed=1
            fi
            echo "[$i/$total] $t, $link, $np ranks, $m, seed $seed ($((SECONDS - start)) s so far)"
            # shellcheck disable=SC2046 # trainer_args and method_args print separate words
            if pactrain_netbed_run 1800 "$np" -- "$exe" $(trainer_args "$t") $(method_args "$m") \
                 "${epochs[@]}" --seed "$seed" --label "$m" \
                 --link "$link" --link-bits "$(pactrain_link_bits "$link")" --machine "$machine" \
                 --out "$out.part"; then
              mv "$out.part" "$out"
            else
              rm -f "$out.part"
              echo "e2e/run.sh: FAILED at $t, $link, $np ranks, $m, seed $seed" >&2
            fi
          done
        done
      done
    done
  done
  bench/netbed/teardown.sh
  trap - EXIT
fi

/usr/bin/python3 bench/e2e/report.py --results "$results" --machine "$machine" \
  --out "${results%/*}/e2e.md"
