#!/usr/bin/env bash
# bench/train.sh — training throughput of compiled xmoec programs against the
# same models in PyTorch on the CPU, side by side in one run.
#
#   bash bench/train.sh [STEPS]        (default 20 timed steps per model)
#
# For each model (samples/tiny.json and bench/cpu-medium.json): compile it,
# write the initial checkpoint, time STEPS optimizer steps of out/train from
# it, and time STEPS steps of bench/torch_train.py (the same model, weights,
# data windows, micro-batch, accumulation, AdamW and clipping, fp32, experts
# as a dropless loop) with the same number of threads. PyTorch runs with both
# OpenMP wait policies and keeps its better figure. Achieved GFLOP/s uses the
# FLOPs per token of `xmoec check` (forward + backward, causal attention) for
# both. PyTorch gets the OpenBLAS kernels out/train chose for itself (its
# JSON summary's blas_core: out/train raises OpenBLAS's detection to the
# CPU's level, docs/train.md "Threads and OpenBLAS"), unless
# OPENBLAS_CORETYPE is set, which both then use. Needs a release build in build/ (bash scripts/test.sh --quick) and
# Debian's python3-torch. The data is English text from the system.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=${1:-20}
threads=${XM_BENCH_THREADS:-$(nproc)}
xmoec="${XMOEC:-$root/build/xmoec}"
[[ -x "$xmoec" ]] || { echo "bench/train.sh: build first (bash scripts/test.sh --quick)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
data="$work/text.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"

cores=""
printf '%-12s %12s %10s %12s %10s %12s %8s\n' model "xmoec tok/s" "GFLOP/s" "torch tok/s" "GFLOP/s" "MFLOP/tok" ratio
for spec in "$root/samples/tiny.json" "$root/bench/cpu-medium.json"; do
  name=$(basename "$spec" .json)
  out="$work/$name"
  "$xmoec" compile "$spec" -o "$out/prog" >/dev/null 2>&1
  read -r flops micro accum seq < <("$xmoec" check "$spec" --json | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
print(d["flops_per_token_fwdbwd"], d["training"]["micro_batch"],
      d["training"]["global_batch"] // d["training"]["micro_batch"], d["training"]["seq_len"])')
  "$out/prog/train" --data "$data" --steps 0 --ckpt-dir "$out/c0" --quiet --progress never
  # Two untimed steps first (page faults, thread start), as for PyTorch.
  "$out/prog/train" --data "$data" --resume "$out/c0" --steps 2 --ckpt-dir "$out/c2" --quiet --progress never
  read -r ours core < <(OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads "$out/prog/train" \
    --data "$data" --resume "$out/c2" --steps $((steps + 2)) --json --quiet --progress never |
    /usr/bin/python3 -c 'import json,sys; d = json.load(sys.stdin); print(d["tokens_per_s"], d["blas_core"])')
  cores="$cores $name:$core"
  best=0
  for policy in active passive; do
    t=$(OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$core} OMP_WAIT_POLICY=$policy /usr/bin/python3 "$root/bench/torch_train.py" "$out/c0/step-000000" "$data" \
      --steps "$steps" --micro "$micro" --accum "$accum" --seq "$seq" --threads "$threads" |
      /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')
    best=$(/usr/bin/python3 -c "print(max($best, $t))")
  done
  /usr/bin/python3 -c "
o, t, f = $ours, $best, $flops
print('%-12s %12.0f %10.2f %12.0f %10.2f %12.2f %7.2fx' % ('$name', o, o * f / 1e9, t, t * f / 1e9, f / 1e6, o / t))"
done
echo "threads per program: $threads; timed steps: $steps; $(nproc) cores; OpenBLAS kernels" \
  "(both):$cores"
