#!/usr/bin/env bash
# scripts/run-sample.sh — the main job on the built-in sample (README.md:
# `bash scripts/run-sample.sh`). Installs what is missing, makes a release
# build in build/, then:
#   xmoec check samples/tiny.json              validate, parameter/FLOP summary
#   xmoec ir samples/tiny.json --emit=mlir     the forward graph, verified by mlir-opt-19
#   xmoec compile samples/tiny.json -o out/tiny --dp 2 --tp 2 --ssmb --ep 4 --rbd
#         --ranks-per-node 2                 shard pass, autodiff, memory plan, C codegen,
#                                            build: 4 ranks as 2 nodes, experts spread
#                                            over all 4, MoE blocks sequence-sharded,
#                                            redundancy-bypassing dispatch
#   mpirun -np 4 out/tiny/train --data TEXT    train on English text (the license
#                                            texts of /usr/share/common-licenses)
#   mpirun -np 4 out/tiny/train --eval ...     held-out loss of the final checkpoint
#   and the inter-node bytes RBD saved against a flat dispatch of the same routing.
# Stops at the first failure with its exit status. Takes a few minutes on
# 2 cores (4 ranks share them).
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

layout=(--dp 2 --tp 2 --ssmb --ep 4 --rbd --ranks-per-node 2)
step "xmoec compile samples/tiny.json -o out/tiny ${layout[*]}"
"$xmoec" compile samples/tiny.json -o out/tiny "${layout[@]}"

data="$root/out/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export XM_RANKS_PER_NODE=2 OMP_NUM_THREADS=1
mpi=(mpirun -np 4)
step "${mpi[*]} out/tiny/train --data out/english.txt (300 steps; 4 ranks as 2 nodes; the last 5% of the text is held out)"
rm -rf out/tiny-ckpt
"${mpi[@]}" out/tiny/train --data "$data" --ckpt-dir out/tiny-ckpt --save-every 100 \
  --log out/tiny-train.jsonl

step "${mpi[*]} out/tiny/train --eval --resume out/tiny-ckpt (all held-out windows)"
"${mpi[@]}" out/tiny/train --data "$data" --eval --batches 23 --resume out/tiny-ckpt

step "what RBD saved (out/tiny-train.jsonl)"
/usr/bin/python3 - out/tiny-train.jsonl out/tiny/config.json <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cfg = json.load(open(sys.argv[2]))
h = cfg["hidden_size"]
pilots = sum(r["rbd"]["inter_rows"] for r in rows)
flat = sum(r["rbd"]["flat_inter_rows"] for r in rows)
moved = sum(r["traffic"]["by_phase"][p]["inter"] for r in rows for p in ("dispatch", "combine"))
# A flat dispatch sends each (token, expert) on another node as a row of h
# floats, four times per step: dispatch, combine and their gradients.
flat_bytes = 4 * flat * 4 * h
print(f"{len(rows)} steps: {pilots} token rows crossed nodes in the forward dispatch instead of "
      f"{flat} with a flat all-to-all ({pilots / flat:.2f}x)")
print(f"dispatch+combine bytes between nodes, forward and backward: {moved / 1e6:.1f} MB with RBD "
      f"vs {flat_bytes / 1e6:.1f} MB flat: {(flat_bytes - moved) / 1e6:.1f} MB saved "
      f"({100 * (flat_bytes - moved) / flat_bytes:.0f}%)")
EOF

echo
echo "run-sample.sh: done (program in out/tiny, checkpoints in out/tiny-ckpt, per-step log out/tiny-train.jsonl)"
