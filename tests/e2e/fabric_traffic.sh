#!/usr/bin/env bash
# tests/e2e/fabric_traffic.sh — a run's measured traffic timed on every
# topology (`xmoec fabric --traffic`).
#
# Trains tests/e2e/inputs/layouts.json on 4 ranks (2 emulated nodes of 2,
# ep4 with RBD) for 2 steps with --traffic, then times the file's last step
# on the four topologies of a matching 2-node cluster and checks that
#   - every (layer, phase) record of the last step is one phase,
#   - the bytes the fabric counts between and inside nodes are the file's
#     (and the step log's) to the byte,
#   - the step is compute + communication, and the fat-tree is the
#     reference of perf_per_cost;
# and that a traffic file of another world is refused (exit 2).
set -euo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1
fail() { echo "fabric_traffic: FAIL: $*" >&2; exit 1; }
data="$work/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"

"$bin/xmoec" compile "$src/tests/e2e/inputs/layouts.json" -o "$work/prog" --dp 4 --ep 4 --rbd \
  --ranks-per-node 2 >/dev/null
XM_RANKS_PER_NODE=2 timeout 600 mpirun -np 4 "$work/prog/train" --data "$data" --seed 7 --steps 2 \
  --progress never --quiet --traffic "$work/traffic.jsonl" --log "$work/log.jsonl"

cat >"$work/cluster.json" <<'JSON'
{"name": "two-nodes", "nodes": 2, "ranks_per_node": 2, "device_memory_gib": 16,
 "peak_tflops": 1, "intra_bw_gbps": 50, "inter_bw_gbps": 12.5}
JSON
cat >"$work/spec.json" <<JSON
$(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); s['parallel']={'dp': 4, 'ep': 4, 'rbd': True}; print(json.dumps(s))" "$src/tests/e2e/inputs/layouts.json")
JSON
"$bin/xmoec" fabric --model "$work/spec.json" --cluster "$work/cluster.json" \
  --traffic "$work/traffic.jsonl" --json >"$work/fabric.json" 2>"$work/fabric.err" ||
  { cat "$work/fabric.err"; fail "xmoec fabric --traffic failed"; }

python3 - "$work" <<'PY' || exit 1
import json, sys
work = sys.argv[1]
recs = [json.loads(l) for l in open(work + "/traffic.jsonl")]
last = max(r["step"] for r in recs)
mine = [r for r in recs if r["step"] == last]
intra = inter = 0
for r in mine:
    for i, row in enumerate(r["bytes"]):
        for j, b in enumerate(row):
            if i // 2 == j // 2:
                intra += b
            else:
                inter += b
log = {json.loads(l)["step"]: json.loads(l) for l in open(work + "/log.jsonl")}
t = log[last]["traffic"]
assert (t["intra_bytes"], t["inter_bytes"]) == (intra, inter), (t, intra, inter)
d = json.load(open(work + "/fabric.json"))
assert d["traffic"]["step"] == last and d["traffic"]["phases"] == len(mine), d["traffic"]
assert d["routing"]["experts"] == "measured" and d["layout_from"] == "spec", d
tops = {x["name"]: x for x in d["topologies"]}
assert sorted(tops) == ["dragonfly", "fat-tree", "fat-tree-oversubscribed", "regional-ocs"], tops
assert tops["fat-tree"]["perf_per_cost"] == 1.0
for name, x in tops.items():
    assert x["inter_node_bytes"] == inter and x["intra_node_bytes"] == intra, (name, x, inter, intra)
    assert abs(x["iteration_s"] - x["compute_s"] - x["comm_s"]) <= 1e-9 * x["iteration_s"], x
    assert x["comm_s"] > 0 and x["comm_by_phase"]["dispatch_s"] > 0, x
# Locality of the measured dispatch: the last step's share inside a node,
# and how far it moved from the step before.
disp = [r for r in mine if r["phase"] == "dispatch"]
d_in = sum(b for r in disp for i, row in enumerate(r["bytes"]) for j, b in enumerate(row) if i // 2 == j // 2)
d_all = sum(b for r in disp for row in r["bytes"] for b in row)
lo = d["locality"]
assert lo["dispatch_bytes"] == d_all and abs(lo["intra_server"] - d_in / d_all) < 1e-12, (lo, d_in, d_all)
assert lo["intra_region"] == 1.0 and 0 <= lo["step_tvd"] <= 1 and lo["layer_tvd"] == 0, lo
print(f"fabric_traffic: {len(mine)} records of step {last}: {inter} bytes across nodes, "
      f"{intra} inside; fat-tree step {tops['fat-tree']['iteration_s']:.3g} s")
PY

# A file of another world (the model without a layout: the plan chooses
# one for 8 ranks): refused at its /world.
cat >"$work/cluster8.json" <<'JSON'
{"name": "four-nodes", "nodes": 4, "ranks_per_node": 2, "device_memory_gib": 16, "peak_tflops": 1}
JSON
if "$bin/xmoec" fabric --model "$src/tests/e2e/inputs/layouts.json" --cluster "$work/cluster8.json" \
  --traffic "$work/traffic.jsonl" >/dev/null 2>"$work/world.err"; then
  fail "a traffic file of 4 ranks was taken for an 8-rank cluster"
else
  rc=$?
fi
[[ $rc -eq 2 ]] || fail "exit $rc for a world mismatch (expected 2)"
grep -q 'traffic.jsonl: error: /world: the traffic is of 4 ranks, the cluster has 8' "$work/world.err" ||
  fail "world mismatch: $(cat "$work/world.err")"
echo "fabric_traffic: ok"
