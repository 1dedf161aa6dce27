#!/usr/bin/env bash
# Builds pactrain optimised and runs its tests there (examples, soak, LibTorch, fault, consumer,
# benchmark smoke, CUDA fence), then builds the unit and MPI tests with AddressSanitizer + UBSan
# and runs them there (each of those is compiled once: in the sanitizer build, or in the
# optimised one with PACTRAIN_SKIP_ASAN=1). Meant for a fresh Debian 12 as root (installs what
# is missing).
# Where nvcc is found (PATH or CUDACXX), the CUDA targets are built too; their gpu-labelled
# tests report "skipped" without a GPU, the cuda-labelled ones (header fence) run.
#
#   scripts/test.sh                       # full run
#   PACTRAIN_SKIP_ASAN=1 scripts/test.sh  # skip the sanitizer build
#   PACTRAIN_SKIP_FUZZ=1 scripts/test.sh  # skip the fuzz smoke runs
#   PACTRAIN_JOBS=4 scripts/test.sh       # build parallelism (default 2)
#   PACTRAIN_TEST_JOBS=3 scripts/test.sh  # test parallelism (default: build parallelism + 1)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/install_deps.sh
source scripts/lib/install_deps.sh

jobs=${PACTRAIN_JOBS:-2}
# One test more than cores: the MPI tests spend part of each run starting up and waiting, and
# the overlap took 13 s from the optimised build's tests and 5 s from the sanitizer build's (65
# against 78 s, 68 against 73 s on 2 cores). A test needing more processes than this (ctest's
# PROCESSORS, the rank count) still runs alone.
test_jobs=${PACTRAIN_TEST_JOBS:-$((jobs + 1))}
start=$SECONDS

section() { echo "== $*"; }

# Ninja: about 25 s less than Makefiles for the Release build on 2 cores (296 against 322 s,
# configure included), by keeping both cores busy to the end. A tree configured before keeps
# its generator.
generator() {  # <build dir>
  if [[ ! -f $1/CMakeCache.txt ]] && command -v ninja >/dev/null 2>&1; then echo "-GNinja"; fi
}

pactrain_install_deps "${PACTRAIN_DEB_PACKAGES[@]}"

unit_tests=OFF
[[ ${PACTRAIN_SKIP_ASAN:-0} == 1 ]] && unit_tests=ON

section "configure (build/, Release)"
# shellcheck disable=SC2046 # generator prints one word or nothing
cmake -S . -B build $(generator build) --log-level=WARNING \
  -DCMAKE_BUILD_TYPE=Release \
  -DPACTRAIN_WERROR=ON \
  -DPACTRAIN_SANITIZE=OFF \
  -DPACTRAIN_UNIT_TESTS=$unit_tests

section "build"
cmake --build build --parallel "$jobs"

section "test"
ctest --test-dir build --output-on-failure --parallel "$test_jobs"

if [[ ${PACTRAIN_SKIP_ASAN:-0} == 1 ]]; then
  section "sanitizer build skipped (PACTRAIN_SKIP_ASAN=1)"
else
  section "sanitizer configure (build-asan/, ASan + UBSan)"
  # The MPI tests on 1 and 4 ranks: the ends that differ most; 2 ranks run in build/ (the
  # allocation, LibTorch, training and example tests) and with PACTRAIN_SKIP_ASAN=1.
  # -O0: with both sanitizers, -O1 compiles the template-heavy tests about 5x slower (100 s
  # against 21 s for tests/unit/sync/sync_test.cpp on 2 cores), far more than the tests then run.
  # -g1: line tables, all a sanitizer report's stack needs; about 6% less compile time than -g
  # (11.8 against 12.6 s for tests/unit/codec/codec_test.cpp).
  # shellcheck disable=SC2046
  cmake -S . -B build-asan $(generator build-asan) --log-level=WARNING \
    -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g1" \
    -DPACTRAIN_SANITIZE=ON \
    -DPACTRAIN_UNIT_TESTS=ON \
    "-DPACTRAIN_MPI_TEST_RANKS=1;4" \
    -DPACTRAIN_WERROR=ON \
    -DPACTRAIN_HEADER_CHECK=OFF \
    -DPACTRAIN_BUILD_EXAMPLES=OFF \
    -DPACTRAIN_BUILD_BENCHMARKS=OFF \
    -DPACTRAIN_ENABLE_CUDA=OFF

  section "sanitizer build"
  cmake --build build-asan --parallel "$jobs"

  section "sanitizer test (unit|mpi)"
  # Any report fails the test. The MPI tests add LeakSanitizer suppressions for Open MPI's
  # own leaks (tests/lsan.supp, see cmake/PactrainTesting.cmake).
  # The consumer and compile-failure tests ran in build/ already; they run no instrumented code.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=0:strict_string_checks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
  ctest --test-dir build-asan --output-on-failure --parallel "$test_jobs" \
    --label-regex 'unit|mpi' --exclude-regex '^(consumer_|compile_fail\.)'
fi

# The libFuzzer targets (tests/fuzz), in their own build with clang-14. Adds about 30 s on 2
# cores: the four targets build in about 23 s (one translation unit each), then each runs for
# 3 s over its seeds and checks that the committed seeds are current.
fuzz_cxx=${PACTRAIN_FUZZ_CXX:-clang++-14}
if [[ ${PACTRAIN_SKIP_FUZZ:-0} == 1 ]]; then
  section "fuzz smoke runs skipped (PACTRAIN_SKIP_FUZZ=1)"
elif ! command -v "$fuzz_cxx" >/dev/null 2>&1; then
  section "fuzz smoke runs skipped ($fuzz_cxx not found)"
else
  section "fuzz configure (build-fuzz/, libFuzzer + ASan + UBSan)"
  # shellcheck disable=SC2046
  cmake -S tests/fuzz -B build-fuzz $(generator build-fuzz) --log-level=WARNING \
    -DCMAKE_CXX_COMPILER="$fuzz_cxx" \
    -DPACTRAIN_FUZZ_SMOKE_SECONDS=3 \
    -DPACTRAIN_WERROR=ON

  section "fuzz build"
  cmake --build build-fuzz --parallel "$jobs"

  section "fuzz smoke runs"
  ctest --test-dir build-fuzz --output-on-failure --parallel "$jobs"
fi

section "all passed ($((SECONDS - start)) s)"
