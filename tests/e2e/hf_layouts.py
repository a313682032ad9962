"""tests/e2e/hf_layouts.py — small random checkpoints laid out exactly as Hugging Face
lays them out, for tests/e2e/hf_checkpoints.sh.

For each architecture xmoec exports (mixtral, qwen2_moe, qwen3_moe, olmoe,
deepseek_v3) this file knows, independently of xmoec's C code, what
transformers writes: the config.json its config class saves for the model_type
(keys sorted, as save_pretrained writes them; DeepSeek-V3 with the keys of
DeepSeek's released config.json that transformers' class does not define:
num_nextn_predict_layers, topk_method, scoring_func, moe_layer_freq,
aux_loss_alpha), and the tensor names and shapes its modeling code has
(modeling_mixtral.py: block_sparse_moe.gate, block_sparse_moe.experts.E.w1 / w3
/ w2; modeling_qwen2_moe.py: mlp.shared_expert.*_proj and
mlp.shared_expert_gate; modeling_qwen3_moe.py: per-head self_attn.q_norm /
k_norm; modeling_olmoe.py: q_norm over hidden_size, k_norm over kv_heads *
head_dim; modeling_deepseek_v3.py: MLA, mlp.gate.e_score_correction_bias,
mlp.shared_experts, and DeepSeek's MTP layers model.layers.{L+k} with
enorm, hnorm, eh_proj, shared_head.norm and the stored copies embed_tokens
and shared_head.head). Safetensors files carry {"format": "pt"}; a sharded
checkpoint is model-0000k-of-0000N.safetensors with
model.safetensors.index.json.

It also writes, per architecture, the xmoec spec of the same model (the
mapping of docs/spec.md, Hugging Face config.json, written out here by hand)
with a small training section, and computes the reference loss with the
project's independent PyTorch model (tests/e2e/torch_ref.py, which reads
xmoec's canonical DeepSeek-style names: the HF names are mapped here).

Usage:
  hf_layouts.py write ROOT          checkpoints ROOT/<arch>/hf, specs ROOT/<arch>/spec.json,
                                    refusal variants ROOT/bad/<case>
  hf_layouts.py loss ROOT DATA ARCH...   {"<arch>": {"loss": .., "ce": ..}} of the first step
  hf_layouts.py compare SRC OUT [SRC OUT ...]   a saved checkpoint against the source:
                                    names, shapes, values, config.json fields
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref as R  # noqa: E402

SEQ, MICRO = 16, 2

# ---- the architectures ---------------------------------------------------------

# Keys of the source config that xmoec does not carry and so does not write
# back the same (tests compare every other key): the dtype of the stored
# tensors (xmoec saves its f32 master weights), the tokenizer's ids, the
# library version, the context length (xmoec writes the length it trains
# at), and Qwen's sliding-window layer count, meaningless without
# use_sliding_window.
NOT_COMPARED = {"torch_dtype", "transformers_version", "bos_token_id", "eos_token_id",
                "pad_token_id", "max_position_embeddings", "max_window_layers"}


def mixtral():
    cfg = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 8,
        "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
        "intermediate_size": 48, "max_position_embeddings": 4096, "num_attention_heads": 4,
        "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "num_local_experts": 4, "output_router_logits": False, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
        "router_jitter_noise": 0.0, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.3", "use_cache": True,
        "vocab_size": 256,
    }
    spec = {"model": {"vocab": 256, "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2,
                      "head_dim": 8, "rope_theta": 1e6, "norm_eps": 1e-5},
            "moe": {"experts": 4, "top_k": 2, "expert_ffn": 48, "norm_topk_prob": True,
                    "aux_alpha": 0.02}}
    # global batch 4: two micro-batches on one rank, one per rank under dp 2
    return cfg, spec, {"dtype": "bf16", "shards": 1, "global_batch": 4}


def qwen3_moe():
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
        "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 16, "hidden_act": "silu",
        "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 64,
        "max_position_embeddings": 32768, "max_window_layers": 28, "mlp_only_layers": [],
        "moe_intermediate_size": 24, "norm_topk_prob": False, "num_attention_heads": 4,
        "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "output_router_logits": False, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 10000.0, "router_aux_loss_coef": 0.001,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "float16",
        "transformers_version": "4.51.3", "use_cache": True, "use_sliding_window": False,
        "vocab_size": 256,
    }
    spec = {"model": {"vocab": 256, "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2,
                      "head_dim": 16, "norm_eps": 1e-6, "tied_embeddings": True,
                      "qk_norm": "head", "dense_ffn": 64},
            "moe": {"experts": 8, "top_k": 2, "expert_ffn": 24, "norm_topk_prob": False,
                    "aux_alpha": 0.001}}
    return cfg, spec, {"dtype": "f16", "shards": 3, "global_batch": 2}


def olmoe():
    cfg = {
        "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "attention_bias": False,
        "attention_dropout": 0.0, "clip_qkv": None, "eos_token_id": 50279, "hidden_act": "silu",
        "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 32,
        "max_position_embeddings": 4096, "norm_topk_prob": False, "num_attention_heads": 4,
        "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2,
        "num_key_value_heads": 4, "output_router_logits": False, "pad_token_id": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8,
                         "beta_fast": 32.0, "beta_slow": 1.0},
        "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": False,
        "torch_dtype": "float32", "transformers_version": "4.51.3", "use_cache": True,
        "vocab_size": 256,
    }
    spec = {"model": {"vocab": 256, "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 4,
                      "norm_eps": 1e-5, "qk_norm": "full", "yarn_factor": 2,
                      "yarn_original_max_position": 8},
            "moe": {"experts": 8, "top_k": 2, "expert_ffn": 32, "norm_topk_prob": False,
                    "aux_alpha": 0.01}}
    return cfg, spec, {"dtype": "f32", "shards": 1, "global_batch": 2}


def qwen2_moe():
    cfg = {
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
        "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 32,
        "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 8192,
        "max_window_layers": 21, "mlp_only_layers": [], "moe_intermediate_size": 16,
        "norm_topk_prob": False, "num_attention_heads": 4, "num_experts": 4,
        "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 4,
        "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": 32, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "float32", "transformers_version": "4.51.3",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 256,
    }
    spec = {"model": {"vocab": 256, "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 4,
                      "rope_theta": 1e6, "norm_eps": 1e-6, "attention_bias": True,
                      "dense_ffn": 64},
            "moe": {"experts": 4, "top_k": 2, "expert_ffn": 16, "shared_experts": 1,
                    "shared_ffn": 32, "shared_expert_gate": True, "norm_topk_prob": False,
                    "aux_alpha": 0.001}}
    return cfg, spec, {"dtype": "f32", "shards": 2, "global_batch": 2}


def deepseek_v3():
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "attention_bias": False, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
        "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 1, "head_dim": 8,
        "hidden_act": "silu", "hidden_size": 48, "initializer_range": 0.02,
        "intermediate_size": 64, "kv_lora_rank": 16, "max_position_embeddings": 4096,
        "moe_intermediate_size": 16, "moe_layer_freq": 1, "n_group": 4, "n_routed_experts": 8,
        "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 4,
        "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 4,
        "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 24,
        "qk_head_dim": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "rms_norm_eps": 1e-06,
        "rope_interleave": True,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0},
        "rope_theta": 10000.0, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
        "tie_word_embeddings": False, "topk_group": 2, "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16", "transformers_version": "4.51.3", "use_cache": True,
        "v_head_dim": 8, "vocab_size": 256,
    }
    spec = {"model": {"vocab": 256, "hidden": 48, "layers": 2, "heads": 4, "attention": "mla",
                      "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                      "qk_rope_head_dim": 8, "v_head_dim": 8, "rope_interleave": True,
                      "yarn_factor": 4, "yarn_original_max_position": 8, "yarn_mscale": 1,
                      "yarn_mscale_all_dim": 1, "first_k_dense": 1, "dense_ffn": 64,
                      "mtp_layers": 1},
            "moe": {"experts": 8, "top_k": 2, "expert_ffn": 16, "shared_experts": 1,
                    "scoring": "sigmoid", "n_group": 4, "topk_group": 2, "norm_topk_prob": True,
                    "routed_scaling": 2.5, "aux_alpha": 0.001, "aux_free_gamma": 0.001}}
    return cfg, spec, {"dtype": "bf16", "shards": 3, "global_batch": 2}


ARCHS = {"mixtral": mixtral, "qwen3_moe": qwen3_moe, "olmoe": olmoe, "qwen2_moe": qwen2_moe,
         "deepseek_v3": deepseek_v3}


def tensors_of(cfg):
    """(name, shape, kind) of every tensor transformers' modeling code has, in its order."""
    mt = cfg["model_type"]
    V, H, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
    nh = cfg["num_attention_heads"]
    out = [("model.embed_tokens.weight", [V, H], "w")]

    def mla(p):
        qr, kvr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
        dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        out.extend([(p + "self_attn.q_a_proj.weight", [qr, H], "w"),
                    (p + "self_attn.q_a_layernorm.weight", [qr], "n"),
                    (p + "self_attn.q_b_proj.weight", [nh * (dn + dr), qr], "w"),
                    (p + "self_attn.kv_a_proj_with_mqa.weight", [kvr + dr, H], "w"),
                    (p + "self_attn.kv_a_layernorm.weight", [kvr], "n"),
                    (p + "self_attn.kv_b_proj.weight", [nh * (dn + dv), kvr], "w"),
                    (p + "self_attn.o_proj.weight", [H, nh * dv], "w")])

    def gqa(p):
        nkv = cfg["num_key_value_heads"]
        hd = cfg.get("head_dim") or H // nh
        out.extend([(p + "self_attn.q_proj.weight", [nh * hd, H], "w"),
                    (p + "self_attn.k_proj.weight", [nkv * hd, H], "w"),
                    (p + "self_attn.v_proj.weight", [nkv * hd, H], "w"),
                    (p + "self_attn.o_proj.weight", [H, nh * hd], "w")])
        if mt == "qwen2_moe":  # q, k and v always have biases
            out.extend([(p + f"self_attn.{x}_proj.bias", [s], "b")
                        for x, s in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd))])
        if mt == "qwen3_moe":  # per head
            out.extend([(p + "self_attn.q_norm.weight", [hd], "n"),
                        (p + "self_attn.k_norm.weight", [hd], "n")])
        if mt == "olmoe":  # over the whole projections
            out.extend([(p + "self_attn.q_norm.weight", [H], "n"),
                        (p + "self_attn.k_norm.weight", [H // nh * nkv], "n")])

    def mlp(p, width):
        out.extend([(p + "gate_proj.weight", [width, H], "w"), (p + "up_proj.weight", [width, H], "w"),
                    (p + "down_proj.weight", [H, width], "w")])

    def moe(p):
        if mt == "mixtral":
            E, F = cfg["num_local_experts"], cfg["intermediate_size"]
            out.append((p + "block_sparse_moe.gate.weight", [E, H], "w"))
            for e in range(E):
                q = p + f"block_sparse_moe.experts.{e}."
                out.extend([(q + "w1.weight", [F, H], "w"), (q + "w2.weight", [H, F], "w"),
                            (q + "w3.weight", [F, H], "w")])
            return
        E = cfg.get("num_experts") or cfg.get("n_routed_experts")
        F = cfg["intermediate_size"] if mt == "olmoe" else cfg["moe_intermediate_size"]
        out.append((p + "mlp.gate.weight", [E, H], "w"))
        if mt == "deepseek_v3":
            out.append((p + "mlp.gate.e_score_correction_bias", [E], "b"))
        for e in range(E):
            mlp(p + f"mlp.experts.{e}.", F)
        if mt == "qwen2_moe":
            mlp(p + "mlp.shared_expert.", cfg["shared_expert_intermediate_size"])
            out.append((p + "mlp.shared_expert_gate.weight", [1, H], "w"))
        if mt == "deepseek_v3" and cfg["n_shared_experts"]:
            mlp(p + "mlp.shared_experts.", cfg["n_shared_experts"] * F)

    def layer(i):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", [H], "n"))
        (mla if mt == "deepseek_v3" else gqa)(p)
        out.append((p + "post_attention_layernorm.weight", [H], "n"))
        if mt == "deepseek_v3" and i < cfg["first_k_dense_replace"]:
            mlp(p + "mlp.", cfg["intermediate_size"])
        else:
            moe(p)

    for i in range(L):
        layer(i)
    for k in range(cfg.get("num_nextn_predict_layers", 0) if mt == "deepseek_v3" else 0):
        p = f"model.layers.{L + k}."
        out.extend([(p + "embed_tokens.weight", [V, H], "copy:model.embed_tokens.weight"),
                     (p + "enorm.weight", [H], "n"), (p + "hnorm.weight", [H], "n"),
                     (p + "eh_proj.weight", [H, 2 * H], "w")])
        layer(L + k)
        out.extend([(p + "shared_head.norm.weight", [H], "n"),
                    (p + "shared_head.head.weight", [V, H], "copy:lm_head.weight")])
    out.append(("model.norm.weight", [H], "n"))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", [V, H], "w"))
    return out


def canonical(mt, name):
    """xmoec's canonical (DeepSeek-style) name of an HF tensor name; None for the MTP
    layers' stored copies, which xmoec shares."""
    parts = name.split(".")
    if mt == "deepseek_v3" and (name.endswith(".shared_head.head.weight") or
                                (len(parts) == 5 and parts[3] == "embed_tokens")):
        return None
    if mt == "mixtral" and ".block_sparse_moe." in name:
        name = name.replace(".block_sparse_moe.", ".mlp.")
        for hf, ours in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            name = name.replace(f".{hf}.weight", f".{ours}.weight")
    if mt == "qwen2_moe":
        name = name.replace(".mlp.shared_expert.", ".mlp.shared_experts.")
    return name


# ---- safetensors -----------------------------------------------------------------

DTYPES = {"f32": (torch.float32, "F32"), "bf16": (torch.bfloat16, "BF16"),
          "f16": (torch.float16, "F16"), "f64": (torch.float64, "F64")}
NP_OF = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def to_bytes(t, code):
    t = t.contiguous()
    if code == "BF16":  # numpy has no bfloat16: its bit pattern
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors):
    """tensors: {name: (code, shape, bytes)}; the format of docs/checkpoints.md."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name in sorted(tensors):
        code, shape, data = tensors[name]
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name in sorted(tensors):
            f.write(tensors[name][2])


def read_safetensors(path):
    """{name: (code, shape, float32 array)}: every dtype the checkpoints use, as f32."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base, out = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        buf, code = raw[base + b:base + e], info["dtype"]
        if code == "BF16":
            bits = np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=NP_OF[code]).astype(np.float32)
        out[name] = (code, list(info["shape"]), arr.reshape(info["shape"]))
    return out, header.get("__metadata__")


def read_checkpoint(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values()))
             if os.path.exists(index) else ["model.safetensors"])
    out = {}
    for f in files:
        t, meta = read_safetensors(os.path.join(d, f))
        assert meta == {"format": "pt"}, (f, meta)
        out.update(t)
    return json.load(open(os.path.join(d, "config.json"))), out


def save_checkpoint(d, cfg, tensors, shards):
    """tensors: [(name, code, shape, bytes)] in model order, split into `shards` files like
    save_pretrained (consecutive, in that order) with the index."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"),
                          {n: (c, s, b) for n, c, s, b in tensors})
        return
    per = math.ceil(len(tensors) / shards)
    weight_map, total = {}, 0
    for k in range(shards):
        part = tensors[k * per:(k + 1) * per]
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(d, name), {n: (c, s, b) for n, c, s, b in part})
        for n, c, s, b in part:
            weight_map[n] = name
            total += len(b)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                  f, indent=2)


def random_tensors(cfg, dtype, seed):
    """Random values, stored in `dtype`: matrices N(0, 0.08), norms 1 + N(0, 0.1), biases
    N(0, 0.05); the MTP copies are the shared tensors' bytes."""
    g = torch.Generator().manual_seed(seed)
    tdt, code = DTYPES[dtype]
    layout, made = tensors_of(cfg), {}
    for name, shape, kind in layout:
        if kind == "n":
            made[name] = (1 + 0.1 * torch.randn(shape, generator=g)).to(tdt)
        elif kind == "b":
            made[name] = (0.05 * torch.randn(shape, generator=g)).to(tdt)
        elif kind == "w":
            made[name] = (0.08 * torch.randn(shape, generator=g)).to(tdt)
    out = []
    for name, shape, kind in layout:
        if kind.startswith("copy:"):  # a tied head is the embedding
            t = made.get(kind[5:], made["model.embed_tokens.weight"])
        else:
            t = made[name]
        out.append((name, code, shape, to_bytes(t, code)))
    return out


def spec_of(name, spec, extra):
    s = json.loads(json.dumps(spec))
    s["name"] = "hf-" + name
    s["training"] = {"seq_len": SEQ, "micro_batch": MICRO, "global_batch": extra["global_batch"],
                     "dtype": "fp32", "lr": 0.001, "warmup_steps": 0, "train_steps": 10,
                     "seed": 7}
    return s


# ---- refusal cases ----------------------------------------------------------------

def bad_cases(root, cfg, tensors):
    """Copies of the Mixtral checkpoint, each broken in one way."""
    def edit(case, fn, cfg_fn=None):
        ts = [list(t) for t in tensors]
        ts = fn(ts)
        c = json.loads(json.dumps(cfg))
        if cfg_fn:
            cfg_fn(c)
        save_checkpoint(os.path.join(root, "bad", case), c, [tuple(t) for t in ts], 1)

    def rename(ts):
        for t in ts:
            if t[0] == "model.layers.1.block_sparse_moe.experts.2.w3.weight":
                t[0] = "model.layers.1.block_sparse_moe.experts.2.w4.weight"
        return ts

    def reshape(ts):
        for t in ts:
            if t[0] == "model.layers.0.self_attn.k_proj.weight":
                t[2] = [t[2][0] // 2, t[2][1]]
                t[3] = t[3][:len(t[3]) // 2]
        return ts

    def extra(ts):
        return ts + [["lm_head.bias", "BF16", [256], bytes(512)]]

    def f64(ts):
        for t in ts:
            if t[0] == "model.layers.1.post_attention_layernorm.weight":
                v = np.frombuffer(t[3], dtype=np.uint16).astype(np.uint32) << 16
                t[1], t[3] = "F64", v.view(np.float32).astype(np.float64).tobytes()
        return ts

    def nan(ts):
        for t in ts:
            if t[0] == "model.layers.0.block_sparse_moe.gate.weight":
                t[3] = b"\xc0\x7f" + t[3][2:]  # a bf16 NaN in element 0
        return ts

    edit("renamed", rename)
    edit("shape", reshape)
    edit("missing", lambda ts: [t for t in ts if t[0] != "model.norm.weight"])
    edit("extra", extra)
    edit("f64", f64)
    edit("nan", nan)
    edit("config", lambda ts: ts, lambda c: c.update(num_experts_per_tok=3))
    edit("model_type", lambda ts: ts, lambda c: c.update(model_type="qwen3_moe"))
    edit("rope", lambda ts: ts, lambda c: c.update(rope_theta=10000.0))


def cmd_write(root):
    for i, (name, fn) in enumerate(ARCHS.items()):
        cfg, spec, extra = fn()
        d = os.path.join(root, name)
        tensors = random_tensors(cfg, extra["dtype"], 100 + i)
        save_checkpoint(os.path.join(d, "hf"), cfg, tensors, extra["shards"])
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(spec_of(name, spec, extra), f, indent=2)
        with open(os.path.join(d, "global_batch"), "w") as f:
            f.write(f"{extra['global_batch']}\n")
        if name == "mixtral":
            bad_cases(root, cfg, tensors)
        if name == "deepseek_v3":  # an MTP layer whose stored embedding is not the model's
            ts = [list(t) for t in tensors]
            for t in ts:
                if t[0] == "model.layers.2.embed_tokens.weight":
                    t[3] = bytes(len(t[3]))
            save_checkpoint(os.path.join(root, "bad", "mtp_copy"), cfg, [tuple(t) for t in ts],
                            extra["shards"])
    return 0


# ---- the reference loss --------------------------------------------------------------

def ref_config(cfg):
    """torch_ref's config (xmoec's DeepSeek-V3 field names) of an HF config."""
    mt = cfg["model_type"]
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    r = {"hidden_size": H, "num_attention_heads": nh, "num_hidden_layers": cfg["num_hidden_layers"],
         "num_key_value_heads": cfg.get("num_key_value_heads", nh),
         "rms_norm_eps": cfg["rms_norm_eps"], "rope_theta": cfg["rope_theta"],
         "rope_scaling": cfg.get("rope_scaling"), "rope_interleave": False,
         "tie_word_embeddings": cfg["tie_word_embeddings"], "hidden_act": "silu",
         "num_experts_per_tok": cfg["num_experts_per_tok"], "scoring_func": "softmax",
         "norm_topk_prob": cfg.get("norm_topk_prob", False), "routed_scaling_factor": 1.0,
         "n_group": 1, "topk_group": 1, "first_k_dense_replace": 0,
         "aux_loss_alpha": cfg.get("router_aux_loss_coef", 0.0), "qk_norm": "none",
         "attention_bias": False, "head_dim": cfg.get("head_dim") or H // nh,
         # the names below are mapped to the canonical ones (canonical())
         "shared_prefix": "mlp.shared_experts."}
    if mt == "mixtral":
        r.update(n_routed_experts=cfg["num_local_experts"], norm_topk_prob=True)
    elif mt in ("qwen2_moe", "qwen3_moe", "olmoe"):
        r["n_routed_experts"] = cfg["num_experts"]
        r["qk_norm"] = {"qwen3_moe": "head", "olmoe": "full"}.get(mt, "none")
        r["attention_bias"] = mt == "qwen2_moe"
        if mt == "qwen2_moe":
            r["n_shared_experts"] = 1
    else:
        r.update({k: cfg[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                      "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
                                      "n_shared_experts", "n_group", "topk_group",
                                      "routed_scaling_factor", "first_k_dense_replace",
                                      "norm_topk_prob", "rope_interleave", "scoring_func")})
        r["aux_loss_alpha"] = cfg.get("aux_loss_alpha", 0.0)
    return r


def gated_shared(moe):
    """Qwen2-MoE's shared expert under its sigmoid gate (Qwen2MoeSparseMoeBlock), around
    torch_ref's routed experts: y = routed + sigmoid(x Wg^T) * shared."""
    def f(cfg, p, pre, t):
        routed, aux = moe(dict(cfg, n_shared_experts=0), p, pre, t)
        s = pre + "mlp.shared_experts."
        shared = R.swiglu(t, p[s + "gate_proj.weight"], p[s + "up_proj.weight"], p[s + "down_proj.weight"])
        return routed + torch.sigmoid(t @ p[pre + "mlp.shared_expert_gate.weight"].T) * shared, aux
    return f


def cmd_loss(root, data, archs):
    torch.set_num_threads(1)
    tokens = R.read_tokens(data)
    out = {}
    plain_moe = R.moe
    for name in archs:
        d = os.path.join(root, name)
        cfg, tensors = read_checkpoint(os.path.join(d, "hf"))
        spec = json.load(open(os.path.join(d, "spec.json")))
        mt = cfg["model_type"]
        p = {}
        for n, (_, _, arr) in tensors.items():
            c = canonical(mt, n)
            if c is not None:
                p[c] = torch.from_numpy(arr.copy())
        rc = ref_config(cfg)
        R.LOADS.clear()  # torch_ref's per-layer load counts, of the previous model
        R.moe = gated_shared(plain_moe) if mt == "qwen2_moe" else plain_moe
        mtp = (cfg.get("num_nextn_predict_layers", 0) if mt == "deepseek_v3" else 0,
               spec["training"].get("mtp_loss_weight", 0.3))
        gb = spec["training"]["global_batch"]
        windows = list(range(gb))
        loss = ce = 0.0
        n = 0
        with torch.no_grad():
            for t, lab in R.batches(tokens, windows, SEQ, MICRO):
                a, b, _ = R.forward(rc, p, t, lab, mtp)
                loss, ce, n = loss + float(a), ce + float(b), n + 1
        out[name] = {"loss": loss / n, "ce": ce / n}
    R.moe = plain_moe
    print(json.dumps(out))
    return 0


# ---- comparison ------------------------------------------------------------------------

def cmd_compare(pairs):
    ok = True
    for src, dst in zip(pairs[0::2], pairs[1::2]):
        scfg, st = read_checkpoint(src)
        dcfg, dt = read_checkpoint(dst)
        bad = []
        # DeepSeek-V3's MTP layers store copies of the embedding and head; xmoec shares
        # them and writes them once.
        copies = [n for n in st if canonical(scfg["model_type"], n) is None]
        for n in copies:
            del st[n]
        if set(st) != set(dt):
            bad.append(f"names differ: only in the source {sorted(set(st) - set(dt))[:5]}, "
                       f"only in the saved one {sorted(set(dt) - set(st))[:5]}")
        for n in sorted(set(st) & set(dt)):
            if st[n][1] != dt[n][1]:
                bad.append(f"{n}: shape {st[n][1]} saved as {dt[n][1]}")
            elif dt[n][0] != "F32":
                bad.append(f"{n}: saved as {dt[n][0]}, expected F32")
            elif not np.array_equal(st[n][2].view(np.uint32), dt[n][2].view(np.uint32)):
                k = int(np.argmax(st[n][2].ravel() != dt[n][2].ravel()))
                bad.append(f"{n}: values differ (element {k}: {st[n][2].ravel()[k]!r} saved as "
                           f"{dt[n][2].ravel()[k]!r})")
        for k in sorted(scfg):
            if k in NOT_COMPARED:
                continue
            if k not in dcfg:
                bad.append(f"config.json: {k} missing (source {scfg[k]!r})")
            elif scfg[k] != dcfg[k]:
                bad.append(f"config.json: {k} is {dcfg[k]!r}, source {scfg[k]!r}")
        dtypes = sorted({v[0] for v in st.values()})
        print(f"{os.path.basename(os.path.dirname(src.rstrip('/')))}: {len(dt)} tensors "
              f"({'/'.join(dtypes)} -> F32), {len([k for k in scfg if k not in NOT_COMPARED])} "
              f"config keys: {'identical' if not bad else 'DIFFERENT'}"
              + (f" ({len(copies)} stored MTP copies not written back)" if copies else ""))
        for b in bad[:10]:
            print("  " + b)
        ok = ok and not bad
    return 0 if ok else 1


def main(argv):
    if len(argv) >= 2 and argv[0] == "write":
        return cmd_write(argv[1])
    if len(argv) >= 4 and argv[0] == "loss":
        return cmd_loss(argv[1], argv[2], argv[3:])
    if len(argv) >= 3 and argv[0] == "compare" and len(argv) % 2 == 1:
        return cmd_compare(argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
