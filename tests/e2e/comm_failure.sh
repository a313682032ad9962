#!/usr/bin/env bash
# tests/e2e/comm_failure.sh — a failure on one rank ends every rank, fast,
# with that rank's message (runtime/comm/comm.h). Runs the 4-rank communicator
# test binary in its failure modes (XM_COMM_TEST_MODE, see
# tests/unit/test_mpi4_comm.c) under `mpirun -np 4` as 2 emulated nodes:
#   agree     rank 1 reports bad input at a safe point: exit 2, its message
#   abort     rank 1 passes a bad count into an all-to-all the other ranks
#             already wait in: MPI_Abort, exit 1, its message
#   overflow  an all-to-all over rank 1's receive bound in one EP group; the
#             other group's ranks learn it at the agreement: exit 1
# Each run has 30 s (timeout) and must finish in under 15. Env:
# XM_BINARY_DIR, XM_SOURCE_DIR.
set -uo pipefail

src=${XM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${XM_BINARY_DIR:-$src/build}
prog=$bin/tests/test_mpi4_comm
work=$(mktemp -d "${TMPDIR:-/tmp}/xm-comm-failure.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "comm_failure: FAIL: $*" >&2; exit 1; }

[[ -x $prog ]] || fail "$prog not built (make test_mpi4_comm)"
# The settings ctest passes, for runs by hand as root on a small box.
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}

# run MODE WANT_RC MESSAGE: exit code and message (once) checked.
run() {
  local mode=$1 want_rc=$2 msg=$3 out=$work/$1.out start end rc
  start=$(date +%s%N)
  timeout 30 mpirun -np 4 --oversubscribe -x XM_RANKS_PER_NODE=2 -x XM_COMM_TEST_MODE="$mode" \
    "$prog" >"$out" 2>&1
  rc=$?
  end=$(date +%s%N)
  local ms=$(((end - start) / 1000000))
  [[ $rc -ne 124 && $rc -ne 137 ]] || { cat "$out"; fail "$mode: hung (killed after 30 s)"; }
  [[ $rc -eq $want_rc ]] || { cat "$out"; fail "$mode: exit code $rc, want $want_rc"; }
  ((ms < 15000)) || fail "$mode: took $ms ms"
  local n
  n=$(grep -cF -- "$msg" "$out")
  [[ $n -eq 1 ]] || { cat "$out"; fail "$mode: message '$msg' printed $n times, want once"; }
  ! grep -q 'NOT REACHED' "$out" || { cat "$out"; fail "$mode: a rank went on after the failure"; }
  echo "comm_failure: $mode: exit $rc in $ms ms"
}

run agree 2 'xmoec: rank 1: data file corpus.tok:128: token id 70000 >= vocab 50257'
run abort 1 'xmoec: rank 1: communicator: all_to_all_v over world: send count -3 to member 0'
run overflow 1 'xmoec: rank 0: all_to_all_v (dispatch, layer 5) over the ep group: rank 1 would receive 8 rows, more than its receive buffer holds'
echo "comm_failure: ok"
