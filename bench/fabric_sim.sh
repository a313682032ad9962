#!/usr/bin/env bash
# bench/fabric_sim.sh — how long the flow engine (fabric/sim.c, SimGrid)
# takes on one training iteration of a 1024-GPU plan: 128 nodes of 8
# ranks, 28 layers of four expert all-to-alls and a gradient ring
# all-reduce (bench/fabric_sim.c), on each topology (docs/fabric.md,
# "Speed").
#
#   bash bench/fabric_sim.sh            uniform routing, every topology
#   XM_BENCH_SKEWED=1 bash bench/...    also one layer of skewed routing
#                                       (every phase distinct; minutes)
#
# Builds bench/fabric_sim.c against the static libraries of a build folder
# (XM_BUILD, default build/; build the xm_fabric target
# first) into a temporary folder, and prints one line per run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${XM_BUILD:-$root/build}"

for lib in xm_fabric xm_frontend xm_support; do
  [[ -f "$build/lib$lib.a" ]] || {
    echo "bench/fabric_sim.sh: no $build/lib$lib.a (build the xm_fabric target, or set XM_BUILD)" >&2
    exit 2
  }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=gnu11 -I"$root" "$root/bench/fabric_sim.c" "$build/libxm_fabric.a" \
  "$build/libxm_frontend.a" "$build/libxm_support.a" -lcjson -ldl -lm -o "$tmp/fabric_sim"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
for kind in fat-tree fat-tree-oversubscribed dragonfly regional-ocs; do
  "$tmp/fabric_sim" uniform 28 "$kind"
done
if [[ "${XM_BENCH_SKEWED:-0}" == 1 ]]; then
  "$tmp/fabric_sim" skewed 1 fat-tree
fi
