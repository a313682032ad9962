#!/usr/bin/env bash
# tests/e2e/cost_validation.sh — the cost model against compiled programs
# and the traffic they log (issue 5, item 5; docs/cost-model.md,
# "Validation").
#
# Compiles tests/e2e/inputs/layouts.json, samples/tiny.json and the MLA
# model tests/e2e/inputs/layouts_mla.json for one rank
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
