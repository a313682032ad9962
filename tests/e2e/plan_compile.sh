#!/usr/bin/env bash
# tests/e2e/plan_compile.sh — plan and program agree: for each sample on a
# cluster it was written for, `xmoec plan` prints the exact `xmoec compile`
# command of the layout it chose; that command, run as printed (OUT filled
# in, --no-build), builds a program that fits the device (exit 0) and whose
# memory plan is within 10% of what the plan predicted (compile prints both:
# "plan: the cost model predicts X ... the program's arenas hold Y (+d%)").
# The runners-up table shows the dispatch bound, the column in which
# otherwise identical rows differ.
set -uo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() {
  echo "FAIL $*"
  fails=$((fails + 1))
}
cl="$src/samples/clusters"
# spec | cluster | extra plan flags
cases=(
  "samples/xmoe-small.json|$cl/frontier-1024.json|"
  "samples/xmoe-medium.json|$cl/frontier-1024.json|"
  "samples/xmoe-large.json|$cl/frontier-1024.json|"
  "samples/xmoe-super.json|$cl/frontier-1024.json|"
  "samples/xmoe-medium.json|$cl/h200-128.json|"
  "samples/tiny.json|$cl/h200-8.json|--global-batch 256"
  "samples/deepseek-v3-mini.json|$cl/h200-8.json|--global-batch 256"
  "samples/hf/mixtral-8x7b.json|$cl/h200-8.json|--global-batch 256"
)
n=0
for c in "${cases[@]}"; do
  IFS='|' read -r spec cluster extra <<<"$c"
  n=$((n + 1))
  name="$(basename "$spec" .json) on $(basename "$cluster" .json)"
  # shellcheck disable=SC2086
  "$bin/xmoec" plan "$src/$spec" --cluster "$cluster" $extra >"$work/plan$n.txt" 2>&1 ||
    { fail "$name: plan exit $?"; cat "$work/plan$n.txt"; continue; }
  line=$(grep -E '^  compile it: xmoec compile ' "$work/plan$n.txt")
  [[ -n "$line" ]] || { fail "$name: no compile command"; cat "$work/plan$n.txt"; continue; }
  cmd=${line#  compile it: xmoec }
  cmd=${cmd/ -o OUT / -o $work/out$n }
  # shellcheck disable=SC2086
  "$bin/xmoec" $cmd --no-build >"$work/compile$n.txt" 2>&1 ||
    { fail "$name: '$cmd' exit $?"; cat "$work/compile$n.txt"; continue; }
  pct=$(sed -n "s/^plan: the cost model predicts .* the program's arenas hold .* (\([-+][0-9.]*\)%)$/\1/p" \
    "$work/compile$n.txt")
  [[ -n "$pct" ]] || { fail "$name: compile printed no prediction"; cat "$work/compile$n.txt"; continue; }
  echo "$name: ${cmd#compile } -> $pct%"
  /usr/bin/python3 -c "import sys; sys.exit(abs(float('$pct')) > 10)" ||
    fail "$name: the program's memory is $pct% off the plan's"
  if grep -q '^runners-up:' "$work/plan$n.txt"; then
    grep -qE '^     #  layout +mb  recompute   B ' "$work/plan$n.txt" || fail "$name: no B column"
  fi
done
[[ $fails -eq 0 ]] && echo "plan_compile: $n cases agree"
exit $((fails > 0))
