# shellcheck shell=bash
# The GPU check's programs: which CMake targets, and where their binaries are. Sourced by
# check.sh and pack.sh.

# Target, binary path relative to the build tree, and how check.sh runs it.
gpu_programs=(
  "pactrain_gpu_compactor_cuda_test tests/cuda/compactor_cuda_test test"
  "pactrain_gpu_sync_cuda_test tests/cuda/sync_cuda_test test"
  "pactrain_gpu_mpi_cuda_test tests/cuda/mpi_cuda_test mpi-test"
  "pactrain_cuda_bench bench/pactrain_cuda_bench bench"
  "pactrain_cuda_mlp examples/pactrain_cuda_mlp example"
)

# The targets a configured build tree has (any generator: CMake lists every target's
# directory in CMakeFiles/TargetDirectories.txt).
gpu_targets_in() {
  local build=$1 p
  for p in "${gpu_programs[@]}"; do
    read -r -a f <<<"$p"; set -- "${f[@]}"
    if grep -q "/$1.dir\$" "$build/CMakeFiles/TargetDirectories.txt" 2>/dev/null; then echo "$1"; fi
  done
}

gpu_binary_of() {
  local build=$1 target=$2 p
  for p in "${gpu_programs[@]}"; do
    read -r -a f <<<"$p"; set -- "${f[@]}"
    if [[ $1 == "$target" ]]; then echo "$build/$2"; return; fi
  done
}
