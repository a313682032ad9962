#!/usr/bin/env bash
# bench/fusion.sh — the fused padding-free permutation against the unfused
# program, side by side in one run: the activation arena each compile
# reports (samples/tiny.json and samples/xmoe-small.json, one rank; the
# latter compiled in fp32, as the figures in docs/benchmarks.md are), then
# the tiny sample trained STEPS steps (default 30) both ways on the same
# text with the same seed: the first step whose loss differs, the loss
# difference at the end, and the tokens/s of each (best of two runs).
# Needs a release build in build/ (bash scripts/test.sh --quick).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
xmoec="${XMOEC:-$root/build/xmoec}"
[[ -x "$xmoec" ]] || { echo "bench/fusion.sh: build first (bash scripts/test.sh --quick)" >&2; exit 2; }
steps=${1:-30}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
/usr/bin/python3 - "$root/samples/xmoe-small.json" "$work/xmoe-small.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["training"]["dtype"] = "fp32"
json.dump(spec, open(sys.argv[2], "w"))
PY
for spec in tiny xmoe-small; do
  src="$root/samples/$spec.json"
  [[ $spec == xmoe-small ]] && src="$work/xmoe-small.json"
  line=$("$xmoec" compile "$src" -o "$work/$spec" --no-build 2>/dev/null |
         grep '^fuse-permute-gemm:')
  echo "$spec: ${line#fuse-permute-gemm: }"
done
"$xmoec" compile "$root/samples/tiny.json" -o "$work/fused" >/dev/null 2>&1
"$xmoec" compile "$root/samples/tiny.json" -o "$work/unfused" --no-fuse >/dev/null 2>&1
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$work/text.txt"
for run in 1 2; do
  for p in unfused fused; do
    "$work/$p/train" --data "$work/text.txt" --steps "$steps" --seed 7 --progress never --quiet \
      --log "$work/$p.$run.jsonl" >/dev/null
  done
done
python3 - "$work" "$steps" <<'PY'
import json, sys
work, steps = sys.argv[1], int(sys.argv[2])
def log(p, r):
    return [json.loads(l) for l in open(f"{work}/{p}.{r}.jsonl") if '"step"' in l]
u, f = log("unfused", 1), log("fused", 1)
first = next((a["step"] for a, b in zip(u, f) if a["loss"] != b["loss"]), None)
print(f"tiny, {steps} steps: losses bitwise equal up to step "
      f"{(first - 1) if first else steps}; step 2 grad norm rel diff "
      f"{abs(u[1]['grad_norm'] - f[1]['grad_norm']) / u[1]['grad_norm']:.1e}; "
      f"final loss rel diff {abs(u[-1]['loss'] - f[-1]['loss']) / u[-1]['loss']:.1e}")
tps = {p: max(log(p, r)[-1]["tokens_per_s"] for r in (1, 2)) for p in ("unfused", "fused")}
print(f"tokens/s: unfused {tps['unfused']:.0f}, fused {tps['fused']:.0f} "
      f"(fused/unfused {tps['fused'] / tps['unfused']:.3f})")
PY
