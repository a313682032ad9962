#!/usr/bin/env bash
# tests/e2e/first_run.sh — the command `xmoec compile` prints works as
# printed, on one machine, with nothing set in the environment.
#
# The README's 4-rank layout (2 nodes of 2) compiled and then started with
# exactly the printed `mpirun -np 4 .../train --data PATH ...` (PATH filled
# in), XM_RANKS_PER_NODE unset: all ranks share this machine, so the
# program emulates the compiled 2 nodes of 2 and says so. --ranks-per-node
# chooses the node size explicitly (a size other than the compiled one, or
# one that does not divide the ranks, is an error with exit 2), and
# `out/train --help` names the layout it was compiled for and the
# environment variables it reads. An error is printed once, not once per
# rank.
set -uo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1
unset XM_RANKS_PER_NODE
fails=0
fail() {
  echo "FAIL $*"
  fails=$((fails + 1))
}
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$work/text.txt"

"$bin/xmoec" compile "$src/samples/tiny.json" -o "$work/out" --dp 2 --tp 2 --ssmb --ep 4 --rbd \
  --ranks-per-node 2 >"$work/compile.txt" 2>&1 || { cat "$work/compile.txt"; exit 1; }
printed=$(grep -E '^run it on 4 ranks: ' "$work/compile.txt" | sed 's/^run it on 4 ranks: //; s/ (docs\/train.md)$//')
[[ -n "$printed" ]] || { fail "no command printed"; cat "$work/compile.txt"; exit 1; }
echo "printed: $printed"
# The printed command with PATH filled in and '...' replaced by a short run.
cmd=${printed/--data PATH .../--data $work/text.txt --steps 2 --progress never}
[[ "$cmd" != "$printed" ]] || fail "the printed command has no '--data PATH ...' to fill in"
out=$(cd "$work" && timeout 300 bash -c "$cmd" 2>&1)
rc=$?
if [[ $rc -ne 0 ]] || ! grep -q "emulating the compiled layout's 2 nodes of 2 ranks" <<<"$out" ||
  ! grep -q "trained 2 steps" <<<"$out"; then
  fail "the printed command: exit $rc"
  tail -n 8 <<<"$out" | sed 's/^/    /'
else
  echo "ok   the printed command trains on one machine: $(grep -m1 'emulating' <<<"$out")"
fi

run() { # want-rc pattern flags...
  local want=$1 pattern=$2
  shift 2
  local o r
  o=$(timeout 120 mpirun -np 4 "$work/out/train" --data "$work/text.txt" --steps 1 \
    --progress never "$@" 2>&1)
  r=$?
  # one copy of the message, however many ranks
  if [[ $r -ne $want ]] || [[ $(grep -cE -- "$pattern" <<<"$o") -ne 1 ]]; then
    fail "$*: exit $r (want $want)"
    tail -n 6 <<<"$o" | sed 's/^/    /'
  else
    echo "ok   $*: exit $r: $(grep -E -m1 -- "$pattern" <<<"$o" | cut -c1-160)"
  fi
}
run 0 "trained 1 step" --ranks-per-node 2
run 2 "compiled for 2 ranks per node, but runs with 4" --ranks-per-node 4
run 2 "--ranks-per-node 3 does not divide the 4 ranks" --ranks-per-node 3
run 2 "--ranks-per-node: .*positive integer" --ranks-per-node 0

help=$("$work/out/train" --help)
for want in "Compiled for dp 2 x tp 2 = 4 ranks (ep 4, ssmb, rbd), 2 per node" \
  "XM_RANKS_PER_NODE=N" "XM_NCCL_LIBRARY=PATH" "OMP_NUM_THREADS=N" "--ranks-per-node N"; do
  grep -qF -- "$want" <<<"$help" || fail "--help does not say '$want'"
done
[[ $fails -eq 0 ]] && echo "ok   --help names the layout and the environment"

if [[ $fails -ne 0 ]]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "the first run works as printed"
