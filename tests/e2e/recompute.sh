#!/usr/bin/env bash
# tests/e2e/recompute.sh — activation recompute changes memory, not training.
#
# Compiles tests/e2e/inputs/layouts.json (a dense layer and an MoE layer of
# 8 experts with a shared expert, aux loss and aux-free balancing) with
# /training/recompute none, selective and full, for one rank (the fused
# expert GEMMs; also in bf16), two ranks of expert parallelism, two ranks
# of TP with SSMB, and four ranks of DP, TP, SSMB, RBD and ZeRO-1 as two
# emulated nodes, plus the emulated GPU program (hip, one rank, one step;
# skipped in the sanitizer build, where the emulator is too slow). Every program
# trains the same steps on the same text with the same seed, and against
# the program without recompute of the same layout:
#   - every step's loss, ce_loss, aux_loss and gradient norm are equal, and
#     the checkpoint's weights and optimizer states are the same bytes;
#   - the compile report names the rebuilt ops, and the activation arena
#     is smaller with full recompute and no larger with selective;
#   - the traffic says which collectives were run again: none with
#     selective (the expert FFN holds none); with full the expert dispatch
#     (the flat exchange's combine too: 1.5 times both phases, as the cost
#     model's repeated forward movements), the attention's TP all-reduce,
#     but neither RBD's combine nor the SSMB block's exit all-gather, whose
#     results the backward never reads (docs/cost-model.md).
set -euo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
steps="${XM_RECOMPUTE_STEPS:-6}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1
data="$work/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"
sanitize=0
grep -q '^XM_SANITIZE:BOOL=ON' "$bin/CMakeCache.txt" 2>/dev/null && sanitize=1

for dtype in fp32 bf16; do
  for policy in none selective full; do
    python3 - "$src/tests/e2e/inputs/layouts.json" "$dtype" "$policy" \
      >"$work/spec_${dtype}_$policy.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
s["training"]["dtype"], s["training"]["recompute"] = sys.argv[2], sys.argv[3]
print(json.dumps(s))
EOF
  done
done

# name world dtype compile-flags...
layouts=(
  "one 1 fp32"
  "one_bf16 1 bf16"
  "dp2_ep2 2 fp32 --dp 2 --ep 2"
  "tp2_ssmb_ep2 2 fp32 --tp 2 --ssmb --ep 2"
  "dp2_tp2_ssmb_ep4_rbd_zero1 4 fp32 --dp 2 --tp 2 --ssmb --ep 4 --rbd --zero 1 --ranks-per-node 2"
)
((sanitize)) || layouts+=("hip_emulated 1 fp32 --target hip --emulate")

names=()
for l in "${layouts[@]}"; do
  read -r name world dtype flags <<<"$l"
  run_steps=$steps
  [[ "$name" == *emulated ]] && run_steps=1
  for policy in none selective full; do
    [[ "$name" == *emulated && "$policy" == selective ]] && continue
    out="$work/${name}_$policy"
    # shellcheck disable=SC2086
    "$bin/xmoec" compile "$work/spec_${dtype}_$policy.json" -o "$out" $flags >"$out.compile.txt" \
      2>&1 || { cat "$out.compile.txt"; exit 1; }
    rpn=2
    [[ "$world" -ge 2 ]] || rpn=1
    XM_RANKS_PER_NODE=$rpn timeout 600 mpirun -np "$world" "$out/train" --data "$data" --seed 7 \
      --steps "$run_steps" --progress never --quiet --log "$out.jsonl" --ckpt-dir "$out.ckpt" \
      --save-every "$run_steps"
  done
  names+=("$name")
  echo "trained $name ($world ranks) without recompute and with it"
done

python3 - "$work" "${names[@]}" <<'EOF'
import json, os, re, sys
work, names = sys.argv[1], sys.argv[2:]
ok = True

def log(path):
    return [json.loads(l) for l in open(path)]

def ckpt_files(ckpt):
    d = os.path.join(ckpt, open(os.path.join(ckpt, "latest")).read().strip())
    return {f: open(os.path.join(d, f), "rb").read()
            for f in ("model.safetensors", "optimizer.safetensors")}

def phases(step):
    return {k: v["intra"] + v["inter"] for k, v in step["traffic"]["by_phase"].items()}

for name in names:
    base = os.path.join(work, name + "_none")
    a, wa = log(base + ".jsonl"), ckpt_files(base + ".ckpt")
    for policy in ("selective", "full"):
        run = os.path.join(work, f"{name}_{policy}")
        if not os.path.exists(run + ".jsonl"):
            continue
        b, wb = log(run + ".jsonl"), ckpt_files(run + ".ckpt")
        keys = ("step", "loss", "ce_loss", "aux_loss", "grad_norm")
        same = len(a) == len(b) and all(all(x.get(k) == y.get(k) for k in keys)
                                        for x, y in zip(a, b))
        weights = wa == wb
        rep = open(run + ".compile.txt").read()
        m = re.search(r"recompute: \S+ .*?: (\d+) forward ops rebuilt.*activation arena "
                      r"([0-9.]+) MiB \(([0-9.]+) MiB without\)", rep)
        smaller = bool(m) and int(m.group(1)) > 0 and (
            float(m.group(2)) < float(m.group(3)) if policy == "full"
            else float(m.group(2)) <= float(m.group(3)))
        # Traffic of step 1 (both runs route the same tokens the same way).
        pa, pb = phases(a[0]), phases(b[0])
        rbd = "rbd" in name
        if policy == "selective":
            traffic = pa == pb
        else:
            traffic = pb["all_gather"] == pa["all_gather"]
            if "ep" in name and not rbd:
                traffic &= 2 * pb["dispatch"] == 3 * pa["dispatch"] > 0
                traffic &= 2 * pb["combine"] == 3 * pa["combine"] > 0
            if rbd:
                traffic &= pb["dispatch"] > pa["dispatch"] > 0 and pb["combine"] == pa["combine"]
            if "tp" in name:
                traffic &= pb["all_reduce"] > pa["all_reduce"]
        good = same and weights and smaller and traffic
        rebuilt = (f"{m.group(1)} ops rebuilt, arena {m.group(2)} of {m.group(3)} MiB" if m
                   else "no recompute line")
        print(f"{name:28s} {policy:9s} losses and gradient norms "
              f"{'equal' if same else 'DIFFERENT'}, weights and optimizer states "
              f"{'the same bytes' if weights else 'DIFFERENT'}; {rebuilt}; traffic {pb}"
              f"{'' if traffic else ' UNEXPECTED (none: ' + str(pa) + ')'}"
              f"{'' if good else '  FAIL'}")
        ok = ok and good
sys.exit(0 if ok else 1)
EOF
