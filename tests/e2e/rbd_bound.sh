#!/usr/bin/env bash
# tests/e2e/rbd_bound.sh — RBD failures end every rank (runtime/moe/rbd_exec.h).
# Runs the 4-rank RBD test binary in its failure modes (XM_RBD_TEST_MODE,
# see tests/unit/test_mpi4_rbd_exec.c) under `mpirun -np 4` as 2 emulated
# nodes:
#   bound  every token routes to EP rank 1's experts, which would hold 64
#          rows against a bound of 16: the EP group agrees before any row
#          moves and every rank ends with exit 1 and the observed size
#   badid  rank 2 routes a slot to expert 8 of 8 while the others already
#          wait in the exchange: exit 1 with rank 2's message
# Each run has 30 s (timeout) and must finish in under 15; no rank may go
# on past the failing call. Env: XM_BINARY_DIR, XM_SOURCE_DIR.
set -uo pipefail

src=${XM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${XM_BINARY_DIR:-$src/build}
prog=$bin/tests/test_mpi4_rbd_exec
work=$(mktemp -d "${TMPDIR:-/tmp}/xm-rbd-bound.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "rbd_bound: FAIL: $*" >&2; exit 1; }

[[ -x $prog ]] || fail "$prog not built (make test_mpi4_rbd_exec)"
# The settings ctest passes, for runs by hand as root on a small box.
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}

# run MODE MESSAGE: exit code 1, the message at least once, nobody went on.
run() {
  local mode=$1 msg=$2 out=$work/$1.out start end rc
  start=$(date +%s%N)
  timeout 30 mpirun -np 4 --oversubscribe -x XM_RANKS_PER_NODE=2 -x XM_RBD_TEST_MODE="$mode" \
    "$prog" >"$out" 2>&1
  rc=$?
  end=$(date +%s%N)
  local ms=$(((end - start) / 1000000))
  [[ $rc -ne 124 && $rc -ne 137 ]] || { cat "$out"; fail "$mode: hung (killed after 30 s)"; }
  [[ $rc -eq 1 ]] || { cat "$out"; fail "$mode: exit code $rc, want 1"; }
  ((ms < 15000)) || fail "$mode: took $ms ms"
  grep -qF -- "$msg" "$out" || { cat "$out"; fail "$mode: message '$msg' not printed"; }
  ! grep -q 'NOT REACHED' "$out" || { cat "$out"; fail "$mode: a rank went on after the failure"; }
  echo "rbd_bound: $mode: exit $rc in $ms ms"
}

run bound 'rbd_dispatch (layer 3, slot 1) over the ep group: rank 1 would hold 64 expert rows, more than the bound of 16 rows'
run badid 'xmoec: rank 2: rbd_dispatch (layer 3): token 2 slot 1 routes to expert 8, but the layer has 8 experts'
echo "rbd_bound: ok"
