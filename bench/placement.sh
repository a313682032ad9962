#!/usr/bin/env bash
# bench/placement.sh — what an expert placement saves: RBD's inter-node
# rows, predicted by `xmoec place` and measured by out/train, in and out of
# the sample the placement was made from (docs/placement.md, "Measured").
#
#   bash bench/placement.sh            bench/placement-moe.json, 8 ranks as
#                                      4 emulated nodes of 2, ep8 with RBD
#   XM_BENCH_STEPS=N bash bench/...    N steps before and N after (default 30)
#
# 1. trains the identity placement for N steps with --routing-stats and a
#    checkpoint at step N;
# 2. `xmoec place` makes a placement from those statistics and predicts the
#    inter-node rows of steps 1..N for the identity and for itself;
# 3. steps 1..N again under the placement (in sample: the prediction is
#    exact when the routing is the same, which it is, the training being
#    the identity's), and steps N+1..2N resumed from the checkpoint under
#    the identity and under the placement (out of sample: the routing of
#    later steps, which the placement never saw).
# Uses the build folder's xmoec (XM_BUILD, default build/). Prints one line
# per figure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${XM_BUILD:-$root/build}"
steps="${XM_BENCH_STEPS:-30}"
xmoec="$build/xmoec"
[[ -x "$xmoec" ]] || { echo "bench/placement.sh: no $xmoec (build first, or set XM_BUILD)" >&2; exit 2; }
spec="$root/bench/placement-moe.json"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1
data="$work/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"
layout=(--dp 8 --ep 8 --rbd --ranks-per-node 2 --dispatch-bound 8)
run() { # program args...
  local prog=$1
  shift
  XM_RANKS_PER_NODE=2 mpirun -np 8 "$work/$prog/train" --data "$data" --seed 7 --progress never \
    --quiet "$@"
}
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1); model $(basename "$spec"), 8 ranks, 4 nodes, ep8 rbd, $steps + $steps steps"
start=$(date +%s.%N)
"$xmoec" compile "$spec" -o "$work/ident" "${layout[@]}" >/dev/null 2>&1
run ident --steps "$steps" --ckpt-dir "$work/ckpt" --log "$work/ident_a.jsonl" \
  --routing-stats "$work/stats.json"
t0=$(date +%s.%N)
"$xmoec" place --model "$spec" --stats "$work/stats.json" -o "$work/placement.json" --json \
  >"$work/place.json"
t1=$(date +%s.%N)
"$xmoec" compile "$spec" -o "$work/placed" "${layout[@]}" --placement "$work/placement.json" \
  >/dev/null 2>&1
run placed --steps "$steps" --log "$work/placed_a.jsonl"
run ident --steps $((2 * steps)) --resume "$work/ckpt" --log "$work/ident_b.jsonl"
run placed --steps $((2 * steps)) --resume "$work/ckpt" --log "$work/placed_b.jsonl"
python3 - "$work" "$t0" "$t1" "$start" <<'PY'
import json, sys
import time
work, t0, t1, start = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
def rows(name):
    lines = [json.loads(l) for l in open(f"{work}/{name}")]
    return (sum(l["rbd"]["inter_rows"] for l in lines), sum(l["rbd"]["flat_inter_rows"] for l in lines),
            [l["loss"] for l in lines])
p = json.load(open(f"{work}/place.json"))
for l in p["layers"]:
    i, q = l["identity"], l["placed"]
    print(f"layer {l['layer']}: predicted RBD inter-node rows {i['rbd_inter_rows']} -> {q['rbd_inter_rows']} "
          f"({1 - q['rbd_inter_rows'] / i['rbd_inter_rows']:.1%} fewer), block imbalance "
          f"{i['imbalance']:.3f} -> {q['imbalance']:.3f}")
ti, tq = p["total"]["identity"], p["total"]["placed"]
ia, qa, ib, qb = rows("ident_a.jsonl"), rows("placed_a.jsonl"), rows("ident_b.jsonl"), rows("placed_b.jsonl")
print(f"in sample  (steps 1..N):  predicted {ti['rbd_inter_rows']} -> {tq['rbd_inter_rows']} "
      f"({1 - tq['rbd_inter_rows'] / ti['rbd_inter_rows']:.1%} fewer); measured {ia[0]} -> {qa[0]} "
      f"({1 - qa[0] / ia[0]:.1%} fewer)")
print(f"out of sample (N+1..2N): measured {ib[0]} -> {qb[0]} ({1 - qb[0] / ib[0]:.1%} fewer); flat "
      f"dispatch would send {ib[1]} -> {qb[1]}")
worst = max(abs(a - b) / abs(a) for a, b in zip(ia[2] + ib[2], qa[2] + qb[2]))
print(f"losses: placed vs identity within {worst:.2g} (relative, every step)")
print(f"xmoec place: {t1 - t0:.2f} s; the whole benchmark: {time.time() - start:.1f} s")
PY
