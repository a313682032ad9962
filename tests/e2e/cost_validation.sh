#!/usr/bin/env bash
# tests/e2e/cost_validation.sh — the cost model against compiled programs
# and the traffic they log (issue 5, item 5; docs/cost-model.md,
# "Validation").
#
# Compiles tests/e2e/inputs/layouts.json, samples/tiny.json and the MLA
# model tests/e2e/inputs/layouts_mla.json for one rank (and its variant
# with an MTP module, tests/e2e/inputs/layouts_mtp.json: memory only, one
# rank; the cost model runs the modules' layers at the full T)
# and for several layouts (flat and RBD expert parallelism across two
# emulated nodes, SSMB, ZeRO-1), trains each for 2 steps under mpirun with
# the step log, and hands the folder to the cost unit test in validation
# mode (XM_COST_VALIDATION_DIR), which compares, per layout:
#   - predicted per-rank weights + grads + optimizer + activations + buffers
#     against the memory plan's persistent + activation arenas
#     (out/manifest.json): within 10%; the persistent part exactly;
#   - predicted all_reduce / all_gather / reduce_scatter bytes, intra- and
#     inter-node, against the logged ones of each step: equal;
#   - dispatch + combine bytes given the routing of the step: RBD runs take
#     the pilot rows that crossed nodes from their own log; the flat run
#     across nodes takes the slots that crossed nodes from the RBD run of the
#     same layout (same seed, same routing) and the slots that left their
#     rank from a one-node run: equal;
#   - under uniform routing, the expected dispatch bytes within 15% of the
#     first step's (the router starts near uniform).
# Then the recompute policies (passes/recompute.c): four of the layouts are
# compiled again with /training/recompute selective and full (their
# training is tests/e2e/recompute.sh's), and each memory plan is compared
# with the cost model's prediction for that layout, micro-batch and policy
# (its candidate in `xmoec plan --json --top 0` on a cluster of the
# layout's shape): persistent + activation arenas within the same 10%, the
# persistent part exactly, and the activation arenas ordered none >
# selective > full wherever the prediction is (never growing).
# 4-rank layouts run as 2 emulated nodes of 2 ranks unless stated.
set -euo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1
data="$work/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"

layouts="$src/tests/e2e/inputs/layouts.json"
tiny="$src/samples/tiny.json"
mla="$src/tests/e2e/inputs/layouts_mla.json"
mtp="$src/tests/e2e/inputs/layouts_mtp.json"

# name spec dp tp ep ssmb rbd zero ranks-per-node [key=value ...]
cases=(
  "l_base $layouts 1 1 1 0 0 0 1"
  "l_dp2_ep2 $layouts 2 1 2 0 0 0 2"
  "l_dp2_ep2_zero1_2nodes $layouts 2 1 2 0 0 1 1"
  "l_ep4_1node $layouts 4 1 4 0 0 0 4"
  "l_ep4_rbd $layouts 4 1 4 0 1 0 2"
  "l_ep4 $layouts 4 1 4 0 0 0 2 flat_from=l_ep4_rbd total_from=l_ep4_1node"
  "l_tp2_ssmb_ep2 $layouts 1 2 2 1 0 0 2"
  "l_tp2_ssmb_ep4_rbd_zero1 $layouts 2 2 4 1 1 1 2"
  "t_base $tiny 1 1 1 0 0 0 1"
  "t_dp2_ep2_zero1_2nodes $tiny 2 1 2 0 0 1 1"
  "t_tp2_ssmb_ep4_rbd_zero1 $tiny 2 2 4 1 1 1 2"
  "m_base $mla 1 1 1 0 0 0 1"
  "m_tp2_ssmb_ep4_rbd_zero1 $mla 2 2 4 1 1 1 2"
  "p_base $mtp 1 1 1 0 0 0 1"
)

: >"$work/cases.txt"
for c in "${cases[@]}"; do
  read -r name spec dp tp ep ssmb rbd zero rpn extra <<<"$c"
  flags=(--dp "$dp" --tp "$tp" --ep "$ep" --zero "$zero" --ranks-per-node "$rpn")
  [[ "$ssmb" == 1 ]] && flags+=(--ssmb)
  [[ "$rbd" == 1 ]] && flags+=(--rbd)
  "$bin/xmoec" compile "$spec" -o "$work/$name" "${flags[@]}" >"$work/$name.compile.txt"
  world=$((dp * tp))
  XM_RANKS_PER_NODE=$rpn timeout 600 mpirun -np "$world" "$work/$name/train" --data "$data" \
    --seed 7 --steps 2 --progress never --quiet --log "$work/$name.jsonl"
  echo "name=$name spec=$spec dp=$dp tp=$tp ep=$ep ssmb=$ssmb rbd=$rbd zero=$zero rpn=$rpn ${extra:-}" \
    >>"$work/cases.txt"
  echo "ran $name ($world ranks, $rpn per node)"
done

XM_COST_VALIDATION_DIR="$work" "$bin/tests/test_cost"

# name-of-the-none-case spec dp tp ep ssmb rbd zero ranks-per-node
recompute_cases=(
  "l_base $layouts 1 1 1 0 0 0 1"
  "l_dp2_ep2 $layouts 2 1 2 0 0 0 2"
  "t_base $tiny 1 1 1 0 0 0 1"
  "t_tp2_ssmb_ep4_rbd_zero1 $tiny 2 2 4 1 1 1 2"
)
: >"$work/recompute.txt"
for c in "${recompute_cases[@]}"; do
  read -r name spec dp tp ep ssmb rbd zero rpn <<<"$c"
  world=$((dp * tp))
  python3 - "$spec" "$((world / rpn))" "$rpn" >"$work/$name.planned.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
s["cluster"] = {"name": "validation", "nodes": int(sys.argv[2]), "ranks_per_node": int(sys.argv[3]),
                "device_memory_gib": 64, "peak_tflops": 100, "gemm_efficiency": 0.5,
                "intra_bw_gbps": 100, "intra_latency_us": 2, "inter_bw_gbps": 10,
                "inter_latency_us": 5}
print(json.dumps(s))
EOF
  "$bin/xmoec" plan "$work/$name.planned.json" --json --top 0 >"$work/$name.plan.json"
  flags=(--dp "$dp" --tp "$tp" --ep "$ep" --zero "$zero" --ranks-per-node "$rpn")
  [[ "$ssmb" == 1 ]] && flags+=(--ssmb)
  [[ "$rbd" == 1 ]] && flags+=(--rbd)
  for policy in selective full; do
    python3 - "$spec" "$policy" >"$work/${name}_$policy.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
s["training"]["recompute"] = sys.argv[2]
print(json.dumps(s))
EOF
    "$bin/xmoec" compile "$work/${name}_$policy.json" -o "$work/${name}_$policy" "${flags[@]}" \
      --no-build >"$work/${name}_$policy.compile.txt"
  done
  echo "$name $dp $tp $ep $ssmb $rbd $zero $spec" >>"$work/recompute.txt"
  echo "compiled $name with recompute selective and full"
done

python3 - "$work" <<'EOF'
import json, os, sys
work = sys.argv[1]
ok = True
for line in open(os.path.join(work, "recompute.txt")):
    name, dp, tp, ep, ssmb, rbd, zero, spec = line.split()
    plan = json.load(open(os.path.join(work, name + ".plan.json")))
    mb = json.load(open(spec))["training"]["micro_batch"]
    want = dict(dp=int(dp), tp=int(tp), ep=int(ep), ssmb=ssmb == "1", rbd=rbd == "1",
                zero=int(zero), micro_batch=mb, dispatch_bound=4)
    pred, meas = {}, {}
    for policy, planned in (("none", "none"), ("selective", "moe"), ("full", "full")):
        cand = [c for c in plan["candidates"] if c["recompute"] == planned and c["legal"] and
                all(c[k] == v for k, v in want.items())]
        if len(cand) != 1:
            print(f"FAIL {name} {policy}: {len(cand)} plan candidates match {want}")
            ok = False
            continue
        m = cand[0]["memory_bytes"]
        folder = name if policy == "none" else f"{name}_{policy}"
        mem = json.load(open(os.path.join(work, folder, "manifest.json")))["memory"]
        persist = m["weights"] + m["grads"] + m["optimizer"]
        pred[policy], meas[policy] = m["activations"] + m["buffers"], mem["activation_bytes"]
        total = mem["persistent_bytes"] + mem["activation_bytes"]
        rel = (persist + pred[policy] - total) / total
        good = abs(rel) <= 0.10 and persist == mem["persistent_bytes"]
        print(f"  {name:28s} recompute {policy:9s} arenas: predicted "
              f"{persist + pred[policy]:10.0f} (activations {pred[policy]:9.0f}) measured "
              f"{total:10.0f} (activation arena {mem['activation_bytes']:9.0f}): "
              f"{100 * rel:+.2f}%{'' if good else '  FAIL'}")
        ok = ok and good
    if len(pred) == 3:
        for a, b in (("none", "selective"), ("selective", "full")):
            good = meas[b] <= meas[a] and (pred[b] >= pred[a] or meas[b] < meas[a])
            if not good:
                print(f"FAIL {name}: {a} -> {b}: activation arena {meas[a]} -> {meas[b]}, "
                      f"predicted {pred[a]:.0f} -> {pred[b]:.0f}")
            ok = ok and good
print("recompute validation:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
EOF
