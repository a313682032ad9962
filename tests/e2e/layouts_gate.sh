#!/usr/bin/env bash
# tests/e2e/layouts_gate.sh — Qwen2-MoE's shared-expert gate under the
# parallel layouts: tests/e2e/inputs/layouts_gate.json (q/k/v biases,
# softmax routing without renormalisation, an aux loss, one shared expert
# under the sigmoid shared_expert_gate) trained on one rank, under tensor
# parallelism (the shared expert column/row-parallel, the gate whole on
# every rank, reading all T tokens and multiplying the all_reduced shared
# output: its gradient summed over dp), with SSMB and expert parallelism
# (shared expert and gate on the rank's T/tp tokens: gradients summed over
# dp and tp), and with data parallelism, RBD and ZeRO-1 on top (the gate's
# optimizer state sharded over dp). Every layout must give the one-rank
# loss at every step (relative difference <= 1e-4), the one-rank gradient
# norm at every step (<= 1e-5) and the one-rank weights (every weight of
# the final checkpoint within 1e-3 of the tensor's largest magnitude, the
# gates within 1e-5). The two tighter bounds are there because AdamW hides
# a gradient off by a constant factor: summing the gate's gradient over tp
# without SSMB (twice the true one) moved the gates by 1.5e-4 and the norm
# by up to 1e-4, where the layouts agree to 2e-7 and 1.6e-6 (measured);
# leaving out the sum over tp under SSMB moved the gates by 0.2. 4-rank
# layouts run as 2 emulated nodes of 2.
set -euo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
steps="${XM_LAYOUT_STEPS:-10}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1
spec="$src/tests/e2e/inputs/layouts_gate.json"
data="$work/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"

# name world compile-flags...
layouts=(
  "base 1"
  "tp2 2 --tp 2"
  "tp2_ssmb_ep2 2 --tp 2 --ssmb --ep 2"
  "dp2_tp2_ssmb_ep4_rbd_zero1 4 --dp 2 --tp 2 --ssmb --ep 4 --rbd --zero 1 --ranks-per-node 2"
)
for l in "${layouts[@]}"; do
  read -r name world flags <<<"$l"
  # shellcheck disable=SC2086
  "$bin/xmoec" compile "$spec" -o "$work/$name" $flags >"$work/$name.compile.txt"
  rpn=2
  [[ "$world" -ge 2 ]] || rpn=1
  timeout 600 mpirun -np "$world" "$work/$name/train" --ranks-per-node "$rpn" --data "$data" \
    --seed 7 --progress never --quiet --steps "$steps" --log "$work/$name.jsonl" \
    --ckpt-dir "$work/$name.ckpt"
  echo "trained $name ($world ranks)"
done

/usr/bin/python3 - "$work" "$steps" "$src/tests/e2e" "${layouts[@]}" <<'PYEOF'
import json, os, sys
work, steps = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, sys.argv[3])
import torch_ref as R  # the checkpoint reader of the PyTorch reference test
names = [l.split()[0] for l in sys.argv[4:]]

def log(path):
    return {r["step"]: r for r in map(json.loads, open(path))}

def tensors(ckpt):
    """The model weights of the latest checkpoint under ckpt."""
    d = os.path.join(ckpt, open(os.path.join(ckpt, "latest")).read().strip())
    return {k: v.numpy() for k, v in R.read_checkpoint(d)[1].items()}

ok = True
base = log(os.path.join(work, "base.jsonl"))
assert sorted(base) == list(range(1, steps + 1)), sorted(base)
base_w = tensors(os.path.join(work, "base.ckpt"))
gates = sorted(k for k in base_w if k.endswith("mlp.shared_expert_gate.weight"))
assert len(gates) == 2, gates
for name in names[1:]:
    run = log(os.path.join(work, name + ".jsonl"))
    if sorted(run) != sorted(base):
        print(f"FAIL {name}: steps {sorted(run)}")
        ok = False
        continue
    worst = max(abs(base[s]["loss"] - run[s]["loss"]) / abs(base[s]["loss"]) for s in base)
    norm = max(abs(base[s]["grad_norm"] - run[s]["grad_norm"]) / base[s]["grad_norm"] for s in base)
    w = tensors(os.path.join(work, name + ".ckpt"))
    line = f"{name:28s} loss rel diff max {worst:.2e}, grad norm {norm:.2e}"
    good = worst <= 1e-4 and norm <= 1e-5
    if sorted(w) != sorted(base_w):
        line += f"; tensors differ: {sorted(set(w) ^ set(base_w))[:4]}"
        good = False
    else:
        wd = gd = 0.0
        for k in base_w:
            scale = max(float(abs(base_w[k]).max()), 1e-6)
            d = float(abs(w[k] - base_w[k]).max()) / scale
            wd = max(wd, d)
            if k in gates:
                gd = max(gd, d)
        line += f"; final weights rel diff max {wd:.2e} (gates {gd:.2e})"
        good = good and wd <= 1e-3 and gd <= 1e-5
    print(line + ("" if good else "  FAIL"))
    ok = ok and good
sys.exit(0 if ok else 1)
PYEOF
