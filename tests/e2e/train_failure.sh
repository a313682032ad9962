#!/usr/bin/env bash
# tests/e2e/train_failure.sh — a failure on one rank of a multi-rank
# training program ends every rank within seconds, with the failing rank's
# message and a non-zero exit code; never a hang.
#
# Compiles tests/e2e/inputs/layouts.json for 4 ranks as 2 emulated nodes
# (dp4 ep4, flat and RBD) and for 2 ranks (dp2 ep2), then:
#   nan     rank 1's loss is NaN at step 2 (XM_FAULT, runtime/comm/fail.c)
#   arena   rank 1's all-to-all receive buffers are given a bound of 0 rows
#           at step 2 (a memory plan too small for the routing): the EP
#           group agrees before any row moves
#   data    a malformed Megatron index (every rank reads it): exit 2 with
#           the file and the place
#   world   a 4-rank program started on 2 ranks: exit 2 on every rank
#   tp      the two ranks of a TP group given different --data files (of
#           one size; MPMD mpirun): exit 1, one message naming the group
#   resume  a checkpoint of another model (rope_theta differs) resumed by
#           the dp2 program: exit 2, the field named once, not per rank
# Each run has 60 s (timeout) and must end in under 20 s.
set -uo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export XM_RANKS_PER_NODE=2 OMP_NUM_THREADS=1
fail() { echo "train_failure: FAIL: $*" >&2; exit 1; }
spec="$src/tests/e2e/inputs/layouts.json"
data="$work/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"

"$bin/xmoec" compile "$spec" -o "$work/ep4" --dp 4 --ep 4 >/dev/null || fail "compile ep4"
"$bin/xmoec" compile "$spec" -o "$work/rbd" --dp 4 --ep 4 --rbd --ranks-per-node 2 >/dev/null ||
  fail "compile rbd"
"$bin/xmoec" compile "$spec" -o "$work/dp2" --dp 2 --ep 2 >/dev/null || fail "compile dp2"

# check NAME WANT_RC MESSAGE np prog args...: exit code, message, time.
check() {
  local name=$1 want=$2 msg=$3 np=$4 prog=$5
  shift 5
  local start end rc
  start=$(date +%s.%N)
  timeout 60 mpirun -np "$np" "$prog" --data "$data" --steps 4 --progress never --quiet "$@" \
    >"$work/$name.out" 2>&1
  rc=$?
  end=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  [[ $rc -ne 124 ]] || { cat "$work/$name.out"; fail "$name: hung (killed after 60 s)"; }
  [[ $rc -eq $want ]] || { cat "$work/$name.out"; fail "$name: exit code $rc, want $want"; }
  grep -q -- "$msg" "$work/$name.out" || { cat "$work/$name.out"; fail "$name: no '$msg' in the output"; }
  awk -v s="$secs" 'BEGIN { exit !(s < 20) }' || fail "$name: took $secs s"
  echo "$name: exit $rc after $secs s: $(grep -m1 -- "$msg" "$work/$name.out")"
}

XM_FAULT=nan:1:2 check nan_ep4 1 "rank 1: step 2: the loss is nan" 4 "$work/ep4/train"
XM_FAULT=nan:1:2 check nan_dp2 1 "rank 1: step 2: the loss is nan" 2 "$work/dp2/train"
XM_FAULT=arena:1:2 check arena_ep4 1 "rank 1" 4 "$work/ep4/train"
grep -q "receive" "$work/arena_ep4.out" || fail "arena_ep4: the message does not name the receive bound"
XM_FAULT=arena:1:2 check arena_rbd 1 "rank 1" 4 "$work/rbd/train"

# A Megatron index whose header is cut short; every rank opens it.
head -c 100 "$data" >"$work/bad.bin"
printf 'MMIDIDX\x00\x00' >"$work/bad.idx"
data="$work/bad" check data_ep4 2 "bad.idx" 4 "$work/ep4/train"
check world 2 "compiled for" 2 "$work/ep4/train"
# TP partners that read different files (as nodes with different copies
# would): the group's hash check ends the run with one message.
"$bin/xmoec" compile "$spec" -o "$work/tp2" --tp 2 >/dev/null || fail "compile tp2"
tr 'a-z' 'b-za' <"$data" >"$work/other.txt"
start=$SECONDS
timeout 60 mpirun -np 1 "$work/tp2/train" --data "$data" --steps 2 --progress never --quiet : \
  -np 1 "$work/tp2/train" --data "$work/other.txt" --steps 2 --progress never --quiet \
  >"$work/tp.out" 2>&1
rc=$?
[[ $rc -eq 1 ]] || { cat "$work/tp.out"; fail "tp: exit code $rc, want 1"; }
n=$(grep -c "differ between the ranks of tensor-parallel group 0..1" "$work/tp.out")
[[ $n -eq 1 ]] || { cat "$work/tp.out"; fail "tp: the message printed $n times, want once"; }
[[ $((SECONDS - start)) -lt 20 ]] || fail "tp: took $((SECONDS - start)) s"
echo "tp: exit 1: $(grep -m1 "tensor-parallel" "$work/tp.out")"

# A checkpoint whose config.json is another model's: one copy of the error.
sed 's/"kv_heads": 2,/"kv_heads": 2, "rope_theta": 500000,/' "$spec" >"$work/theta.json"
"$bin/xmoec" compile "$work/theta.json" -o "$work/theta" --dp 2 --ep 2 >/dev/null || fail "compile theta"
timeout 60 mpirun -np 2 "$work/theta/train" --data "$data" --steps 1 --progress never --quiet \
  --ckpt-dir "$work/ck" >"$work/theta.out" 2>&1 || { cat "$work/theta.out"; fail "theta run"; }
check resume 2 "/rope_theta: is 500000 in the checkpoint, 10000 in the compiled program" 2 \
  "$work/dp2/train" --resume "$work/ck"
n=$(grep -c "rope_theta" "$work/resume.out")
[[ $n -eq 1 ]] || { cat "$work/resume.out"; fail "resume: the error printed $n times, want once"; }
echo "train_failure: ok"
