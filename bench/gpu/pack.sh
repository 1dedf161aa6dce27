#!/usr/bin/env bash
# Builds the GPU check's programs here, for a GPU machine that lacks a toolchain or the test
# libraries (doctest, Google Benchmark): needs nvcc and CMake, no GPU. Writes gpu-pack/ at the
# repository root (ignored by git):
#   gpu-pack/bin/   the gpu tests, the CUDA benchmark and the CUDA example
#   gpu-pack/lib/   the shared libraries they need that a bare machine may lack and that are
#                   small enough to travel (the CUDA runtime, Google Benchmark, Open MPI's
#                   libraries); NCCL and cuBLAS (over 200 MB each) and the driver come from the
#                   GPU machine (check.sh also looks in NVIDIA's Python wheels there)
#   gpu-pack/MANIFEST  commit, date, architecture, compiler
# bench/gpu/check.sh runs these when it cannot build on the GPU machine.
#
#   bench/gpu/pack.sh                   # sm_90 (H100, H200)
#   PACTRAIN_CUDA_ARCH=100 bench/gpu/pack.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${PACTRAIN_GPU_PACK_BUILD:-$root/build-gpu-pack}
pack=$root/gpu-pack
arch=${PACTRAIN_CUDA_ARCH:-90}
export PATH="$PATH:/usr/local/cuda/bin"

generator=()
if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
echo "== configure ($build, sm_$arch)"
cmake -S "$root" -B "$build" "${generator[@]}" --log-level=WARNING \
  -DCMAKE_BUILD_TYPE=Release -DPACTRAIN_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DPACTRAIN_WERROR=ON -DPACTRAIN_HEADER_CHECK=OFF -DPACTRAIN_BUILD_TESTS=ON \
  -DPACTRAIN_BUILD_BENCHMARKS=ON -DPACTRAIN_BUILD_EXAMPLES=ON >/dev/null
source "$root/bench/gpu/targets.sh"
mapfile -t targets < <(gpu_targets_in "$build")
echo "== build: ${targets[*]}"
cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]}"

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib"
for t in "${targets[@]}"; do
  bin=$(gpu_binary_of "$build" "$t")
  cp "$bin" "$pack/bin/"
done
# Shared libraries outside the C and C++ runtimes, up to 32 MB each; never the driver.
for b in "$pack"/bin/*; do
  ldd "$b" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  name=$(basename "$lib")
  [[ -e $pack/lib/$name ]] && continue
  case $name in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s*|libstdc++*|libcuda.so*) continue ;;
  esac
  if (($(stat -Lc %s "$lib") > 32 * 1024 * 1024)); then
    echo "   not packed (too large; check.sh looks on the GPU machine): $name"
    continue
  fi
  cp -L "$lib" "$pack/lib/$name"
done
{
  echo "commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo '+changes')"
  echo "date $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "arch sm_$arch"
  echo "nvcc $(nvcc --version | tail -1)"
  echo "cxx $(c++ --version | head -1)"
} >"$pack/MANIFEST"
du -sh "$pack"
echo "== packed: $(cd "$pack/bin" && echo *)"
