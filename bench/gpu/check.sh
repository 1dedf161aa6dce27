#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU, runs the gpu tests, the CUDA benchmark and a
# short CUDA example run, then prints a summary against the targets. Needs no network.
#
# Where the programs come from:
#   - built here, when nvcc, CMake and doctest are found: a fresh Release build for sm_$arch
#     (Ninja where found, all cores), into <repo>/build-gpu;
#   - else from gpu-pack/ (bench/gpu/pack.sh, run on a machine with the CUDA toolkit and no GPU;
#     carry gpu-pack with the tree). PACTRAIN_GPU_PREBUILT=1 uses gpu-pack/ even when a build
#     would be possible.
# Everything runs under one deadline (PACTRAIN_GPU_DEADLINE seconds, default 450); each phase
# gets at most what is left.
#
# Verdict: exits non-zero when a phase fails, when a program cannot run, or when nvidia-smi
# lists a GPU but a gpu test skipped (then the CUDA runtime's error name is printed): a check
# that tested nothing does not pass.
#
#   bench/gpu/check.sh
#   PACTRAIN_GPU_PREBUILT=1 bench/gpu/check.sh
# Logs go to $OUT/gpu-check when OUT is set (e.g. by a remote runner), else <build>/logs.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/bench/gpu/targets.sh"
build=${PACTRAIN_GPU_BUILD:-$root/build-gpu}
pack=$root/gpu-pack
arch=${PACTRAIN_CUDA_ARCH:-90}
jobs=${PACTRAIN_JOBS:-$(nproc)}
start=$SECONDS
deadline=$((start + ${PACTRAIN_GPU_DEADLINE:-450}))
export PATH="$PATH:/usr/local/cuda/bin"

summary=()
status=0
note() { summary+=("$*"); echo "== $*"; }
fail() { status=1; note "$*"; }
# Seconds left before the deadline, at most $1 (and at least 1).
left() {
  local l=$((deadline - SECONDS))
  ((l > $1)) && l=$1
  ((l < 1)) && l=1
  echo "$l"
}
finish() {
  echo
  echo "== summary ($((SECONDS - start)) s)"
  printf '  %s\n' "${summary[@]}"
  exit $status
}

# --- what this machine has -----------------------------------------------------------------
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
  sed 's/^/GPU: /' || echo "GPU: nvidia-smi not available"
note "nvidia-smi lists ${gpus:-0} GPU(s)"

have_package() {  # a CMake config package on the default prefixes
  local dir
  dir=$(mktemp -d)
  printf 'cmake_minimum_required(VERSION 3.25)\nproject(p LANGUAGES CXX)\nfind_package(%s CONFIG REQUIRED)\n' \
    "$1" >"$dir/CMakeLists.txt"
  if cmake -S "$dir" -B "$dir/b" >/dev/null 2>&1; then rm -rf "$dir"; return 0; fi
  rm -rf "$dir"
  return 1
}

mode=prebuilt
if [[ ${PACTRAIN_GPU_PREBUILT:-0} != 1 ]] && command -v nvcc >/dev/null 2>&1 &&
    command -v cmake >/dev/null 2>&1 && have_package doctest; then
  mode=build
fi

# --- the programs ------------------------------------------------------------------------------
declare -A binary=()
if [[ $mode == build ]]; then
  logs=${OUT:+$OUT/gpu-check}
  logs=${logs:-$build/logs}
  benchmarks=ON
  have_package benchmark || { benchmarks=OFF; note "Google Benchmark not found: no CUDA benchmark"; }
  generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  rm -rf "$build"
  mkdir -p "$logs"
  echo "== configure ($build, sm_$arch, ${generator[*]:-Makefiles})"
  if ! timeout "$(left 120)" cmake -S "$root" -B "$build" "${generator[@]}" --log-level=WARNING \
      -DCMAKE_BUILD_TYPE=Release -DPACTRAIN_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
      -DPACTRAIN_WERROR=ON -DPACTRAIN_HEADER_CHECK=OFF -DPACTRAIN_BUILD_TESTS=ON \
      -DPACTRAIN_BUILD_BENCHMARKS=$benchmarks -DPACTRAIN_BUILD_EXAMPLES=ON \
      >"$logs/configure.log" 2>&1; then
    tail -30 "$logs/configure.log"
    fail "configure: FAILED (see $logs/configure.log)"
    finish
  fi
  mapfile -t targets < <(gpu_targets_in "$build")
  echo "== build (${targets[*]}) with $jobs jobs"
  t0=$SECONDS
  if timeout "$(left 300)" cmake --build "$build" --parallel "$jobs" --target "${targets[@]}" \
      >"$logs/build.log" 2>&1; then
    note "build: OK ($((SECONDS - t0)) s)"
  else
    tail -40 "$logs/build.log"
    fail "build: FAILED (see $logs/build.log)"
    finish
  fi
  for t in "${targets[@]}"; do binary[$t]=$(gpu_binary_of "$build" "$t"); done
else
  logs=${OUT:+$OUT/gpu-check}
  logs=${logs:-$pack/logs}
  mkdir -p "$logs"
  if [[ ! -d $pack/bin ]]; then
    fail "no toolchain or doctest here, and no gpu-pack/ (run bench/gpu/pack.sh and carry it)"
    finish
  fi
  note "programs from gpu-pack: $(tr '\n' ';' <"$pack/MANIFEST")"
  export LD_LIBRARY_PATH="$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # NCCL and cuBLAS are too large to pack: take the machine's, from the system or from the
  # NVIDIA Python wheels (nvidia-nccl, nvidia-cublas) that a PyTorch install brings.
  wheels=$(python3 -c 'import glob, nvidia; print(":".join(sorted(glob.glob(list(nvidia.__path__)[0] + "/*/lib"))))' 2>/dev/null || true)
  [[ -n $wheels ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$wheels"
  for p in "${gpu_programs[@]}"; do
    read -r -a f <<<"$p"; set -- "${f[@]}"
    [[ -x $pack/bin/$(basename "$2") ]] && binary[$1]=$pack/bin/$(basename "$2")
  done
fi

# Runs one program with a time limit; $1 names it, $2 is its log, the rest the command.
# Sets rc.
run_logged() {
  local name=$1 log=$2
  shift 2
  local missing
  missing=$(ldd "$1" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')
  if [[ -n $missing ]]; then
    echo "missing libraries: $missing" >"$log"
    rc=127
    return
  fi
  rc=0
  timeout "$(left 240)" "$@" >"$log" 2>&1 || rc=$?
}

# --- gpu tests -----------------------------------------------------------------------------------
launch_mpi=()
if command -v mpiexec >/dev/null 2>&1; then
  launch_mpi=(mpiexec --allow-run-as-root --oversubscribe -n 2)
fi
for p in "${gpu_programs[@]}"; do
  read -r -a f <<<"$p"; set -- "${f[@]}"
  target=$1 kind=$3
  [[ $kind == test || $kind == mpi-test ]] || continue
  name=$(basename "$2")
  if [[ -z ${binary[$target]:-} ]]; then
    fail "gpu test $name: NOT BUILT"
    continue
  fi
  if [[ $kind == mpi-test && ${#launch_mpi[@]} == 0 ]]; then
    fail "gpu test $name: NOT RUN (no mpiexec on this machine)"
    continue
  fi
  echo "== gpu test $name"
  if [[ $kind == mpi-test ]]; then
    run_logged "$name" "$logs/$name.log" "${launch_mpi[@]}" "${binary[$target]}"
  else
    run_logged "$name" "$logs/$name.log" "${binary[$target]}"
  fi
  result=$(grep -E '^\[doctest\] (test cases|assertions)' "$logs/$name.log" | tail -2 | tr -s ' ' |
    tr '\n' ' ')
  if [[ $rc == 0 ]]; then
    note "gpu test $name: passed; $result"
  elif [[ $rc == 77 ]]; then
    why=$(grep -m1 'no CUDA device' "$logs/$name.log")
    if ((gpus > 0)); then
      fail "gpu test $name: SKIPPED although nvidia-smi lists a GPU: $why"
    else
      note "gpu test $name: skipped: $why"
    fi
  else
    grep -E 'ERROR|error|missing|Timeout|what\(\)' "$logs/$name.log" | head -20
    fail "gpu test $name: FAILED (rc $rc; $result; see $logs/$name.log)"
  fi
done

# --- benchmark -----------------------------------------------------------------------------------
bench_bin=${binary[pactrain_cuda_bench]:-}
if [[ -z $bench_bin ]]; then
  fail "benchmark: NOT BUILT"
else
  echo "== CUDA benchmark"
  run_logged bench "$logs/cuda_bench.txt" "$bench_bin" --benchmark_min_time=0.05 \
    --benchmark_counters_tabular=true --benchmark_out="$logs/cuda_bench.json" \
    --benchmark_out_format=json
  if [[ $rc == 0 ]]; then
    cat "$logs/cuda_bench.txt"
    note "benchmark: OK ($logs/cuda_bench.txt, .json)"
  else
    tail -20 "$logs/cuda_bench.txt"
    fail "benchmark: FAILED or skipped (rc $rc; see $logs/cuda_bench.txt)"
  fi
  if command -v python3 >/dev/null 2>&1 && [[ -s $logs/cuda_bench.json ]]; then
    while IFS= read -r line; do
      note "$line"
      [[ $line == *"NOT MET"* ]] && status=1
    done < <(python3 - "$logs/cuda_bench.json" <<'PY'
import json, sys
rows = {b["name"]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
def row(name):
    return rows.get(name + "/manual_time") or rows.get(name)
for op in ("gather", "scatter", "gather_fp16", "scatter_fp16", "thrust_gather", "thrust_scatter"):
    b = row(op + "/bitmap/10")
    if b and "x_memcpy_bw" in b:
        v = b["x_memcpy_bw"]
        line = f"{op}/bitmap/10: {v:.2f}x memcpy bandwidth"
        if op in ("gather", "scatter"):  # the targets: the hand-written kernels
            line = "target " + line + " (want >= 0.8): " + ("MET" if v >= 0.8 else "NOT MET")
        print(line)
b = row("sync/nccl1/10")
if b and "outside_allreduce_us" in b:
    v = b["outside_allreduce_us"]
    print(f"target sync 100 MB at 90% sparsity: {v:.1f} us outside the allreduce (want < 200): "
          + ("MET" if v < 200 else "NOT MET"))
b = row("sync_ternary_ef/nccl1/10")
if b and "outside_allreduce_us" in b:
    print(f"sync 100 MB at 90% sparsity, ternary with error feedback: "
          f"{b['outside_allreduce_us']:.1f} us outside the allreduce of its wire words")
PY
    )
  fi
fi

# --- example -------------------------------------------------------------------------------------
mlp_bin=${binary[pactrain_cuda_mlp]:-}
data=/usr/share/datasets/fashion-mnist
if [[ -z $mlp_bin ]]; then
  fail "example: NOT BUILT"
elif [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
  note "example: not run (no Fashion-MNIST data in $data)"
else
  echo "== example: pactrain_cuda_mlp, 1 rank, 2 epochs"
  launch=()
  command -v mpiexec >/dev/null 2>&1 && launch=(mpiexec --allow-run-as-root --oversubscribe -n 1)
  run_logged example "$logs/cuda_mlp.log" "${launch[@]}" "$mlp_bin" --epochs 2 --sparsity 0.9
  if [[ $rc == 0 ]]; then
    cat "$logs/cuda_mlp.log"
    note "example: OK, $(grep '^epoch' "$logs/cuda_mlp.log" | tail -1)"
  else
    tail -20 "$logs/cuda_mlp.log"
    fail "example: FAILED (rc $rc; see $logs/cuda_mlp.log)"
  fi
fi

finish
