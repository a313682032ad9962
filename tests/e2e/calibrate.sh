#!/usr/bin/env bash
# tests/e2e/calibrate.sh — xmoec-calibrate measures this machine and writes a
# profile the cost model can read (tools/calibrate).
#
# Two --quick runs: 2 ranks as 2 emulated nodes of 1 (every group spans
# nodes) and 4 ranks as 2 nodes of 2 (the world spans nodes, the groups of
# 2 do not). Each profile must have every member, every figure finite and
# positive, GEMM rates in a sane range, collectives that take longer on
# their largest size than on their smallest, and a latency + bandwidth fit
# for every (kind, inter_node) measured. One run on a --shapes file of its
# own, and bad flags and bad input, which end with exit code 2 and one
# message.
set -uo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
cal="$bin/xmoec-calibrate"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
unset XM_RANKS_PER_NODE OMP_NUM_THREADS
fails=0
fail() {
  echo "FAIL $*"
  fails=$((fails + 1))
}
[[ -x "$cal" ]] || { echo "FAIL no $cal (build the xmoec-calibrate target)"; exit 1; }
[[ -d "$src/tools/calibrate" ]] || { echo "FAIL no $src/tools/calibrate"; exit 1; }

# check_profile FILE RANKS RANKS_PER_NODE WANT: WANT is "both" (inter- and
# intra-node collectives), "inter", or "none" (one rank: no collectives);
# SHAPES (optional) the expected "m,n,k" list.
check_profile() {
  /usr/bin/python3 - "$@" <<'EOF'
import json, math, re, sys
path, ranks, rpn, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
shapes = sys.argv[5] if len(sys.argv) > 5 else None
errors, timing = [], []
def need(cond, what, into=errors):
    if not cond:
        into.append(what)
def pos(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
def posint(v):
    return isinstance(v, int) and not isinstance(v, bool) and v > 0
try:
    p = json.load(open(path))
except Exception as e:
    print(f"  {path}: not JSON: {e}")
    sys.exit(1)
for key in ["kind", "version", "backend", "ranks", "ranks_per_node", "threads_per_rank",
            "blas_core", "cpu", "created", "cluster", "gemm", "memory", "overhead", "collectives",
            "collective_fits"]:
    need(key in p, f"no member {key}")
need(p.get("kind") == "xmoec-profile", f"kind {p.get('kind')!r}")
need(p.get("version") == 1, f"version {p.get('version')!r}")
need(p.get("backend") == "cpu", f"backend {p.get('backend')!r}")
need(p.get("ranks") == ranks, f"ranks {p.get('ranks')!r}, want {ranks}")
need(p.get("ranks_per_node") == rpn, f"ranks_per_node {p.get('ranks_per_node')!r}, want {rpn}")
need(posint(p.get("threads_per_rank")), f"threads_per_rank {p.get('threads_per_rank')!r}")
need(p.get("blas_core") is None or (isinstance(p.get("blas_core"), str) and p["blas_core"]),
     f"blas_core {p.get('blas_core')!r}")
need(isinstance(p.get("cpu"), str) and p["cpu"], f"cpu {p.get('cpu')!r}")
need(isinstance(p.get("created"), str) and
     re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", p["created"]),
     f"created {p.get('created')!r}")

gemm = p.get("gemm") or []
need(len(gemm) > 0, "no gemm entries")
seen = {}
for g in gemm:
    need(g.get("op") in ("fwd", "dx", "dw"), f"gemm op {g.get('op')!r}")
    need(all(posint(g.get(k)) for k in "mnk"), f"gemm shape {g}")
    gf = g.get("gflops")
    need(pos(gf) and 0.1 <= gf <= 10000, f"gemm {g}: gflops not in [0.1, 10000]")
    seen.setdefault((g.get("m"), g.get("n"), g.get("k")), set()).add(g.get("op"))
for s, ops in seen.items():
    need(ops == {"fwd", "dx", "dw"}, f"gemm {s}: ops {sorted(ops)}")
if shapes is not None:
    want_shapes = {tuple(int(x) for x in s.split(",")) for s in shapes.split()}
    need(set(seen) == want_shapes, f"gemm shapes {sorted(seen)}, want {sorted(want_shapes)}")
else:
    need(len(seen) == 8, f"{len(seen)} gemm shapes, want the 8 of --quick")

mem = p.get("memory") or {}
per, tot = mem.get("triad_gbps_per_rank"), mem.get("triad_gbps_total")
need(pos(per) and pos(tot), f"memory {mem}")
if pos(per) and pos(tot):
    need(abs(tot - per * ranks) <= 0.01 * tot, f"triad total {tot} is not {ranks} x {per}")
need(pos((p.get("overhead") or {}).get("call_us")), f"overhead {p.get('overhead')}")

coll = p.get("collectives") or []
kinds = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
series = {}
for c in coll:
    need(c.get("kind") in kinds, f"collective kind {c.get('kind')!r}")
    need(posint(c.get("group")) and c["group"] >= 2, f"collective group {c.get('group')!r}")
    need(isinstance(c.get("inter_node"), bool), f"inter_node {c.get('inter_node')!r}")
    need(posint(c.get("bytes")), f"collective bytes {c.get('bytes')!r}")
    need(pos(c.get("seconds")), f"collective {c}: seconds")
    series.setdefault((c.get("kind"), c.get("group"), c.get("inter_node")), []).append(c)
for key, pts in series.items():
    pts = [c for c in pts if posint(c.get("bytes")) and pos(c.get("seconds"))]
    if len(pts) < 2:
        need(False, f"{key}: fewer than 2 sizes")
        continue
    lo, hi = min(pts, key=lambda c: c["bytes"]), max(pts, key=lambda c: c["bytes"])
    need(hi["seconds"] > lo["seconds"],
         f"{key}: {hi['bytes']} bytes take {hi['seconds']} s, "
         f"{lo['bytes']} bytes {lo['seconds']} s", timing)
inter = {c.get("inter_node") for c in coll}
if want == "both":
    need(inter == {True, False}, f"inter_node values {sorted(inter)}, want both")
    need({c.get("group") for c in coll} == {2, ranks}, "groups are not 2 and the world")
elif want == "inter":
    need(inter == {True}, f"inter_node values {sorted(inter)}, want only true")
else:
    need(coll == [] and p.get("collective_fits") == [], "collectives with one rank")
if want != "none":
    need({c.get("kind") for c in coll} == set(kinds), "not every collective kind measured")

fits = p.get("collective_fits") or []
fitted = set()
for f in fits:
    need(f.get("kind") in kinds and isinstance(f.get("inter_node"), bool), f"fit {f}")
    need(pos(f.get("latency_us")) and pos(f.get("bandwidth_gbps")), f"fit {f}: not positive")
    fitted.add((f.get("kind"), f.get("inter_node")))
need(fitted == {(c.get("kind"), c.get("inter_node")) for c in coll},
     f"fits {sorted(fitted)} do not cover the measured (kind, inter_node)")
for e in errors + timing:
    print(f"  {path}: {e}")
# 3: only the order of the times is wrong, which other load on the machine
# can cause (the caller measures once more).
sys.exit(1 if errors else 3 if timing else 0)
EOF
}

# calibrate NAME RANKS RANKS_PER_NODE WANT [FLAGS...]: one run, then its
# profile checked. Timings are only as steady as the machine is quiet (ctest
# runs other tests beside this one): a profile whose only fault is a small
# collective slower than a large one is measured once more.
calibrate() {
  local name=$1 ranks=$2 rpn=$3 want=$4
  shift 4
  local out rc try start=$SECONDS
  for try in 1 2; do
    out=$(timeout 120 mpirun -np "$ranks" -x XM_RANKS_PER_NODE="$rpn" "$cal" "$@" \
      -o "$work/$name.json" 2>&1)
    rc=$?
    if [[ $rc -ne 0 ]]; then
      fail "$name: $ranks ranks, exit $rc"
      tail -n 12 <<<"$out" | sed 's/^/    /'
      return
    fi
    check_profile "$work/$name.json" "$ranks" "$rpn" "$want" ${SHAPES:+"$SHAPES"}
    rc=$?
    [[ $rc -eq 3 && $try -eq 1 ]] || break
    echo "note $name: times out of order, measuring once more"
  done
  # Still out of order: the machine is busy (on 2 cores the 4-rank run
  # shares them with ctest's other test, and a small message can wait a
  # scheduler slice of 4 ms). That is the measurement's noise, not a fault
  # of the profile, so it is reported, not failed; the speed figures
  # themselves are the benchmarks' business.
  if [[ $rc -eq 3 ]]; then
    echo "note $name: times still out of order on a busy machine (not a failure)"
    rc=0
  fi
  grep -q "^calibrate: wrote " <<<"$out" || fail "$name: no summary"
  for section in gemm memory overhead collectives; do
    [[ $(grep -c "^calibrate: $section .* done in" <<<"$out") -eq 1 ]] ||
      fail "$name: not one progress line for $section"
  done
  if [[ $rc -eq 0 ]]; then
    echo "ok   $name: $ranks ranks, $rpn per node, $((SECONDS - start)) s"
    grep '^calibrate:  ' <<<"$out" | sed 's/^/    /'
  else
    fail "$name: the profile"
  fi
}

calibrate two 2 1 inter --quick
calibrate four 4 2 both --quick
echo '[{"m": 32, "n": 48, "k": 64}, {"m": 16, "n": 8, "k": 24}]' >"$work/shapes.json"
SHAPES="32,48,64 16,8,24" calibrate shapes 1 1 none --quick --shapes "$work/shapes.json"

# --cluster: without XM_RANKS_PER_NODE the cluster's ranks per node form the
# nodes, and the profile names the cluster.
cat >"$work/cl.json" <<'JSON'
{"name": "two-by-two", "nodes": 2, "ranks_per_node": 2, "device_memory_gib": 16,
 "peak_tflops": 0.1, "gemm_efficiency": 0.5, "intra_bw_gbps": 5, "intra_latency_us": 5,
 "inter_bw_gbps": 2, "inter_latency_us": 10, "topology": "fat-tree"}
JSON
if out=$(timeout 120 mpirun -np 4 "$cal" --quick --cluster "$work/cl.json" -o "$work/cl-p.json" 2>&1); then
  /usr/bin/python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
assert p["cluster"] == "two-by-two" and p["ranks_per_node"] == 2 and p["ranks"] == 4, p
assert {c["inter_node"] for c in p["collectives"]} == {True, False}, "no intra- and inter-node groups"
' "$work/cl-p.json" && echo "ok   --cluster: 2 ranks per node from the cluster, named in the profile" ||
    fail "--cluster: the profile"
else
  fail "--cluster: exit $?"
  tail -n 6 <<<"$out" | sed 's/^/    /'
fi

# bad NAME PATTERN COMMAND...: exit 2 with one line matching PATTERN.
bad() {
  local name=$1 pattern=$2
  shift 2
  local out rc
  out=$(timeout 60 "$@" 2>&1)
  rc=$?
  if [[ $rc -ne 2 ]] || [[ $(grep -cE -- "$pattern" <<<"$out") -ne 1 ]]; then
    fail "$name: exit $rc (want 2 and one '$pattern')"
    tail -n 6 <<<"$out" | sed 's/^/    /'
  else
    echo "ok   $name: exit 2: $(grep -E -m1 -- "$pattern" <<<"$out")"
  fi
}
bad "unknown flag" "unknown flag '--bogus'" "$cal" --bogus -o "$work/x.json"
bad "no -o" "-o FILE is required" "$cal" --quick
bad "-o without a file" "-o needs a file name" "$cal" --quick -o
bad "a stray argument" "unexpected argument 'extra'" "$cal" -o "$work/x.json" extra
bad "unknown flag on 2 ranks" "unknown flag '--fast'" mpirun -np 2 "$cal" --fast -o "$work/x.json"
echo '[{"m": 32, "n": 0, "k": 64}]' >"$work/zero.json"
bad "a zero dimension" "zero.json: shape 0: must be" \
  mpirun -np 2 "$cal" --quick --shapes "$work/zero.json" -o "$work/x.json"
echo '[{"m": 32, "n": 48, "k": 64},' >"$work/broken.json"
bad "broken JSON" "broken.json:[0-9]+:[0-9]+: not valid JSON" \
  mpirun -np 2 "$cal" --quick --shapes "$work/broken.json" -o "$work/x.json"
bad "a missing shapes file" "cannot read .*/none.json" \
  mpirun -np 2 "$cal" --quick --shapes "$work/none.json" -o "$work/x.json"
bad "an output in no directory" "cannot write in .*/no/such" \
  mpirun -np 2 "$cal" --quick -o "$work/no/such/p.json"
echo '{"name": "x", "nodes": 0}' >"$work/badc.json"
bad "a bad cluster file" "badc.json: error: /nodes: integer 0 is out of range" \
  mpirun -np 2 "$cal" --quick --cluster "$work/badc.json" -o "$work/x.json"
bad "a missing cluster file" "none-cl.json: error: cannot read" \
  "$cal" --quick --cluster "$work/none-cl.json" -o "$work/x.json"

# A failure of the machine (no memory for the first GEMM buffer under a
# 1.2 GB address-space limit) ends every rank with exit 1 and a message,
# never a hang. The sanitizers reserve far more address space than that.
if grep -qa __asan_init "$cal"; then
  echo "skip the out-of-memory run (a sanitizer build)"
else
  echo '[{"m": 16384, "n": 16384, "k": 16384}]' >"$work/big.json"
  out=$( (ulimit -v 1200000 && timeout 60 mpirun -np 2 "$cal" --quick --shapes "$work/big.json" \
    -o "$work/x.json") 2>&1)
  rc=$?
  if [[ $rc -ne 1 ]] || ! grep -qE "xmoec: rank [01]: xmoec-calibrate: error: out of memory for the GEMM" <<<"$out"; then
    fail "out of memory: exit $rc (want 1 and a message)"
    tail -n 6 <<<"$out" | sed 's/^/    /'
  else
    echo "ok   out of memory: exit 1: $(grep -m1 'out of memory' <<<"$out")"
  fi
fi
[[ ! -e "$work/x.json" ]] || fail "a failed run wrote $work/x.json"

# Through the xmoec driver, as the README says to run it.
help=$("$bin/xmoec" calibrate --help)
rc=$?
[[ $rc -eq 0 ]] || fail "--help: exit $rc"
for want in "usage: [mpirun -np P] xmoec calibrate [--cluster FILE]" "--shapes FILE" "--quick" "-o, --output FILE" \
  "OMP_NUM_THREADS=N" "XM_RANKS_PER_NODE=N"; do
  grep -qF -- "$want" <<<"$help" || fail "--help does not say '$want'"
done
[[ $rc -eq 0 ]] && echo "ok   --help"

if [[ $fails -ne 0 ]]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "xmoec-calibrate writes a complete profile"
