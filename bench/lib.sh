# shellcheck shell=bash
# Shared by bench/sync/run_all.sh and bench/sync/run_codecs.sh (sourced from the repository root).

# pactrain_bench_prepare NAME TARGET...: checks for root (the testbed needs network
# namespaces), installs missing packages, builds TARGET... in $build (Release) and sets
# bench_exe to pactrain_sync_bench's absolute path.
pactrain_bench_prepare() {
  local name=$1
  shift
  [[ $(id -u) -eq 0 ]] || { echo "$name: must run as root (network namespaces)" >&2; exit 1; }
  # shellcheck source=scripts/lib/install_deps.sh
  source scripts/lib/install_deps.sh
  pactrain_install_deps "${PACTRAIN_DEB_PACKAGES[@]}"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" --target "$@" -j2 >/dev/null
  bench_exe=$(cd "$build/bench" && pwd)/pactrain_sync_bench
}

# pactrain_netbed_run SECONDS NP [VAR=value...] -- PROGRAM [ARG...]: runs PROGRAM on NP
# testbed hosts with the environment given, killed after SECONDS; Open MPI's harmless
# setpgid warnings are dropped from stderr.
pactrain_netbed_run() {
  local limit=$1 np=$2
  shift 2
  local envs=()
  while [[ $1 != -- ]]; do
    envs+=("$1")
    shift
  done
  shift
  env "${envs[@]}" timeout "$limit" bench/netbed/launch.sh -n "$np" "$@" \
    2> >(grep -v 'setpgid' >&2)
}

# pactrain_link_bits RATE: the bits per second of a testbed rate's name (0: unshaped).
pactrain_link_bits() {
  case "$1" in
    100mbit) echo 100000000 ;;
    500mbit) echo 500000000 ;;
    1gbit) echo 1000000000 ;;
    2gbit) echo 2000000000 ;;
    *) echo 0 ;;
  esac
}
