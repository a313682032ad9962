#!/usr/bin/env bash
# bench/gpu_moe.sh — the fused MoE kernels on an NVIDIA GPU against cuBLAS
# and PyTorch, in one command:
#
#   bash bench/gpu_moe.sh [--sm90a] [OUT_DIR]      (OUT_DIR default: gpu_moe_out)
#
# Builds bench/gpu_moe.cu with nvcc (-arch=sm_90; sm_90a with --sm90a or
# XM_BENCH_SM90A=1) and -lcublas, runs it (OUT_DIR/gpu_moe.json), runs
# bench/gpu_moe.py when python3 has torch with CUDA (OUT_DIR/torch_moe.json),
# and prints the combined summary. Budgets: XM_BENCH_BUDGET_S (gpu_moe, 150 s),
# XM_TORCH_BUDGET_S (gpu_moe.py, 90 s). NVCC overrides the compiler.
# Exit status: 1 build failure, a FAIL of the correctness check or a failed
# run; 3 no CUDA device; 0 otherwise.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARCH=sm_90
[ "${XM_BENCH_SM90A:-0}" = 1 ] && ARCH=sm_90a
OUT=
for a in "$@"; do
  case "$a" in
    --sm90a) ARCH=sm_90a ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "gpu_moe.sh: unknown option $a" >&2; exit 2 ;;
    *) OUT=$a ;;
  esac
done
OUT=${OUT:-gpu_moe_out}
mkdir -p "$OUT" || { echo "gpu_moe.sh: cannot create $OUT" >&2; exit 1; }
OUT=$(cd "$OUT" && pwd)

NVCC=${NVCC:-}
if [ -z "$NVCC" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc
  else NVCC=$(command -v nvcc || true); fi
fi
[ -n "$NVCC" ] || { echo "gpu_moe.sh: nvcc not found (set NVCC)" >&2; exit 1; }

# The binary and its log go to a build folder, OUT gets the JSON figures only.
BUILD=${TMPDIR:-/tmp}/xm-gpu-moe-build
mkdir -p "$BUILD" || { echo "gpu_moe.sh: cannot create $BUILD" >&2; exit 1; }
echo "== build: $NVCC -arch=$ARCH"
if ! "$NVCC" -std=c++17 -O3 -arch="$ARCH" -I"$ROOT" -Xcompiler -Wall \
    "$ROOT/bench/gpu_moe.cu" -lcublas -o "$BUILD/gpu_moe" 2>"$BUILD/build.log"; then
  cat "$BUILD/build.log" >&2
  echo "gpu_moe.sh: BUILD FAILED (log: $BUILD/build.log)" >&2
  exit 1
fi
[ -s "$BUILD/build.log" ] && cat "$BUILD/build.log"

echo "== gpu_moe (fused kernels vs cuBLAS)"
rm -f "$OUT/gpu_moe.json" "$OUT/torch_moe.json"
"$BUILD/gpu_moe" "$OUT/gpu_moe.json" "${XM_BENCH_BUDGET_S:-150}"
rc=${PIPESTATUS[0]}
if [ "$rc" = 3 ]; then
  echo "gpu_moe.sh: no CUDA device here (see the message above); nothing measured" >&2
  exit 3
fi
status=0
if [ "$rc" != 0 ]; then
  if [ -f "$OUT/gpu_moe.json" ] && grep -q '"result": "FAIL"' "$OUT/gpu_moe.json"; then
    echo "gpu_moe.sh: CORRECTNESS CHECK FAILED (gpu_moe exit $rc)" >&2
  else
    echo "gpu_moe.sh: gpu_moe FAILED (exit $rc)" >&2
  fi
  status=1
fi

echo "== gpu_moe.py (PyTorch baseline)"
if command -v python3 >/dev/null 2>&1 &&
   python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  python3 "$ROOT/bench/gpu_moe.py" "$OUT/torch_moe.json" "${XM_TORCH_BUDGET_S:-90}" |
    cat
  prc=${PIPESTATUS[0]}
  if [ "$prc" != 0 ]; then
    echo "gpu_moe.sh: gpu_moe.py FAILED (exit $prc)" >&2
    status=1
  fi
else
  echo "python3 with torch and CUDA not found: the PyTorch baseline is skipped"
fi

echo "== summary"
if command -v python3 >/dev/null 2>&1; then
  python3 - "$OUT/gpu_moe.json" "$OUT/torch_moe.json" <<'EOF' || status=1
import json, os, sys
def load(p):
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)
ours, tor = load(sys.argv[1]), load(sys.argv[2])
if ours is None:
    print("no gpu_moe.json: nothing to summarise")
    sys.exit(1)
print("device: %s  run: %s  spot check: %s (gather %.2e, combine %.2e)" % (
    ours["device"], ours["run_utc"], ours["spot_check"]["result"],
    ours["spot_check"]["gather_max_rel_err"], ours["spot_check"]["combine_max_rel_err"]))
tk = {}
if tor:
    for c in tor["configs"]:
        tk[(c["T"], c["E"], c["routing"])] = c
fmt = "%-6s %-3s %-8s | %-5s %-5s | %6s %6s | %9s %9s %7s | %-13s"
print(fmt % ("T", "E", "routing", "up", "down", "up TF", "dn TF", "ours f+b", "torch f+b",
             "speedup", "gmm up/dn TF"))
print(fmt % ("", "", "", "ratio", "ratio", "ours", "ours", "ms", "ms", "x", "(torch)"))
low = 0
for c in ours["configs"]:
    t = tk.get((c["T"], c["E"], c["routing"]))
    tms = t["eager"]["fwd_bwd_ms"] if t else None
    g = t.get("grouped_mm") if t else None
    gs = "%.0f/%.0f" % (g["up_tflops"], g["down_tflops"]) if g and "up_tflops" in g else "-"
    ur, dr = c["up"]["ratio"], c["down"]["ratio"]
    low += (ur < 0.70) + (dr < 0.70)
    print(fmt % (c["T"], c["E"], c["routing"], "%.2f" % ur, "%.2f" % dr,
                 "%.0f" % c["up"]["ours_tflops"], "%.0f" % c["down"]["ours_tflops"],
                 "%.2f" % c["layer"]["fwd_bwd_ms"], "%.2f" % tms if tms else "-",
                 "%.2f" % (tms / c["layer"]["fwd_bwd_ms"]) if tms else "-", gs))
print("ratio = ours TFLOP/s / cuBLAS TFLOP/s (target >= 0.70; %d of %d below); speedup = "
      "PyTorch eager f+b ms / ours f+b ms" % (low, 2 * len(ours["configs"])))
for name, d in (("gpu_moe", ours), ("gpu_moe.py", tor)):
    if d and d.get("skipped"):
        print("%s skipped for its time budget: %s" % (name, ", ".join(d["skipped"])))
if tor is None:
    print("(no PyTorch figures)")
EOF
else
  echo "python3 not found: see $OUT/gpu_moe.json"
fi
echo "files: $OUT"
exit $status
