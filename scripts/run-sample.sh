#!/usr/bin/env bash
# scripts/run-sample.sh — the main job on the built-in sample (README.md:
# `bash scripts/run-sample.sh`). Installs what is missing, makes a release
# build in build/, then runs the compiler on the samples:
#   xmoec check samples/tiny.json              validate, parameter/FLOP summary
#   xmoec ir samples/tiny.json                 the forward graph (first lines)
#   xmoec ir samples/tiny.json --emit=mlir     verified by mlir-opt-19
#   xmoec check samples/hf/deepseek-v3.json    a Hugging Face config
# Stops at the first failure with its exit status. Training on the sample
# (xmoec compile, out/train) comes with a later milestone.
#
# Options: --no-setup  skip scripts/setup.sh
# Environment: XM_JOBS (parallel build jobs, default 2).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

setup=1
for arg in "$@"; do
  case "$arg" in
    --no-setup) setup=0 ;;
    *) echo "run-sample.sh: unknown option '$arg' (use --no-setup)" >&2; exit 2 ;;
  esac
done

step() { echo; echo "=== $*"; }

if [[ $setup -eq 1 ]]; then
  step "setup"
  bash "$root/scripts/setup.sh"
fi

step "release build (build/)"
CC=gcc CXX=g++ cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$root/build" -j "${XM_JOBS:-2}" --target xmoec
xmoec="$root/build/xmoec"
mlir_opt=$(command -v mlir-opt-19 || echo /usr/lib/llvm-19/bin/mlir-opt)

step "xmoec check samples/tiny.json"
"$xmoec" check samples/tiny.json

step "xmoec ir samples/tiny.json (first 20 lines)"
ir_text=$("$xmoec" ir samples/tiny.json)
# A here-string, not a pipe: head closing early would end printf with
# SIGPIPE, which pipefail turns into a failure.
head -n 20 <<<"$ir_text"
echo "... ($(wc -l <<<"$ir_text") lines)"

step "xmoec ir samples/tiny.json --emit=mlir | mlir-opt-19 --allow-unregistered-dialect"
mlir_text=$("$xmoec" ir samples/tiny.json --emit=mlir)
printf '%s\n' "$mlir_text" | "$mlir_opt" --allow-unregistered-dialect >/dev/null
echo "mlir-opt-19 verified the exported module ($(grep -c '"xmoe\.' <<<"$mlir_text") xmoe ops)"

step "xmoec check samples/hf/deepseek-v3.json"
"$xmoec" check samples/hf/deepseek-v3.json

echo
echo "run-sample.sh: done"
