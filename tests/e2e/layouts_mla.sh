#!/usr/bin/env bash
# tests/e2e/layouts_mla.sh — multi-head latent attention under the parallel
# layouts: tests/e2e/inputs/layouts_mla.json (DeepSeek-V3-style: MLA with a
# q compression, interleaved YaRN RoPE, sigmoid group-limited routing with
# aux-free balancing, a shared expert) trained on one rank and under tensor
# parallelism (MLA's heads split over TP: q_b_proj and kv_b_proj
# column-parallel, o_proj row-parallel, the low-rank projections and their
# norms replicated, the shared rotary key entering through replicate), with
# SSMB and expert parallelism, with RBD and ZeRO-1. Every layout must give
# the one-rank loss at every step (relative difference <= 1e-4) and the
# one-rank weights (every weight of the final checkpoint, <= 1e-3 of the
# tensor's largest magnitude). The same again for
# tests/e2e/inputs/layouts_mtp.json, the model with one multi-token-prediction
# module (its MoE block on 31 of the 32 positions, its head the main one;
# micro_batch 4, so that 4 x 31 tokens split over tp 4 under ssmb).
# 4-rank layouts run as 2 emulated nodes of 2.
set -euo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
steps="${XM_LAYOUT_STEPS:-10}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1
data="$work/english.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"

# name world compile-flags...
layouts=(
  "base 1"
  "tp2 2 --tp 2"
  "tp4_ssmb_ep4 4 --tp 4 --ssmb --ep 4"
  "tp2_ssmb_ep4_rbd_zero1 4 --dp 2 --tp 2 --ssmb --ep 4 --rbd --zero 1 --ranks-per-node 2"
)
check_model() {
model=$1
spec="$src/tests/e2e/inputs/$model.json"
mkdir -p "$work/$model"
for l in "${layouts[@]}"; do
  read -r name world flags <<<"$l"
  # shellcheck disable=SC2086
  "$bin/xmoec" compile "$spec" -o "$work/$model/$name" $flags >"$work/$model/$name.compile.txt"
  rpn=2
  [[ "$world" -ge 2 ]] || rpn=1
  timeout 600 mpirun -np "$world" "$work/$model/$name/train" --ranks-per-node "$rpn" --data "$data" \
    --seed 7 --progress never --quiet --steps "$steps" --log "$work/$model/$name.jsonl" \
    --ckpt-dir "$work/$model/$name.ckpt"
  echo "trained $model $name ($world ranks)"
done

/usr/bin/python3 - "$work/$model" "$steps" "$model" "$src/tests/e2e" "${layouts[@]}" <<'PYEOF'
import json, os, sys
work, steps, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, sys.argv[4])
import torch_ref as R  # the checkpoint reader of the PyTorch reference test
names = [l.split()[0] for l in sys.argv[5:]]

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
assert any("kv_a_proj_with_mqa" in k for k in base_w), "no MLA tensor in the checkpoint"
if model == "layouts_mtp":
    assert "model.layers.2.eh_proj.weight" in base_w, "no MTP module in the checkpoint"
for name in names[1:]:
    run = log(os.path.join(work, name + ".jsonl"))
    if sorted(run) != sorted(base):
        print(f"FAIL {name}: steps {sorted(run)}")
        ok = False
        continue
    worst = max(abs(base[s]["loss"] - run[s]["loss"]) / abs(base[s]["loss"]) for s in base)
    w = tensors(os.path.join(work, name + ".ckpt"))
    line = f"{model} {name:26s} loss rel diff max {worst:.2e}"
    good = worst <= 1e-4
    if sorted(w) != sorted(base_w):
        line += f"; tensors differ: {sorted(set(w) ^ set(base_w))[:4]}"
        good = False
    else:
        wd = 0.0
        for k in base_w:
            scale = max(float(abs(base_w[k]).max()), 1e-6)
            wd = max(wd, float(abs(w[k] - base_w[k]).max()) / scale)
        line += f"; final weights rel diff max {wd:.2e}"
        good = good and wd <= 1e-3
    print(line + ("" if good else "  FAIL"))
    ok = ok and good
sys.exit(0 if ok else 1)
PYEOF
}

check_model layouts_mla
check_model layouts_mtp
