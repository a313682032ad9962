#!/usr/bin/env bash
# scripts/setup.sh — installs the Debian 12 packages xmoec needs to build and
# test. Idempotent: when everything is present it only says so (dpkg-query
# is checked first, so no network access happens on a ready machine).
#
# Usage: bash scripts/setup.sh
# The ROCm/HIP group (hipcc, libamdhip64-dev, rocm-device-libs: Debian's
# ROCm 5.2) builds the HIP backend and compiles out/kernels.hip for AMD GPUs
# with no GPU present; XM_SETUP_GPU=0 leaves it out (the HIP target is then
# skipped, and says so). nvcc is not a Debian package: the CUDA target is
# built where /usr/local/cuda (or CUDA_HOME) has it.
# Runs as root directly (CI) and through sudo otherwise. OpenMP: gcc brings
# libgomp; libomp-19-dev is the runtime of the clang-19 sanitizer build.
# python3-torch and python3-numpy are the independent reference of the
# end-to-end tests and the PyTorch baseline of the benchmarks (never a
# dependency of xmoec itself).
set -euo pipefail

packages=(
  cmake make gcc g++ pkg-config
  libcjson-dev libcmocka-dev
  llvm-19-dev libmlir-19-dev mlir-19-tools llvm-19-tools
  clang-19 libclang-rt-19-dev
  openmpi-bin libopenmpi-dev
  libopenblas-dev
  libsimgrid-dev
  libomp-19-dev
  python3 python3-torch python3-numpy
)
gpu_packages=(hipcc libamdhip64-dev rocm-device-libs)
if [[ "${XM_SETUP_GPU:-1}" == "1" ]]; then
  packages+=("${gpu_packages[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} required packages are installed"
  exit 0
fi

echo "setup: missing packages: ${missing[*]}"
if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup: error: not root and sudo is not available; install as root:" >&2
  echo "  apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "setup: apt-get update"
"${as_root[@]}" apt-get update -qq
echo "setup: apt-get install ${missing[*]}"
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
