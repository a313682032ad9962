#!/usr/bin/env bash
# tests/e2e/stopped_rank.sh — a rank that stops responding (SIGSTOP: alive,
# but never joining the next collective) is detected by the other ranks'
# watchdog (out/train --timeout) and ends the run with a message naming
# where the run was, instead of the job spinning forever.
#
# Trains the tiny sample on 2 ranks (dp 2) with --timeout 3, stops rank 1
# once the first step is logged, and requires: the job ends (exit code not
# 0, well before the 120 s guard), the message of rank 0 appears once, and
# no rank is left behind.
set -uo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
work=$(mktemp -d)
stopped=""
cleanup() {
  [[ -n "$stopped" ]] && kill -CONT "$stopped" 2>/dev/null && kill -KILL "$stopped" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1
unset XM_RANKS_PER_NODE
fail() {
  echo "stopped_rank: FAIL: $*"
  exit 1
}
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$work/text.txt"
"$bin/xmoec" compile "$src/samples/tiny.json" -o "$work/out" --dp 2 >"$work/compile.txt" 2>&1 ||
  { cat "$work/compile.txt"; fail "compile"; }

start=$(date +%s)
timeout 120 mpirun -np 2 "$work/out/train" --data "$work/text.txt" --steps 100000 \
  --progress never --timeout 3 --log "$work/log.jsonl" >"$work/run.out" 2>&1 &
job=$!
for _ in $(seq 1 600); do [[ -s "$work/log.jsonl" ]] && break; sleep 0.1; done
[[ -s "$work/log.jsonl" ]] || { cat "$work/run.out"; fail "no step was logged"; }
# Rank 1's process: the train process whose environment says so.
for pid in $(pgrep -f "$work/out/train"); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then
    stopped=$pid
  fi
done
[[ -n "$stopped" ]] || fail "rank 1's process not found"
kill -STOP "$stopped"
wait "$job"
rc=$?
took=$(($(date +%s) - start))
[[ $rc -ne 124 ]] || { cat "$work/run.out"; fail "the job hung (120 s)"; }
[[ $rc -ne 0 ]] || { cat "$work/run.out"; fail "exit code 0"; }
n=$(grep -c "rank 0: no progress for [0-9]* s in .* of step [0-9]*: another rank stopped responding" \
  "$work/run.out")
[[ $n -eq 1 ]] || { cat "$work/run.out"; fail "rank 0's message $n times, want once"; }
echo "ok: rank 1 stopped; the job ended after ${took} s with exit code $rc:"
grep -m1 "no progress" "$work/run.out"
if pgrep -f "$work/out/train" | grep -vx "$stopped" >/dev/null; then
  fail "a rank other than the stopped one is still running"
fi
