#!/usr/bin/env bash
# bench/precision.sh — bf16 mixed precision against fp32 on the CPU
# backend, side by side in one run: the memory each compile reports for
# samples/tiny.json, then the tiny sample trained STEPS steps (default 30)
# both ways on the same text and seed: tokens/s of each (best of two runs)
# and the loss at the end. The CPU has no bf16 GEMM (Debian's OpenBLAS is
# built without sbgemm), so its bf16 kernels widen the operands to f32 in
# tiles: this measures what that costs, not what bf16 gains on a GPU.
#
# bash bench/precision.sh --held-out: instead, the held-out loss (every
# held-out window) after 300 steps of seeds 1 to 4 for fp32 and bf16, fused
# and unfused (--no-fuse), and each one's mean: the table
# tests/e2e/train_bf16.sh and docs/benchmarks.md quote (16 runs, about 8
# minutes on 2 cores).
# Needs a release build in build/ (bash scripts/test.sh --quick).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
xmoec="${XMOEC:-$root/build/xmoec}"
[[ -x "$xmoec" ]] || { echo "bench/precision.sh: build first (bash scripts/test.sh --quick)" >&2; exit 2; }
held_out=0
if [[ ${1:-} == --held-out ]]; then
  held_out=1
  shift
fi
steps=${1:-30}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
/usr/bin/python3 - "$root/samples/tiny.json" "$work/tiny-bf16.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["training"]["dtype"] = "bf16"
json.dump(spec, open(sys.argv[2], "w"))
PY
"$xmoec" compile "$root/samples/tiny.json" -o "$work/fp32" >"$work/fp32.txt" 2>&1
"$xmoec" compile "$work/tiny-bf16.json" -o "$work/bf16" >"$work/bf16.txt" 2>&1
"$xmoec" compile "$root/samples/tiny.json" -o "$work/fp32-nofuse" --no-fuse >"$work/fp32-nofuse.txt" 2>&1
"$xmoec" compile "$work/tiny-bf16.json" -o "$work/bf16-nofuse" --no-fuse >"$work/bf16-nofuse.txt" 2>&1
for p in fp32 bf16 fp32-nofuse bf16-nofuse; do
  echo "$p: $(grep '^peak memory per rank:' "$work/$p.txt" | sed 's/^peak memory per rank: //')"
done
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$work/text.txt"
if [[ $held_out == 1 ]]; then
  for p in fp32 fp32-nofuse bf16 bf16-nofuse; do
    for seed in 1 2 3 4; do
      "$work/$p/train" --data "$work/text.txt" --steps 300 --seed "$seed" --progress never \
        --quiet --ckpt-dir "$work/ckpt-$p-$seed" >/dev/null
      "$work/$p/train" --data "$work/text.txt" --eval --batches 1000 --json \
        --resume "$work/ckpt-$p-$seed" >"$work/eval-$p-$seed.json" 2>/dev/null
    done
  done
  /usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
print("held-out loss after 300 steps, seeds 1 2 3 4, and the mean:")
base = None
for p in ("fp32", "fp32-nofuse", "bf16", "bf16-nofuse"):
    v = [json.load(open(f"{work}/eval-{p}-{s}.json"))["loss"] for s in (1, 2, 3, 4)]
    m = sum(v) / 4
    base = base or m
    print(f"  {p:12s} " + " ".join(f"{x:.4f}" for x in v) + f"  mean {m:.4f} "
          f"({100 * (m - base) / base:+.1f}% against fp32)")
PY
  exit 0
fi
for run in 1 2; do
  for p in fp32 bf16; do
    "$work/$p/train" --data "$work/text.txt" --steps "$steps" --seed 7 --progress never --quiet \
      --log "$work/$p.$run.jsonl" >/dev/null
  done
done
/usr/bin/python3 - "$work" "$steps" <<'PY'
import json, sys
work, steps = sys.argv[1], int(sys.argv[2])
best, last = {}, {}
for p in ("fp32", "bf16"):
    for run in (1, 2):
        r = [json.loads(l) for l in open(f"{work}/{p}.{run}.jsonl")]
        best[p] = max(best.get(p, 0.0), r[-1]["tokens_per_s"])
        last[p] = r[-1]["loss"]
print(f"step {steps}: loss fp32 {last['fp32']:.4f}, bf16 {last['bf16']:.4f} "
      f"({100 * (last['bf16'] - last['fp32']) / last['fp32']:+.2f}%)")
print(f"tokens/s (best of 2): fp32 {best['fp32']:.0f}, bf16 {best['bf16']:.0f}; "
      f"bf16/fp32 {best['bf16'] / best['fp32']:.3f}")
PY
