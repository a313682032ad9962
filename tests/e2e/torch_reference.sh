#!/usr/bin/env bash
# tests/e2e/torch_reference.sh — the compiled training program against an
# independent PyTorch implementation (tests/e2e/torch_ref.py, Debian's
# python3-torch), through the public files only: the Hugging Face style
# checkpoint (config.json + model.safetensors) and the data file.
#
# For each model: compile; write the initial checkpoint (--steps 0); take
# one optimizer step from it (--resume, --steps 1) with a per-step log.
# Then PyTorch, from the initial checkpoint, must give
#   - the same loss of step 1 (relative difference <= 1e-4), and
#   - after one AdamW step (global-norm clipping, decoupled weight decay,
#     the logged learning rate) the same parameters as our checkpoint.
# AdamW's first step moves each weight by lr * g / (|g| + eps): an element
# whose gradient is at float noise level (|g| <= 1e-6 * max|g| of the
# tensor) or near Adam's eps (|g| <= 100 * eps, where the step depends on
# the last digits of g) may legitimately move differently; those elements
# (counted and reported) are allowed a difference of 2.1 * lr; every other
# element must agree within 1e-6 + 1e-5 * |p|.
set -euo pipefail
src="${XM_SOURCE_DIR:?}"
bin="${XM_BINARY_DIR:?}"
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export XM_NO_REEXEC=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# English text from the system (Debian's base-files): the license texts.
data="$work/text.txt"
for f in /usr/share/common-licenses/*; do [[ -L "$f" ]] || cat "$f"; done >"$data"

# A second model exercising the other code paths: GeLU experts, sigmoid
# scoring with group-limited routing, a capacity factor, tied embeddings,
# per-head q/k norms.
cat >"$work/variant.json" <<'EOF'
{
  "name": "variant",
  "model": {"vocab": 256, "hidden": 64, "layers": 3, "heads": 4, "kv_heads": 2,
            "head_dim": 16, "first_k_dense": 1, "dense_ffn": 96,
            "tied_embeddings": true, "qk_norm": "head"},
  "moe": {"experts": 8, "top_k": 3, "expert_ffn": 48, "activation": "gelu",
          "scoring": "sigmoid", "n_group": 4, "topk_group": 2,
          "norm_topk_prob": true, "routed_scaling": 1.5, "aux_alpha": 0.02,
          "capacity_factor": 1.25, "shared_experts": 1},
  "training": {"seq_len": 64, "micro_batch": 2, "global_batch": 4, "dtype": "fp32", "lr": 0.002,
               "warmup_steps": 0, "train_steps": 50, "grad_clip": 0.5, "weight_decay": 0.05}
}
EOF

# DeepSeek-V3-style attention: MLA with a q compression, interleaved RoPE
# on the rotary part, YaRN (the scaled frequencies, the factor on cos/sin
# and the softmax mscale); sigmoid group-limited routing with the
# correction bias and a shared expert. And the q_proj form (q_lora_rank 0) without
# YaRN or interleaving.
cat >"$work/mla.json" <<'EOF'
{
  "name": "mla",
  "model": {"vocab": 256, "hidden": 64, "layers": 2, "heads": 4, "attention": "mla",
            "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 12,
            "qk_rope_head_dim": 8, "v_head_dim": 10, "first_k_dense": 1, "dense_ffn": 96,
            "rope_interleave": true, "yarn_factor": 4, "yarn_original_max_position": 16,
            "yarn_mscale": 0.8, "yarn_mscale_all_dim": 0.9},
  "moe": {"experts": 8, "top_k": 2, "expert_ffn": 32, "scoring": "sigmoid", "n_group": 4,
          "topk_group": 2, "norm_topk_prob": true, "routed_scaling": 2.5,
          "shared_experts": 1},
  "training": {"seq_len": 32, "micro_batch": 2, "global_batch": 4, "dtype": "fp32", "lr": 0.002,
               "warmup_steps": 0, "train_steps": 50, "grad_clip": 1.0}
}
EOF
cat >"$work/mla_q.json" <<'EOF'
{
  "name": "mla_q",
  "model": {"vocab": 256, "hidden": 48, "layers": 1, "heads": 2, "attention": "mla",
            "kv_lora_rank": 8, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4,
            "v_head_dim": 8},
  "moe": {"experts": 4, "top_k": 2, "expert_ffn": 16},
  "training": {"seq_len": 16, "micro_batch": 2, "global_batch": 2, "dtype": "fp32", "lr": 0.002,
               "warmup_steps": 0, "train_steps": 50}
}
EOF

# Multi-token prediction with two chained modules over GQA attention, an
# aux loss in every MoE block (the modules' too) and another loss weight.
cat >"$work/mtp.json" <<'EOF'
{
  "name": "mtp",
  "model": {"vocab": 256, "hidden": 48, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 12,
            "first_k_dense": 1, "dense_ffn": 64, "mtp_layers": 2},
  "moe": {"experts": 4, "top_k": 2, "expert_ffn": 24, "aux_alpha": 0.01},
  "training": {"seq_len": 24, "micro_batch": 2, "global_batch": 4, "dtype": "fp32", "lr": 0.002,
               "warmup_steps": 0, "train_steps": 50, "mtp_loss_weight": 0.5}
}
EOF

# Qwen2-MoE-like (its checkpoint is transformers' qwen2_moe: config.json and
# the mlp.shared_expert.* names): q/k/v biases, softmax routing without
# renormalisation, and one shared expert of its own width under the sigmoid
# shared_expert_gate, out = routed + sigmoid(x W_g^T) * shared(x); an aux
# loss and two micro-batches. And the gate without the biases, a spec of
# no Hugging Face architecture (xmoec's config.json, which does not name the
# gate: torch_ref finds its tensor), with a dense first layer.
cat >"$work/qwen2_moe.json" <<'EOF'
{
  "name": "qwen2_moe",
  "model": {"vocab": 256, "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2,
            "head_dim": 16, "attention_bias": true},
  "moe": {"experts": 8, "top_k": 2, "expert_ffn": 32, "shared_experts": 1, "shared_ffn": 48,
          "shared_expert_gate": true, "norm_topk_prob": false, "aux_alpha": 0.01},
  "training": {"seq_len": 32, "micro_batch": 2, "global_batch": 4, "dtype": "fp32", "lr": 0.002,
               "warmup_steps": 0, "train_steps": 50, "grad_clip": 1.0, "weight_decay": 0.05}
}
EOF
cat >"$work/gated.json" <<'EOF'
{
  "name": "gated",
  "model": {"vocab": 256, "hidden": 48, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 12,
            "first_k_dense": 1, "dense_ffn": 64},
  "moe": {"experts": 4, "top_k": 2, "expert_ffn": 24, "shared_experts": 2,
          "shared_expert_gate": true},
  "training": {"seq_len": 24, "micro_batch": 2, "global_batch": 2, "dtype": "fp32", "lr": 0.002,
               "warmup_steps": 0, "train_steps": 50}
}
EOF

check_model() {
  local spec=$1 name=$2 micro=$3 accum=$4 seq=$5
  local out="$work/$name"
  "$bin/xmoec" compile "$spec" -o "$out/prog" >/dev/null
  "$out/prog/train" --data "$data" --steps 0 --ckpt-dir "$out/c0" --progress never --quiet
  "$out/prog/train" --data "$data" --resume "$out/c0" --steps 1 --ckpt-dir "$out/c1" \
    --log "$out/log.jsonl" --progress never --quiet
  local windows
  windows=$(seq -s, 0 $((micro * accum - 1)))
  "$py" "$src/tests/e2e/torch_ref.py" step "$out/c0/step-000000" "$data" --windows "$windows" \
    --seq "$seq" --micro "$micro" --lr "$("$py" -c "import json;print(json.loads(open('$out/log.jsonl').readline())['lr'])")" \
    --out "$out/ref.safetensors" --grads "$out/grads.safetensors" >"$out/ref.json"
  "$py" - "$out" "$src/tests/e2e" <<'PYEOF'
import json, sys
out, here = sys.argv[1], sys.argv[2]
sys.path.insert(0, here)
import torch_ref as R
log = json.loads(open(out + "/log.jsonl").readline())
ref = json.load(open(out + "/ref.json"))
rel = abs(log["loss"] - ref["loss"]) / abs(ref["loss"])
print(f"{out.rsplit('/',1)[1]}: loss ours {log['loss']:.7f} torch {ref['loss']:.7f} rel {rel:.2e}; "
      f"grad norm ours {log['grad_norm']:.6f} torch {ref['grad_norm']:.6f}")
ok = rel <= 1e-4 and abs(log["grad_norm"] - ref["grad_norm"]) <= 1e-4 * ref["grad_norm"]
# The MTP modules' mean cross-entropy is logged apart (and not inside aux_loss).
if ref["mtp"] is not None:
    mrel = abs(log["mtp_loss"] - ref["mtp"]) / abs(ref["mtp"])
    print(f"  mtp loss ours {log['mtp_loss']:.7f} torch {ref['mtp']:.7f} rel {mrel:.2e}")
    ok = ok and mrel <= 1e-4
else:
    ok = ok and "mtp_loss" not in log
_, ours = R.read_checkpoint(out + "/c1/step-000001")
theirs = R.read_safetensors(out + "/ref.safetensors")
grads = R.read_safetensors(out + "/grads.safetensors")
lr = log["lr"]
state = json.load(open(out + "/c0/step-000000/trainer_state.json"))
adam_eps = state["settings"]["adam_eps"]
assert set(ours) == set(theirs), set(ours) ^ set(theirs)
weak_total = 0
for name in sorted(theirs):
    a, b = ours[name], theirs[name]
    diff = (a - b).abs()
    g = grads.get(name)
    if g is None:  # not trainable: must be untouched and equal
        bad = diff > 0
    else:
        weak = g.abs() <= max(1e-6 * float(g.abs().max()), 100 * adam_eps)
        weak_total += int(weak.sum())
        bad = (~weak & (diff > 1e-6 + 1e-5 * b.abs())) | (weak & (diff > 2.1 * lr))
    if bool(bad.any()):
        ok = False
        gb = float(g[bad].abs().max()) if g is not None else 0.0
        print(f"  MISMATCH {name}: {int(bad.sum())} of {b.numel()} elements, max diff {float(diff.max()):.3g}, largest |g| there {gb:.3g}")
print(f"  {len(theirs)} tensors compared after one AdamW step; {weak_total} elements with noise-level gradients")
sys.exit(0 if ok else 1)
PYEOF
}

check_model "$src/samples/tiny.json" tiny 4 2 128
check_model "$work/variant.json" variant 2 2 64
check_model "$src/samples/deepseek-v3-mini.json" deepseek-v3-mini 4 2 128
check_model "$work/mla.json" mla 2 2 32
check_model "$work/mla_q.json" mla_q 2 1 16
check_model "$work/mtp.json" mtp 2 2 24
check_model "$work/qwen2_moe.json" qwen2_moe 2 2 32
check_model "$work/gated.json" gated 2 1 24
echo "torch_reference: ok"
