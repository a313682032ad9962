#!/usr/bin/env bash
# tests/comm/transports.sh — out/train of an emulated GPU program with each
# transport of the collectives (runtime/comm/transport.h): --comm host (host
# staging), --comm nccl (the NCCL test double tests/comm/nccl_shim.c through
# XM_NCCL_LIBRARY) and --comm mpi (MPI on the emulated device memory).
#
# The program: the tiny sample with the aux-free bias on (so the int32
# all-reduce of the load counters runs too), compiled with `--target cuda
# --emulate` for 4 ranks as 2 nodes of 2: the README's layout without RBD
# (RBD replaces the expert all-to-all and always stages) and with ZeRO-1:
# --dp 2 --tp 2 --ssmb --ep 4 --zero 1. Its schedule calls all_reduce,
# all_reduce_i32, all_gather, narrow, exchange_counts, all_to_all,
# zero_reduce_scatter and zero_gather (checked below; the plain
# reduce_scatter is covered by tests/comm/test_mpi4_transport.c).
#
# Each transport trains 2 steps from the same seed. Asserted: the start-up
# line names the transport; the per-step loss, cross-entropy and gradient
# norm are bit-equal to the host-staging run's; the traffic of every step
# (the log's member and the --traffic file) is identical. Bit-equality
# holds by construction here, so it is what is asserted: --comm mpi makes
# the very MPI calls of the staged run on the same (host) memory, and the
# double runs each reduction as the same MPI reduction over a communicator
# of the same members in the same order; the one it computes differently,
# the ZeRO-1 reduce-scatter (padded to even chunks: MPI_Reduce_scatter_block
# instead of MPI_Reduce_scatter), runs over the DP groups of 2, where a sum
# of two floats does not depend on the order. (A real NCCL sums in its own
# ring order; there the losses would agree to about 1e-6, not to the bit.)
# And:
# --comm nccl with XM_NCCL_LIBRARY naming a missing file, and an unknown
# --comm value, exit 2 with their messages; an all-to-all overflow
# (XM_FAULT=arena) fails every rank with the same messages under nccl as
# under host staging. Env: XM_BINARY_DIR, XM_SOURCE_DIR, XM_NCCL_SHIM (the
# double's path; ctest sets it); XM_KEEP=1 keeps the work folder.
set -euo pipefail

src=${XM_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${XM_BINARY_DIR:-$src/build}
shim=${XM_NCCL_SHIM:-$bin/tests/libxm_nccl_shim.so}
[[ -f "$shim" ]] || { echo "transports: FAIL: no NCCL test double at $shim"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/xm-transports.XXXXXX")
trap '[[ -n "${XM_KEEP:-}" ]] || rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export XM_RANKS_PER_NODE=2 OMP_NUM_THREADS=1
unset XM_NCCL_LIBRARY XM_FAULT
failed=()

python3 -c '
import json, sys
s = json.load(open(sys.argv[1])); s["moe"]["aux_free_gamma"] = 0.001
json.dump(s, open(sys.argv[2], "w"))' "$src/samples/tiny.json" "$work/tiny.json"
data=$work/english.txt
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"
prog=$work/out
"$bin/xmoec" compile "$work/tiny.json" -o "$prog" --target cuda --emulate \
  --dp 2 --tp 2 --ssmb --ep 4 --zero 1 --ranks-per-node 2 >"$work/compile.log" 2>&1 ||
  { cat "$work/compile.log"; echo "transports: FAIL: compile"; exit 1; }
for call in all_reduce all_reduce_i32 all_gather narrow exchange_counts all_to_all \
  zero_reduce_scatter zero_gather; do
  grep -q "xm_rt_${call}(" "$prog/program.c" || failed+=("the program calls no $call")
done

train() { # name env... -- flags...: runs out/train on 4 ranks, stderr in $work/name.err
  local name=$1 envs=()
  shift
  while [[ $1 != -- ]]; do envs+=("-x" "$1"); shift; done
  shift
  local rc=0
  timeout 300 mpirun -np 4 "${envs[@]}" "$prog/train" --data "$data" --seed 7 --progress never \
    "$@" >"$work/$name.out" 2>"$work/$name.err" || rc=$?
  return $rc
}

declare -A line=([host]="comm: host staging (--comm host)"
  [nccl]="comm: nccl 2.30.1 ($shim), --comm nccl"
  [mpi]="comm: MPI on device memory (--comm mpi;")
for t in host nccl mpi; do
  envs=(XM_RANKS_PER_NODE=2)
  [[ $t == nccl ]] && envs+=("XM_NCCL_LIBRARY=$shim")
  start=$SECONDS
  if train "$t" "${envs[@]}" -- --comm "$t" --steps 2 --log "$work/$t.jsonl" \
    --traffic "$work/$t.traffic"; then
    echo "--- --comm $t: $((SECONDS - start)) s"
    grep -qF "train: ${line[$t]}" "$work/$t.err" ||
      { cat "$work/$t.err"; failed+=("--comm $t: no start-up line '${line[$t]}'"); }
  else
    cat "$work/$t.err"
    failed+=("--comm $t (run)")
  fi
done

python3 - "$work" <<'PY' || failed+=("losses or traffic differ between transports")
import json, sys
work = sys.argv[1]
logs = {t: [json.loads(l) for l in open(f"{work}/{t}.jsonl")] for t in ("host", "nccl", "mpi")}
bad = any(len(v) != 2 for v in logs.values())
for t in ("nccl", "mpi"):
    for a, b in zip(logs["host"], logs[t]):
        for key in ("loss", "ce_loss", "grad_norm"):
            rel = abs(a[key] - b[key]) / max(abs(a[key]), 1e-30)
            ok = a[key] == b[key]
            bad |= not ok
            print(f"{'ok  ' if ok else 'FAIL'} step {a['step']} {key:9s} host {a[key]!r:22} "
                  f"{t:4s} {b[key]!r:22} {'bit-equal' if ok else f'differ (rel {rel:.1e})'}")
        same = a["traffic"] == b["traffic"]
        bad |= not same
        print(f"{'ok  ' if same else 'FAIL'} step {a['step']} traffic of the log: host == {t}")
    same = open(f"{work}/host.traffic").read() == open(f"{work}/{t}.traffic").read()
    bad |= not same
    print(f"{'ok  ' if same else 'FAIL'} --traffic file: host == {t}")
sys.exit(1 if bad else 0)
PY

# Bad choices: exit 2 with the reason.
expect_fail() { # name rc message env... -- flags...
  local name=$1 want=$2 msg=$3 rc=0
  shift 3
  train "$name" "$@" || rc=$?
  if [[ $rc != "$want" ]] || ! grep -qF -- "$msg" "$work/$name.err"; then
    cat "$work/$name.err"
    failed+=("$name: exit $rc (want $want) or no '$msg'")
  else
    echo "ok   $name: exit $rc, $(grep -F -- "$msg" "$work/$name.err" | head -1)"
  fi
}
expect_fail missing 2 "train: error: --comm nccl: $work/none/libnccl.so.2 not found (dlopen: " \
  "XM_NCCL_LIBRARY=$work/none/libnccl.so.2" -- --comm nccl --steps 1
# Flags are checked before MPI starts: one process says it (4 would
# interleave their lines).
rc=0
"$prog/train" --data "$data" --comm gloo --steps 1 2>"$work/unknown.err" || rc=$?
msg="train: error: --comm: expected auto, nccl, mpi or host, got 'gloo'"
if [[ $rc == 2 ]] && grep -qF -- "$msg" "$work/unknown.err"; then
  echo "ok   unknown: exit 2, $msg"
else
  cat "$work/unknown.err"
  failed+=("unknown --comm value: exit $rc (want 2) or no '$msg'")
fi

# An all-to-all over its receive bound on rank 1 at step 1: the same
# messages from every rank under nccl as under host staging.
for t in host nccl; do
  envs=(XM_FAULT=arena:1:1)
  [[ $t == nccl ]] && envs+=("XM_NCCL_LIBRARY=$shim")
  expect_fail "overflow_$t" 1 "would receive" "${envs[@]}" -- --comm "$t" --steps 1
  grep -o 'all_to_all_v (dispatch.*' "$work/overflow_$t.err" | sort -u >"$work/overflow_$t.msg" || true
done
# The ranks agree on the failure, then each prints and aborts: a rank may
# be killed before it prints, so a run can show a subset of the two
# messages (the rank over its bound, the others naming it). Both runs must
# show some, and together no more than those two.
nmsg=$(sort -u "$work/overflow_host.msg" "$work/overflow_nccl.msg" | wc -l)
if [[ -s "$work/overflow_host.msg" && -s "$work/overflow_nccl.msg" ]] && ((nmsg <= 2)); then
  echo "ok   overflow: the same messages under host and nccl ($nmsg distinct)"
else
  diff "$work/overflow_host.msg" "$work/overflow_nccl.msg" || true
  failed+=("overflow: the messages differ between host and nccl")
fi

if ((${#failed[@]})); then
  printf 'transports FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "transports passed: host, nccl and mpi give the same losses and traffic"
