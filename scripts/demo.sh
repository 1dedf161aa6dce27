#!/usr/bin/env bash
# Builds a trainer (by default the Fashion-MNIST MLP of examples/fmnist, in Eigen;
# PACTRAIN_DEMO=torch-cnn: the LibTorch CNN of examples/torch_cnn; PACTRAIN_DEMO=torch-lm: the
# LibTorch transformer language model of examples/torch_lm) and runs it on 4 MPI ranks
# (installs what is missing first): a dense run, a run pruned gradually (to 90% sparsity; the
# language model to 80%), and the same pruned run with its kept entries sent as ternary lanes
# with error feedback, all with the same seed and epochs, then a side-by-side table (test
# accuracy or validation bits per byte, sparsity, bytes sent per step, step time). The JSON summary goes to build/demo/summary.json. Extra arguments go to the trainer
# (later options win over the demo's own):
#
#   scripts/demo.sh [trainer args...]          # e.g. --epochs 4, --seed 2, --codec none
#   PACTRAIN_DEMO_RANKS=2 scripts/demo.sh      # another rank count
#   PACTRAIN_DEMO=torch-cnn scripts/demo.sh    # the same three runs with a LibTorch CNN
#                                              # (examples/torch_cnn; needs libtorch-dev)
#   PACTRAIN_DEMO=torch-lm scripts/demo.sh     # ... with a LibTorch transformer language
#                                              # model on Debian's fortunes (examples/torch_lm)
#   PACTRAIN_DEMO=sync scripts/demo.sh         # the gradient-sync check (examples/sync_demo)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/install_deps.sh
source scripts/lib/install_deps.sh

pactrain_install_deps "${PACTRAIN_DEB_PACKAGES[@]}"

echo "== configure (build/)"
if [[ -f build/CMakeCache.txt ]]; then
  cmake -S . -B build --log-level=WARNING   # keep the existing configuration
else
  cmake -S . -B build --log-level=WARNING -DCMAKE_BUILD_TYPE=Release
fi

demo=${PACTRAIN_DEMO:-fmnist}
case "$demo" in
  fmnist) target=pactrain_fmnist; demo_args=(--sparsity 0.9 --codec ternary) ;;
  torch-cnn) target=pactrain_torch_cnn; demo_args=(--sparsity 0.9 --mode all) ;;
  torch-lm) target=pactrain_torch_lm; demo_args=(--sparsity 0.8 --mode all) ;;
  sync) target=pactrain_sync_demo ;;
  *)
    echo "error: PACTRAIN_DEMO must be fmnist, torch-cnn, torch-lm or sync, not '$demo'" >&2
    exit 2
    ;;
esac

echo "== build $target"
cmake --build build --parallel "${PACTRAIN_JOBS:-2}" --target "$target"
if [[ ! -x build/examples/$target ]]; then
  echo "error: build/examples/$target was not built (see the configure messages above)" >&2
  exit 1
fi

ranks=${PACTRAIN_DEMO_RANKS:-4}
echo "== run on $ranks ranks"
# Yielding matters when there are more ranks than cores: busy-polling ranks starve each other.
export OMPI_MCA_mpi_yield_when_idle=1
# One LibTorch thread per rank: its thread pools would oversubscribe the cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mpirun=(mpiexec -n "$ranks" --allow-run-as-root --oversubscribe)

if [[ $demo == sync ]]; then
  exec "${mpirun[@]}" build/examples/pactrain_sync_demo "$@"
fi

summary=build/demo/summary.json
mkdir -p build/demo
rm -f "$summary"
start=$SECONDS
"${mpirun[@]}" "build/examples/$target" "${demo_args[@]}" --summary "$summary" "$@"
echo "== finished in $((SECONDS - start)) s (including MPI start-up); summary: $summary"

# The trainer printed the table; check the demo's targets against the summary.
if [[ -f $summary ]] && command -v python3 >/dev/null 2>&1; then
  python3 - "$summary" <<'EOF'
import json, sys

s = json.load(open(sys.argv[1]))
if "dense" not in s or "sparse" not in s:
    sys.exit(0)
d, p = s["dense"], s["sparse"]
ratio = p["bytes_per_step"] / d["bytes_per_step"]


def verdict(ok):
    return "met" if ok else "MISSED"


if "val_bits_per_byte" in d:  # the language model: bits per byte within 3% (ternary 5%)
    r = p["val_bits_per_byte"] / d["val_bits_per_byte"] - 1
    print(f"targets: validation bits per byte {100 * r:+.2f}% against dense (want <= +3%): "
          f"{verdict(r <= 0.03)}; sparse bytes {100 * ratio:.1f}% of dense at "
          f"{100 * p['sparsity']:.1f}% sparsity")
    if "ternary" in s:
        t = s["ternary"]
        tr = t["val_bits_per_byte"] / d["val_bits_per_byte"] - 1
        print(f"         ternary {100 * tr:+.2f}% (want <= +5%): {verdict(tr <= 0.05)}; "
              f"ternary bytes {100 * t['bytes_per_step'] / d['bytes_per_step']:.2f}% of dense")
    sys.exit(0)
gap = 100.0 * (d["test_accuracy"] - p["test_accuracy"])
print(f"targets: accuracy gap {gap:.2f} points (want <= 0.5): {verdict(gap <= 0.5)}; "
      f"sparse bytes {100 * ratio:.1f}% of dense at {100 * p['sparsity']:.1f}% sparsity "
      f"(weights {100 * (1 - p['sparsity']):.1f}% kept, biases dense)")
if "ternary" in s:
    t = s["ternary"]
    tgap = 100.0 * (d["test_accuracy"] - t["test_accuracy"])
    print(f"         ternary gap {tgap:.2f} points (want <= 1): {verdict(tgap <= 1.0)}; "
          f"ternary bytes {100 * t['bytes_per_step'] / d['bytes_per_step']:.2f}% of dense")
EOF
fi
