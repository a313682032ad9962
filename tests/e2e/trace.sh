#!/usr/bin/env bash
# tests/e2e/trace.sh — `xmoec inspect` on real compiled programs and the
# measured timeline of `out/train --trace` against the predicted one
# (docs/inspect.md).
#
# For the tiny sample on 1 rank, on 2 ranks (dp2 ep2, one rank per node) and
# on 4 ranks (dp2 tp2 ssmb ep4 rbd zero1, two nodes of two):
#   - text: the five sections; dot: balanced braces, one node per op of
#     model.xir, an edge per operand; html: parses (html.parser, every tag
#     closed in order), has the four <svg> charts, refers to nothing outside
#     the page (no "http", no script, no src=), each chart well-formed SVG;
#     trace: valid JSON, one "X" event per op that runs code per
#     micro-batch and per step function;
#   - `out/train --trace` (one traced step) writes valid JSON whose events,
#     on every rank, map one to one onto the predicted ones by
#     (micro-batch, op index), with the same names, phases and threads;
#   - tracing changes no number: the same losses with and without it;
#   - the predicted bytes agree with the runtime's traffic counters: the
#     all-reduce bytes of dp2 ep2 exactly, the ZeRO-1 gathers and
#     reduce-scatters of the 4-rank layout exactly, the RBD dispatch within
#     the spread of routing;
#   - bad --trace / --trace-steps flags exit 2.
# Env: XM_BINARY_DIR, XM_SOURCE_DIR.
set -euo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
xmoec="$bin/xmoec"
work=$(mktemp -d "${TMPDIR:-/tmp}/xm-trace.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "trace: FAIL: $*" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1
data="$work/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"
cd "$src"

# name world ranks-per-node compile-flags...
layouts=(
  "one 1 1"
  "two 2 1 --dp 2 --ep 2 --ranks-per-node 1"
  "four 4 2 --dp 2 --tp 2 --ssmb --ep 4 --rbd --zero 1 --ranks-per-node 2"
)

run() { # name world rpn args...
  local name=$1 world=$2 rpn=$3
  shift 3
  XM_RANKS_PER_NODE=$rpn timeout 600 mpirun -np "$world" "$work/$name/train" --data "$data" \
    --seed 7 --progress never --quiet --json "$@"
}

for l in "${layouts[@]}"; do
  read -r name world rpn flags <<<"$l"
  # shellcheck disable=SC2086
  "$xmoec" compile samples/tiny.json -o "$work/$name" $flags >"$work/$name.compile.txt" 2>&1 ||
    { cat "$work/$name.compile.txt"; fail "$name: compile"; }
  for fmt in text dot html trace; do
    "$xmoec" inspect "$work/$name" --format $fmt -o "$work/$name.$fmt" ||
      fail "$name: inspect --format $fmt exited $?"
  done
  run "$name" "$world" "$rpn" --steps 2 --trace "$work/$name.measured.json" \
    >"$work/$name.on.json" || fail "$name: training with --trace"
  run "$name" "$world" "$rpn" --steps 2 >"$work/$name.off.json" || fail "$name: training"
  python3 - "$work" "$name" "$world" <<'PY' || fail "$name: checks above"
import html.parser, json, re, sys, xml.etree.ElementTree
from collections import Counter
work, name, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = f"{work}/{name}"

# model.xir: op index -> (name, phase, operands) for every op line
ops = []
for line in open(f"{out}/model.xir").read().splitlines()[1:]:
    m = re.match(r"^  (?:%\d+(?:, %\d+)* = )?([a-z_]+)\((.*?)\)", line)
    if not m:
        continue
    ph = re.search(r'phase = "(\w+)"', line)
    ops.append((m.group(1), ph.group(1) if ph else "fwd", len(re.findall(r"%\d+", m.group(2)))))
G = int(re.search(r"grad_accum = (\d+)", open(f"{out}/model.xir").readline()).group(1))
traced = [i for i, (n, p, _) in enumerate(ops) if n not in ("param", "state", "input", "return")]
micro = [i for i in traced if ops[i][1] != "step"]
step = [i for i in traced if ops[i][1] == "step"]
want = Counter([(m, i) for m in range(G) for i in micro] + [(-1, i) for i in step])

text = open(f"{work}/{name}.text").read()
for section in ("== schedule", "== ops by kind", "== memory (per rank", "== memory timeline",
                "== collectives"):
    assert section in text, f"text: no section {section}"
colls = re.findall(r"^  op \d+ +(\w+) +(fwd|bwd|step) +group (\w+) +\((\d+) ranks\)", text, re.M)
if world == 1:
    assert "none: the program runs on one rank" in text
else:
    assert colls, "text: no collective rows"
    comm_ops = [i for i, (n, _, _) in enumerate(ops) if n in (
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "exchange_counts",
        "reduce_state", "zero_reduce_scatter", "zero_gather", "rbd_dispatch", "rbd_combine",
        "rbd_combine_grad", "rbd_dispatch_grad")]
    assert len(colls) == len(comm_ops), (len(colls), len(comm_ops))
    for c in colls:
        assert 1 < int(c[3]) <= world, c

dot = open(f"{work}/{name}.dot").read()
assert dot.startswith("digraph ") and dot.rstrip().endswith("}")
assert dot.count("{") == dot.count("}") and dot.count("[") == dot.count("]")
nodes = re.findall(r"^  op(\d+) \[label=", dot, re.M)
assert [int(n) for n in nodes] == list(range(len(ops))), "dot: one node per op, in order"
edges = re.findall(r"^  op(\d+) -> op(\d+);", dot, re.M)
assert len(edges) == sum(n for _, _, n in ops), "dot: one edge per operand"
assert all(int(a) < int(b) for a, b in edges)

page = open(f"{work}/{name}.html").read()
class Strict(html.parser.HTMLParser):
    VOID = {"meta", "br", "hr", "img", "input", "link"}
    def __init__(self):
        super().__init__()
        self.stack, self.tags = [], Counter()
    def handle_starttag(self, tag, attrs):
        self.tags[tag] += 1
        if tag not in self.VOID:
            self.stack.append(tag)
    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"html: </{tag}> closes {self.stack[-1:]}"
        self.stack.pop()
p = Strict()
p.feed(page)
p.close()
assert not p.stack, f"html: unclosed {p.stack}"
assert p.tags["svg"] == 5 and p.tags["html"] == 1 and p.tags["pre"] == 1, p.tags
# The charts scale to the page (a viewBox, no fixed width).
assert all("viewBox=" in svg and ' width="760"' not in svg
           for svg in re.findall(r"<svg[^>]*>", page)), "html: a chart of fixed width"
# The rank layout: every rank drawn once with its groups, as the layout
# defines them (tp: consecutive ranks; ep: consecutive ranks, ep of them;
# dp: the ranks of one tp index), numbered by their first rank.
tp_n = {"one": 1, "two": 1, "four": 2}[name]
ep_n = {"one": 1, "two": 2, "four": 4}[name]
drawn = re.findall(r"<title>rank (\d+): tp group of rank (\d+), ep group of rank (\d+), "
                   r"dp group of rank (\d+)</title>", page)
assert sorted(int(r) for r, *_ in drawn) == list(range(world)), f"html: ranks drawn {drawn}"
for r, t, e, d in (tuple(map(int, x)) for x in drawn):
    assert (t, e, d) == (r // tp_n * tp_n, r // ep_n * ep_n, r % tp_n), f"html: rank {r}: {t} {e} {d}"
for svg in re.findall(r"<svg.*?</svg>", page, re.S):
    xml.etree.ElementTree.fromstring(svg)  # each chart is well-formed SVG markup
low = page.lower()
for bad in ("http", "<script", "src=", "url(", "@import"):
    assert bad not in low, f"html: refers outside the page ({bad})"

def xevents(path):
    d = json.load(open(path))
    return d, [e for e in d["traceEvents"] if e["ph"] == "X"]
pd, pe = xevents(f"{work}/{name}.trace")
assert pd["otherData"]["kind"] == "predicted" and pd["otherData"]["events"] == len(pe)
assert Counter((e["args"]["micro"], e["args"]["op"]) for e in pe) == want, "predicted != schedule"
assert all(e["pid"] == 0 and e["dur"] >= 0 for e in pe)
byop = {e["args"]["op"]: e for e in pe}
for i in traced:
    assert byop[i]["name"] == ops[i][0] and byop[i]["cat"] == ops[i][1], i

md, me = xevents(f"{work}/{name}.measured.json")
assert md["otherData"]["kind"] == "measured" and md["otherData"]["world"] == world
assert not md["otherData"]["truncated"]
assert {e["pid"] for e in me} == set(range(world))
for r in range(world):
    mine = [e for e in me if e["pid"] == r]
    assert all(e["args"]["step"] == 2 for e in mine), "only the last step is traced"
    assert Counter((e["args"]["micro"], e["args"]["op"]) for e in mine) == want, f"rank {r}"
    for e in mine:
        q = byop[e["args"]["op"]]
        assert (e["name"], e["cat"], e["tid"]) == (q["name"], q["cat"], q["tid"]), (e, q)
        assert e["dur"] >= 0
    ts = [e["ts"] for e in mine]
    assert ts == sorted(ts), f"rank {r}: events out of order"
assert min(e["ts"] for e in me) == 0.0

on, off = (json.load(open(f"{work}/{name}.{k}.json")) for k in ("on", "off"))
assert on["final_loss"] == off["final_loss"], "tracing changed the loss"

# predicted bytes (rank 0, per step) against the runtime's counters (all ranks)
sent = dict(re.findall(r"^  (\w+) +(\d+) B \(intra", text, re.M))
measured = on["traffic"]["by_phase"]
def total(phase):
    return measured[phase]["intra"] + measured[phase]["inter"]
if name == "two":
    assert total("all_reduce") == world * int(sent["all_reduce"]), (measured, sent)
    assert total("other") == world * int(sent["other"])
    assert measured["all_reduce"]["intra"] == 0  # one rank per node
if name == "four":
    for ph in ("all_gather", "reduce_scatter"):
        assert total(ph) == world * int(sent[ph]), (ph, total(ph), sent[ph])
    rel = abs(total("dispatch") - world * int(sent["dispatch"])) / total("dispatch")
    assert rel < 0.3, ("RBD dispatch bytes off by", rel)
print(f"{name}: {len(pe)} events per rank, {len(colls)} collectives: ok")
PY
done

# Bad flags exit 2 before anything runs.
expect2() { # what command...
  local what=$1 rc=0
  shift
  "$@" >"$work/bad.out" 2>&1 || rc=$?
  [[ $rc -eq 2 ]] || { cat "$work/bad.out"; fail "$what: exit $rc, expected 2"; }
}
expect2 "--trace-steps past the run" run one 1 1 --steps 2 --trace "$work/x.json" --trace-steps 5
grep -q -- '--trace-steps: steps 5..5 are not trained by this run (steps 1..2)' "$work/bad.out" ||
  fail "no message for --trace-steps past the run"
expect2 "--trace-steps without --trace" run one 1 1 --steps 2 --trace-steps 1
grep -q -- '--trace-steps: needs --trace FILE' "$work/bad.out" || fail "no message: needs --trace"
expect2 "--trace-steps 3:2" run one 1 1 --steps 4 --trace "$work/x.json" --trace-steps 3:2
expect2 "--trace with --eval" run one 1 1 --eval --ckpt "$work" --trace "$work/x.json"
grep -q -- '--trace: has no effect with --eval' "$work/bad.out" || fail "no message: --eval"
expect2 "unwritable trace" run one 1 1 --steps 1 --trace "$work/no/such/dir/x.json"
grep -q 'cannot open the trace file' "$work/bad.out" || fail "no message: unwritable trace"
expect2 "inspect of a missing folder" "$xmoec" inspect "$work/missing"

# --trace-steps 1:2 records both steps.
run one 1 1 --steps 2 --trace "$work/both.json" --trace-steps 1:2 >/dev/null
python3 - "$work/both.json" <<'PY' || fail "--trace-steps 1:2"
import json, sys
d = json.load(open(sys.argv[1]))
steps = {e["args"]["step"] for e in d["traceEvents"] if e["ph"] == "X"}
assert steps == {1, 2}, steps
assert (d["otherData"]["first_step"], d["otherData"]["last_step"]) == (1, 2)
PY
echo "trace: ok"
