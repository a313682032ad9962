#!/usr/bin/env bash
# bench/parallel.sh — multi-rank training: throughput and bytes on the wire
# of samples/tiny.json (micro-batch 2) under several parallel layouts.
#
#   bash bench/parallel.sh             (XM_BENCH_STEPS steps per layout, default 20)
#
# For each layout: `xmoec compile tiny.json -o DIR <flags>`, then
# `mpirun -np RANKS DIR/train` for the steps on English text made of
# /usr/share/common-licenses/*, with `--log FILE --progress never --quiet`.
# 4-rank layouts run as 2 emulated nodes of 2 ranks (XM_RANKS_PER_NODE=2),
# 2-rank layouts as one node of 2, and every multi-rank run uses 1 thread per
# rank (OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1); the single rank runs twice,
# with 1 and with 2 threads.
#
# From the per-step JSON log lines (step 1 skipped as warm-up) it prints one
# row per layout: tokens/s over steps 2..N (tokens and elapsed_s of the log
# are cumulative, so (tokens_N - tokens_1) / (elapsed_N - elapsed_1)), and the
# mean bytes per step of the "traffic" member (summed over all ranks,
# docs/traffic.md), inter-node and intra-node, for dispatch+combine,
# all_reduce, all_gather and reduce_scatter; for RBD programs also the "rbd"
# member: inter-node dispatch rows sent by RBD against what a flat dispatch
# of the same routing would send. Compiler warnings (e.g. an --rbd that has
# no effect) are printed after the table.
#
# XMOEC selects the compiler (default build/xmoec, else build-lead/xmoec).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=${XM_BENCH_STEPS:-20}
xmoec="${XMOEC:-$root/build/xmoec}"
[[ -n "${XMOEC:-}" || -x "$xmoec" ]] || xmoec="$root/build-lead/xmoec"
[[ -x "$xmoec" ]] || { echo "bench/parallel.sh: no xmoec at $xmoec (build first, or set XMOEC)" >&2; exit 2; }
[[ "$steps" -ge 2 ]] || { echo "bench/parallel.sh: XM_BENCH_STEPS must be >= 2 (step 1 is warm-up)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "bench/parallel.sh: mpirun not found" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
# samples/tiny.json with micro_batch 2 instead of 4: dp4 needs global_batch
# (8) to be a multiple of micro_batch*dp. Every layout uses this spec, so a
# step is the same 1024 tokens (8 sequences of 128) and the same work
# everywhere; only the gradient accumulation per rank differs (4 at dp1,
# 2 at dp2, 1 at dp4).
spec="$work/tiny-mb2.json"
/usr/bin/python3 - "$root/samples/tiny.json" "$spec" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
d["training"]["micro_batch"] = 2
json.dump(d, open(sys.argv[2], "w"), indent=2)
EOF
data="$work/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"

# name ranks threads-per-rank compile-flags...
layouts=(
  "1rank 1 1"
  "1rank 1 2"
  "dp2 2 1 --dp 2"
  "dp2_ep2 2 1 --dp 2 --ep 2"
  "dp2_ep2_zero1 2 1 --dp 2 --ep 2 --zero 1"
  "dp4_ep4_flat 4 1 --dp 4 --ep 4 --ranks-per-node 2"
  "dp4_ep4_rbd 4 1 --dp 4 --ep 4 --rbd --ranks-per-node 2"
  "dp2_tp2_ssmb_ep2 4 1 --dp 2 --tp 2 --ssmb --ep 2 --ranks-per-node 2"
  "dp2_tp2_ssmb_ep2_rbd 4 1 --dp 2 --tp 2 --ssmb --ep 2 --rbd --ranks-per-node 2"
  "dp2_tp2_ssmb_ep4 4 1 --dp 2 --tp 2 --ssmb --ep 4 --ranks-per-node 2"
  "dp2_tp2_ssmb_ep4_rbd 4 1 --dp 2 --tp 2 --ssmb --ep 4 --rbd --ranks-per-node 2"
)

runs=()
for l in "${layouts[@]}"; do
  read -r name ranks threads flags <<<"$l"
  dir="$work/$name"
  if [[ ! -x "$dir/train" ]]; then
    # shellcheck disable=SC2086
    "$xmoec" compile "$spec" -o "$dir" $flags >"$work/$name.compile.txt" 2>&1 ||
      { cat "$work/$name.compile.txt" >&2; echo "bench/parallel.sh: compile of $name failed" >&2; exit 1; }
  fi
  rpn=2
  [[ "$ranks" -ge 2 ]] || rpn=1
  log="$work/$name.t$threads.jsonl"
  XM_RANKS_PER_NODE=$rpn OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads \
    timeout 900 mpirun -np "$ranks" "$dir/train" --data "$data" --seed 7 --steps "$steps" \
    --log "$log" --progress never --quiet ||
    { echo "bench/parallel.sh: training $name failed" >&2; exit 1; }
  runs+=("$name $ranks $threads $log $work/$name.compile.txt")
  echo "ran $name ($ranks ranks, $threads thread(s) per rank)" >&2
done

/usr/bin/python3 - "$steps" "${runs[@]}" <<'EOF'
import json, sys
steps = int(sys.argv[1])
MiB = 1024.0 * 1024.0
hdr = ("layout", "ranks", "thr", "tok/s", "d+c inter", "d+c intra", "ar inter", "ar intra",
       "ag inter", "ag intra", "rs inter", "rs intra", "rbd rows", "flat rows")
fmt = "%-22s %5s %3s %8s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s"
print("bytes: MiB per step (mean of steps 2..%d, summed over ranks); rows: inter-node dispatch rows per step" % steps)
print(fmt % hdr)
notes = []
for run in sys.argv[2:]:
    name, ranks, threads, path, ctxt = run.split()
    recs = {r["step"]: r for r in map(json.loads, open(path))}
    if sorted(recs) != list(range(1, steps + 1)):
        sys.exit("bench/parallel.sh: %s: steps %s in the log" % (name, sorted(recs)))
    first, last = recs[1], recs[steps]
    tps = (last["tokens"] - first["tokens"]) / (last["elapsed_s"] - first["elapsed_s"])
    timed = [recs[s] for s in range(2, steps + 1)]

    def mean(f):
        return sum(f(r) for r in timed) / len(timed)

    def phase(p, where):
        return mean(lambda r: r.get("traffic", {}).get("by_phase", {}).get(p, {}).get(where, 0)) / MiB

    cols = ["%.3f" % (phase("dispatch", w) + phase("combine", w)) for w in ("inter", "intra")]
    for p in ("all_reduce", "all_gather", "reduce_scatter"):
        cols += ["%.3f" % phase(p, w) for w in ("inter", "intra")]
    if all("rbd" in r for r in timed):
        cols += ["%.0f" % mean(lambda r: r["rbd"]["inter_rows"]),
                 "%.0f" % mean(lambda r: r["rbd"]["flat_inter_rows"])]
    else:
        cols += ["-", "-"]
    print(fmt % tuple([name, ranks, threads, "%.0f" % tps] + cols))
    for line in open(ctxt):
        if "warning" in line and line not in notes:
            notes.append(line)
if notes:
    print("\ncompiler warnings:")
    for n in notes:
        print("  " + n.rstrip())
EOF
echo "steps per layout: $steps (step 1 not timed); $(nproc) cores; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
