# shellcheck shell=bash
# Installs the Debian packages pactrain's scripts need; sourced by scripts/test.sh and
# scripts/demo.sh. Quiet when everything is present.

PACTRAIN_DEB_PACKAGES=(
  build-essential cmake g++ pkg-config ninja-build
  openmpi-bin libopenmpi-dev
  doctest-dev libbenchmark-dev libeigen3-dev zlib1g-dev
  clang-14 libclang-rt-14-dev
  dataset-fashion-mnist gnuplot-nox iproute2 ethtool
  libtorch-dev fortunes
  # LibTorch's matrix products go through the system BLAS, which is otherwise Debian's
  # reference implementation: 4.6x slower per language-model step here. The serial build,
  # because each MPI rank runs one thread.
  libopenblas0-serial
)

# pactrain_install_deps [package...]: installs whichever of the packages (default:
# PACTRAIN_DEB_PACKAGES) are missing. Runs apt-get only when something is missing.
pactrain_install_deps() {
  local packages=("$@")
  if [[ ${#packages[@]} -eq 0 ]]; then
    packages=("${PACTRAIN_DEB_PACKAGES[@]}")
  fi
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "note: dpkg-query not found (not Debian?); assuming dependencies are installed" >&2
    return 0
  fi

  local missing=() pkg
  for pkg in "${packages[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" != "install ok installed" ]]; then
      missing+=("$pkg")
    fi
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0

  echo "== installing: ${missing[*]}"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "error: missing packages (${missing[*]}) and not root; install them first" >&2
      return 1
    fi
  fi
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
