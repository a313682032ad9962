#!/usr/bin/env bash
# bench/fabric_paper.sh — mFabric's comparison with our model: four MoE
# models on 1024 GPUs (128 nodes of 8, one NIC port per GPU) at 100 and
# 400 Gb/s, the step time and the performance per unit of network cost of
# each topology relative to the non-blocking fat-tree, with the cost
# model's uniform expert routing and with a local one (80% of the tokens
# routed inside an affinity group of experts, 90% of those to their node's
# home group). Prints the markdown table of docs/fabric.md, "mFabric's
# claim, side by side".
#
#   bash bench/fabric_paper.sh             closed forms (seconds)
#   XM_ENGINE=simgrid bash bench/...       SimGrid (uniform rows only; the
#                                          local rows take minutes each)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
xmoec="${XMOEC:-$root/build/xmoec}"
engine="${XM_ENGINE:-analytic}"
[[ -x "$xmoec" ]] || { echo "bench/fabric_paper.sh: no $xmoec (build first, or set XMOEC)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for g in 100 400; do
  cat >"$tmp/c$g.json" <<JSON
{"name": "gpu-1024-${g}g", "nodes": 128, "ranks_per_node": 8, "device_memory_gib": 80,
 "peak_tflops": 989, "gemm_efficiency": 0.5, "intra_bw_gbps": 450, "intra_latency_us": 1,
 "inter_bw_gbps": $((g / 8)).$((g * 10 / 8 % 10)), "inter_latency_us": 3,
 "nic_ports": 8, "link_gbps": $g}
JSON
done
models=("$root/samples/xmoe-small.json" "$root/samples/xmoe-medium.json"
        "$root/samples/xmoe-large.json" "$root/samples/hf/mixtral-8x7b.json")
echo "engine: $engine; cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
echo
echo "| model | Gb/s | routing | fat-tree step s | oversubscribed 2:1 step s, perf/\$ | dragonfly step s, perf/\$ | regional-ocs step s, perf/\$ |"
echo "|---|---|---|---|---|---|---|"
for m in "${models[@]}"; do
  for g in 100 400; do
    for routing in uniform local; do
      extra=()
      [[ $routing == local ]] && extra=(--locality 0.8 --source-affinity 0.9)
      [[ $engine == simgrid && $routing == local ]] && continue
      "$xmoec" fabric --model "$m" --cluster "$tmp/c$g.json" --global-batch 1024 \
        --engine "$engine" --json "${extra[@]}" >"$tmp/out.json" 2>"$tmp/err" ||
        { cat "$tmp/err" >&2; exit 1; }
      python3 - "$tmp/out.json" "$g" "$routing" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
t = {x["name"]: x for x in d["topologies"]}
def cell(n):
    return f"{t[n]['iteration_s']:.3g}, {t[n]['perf_per_cost']:.2f}"
print(f"| {d['model'].split('/')[-1]} ({d['layout']}) | {sys.argv[2]} | {sys.argv[3]} | "
      f"{t['fat-tree']['iteration_s']:.3g} | {cell('fat-tree-oversubscribed')} | "
      f"{cell('dragonfly')} | {cell('regional-ocs')} |")
PY
    done
  done
done
