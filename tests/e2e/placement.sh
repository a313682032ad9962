#!/usr/bin/env bash
# tests/e2e/placement.sh — expert placement from a run's routing, end to end.
#
# Trains tests/e2e/inputs/layouts.json (8 experts, top-2, one MoE layer) on
# 4 ranks (2 emulated nodes of 2, ep4 with RBD) with --routing-stats, makes a
# placement with `xmoec place`, compiles the same layout with --placement
# and trains again. Checks:
#   - the statistics count every routed token once (also under TP + SSMB,
#     where the TP group routes the same tokens), in the Hugging Face
#     numbering whatever the run's placement;
#   - the prediction of RBD's inter-node rows (and the flat dispatch's) for
#     the identity equals what the identity run's log measured, to the row,
#     and the placed run measures what was predicted for the placement;
#   - the placed run trains to the identity's losses (every step) and saves
#     the identity's checkpoint (every tensor, Hugging Face expert names);
#   - a checkpoint of either resumes under the other with the other's
#     losses; a single rank and tp2+ssmb+ep4+rbd+zero1 with the placement
#     train the same;
#   - placements that do not fit the model are refused at compile (exit 2).
set -euo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
steps=10
half=5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1
fail() { echo "placement: FAIL: $*" >&2; exit 1; }
spec="$src/tests/e2e/inputs/layouts.json"
data="$work/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"
ep4_rbd=(--dp 4 --ep 4 --rbd --ranks-per-node 2)

compile() { # name flags...
  local name=$1
  shift
  "$bin/xmoec" compile "$spec" -o "$work/$name" "$@" >"$work/$name.compile" 2>&1 ||
    { cat "$work/$name.compile"; fail "compile $name"; }
}
train() { # name world args...
  local name=$1 world=$2
  shift 2
  local rpn=2
  [[ "$world" -ge 2 ]] || rpn=1
  XM_RANKS_PER_NODE=$rpn timeout 600 mpirun -np "$world" "$work/$name/train" --data "$data" \
    --seed 7 --progress never --quiet "$@"
}

compile ident "${ep4_rbd[@]}"
train ident 4 --steps "$steps" --save-every "$half" --ckpt-dir "$work/ident.ckpt" \
  --log "$work/ident.jsonl" --routing-stats "$work/stats.json"
"$bin/xmoec" place --model "$spec" --stats "$work/stats.json" -o "$work/placement.json" --json \
  >"$work/place.json" 2>"$work/place.err" || { cat "$work/place.err"; fail "xmoec place"; }

compile placed "${ep4_rbd[@]}" --placement "$work/placement.json"
grep -q "^placement: .*1 of 1 listed MoE layers" "$work/placed.compile" ||
  { cat "$work/placed.compile"; fail "compile --placement did not report the placement"; }
train placed 4 --steps "$steps" --save-every "$half" --ckpt-dir "$work/placed.ckpt" \
  --log "$work/placed.jsonl" --routing-stats "$work/stats_placed.json"
# Each resumes the other's half-way checkpoint.
train ident 4 --steps "$steps" --resume "$work/placed.ckpt/step-00000$half" --log "$work/ident_from_placed.jsonl"
train placed 4 --steps "$steps" --resume "$work/ident.ckpt/step-00000$half" --log "$work/placed_from_ident.jsonl"
# Other layouts with the same placement.
compile placed_tp2 --dp 2 --tp 2 --ssmb --ep 4 --rbd --zero 1 --ranks-per-node 2 \
  --placement "$work/placement.json"
train placed_tp2 4 --steps "$steps" --log "$work/placed_tp2.jsonl" --routing-stats "$work/stats_tp2.json"
compile placed_one --placement "$work/placement.json"
train placed_one 1 --steps "$steps" --log "$work/placed_one.jsonl" --ckpt-dir "$work/placed_one.ckpt"

/usr/bin/python3 - "$work" "$steps" "$half" <<'PY' || exit 1
import json, os, struct, sys
import numpy as np
work, steps, half = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def log(name):
    return {r["step"]: r for r in map(json.loads, open(os.path.join(work, name)))}
def tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        b = open(os.path.join(d, f), "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n])
        for k, v in h.items():
            if k == "__metadata__":
                continue
            s, e = v["data_offsets"]
            dt = {"F32": np.float32, "I32": np.int32}[v["dtype"]]
            out[f + ":" + k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=dt).reshape(v["shape"])
    return out
def close_losses(a, b, what, tol=1e-5, first=1):
    worst = 0.0
    for s in range(first, steps + 1):
        worst = max(worst, abs(a[s]["loss"] - b[s]["loss"]) / abs(a[s]["loss"]))
    assert worst <= tol, f"{what}: loss differs by {worst:.3g} (relative)"
    return worst
ident, placed = log("ident.jsonl"), log("placed.jsonl")
assert sorted(ident) == sorted(placed) == list(range(1, steps + 1))

# The statistics: every routed token once, in the Hugging Face numbering.
spec = json.load(open(os.path.join(os.environ["XM_SOURCE_DIR"], "tests/e2e/inputs/layouts.json")))
tokens = steps * spec["training"]["global_batch"] * spec["training"]["seq_len"]
k, E = spec["moe"]["top_k"], spec["moe"]["experts"]
st = json.load(open(os.path.join(work, "stats.json")))
assert st["format"] == "xmoec-routing-stats" and st["experts"] == E and st["top_k"] == k, st.keys()
assert st["layout"] == {"world": 4, "ep": 4, "ranks_per_node": 2, "nodes": 2}, st["layout"]
assert st["steps"] == steps and st["placed"] is False
(lay,) = st["layers"]
assert lay["layer"] == 1 and lay["tokens"] == tokens and lay["samples"] == tokens, lay["tokens"]
assert sum(lay["load"]) == tokens * k  # no capacity: nothing dropped
co = np.array(lay["coselect"]).reshape(E, E)
assert (co == co.T).all() and co.trace() == 0 and co.sum() == tokens * k * (k - 1)
for other in ("stats_placed.json", "stats_tp2.json"):
    o = json.load(open(os.path.join(work, other)))
    (ol,) = o["layers"]
    assert o["placed"] is True and ol["tokens"] == tokens, (other, ol["tokens"], tokens)
    # the same routing, seen through another placement and layout
    assert ol["load"] == lay["load"], (other, ol["load"], lay["load"])

# Prediction against measurement: RBD's pilot rows across nodes and the
# rows a flat dispatch would send, summed over the run's steps.
def measured(lg):
    return (sum(r["rbd"]["inter_rows"] for r in lg.values()),
            sum(r["rbd"]["flat_inter_rows"] for r in lg.values()))
pj = json.load(open(os.path.join(work, "place.json")))
tot = pj["total"]
pred_id = (tot["identity"]["rbd_inter_rows"], tot["identity"]["flat_inter_rows"])
pred_pl = (tot["placed"]["rbd_inter_rows"], tot["placed"]["flat_inter_rows"])
m_id, m_pl = measured(ident), measured(placed)
assert pred_id == m_id, f"identity: predicted {pred_id}, measured {m_id}"
assert pred_pl == m_pl, f"placement: predicted {pred_pl}, measured {m_pl}"
assert pred_pl[0] <= pred_id[0], (pred_pl, pred_id)
pl = json.load(open(os.path.join(work, "placement.json")))
assert pl["format"] == "xmoec-placement" and pl["experts"] == E and pl["nodes"] == 2
assert [r["layer"] for r in pl["layers"]] == [1] and sorted(pl["layers"][0]["slots"]) == list(range(E))

# The same training: losses and saved weights.
w = close_losses(ident, placed, "placed vs identity")
a, b = tensors(os.path.join(work, f"ident.ckpt/step-0000{steps:02d}")), tensors(os.path.join(work, f"placed.ckpt/step-0000{steps:02d}"))
assert sorted(a) == sorted(b), set(a) ^ set(b)
assert any(".mlp.experts.7." in n for n in a)
wt = max(float(np.max(np.abs(a[n].astype(np.float64) - b[n]))) for n in a if a[n].size)
assert wt <= 1e-5, f"checkpoints differ by {wt:.3g}"
close_losses(ident, log("ident_from_placed.jsonl"), "identity resumed from the placed checkpoint", first=half + 1)
close_losses(placed, log("placed_from_ident.jsonl"), "placed resumed from the identity checkpoint", first=half + 1)
close_losses(ident, log("placed_tp2.jsonl"), "tp2 ssmb ep4 rbd zero1 placed", tol=1e-4)
close_losses(ident, log("placed_one.jsonl"), "one rank placed", tol=1e-4)
one = tensors(os.path.join(work, f"placed_one.ckpt/step-0000{steps:02d}"))
wo = max(float(np.max(np.abs(a[n].astype(np.float64) - one[n]))) for n in a if a[n].size)
assert wo <= 1e-4, f"one-rank placed checkpoint differs by {wo:.3g}"
drop = 1 - pred_pl[0] / pred_id[0] if pred_id[0] else 0
print(f"placement: RBD inter-node rows {m_id[0]} -> {m_pl[0]} ({drop:.1%} fewer; predicted "
      f"{pred_id[0]} -> {pred_pl[0]}), losses within {w:.2g}, weights within {wt:.2g}")
PY

# Placements that do not fit the model: refused with their place.
refuse() { # name expected-text file-content
  printf '%s' "$3" >"$work/$1.json"
  set +e
  "$bin/xmoec" compile "$spec" -o "$work/bad" --no-build --placement "$work/$1.json" \
    >"$work/$1.out" 2>&1
  local rc=$?
  set -e
  [[ $rc -eq 2 ]] || { cat "$work/$1.out"; fail "$1: exit $rc, not 2"; }
  grep -q -- "$2" "$work/$1.out" || { cat "$work/$1.out"; fail "$1: no '$2'"; }
}
refuse sixteen "16" \
  '{"format": "xmoec-placement", "version": 1, "experts": 16, "layers": [{"layer": 1, "slots": [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]}'
refuse dense "layer" \
  '{"format": "xmoec-placement", "version": 1, "experts": 8, "layers": [{"layer": 0, "slots": [1,0,2,3,4,5,6,7]}]}'
refuse twice "/layers/0/slots" \
  '{"format": "xmoec-placement", "version": 1, "experts": 8, "layers": [{"layer": 1, "slots": [1,1,2,3,4,5,6,7]}]}'
set +e
"$bin/xmoec" compile "$spec" -o "$work/bad" --no-build --placement "$work/missing.json" \
  >"$work/missing.out" 2>&1
rc=$?
set -e
[[ $rc -eq 2 ]] || { cat "$work/missing.out"; fail "a missing placement file: exit $rc"; }
echo "placement: ok"
