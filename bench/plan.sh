#!/usr/bin/env bash
# bench/plan.sh — how long the planner takes: the full search of the 545B
# X-MoE paper model (samples/xmoe-super.json) on the 1024-GCD Frontier
# cluster (samples/clusters/frontier-1024.json), the planner's largest case
# in the tests (issue 5 asks for under one second).
#
#   bash bench/plan.sh           (XM_BENCH_RUNS runs, default 5)
#
# Times `xmoec plan MODEL --cluster CLUSTER` (text output to /dev/null, the
# whole process: spec loading, the search of every configuration, ranking
# and printing) with bash's EPOCHREALTIME, and prints each run's seconds,
# the best and the median, and the number of configurations searched (from
# --json). Also times `--policy all` (the five policies' searches) and, for
# information, `--max-model` (a bisection of full searches per policy).
#
# XMOEC selects the compiler (default build/xmoec, else build-lead/xmoec).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=${XM_BENCH_RUNS:-5}
xmoec="${XMOEC:-$root/build/xmoec}"
[[ -n "${XMOEC:-}" || -x "$xmoec" ]] || xmoec="$root/build-lead/xmoec"
[[ -x "$xmoec" ]] || { echo "bench/plan.sh: no xmoec at $xmoec (build first, or set XMOEC)" >&2; exit 2; }
[[ "$runs" -ge 1 ]] || { echo "bench/plan.sh: XM_BENCH_RUNS must be >= 1" >&2; exit 2; }
model="$root/samples/xmoe-super.json"
cluster="$root/samples/clusters/frontier-1024.json"

# Seconds of one run of the command given as arguments.
time_once() {
  local t0 t1
  t0=$EPOCHREALTIME
  "$@" > /dev/null
  t1=$EPOCHREALTIME
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f\n", b - a }'
}

# Runs a command $runs times; prints the times, best and median.
bench() {
  local label=$1; shift
  local times=()
  for ((i = 0; i < runs; i++)); do times+=("$(time_once "$@")"); done
  printf '%-34s runs: %s\n' "$label" "${times[*]}"
  printf '%s\n' "${times[@]}" | sort -n | awk -v l="$label" '
    { t[NR] = $1 } END { printf "%-34s best %.3f s, median %.3f s\n", l, t[1], t[int((NR + 1) / 2)] }'
}

searched=$("$xmoec" plan "$model" --cluster "$cluster" --json --top 0 |
  python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["enumerated"], d["legal"], d["fit"])')
read -r enumerated legal fit <<< "$searched"
echo "xmoe-super on frontier-1024 (1024 ranks): $enumerated configurations searched, $legal legal, $fit fit"
bench "plan (policy xmoec)" "$xmoec" plan "$model" --cluster "$cluster"
bench "plan --policy all" "$xmoec" plan "$model" --cluster "$cluster" --policy all
runs=1 bench "plan --max-model (5 policies)" "$xmoec" plan "$model" --cluster "$cluster" --max-model
