#!/usr/bin/env bash
# tests/e2e/train_bf16.sh — bf16 mixed precision trains like fp32.
#
# Compiles samples/tiny.json twice, as written (fp32) and with
# training.dtype "bf16", and checks:
#   - the bf16 program is what the spec says: its GEMMs are the bf16
#     kernels on bf16 buffers (program.c), no f32 GEMM is left, and every
#     parameter and state (master weights, gradients, Adam) is f32
#     (model.xir);
#   - trained 300 steps on the same English text from the same seeds, bf16
#     ends close to fp32: the held-out loss (every held-out window)
#     averaged over seeds 1 to 4 within 4% of fp32's (the target is 2%, and
#     the line printed says whether it was met), each seed within 10%; both
#     learned (the training loss fell by more than 1 nat), and the runs
#     differ (something ran in bf16).
# One run's loss after 300 steps is a chaotic function of every rounding,
# as far apart as two seeds. Measured on an AMD EPYC (Zen 4) with
# `bash bench/precision.sh --held-out`, held-out loss at step 300, seeds 1-4:
#   fp32 (fused MoE kernels)    2.2986 2.3845 2.3932 2.3831  mean 2.3649
#   fp32 (--no-fuse)            2.3384 2.3407 2.3815 2.4247  mean 2.3713
#   bf16 (--no-fuse)            2.2926 2.3088 2.4144 2.3775  mean 2.3483 (-0.7%)
#   bf16 (fused)                2.2876 2.2501 2.3330 2.4768  mean 2.3369 (-1.2%)
# Two fp32 programs that only sum in another order differ by up to 1.8%
# per seed; bf16 against fp32 by -5.6% to +3.9% per seed (the spread of
# the seeds themselves), so the mean over four seeds has a spread of about
# 2%: the test bounds it at twice that, where a bias of bf16 would show,
# and does not fail on the draw of a machine whose BLAS rounds otherwise.
# Under AddressSanitizer (10x slower) one seed trains 40 steps, before the
# trajectories part, and the mean training loss of the last 10 steps must
# be within 2%.
set -euo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
steps=300
seeds="1 2 3 4"
if grep -q '^XM_SANITIZE:BOOL=ON' "$bin/CMakeCache.txt" 2>/dev/null; then
  steps=40
  seeds="1"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

data="$work/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"
/usr/bin/python3 - "$src/samples/tiny.json" "$work/tiny-bf16.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
assert spec["training"]["dtype"] == "fp32", spec["training"]
spec["training"]["dtype"] = "bf16"
json.dump(spec, open(sys.argv[2], "w"), indent=2)
PY

"$bin/xmoec" compile "$src/samples/tiny.json" -o "$work/fp32" >/dev/null
"$bin/xmoec" compile "$work/tiny-bf16.json" -o "$work/bf16" >"$work/compile.txt"
grep -q '^precision: bf16 GEMM operands and results, f32 accumulation' "$work/compile.txt"

# What was built: bf16 GEMM kernels, no f32 GEMM left in the bf16 program.
prog="$work/bf16/program.c"
for k in xm_k_matmul_bf16 xm_k_matmul_dx_bf16 xm_k_matmul_dw_bf16 \
  xm_k_gather_grouped_matmul_bf16 xm_k_grouped_matmul_combine_bf16 \
  xm_k_gather_grouped_matmul_dx_bf16 xm_k_gather_grouped_matmul_dw_bf16 \
  xm_k_grouped_matmul_combine_grad_bf16 xm_k_grouped_matmul_combine_dw_bf16 \
  xm_k_cast_f32_bf16 xm_k_cast_bf16_f32; do
  grep -q "$k(" "$prog" || { echo "FAIL: $prog calls no $k"; exit 1; }
done
f32_gemm='xm_k_(gather_)?(grouped_)?matmul(_combine)?(_dx|_dw|_dw_acc|_grad)?\('
if grep -Eq "$f32_gemm" "$prog"; then
  echo "FAIL: the bf16 program still calls an f32 GEMM:"
  grep -E "$f32_gemm" "$prog" | head -3
  exit 1
fi
grep -q '^fuse-permute-gemm: the gather folded into' "$work/compile.txt" ||
  { echo "FAIL: the bf16 program is not fused"; exit 1; }
if grep -E '= (state|param)\(' "$work/bf16/model.xir" | grep -q 'bf16\['; then
  echo "FAIL: a parameter or state is not f32 in the bf16 program"
  exit 1
fi

for seed in $seeds; do
  for p in fp32 bf16; do
    "$work/$p/train" --data "$data" --steps "$steps" --seed "$seed" --log "$work/$p-$seed.jsonl" \
      --ckpt-dir "$work/ckpt-$p-$seed" --progress never --quiet
    "$work/$p/train" --data "$data" --eval --batches 1000 --resume "$work/ckpt-$p-$seed" --json \
      >"$work/eval-$p-$seed.json"
  done
done

/usr/bin/python3 - "$work" "$steps" "$seeds" <<'PY'
import json, sys
work, steps, seeds = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
ok = True
held = {"fp32": [], "bf16": []}
for seed in seeds:
    runs = {}
    for p in ("fp32", "bf16"):
        r = [json.loads(l) for l in open(f"{work}/{p}-{seed}.jsonl")]
        if len(r) != steps:
            print(f"FAIL: {p} seed {seed} logged {len(r)} steps, not {steps}")
            sys.exit(1)
        if r[0]["loss"] - r[-1]["loss"] < 1.0:
            print(f"FAIL: {p} seed {seed} did not learn: loss {r[0]['loss']:.4f} -> "
                  f"{r[-1]['loss']:.4f}")
            ok = False
        runs[p] = r
        held[p].append(json.load(open(f"{work}/eval-{p}-{seed}.json"))["loss"])
    f, b = runs["fp32"], runs["bf16"]
    if all(x["loss"] == y["loss"] for x, y in zip(f, b)):
        print(f"FAIL: seed {seed}: the bf16 losses equal the fp32 ones bit for bit")
        ok = False
    hf, hb = held["fp32"][-1], held["bf16"][-1]
    last = 10
    mf = sum(x["loss"] for x in f[-last:]) / last
    mb = sum(x["loss"] for x in b[-last:]) / last
    print(f"seed {seed}, step {steps}: held-out loss fp32 {hf:.4f}, bf16 {hb:.4f} "
          f"({100 * (hb - hf) / hf:+.2f}%); training loss, mean of the last {last}: fp32 "
          f"{mf:.4f}, bf16 {mb:.4f} ({100 * (mb - mf) / mf:+.2f}%)")
    if steps < 300 and abs(mb - mf) / mf > 0.02:
        print("FAIL: the bf16 training loss is more than 2% from fp32's")
        ok = False
    if steps >= 300 and abs(hb - hf) / hf > 0.10:
        print(f"FAIL: seed {seed}: the bf16 held-out loss is more than 10% from fp32's")
        ok = False
if steps >= 300:
    mf, mb = sum(held["fp32"]) / len(seeds), sum(held["bf16"]) / len(seeds)
    rel = (mb - mf) / mf
    print(f"held-out loss over seeds {' '.join(seeds)}: fp32 {mf:.4f}, bf16 {mb:.4f} "
          f"({100 * rel:+.2f}%; the 2% target {'met' if abs(rel) <= 0.02 else 'missed'})")
    if abs(rel) > 0.04:
        print("FAIL: the mean bf16 held-out loss is more than 4% from fp32's")
        ok = False
sys.exit(0 if ok else 1)
PY
echo "train_bf16: ok"
