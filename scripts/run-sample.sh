#!/usr/bin/env bash
# scripts/run-sample.sh — the main job on the built-in sample (README.md:
# `bash scripts/run-sample.sh`). Installs what is missing, makes a release
# build in build/, then:
#   xmoec check samples/tiny.json              validate, parameter/FLOP summary
#   xmoec ir samples/tiny.json --emit=mlir     the forward graph, verified by mlir-opt-19
#   xmoec compile samples/tiny.json -o out/tiny   autodiff, memory plan, C codegen, build
#   out/tiny/train --data TEXT ...             train on English text (the license
#                                              texts of /usr/share/common-licenses)
#   out/tiny/train --eval ...                  held-out loss of the final checkpoint
# Stops at the first failure with its exit status. Takes about two minutes on
# 2 cores.
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

step "xmoec ir samples/tiny.json --emit=mlir | mlir-opt-19 --allow-unregistered-dialect"
mlir_text=$("$xmoec" ir samples/tiny.json --emit=mlir)
printf '%s\n' "$mlir_text" | "$mlir_opt" --allow-unregistered-dialect >/dev/null
echo "mlir-opt-19 verified the exported module ($(grep -c '"xmoe\.' <<<"$mlir_text") xmoe ops)"

step "xmoec compile samples/tiny.json -o out/tiny"
"$xmoec" compile samples/tiny.json -o out/tiny

data="$root/out/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"
step "out/tiny/train --data out/english.txt (300 steps; the last 5% of the text is held out)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf out/tiny-ckpt
out/tiny/train --data "$data" --ckpt-dir out/tiny-ckpt --save-every 100 --log out/tiny-train.jsonl

step "out/tiny/train --eval --resume out/tiny-ckpt (all held-out windows)"
out/tiny/train --data "$data" --eval --batches 23 --resume out/tiny-ckpt

echo
echo "run-sample.sh: done (program in out/tiny, checkpoints in out/tiny-ckpt, per-step log out/tiny-train.jsonl)"
