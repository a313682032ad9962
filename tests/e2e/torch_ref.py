"""tests/e2e/torch_ref.py — an independent PyTorch implementation of the
xmoec model family (docs/design.md, Model semantics), used to check what out/train
computes: the forward loss of a checkpoint and one full AdamW step.

It reads only public formats: a checkpoint directory's config.json (DeepSeek-V3
field names, or transformers' Qwen2-MoE config, model_type qwen2_moe) and
model.safetensors (Hugging Face tensor names), and the training windows of a
data file. Nothing here imports xmoec code.

Usage:
  torch_ref.py loss  CKPT DATA --windows W0,W1,... --seq S --micro B
      prints {"loss": ..., "ce": ...} averaged over micro-batches
  torch_ref.py step  CKPT DATA --windows ... --seq S --micro B --lr LR
          --out OUT.safetensors [--grads GRADS.safetensors]
      takes one AdamW step (settings from CKPT/trainer_state.json) and writes
      the updated parameters
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float32)


# ---- files ------------------------------------------------------------------

def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = {"F32": np.float32, "I32": np.int32}[info["dtype"]]
        arr = np.frombuffer(data[base + b:base + e], dtype=dt).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = tensors[name].detach().contiguous().numpy().astype(np.float32)
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_checkpoint(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
        params = {}
        for f in files:
            params.update(read_safetensors(os.path.join(d, f)))
    else:
        params = read_safetensors(os.path.join(d, "model.safetensors"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    return cfg, params


def model_config(cfg):
    """The config with the DeepSeek-V3 field names the model code below reads.

    transformers' Qwen2MoeConfig (model_type qwen2_moe) names the routed experts
    num_experts, always biases q, k and v, routes by softmax, has one shared expert of
    shared_expert_intermediate_size under a sigmoid shared_expert_gate, and calls the
    aux loss weight router_aux_loss_coef. Its shared expert's tensors are
    mlp.shared_expert.* (singular): "shared_prefix" says which."""
    c = dict(cfg)
    c.setdefault("shared_prefix", "mlp.shared_experts.")
    mt = cfg.get("model_type", "xmoec")
    if mt == "qwen2_moe":
        c["n_routed_experts"] = cfg["num_experts"]
        c["n_shared_experts"] = 1 if cfg.get("shared_expert_intermediate_size") else 0
        c["shared_expert_gate"] = bool(c["n_shared_experts"])
        c["attention_bias"] = True
        c["scoring_func"] = "softmax"
        c["aux_loss_alpha"] = cfg.get("router_aux_loss_coef", 0.0)
        c["shared_prefix"] = "mlp.shared_expert."
        dense = cfg.get("mlp_only_layers") or []  # dense FFNs: the first layers only here
        assert dense == list(range(len(dense))), dense
        c["first_k_dense_replace"] = len(dense)
    elif mt not in ("xmoec", "deepseek_v3"):
        raise SystemExit(f"torch_ref: config.json of model_type {mt!r} is not read here")
    return c


def read_tokens(path):
    """The three data formats of runtime/io/data.h."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:8] == b"XMTOKENS":
        _, width = struct.unpack("<II", raw[8:16])
        return np.frombuffer(raw[16:], dtype=np.uint16 if width == 2 else np.uint32).astype(np.int64)
    return np.frombuffer(raw, dtype=np.uint8).astype(np.int64)


# ---- the model ----------------------------------------------------------------

def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def yarn_mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def inv_freq(d, theta, scaling):
    """transformers' default / YaRN inverse frequencies of d rotary dims and the factor on
    cos and sin (_compute_default_rope_parameters, _compute_yarn_parameters)."""
    pos = theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    if not scaling:
        return 1.0 / pos, 1.0
    assert scaling.get("rope_type", scaling.get("type")) == "yarn", scaling
    f = scaling["factor"]
    orig = scaling["original_max_position_embeddings"]
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1
    m, mall = scaling.get("mscale"), scaling.get("mscale_all_dim")
    att = scaling.get("attention_factor")
    if att is None:
        att = yarn_mscale(f, m) / yarn_mscale(f, mall) if m and mall else yarn_mscale(f)

    def corr(rot):
        return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = corr(fast), corr(slow)
    if scaling.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    extrap = 1.0 - ramp
    return (1.0 / (f * pos)) * (1 - extrap) + (1.0 / pos) * extrap, att


def rope(x, theta, scaling=None, interleave=False):
    b, s, h, d = x.shape
    inv, att = inv_freq(d, theta, scaling)
    ang = torch.outer(torch.arange(s, dtype=torch.float64), inv)
    ang = torch.cat([ang, ang], dim=-1)
    cos = (ang.cos() * att).float()[None, :, None, :]
    sin = (ang.sin() * att).float()[None, :, None, :]
    if interleave:  # apply_rotary_pos_emb_interleave: pairs (2i, 2i+1) moved to (i, i + d/2)
        x = x.reshape(b, s, h, d // 2, 2).transpose(-1, -2).reshape(b, s, h, d)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def mla(cfg, p, at, hn):
    """transformers' DeepseekV3Attention (eager, no cache) on hn [B,S,H]."""
    B, S, _ = hn.shape
    nh = cfg["num_attention_heads"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvr = cfg["kv_lora_rank"]
    scaling = cfg.get("rope_scaling")
    inter = cfg.get("rope_interleave", True)
    if cfg.get("q_lora_rank"):
        qa = rmsnorm(hn @ p[at + "q_a_proj.weight"].T, p[at + "q_a_layernorm.weight"], 1e-6)
        q = qa @ p[at + "q_b_proj.weight"].T
    else:
        q = hn @ p[at + "q_proj.weight"].T
    q = q.view(B, S, nh, dn + dr)
    q_pass, q_rot = q[..., :dn], q[..., dn:]
    ckv = hn @ p[at + "kv_a_proj_with_mqa.weight"].T
    k_pass, k_rot = ckv[..., :kvr], ckv[..., kvr:]
    kv = (rmsnorm(k_pass, p[at + "kv_a_layernorm.weight"], 1e-6) @ p[at + "kv_b_proj.weight"].T)
    kv = kv.view(B, S, nh, dn + dv)
    k_pass, v = kv[..., :dn], kv[..., dn:]
    q_rot = rope(q_rot, cfg["rope_theta"], scaling, inter)
    k_rot = rope(k_rot.view(B, S, 1, dr), cfg["rope_theta"], scaling, inter).expand(B, S, nh, dr)
    qs = torch.cat([q_pass, q_rot], dim=-1)
    ks = torch.cat([k_pass, k_rot], dim=-1)
    scale = (dn + dr) ** -0.5
    if scaling and scaling.get("mscale_all_dim"):
        m = yarn_mscale(scaling["factor"], scaling["mscale_all_dim"])
        scale = scale * m * m
    return attention(qs, ks, v, scale).reshape(B, S, nh * dv)


def attention(q, k, v, scale):
    b, s, hq, d = q.shape
    hkv = k.shape[2]
    k = k.repeat_interleave(hq // hkv, dim=2)
    v = v.repeat_interleave(hq // hkv, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-1, -2)) * scale
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    att = att.masked_fill(mask, float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2)


def swiglu(x, g, u, d):
    return torch.nn.functional.silu(x @ g.T) * (x @ u.T) @ d.T


def route(cfg, t, wg, bias):
    e = wg.shape[0]
    k = cfg["num_experts_per_tok"]
    logits = t @ wg.T
    scores = logits.softmax(-1) if cfg["scoring_func"] == "softmax" else logits.sigmoid()
    choice = scores.detach() + (bias if bias is not None else 0)
    ng, tg = cfg.get("n_group", 1) or 1, cfg.get("topk_group", 1) or 1
    if ng > 1:
        grouped = choice.view(t.shape[0], ng, e // ng)
        if cfg["scoring_func"] == "softmax":
            gscore = grouped.max(-1).values
        else:
            gscore = grouped.topk(2, dim=-1).values.sum(-1)
        keep = gscore.topk(tg, dim=-1).indices
        gmask = torch.zeros_like(gscore).scatter_(1, keep, 1.0)
        emask = gmask.unsqueeze(-1).expand_as(grouped).reshape(t.shape[0], e)
        choice = choice.masked_fill(emask == 0, float("-inf"))
    # Ties go to the lower index: a stable descending sort does that.
    idx = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :k]
    w = scores.gather(1, idx)
    if cfg.get("norm_topk_prob", False):
        w = w / w.sum(-1, keepdim=True)
    w = w * cfg.get("routed_scaling_factor", 1.0)
    return scores, idx, w


# Tokens routed to each expert over the step's micro-batches, per MoE layer:
# the load the aux-free bias update reads.
LOADS = {}


def moe(cfg, p, pre, t):
    e = cfg["n_routed_experts"]
    k = cfg["num_experts_per_tok"]
    T = t.shape[0]
    bias = p.get(pre + "mlp.gate.e_score_correction_bias")
    scores, idx, w = route(cfg, t, p[pre + "mlp.gate.weight"], bias)
    cf = cfg.get("capacity_factor")
    keep = torch.ones_like(w, dtype=torch.bool)
    if cf is not None:
        cap = math.ceil(cf * T * k / e - 1e-9)
        for ex in range(e):
            slots = (idx == ex).nonzero(as_tuple=False)
            if len(slots) > cap:
                ws = w.detach()[slots[:, 0], slots[:, 1]]
                flat = slots[:, 0] * k + slots[:, 1]
                order = sorted(range(len(slots)), key=lambda i: (-float(ws[i]), int(flat[i])))
                for i in order[cap:]:
                    keep[slots[i, 0], slots[i, 1]] = False
    LOADS[pre] = LOADS.get(pre, 0) + torch.bincount(idx[keep].flatten(), minlength=e)
    out = torch.zeros_like(t)
    gelu = cfg.get("hidden_act", "silu") != "silu"
    for ex in range(e):
        rows, cols = ((idx == ex) & keep).nonzero(as_tuple=True)
        if len(rows) == 0:
            continue
        x = t[rows]
        q = pre + f"mlp.experts.{ex}."
        if gelu:
            y = torch.nn.functional.gelu(x @ p[q + "up_proj.weight"].T, approximate="tanh") @ p[q + "down_proj.weight"].T
        else:
            y = swiglu(x, p[q + "gate_proj.weight"], p[q + "up_proj.weight"], p[q + "down_proj.weight"])
        out = out.index_add(0, rows, y * w[rows, cols].unsqueeze(-1))
    if cfg.get("n_shared_experts", 0):
        s = pre + cfg.get("shared_prefix", "mlp.shared_experts.")
        shared = swiglu(t, p[s + "gate_proj.weight"], p[s + "up_proj.weight"],
                        p[s + "down_proj.weight"])
        # Qwen2-MoE (Qwen2MoeSparseMoeBlock): the shared expert's output scaled per token by
        # sigmoid(t W^T), W = mlp.shared_expert_gate.weight [1, H], no bias. An xmoec-type
        # config.json does not say whether the gate exists: the checkpoint's tensor does.
        g = p.get(pre + "mlp.shared_expert_gate.weight")
        if "shared_expert_gate" in cfg:
            assert bool(cfg["shared_expert_gate"]) == (g is not None), (pre, cfg["shared_expert_gate"])
        if g is not None:
            assert g.shape == (1, t.shape[1]), g.shape
            shared = torch.sigmoid(t @ g.T) * shared
        out = out + shared
    aux = torch.zeros(())
    alpha = cfg.get("aux_loss_alpha", 0.0) or 0.0
    if alpha > 0:
        counts = torch.bincount(idx.flatten(), minlength=e).float()
        f = counts * e / (k * T)
        aux = alpha * (f * scores.mean(0)).sum()
    return out, aux


def ffn(cfg, p, pre, h, eps, aux_total):
    """h + FFN(post_attention_layernorm(h)) of layer `pre`, and the aux losses so far."""
    B, S, H = h.shape
    i = int(pre.split(".")[2])
    hn2 = rmsnorm(h, p[pre + "post_attention_layernorm.weight"], eps)
    if i < cfg.get("first_k_dense_replace", 0) or not cfg.get("n_routed_experts"):
        m = swiglu(hn2, p[pre + "mlp.gate_proj.weight"], p[pre + "mlp.up_proj.weight"], p[pre + "mlp.down_proj.weight"])
    else:
        m, aux = moe(cfg, p, pre, hn2.reshape(B * S, H))
        m = m.view(B, S, H)
        aux_total = aux_total + aux
    return h + m, aux_total


def layer(cfg, p, i, x, aux_total):
    """Decoder layer i over x [B,S,H]; returns its output and the aux losses so far."""
    B, S, H = x.shape
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps = cfg["rms_norm_eps"]
    pre = f"model.layers.{i}."
    hn = rmsnorm(x, p[pre + "input_layernorm.weight"], eps)
    at = pre + "self_attn."
    if cfg.get("kv_lora_rank"):
        h = x + mla(cfg, p, at, hn) @ p[pre + "self_attn.o_proj.weight"].T
        return ffn(cfg, p, pre, h, eps, aux_total)
    q, k, v = (hn @ p[at + n + "_proj.weight"].T for n in ("q", "k", "v"))
    if cfg.get("attention_bias"):
        q, k, v = (t + p[at + n + "_proj.bias"] for t, n in zip((q, k, v), "qkv"))
    qk_norm = cfg.get("qk_norm", "none")
    if qk_norm == "full":  # OLMoE: over the whole projection
        q, k = rmsnorm(q, p[at + "q_norm.weight"], eps), rmsnorm(k, p[at + "k_norm.weight"], eps)
    q, k, v = q.view(B, S, nh, hd), k.view(B, S, nkv, hd), v.view(B, S, nkv, hd)
    if qk_norm == "head":  # Qwen3: per head
        q, k = rmsnorm(q, p[at + "q_norm.weight"], eps), rmsnorm(k, p[at + "k_norm.weight"], eps)
    scaling, inter = cfg.get("rope_scaling"), cfg.get("rope_interleave", False)
    q, k = rope(q, cfg["rope_theta"], scaling, inter), rope(k, cfg["rope_theta"], scaling, inter)
    a = attention(q, k, v, 1.0 / math.sqrt(hd)).reshape(B, S, nh * hd)
    h = x + a @ p[pre + "self_attn.o_proj.weight"].T
    return ffn(cfg, p, pre, h, eps, aux_total)


def ce_loss(logits, labels):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def forward(cfg, p, tokens, labels, mtp=(0, 0.0)):
    """(loss, ce, mtp) of one micro-batch; mtp = (D, lambda): DeepSeek-V3's multi-token
    prediction, module k predicting token i+k+1 at position i from
    eh_proj([enorm(emb(t_{i+k})), hnorm(h_{k-1}[i])]) through decoder layer L+k-1, then
    shared_head.norm and the main head; loss += lambda/D * sum_k CE_k. The third
    value is the modules' mean cross-entropy (None without them)."""
    eps = cfg["rms_norm_eps"]
    L = cfg["num_hidden_layers"]
    emb = p["model.embed_tokens.weight"][tokens]
    x = emb
    aux_total = torch.zeros(())
    for i in range(L):
        x, aux_total = layer(cfg, p, i, x, aux_total)
    xn = rmsnorm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    ce = ce_loss(xn @ head.T, labels)
    loss, mean = ce, None
    D, lam = mtp
    if D > 0:
        S = tokens.shape[1]
        h, total = xn, 0.0
        for k in range(1, D + 1):
            pre = f"model.layers.{L + k - 1}."
            e = rmsnorm(emb[:, k:], p[pre + "enorm.weight"], eps)
            hp = rmsnorm(h[:, :S - k], p[pre + "hnorm.weight"], eps)
            y = torch.cat([e, hp], -1) @ p[pre + "eh_proj.weight"].T
            y, aux_total = layer(cfg, p, L + k - 1, y, aux_total)
            h = rmsnorm(y, p[pre + "shared_head.norm.weight"], eps)
            total = total + ce_loss(h @ head.T, labels[:, k:])
        mean = total / D
        loss = loss + mean * lam
    return loss + aux_total, ce, mean


def batches(tokens, windows, seq, micro):
    for i in range(0, len(windows), micro):
        ws = windows[i:i + micro]
        t = torch.stack([torch.from_numpy(tokens[j * seq: j * seq + seq].copy()) for j in ws])
        l = torch.stack([torch.from_numpy(tokens[j * seq + 1: j * seq + seq + 1].copy()) for j in ws])
        yield t.long(), l.long()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["loss", "step"])
    ap.add_argument("ckpt")
    ap.add_argument("data")
    ap.add_argument("--windows", required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--micro", type=int, required=True)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--out")
    ap.add_argument("--grads", help="step mode: also write the gradients here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg, params = read_checkpoint(a.ckpt)
    cfg = model_config(cfg)
    # The MTP modules and their loss weight come from the spec the program
    # was compiled from (a training setting, not in config.json).
    spec = json.load(open(os.path.join(a.ckpt, "spec.json")))
    mtp = (spec["model"].get("mtp_layers", 0), spec.get("training", {}).get("mtp_loss_weight", 0.3))
    tokens = read_tokens(a.data)
    windows = [int(w) for w in a.windows.split(",")]
    trainable = {n: t.clone().requires_grad_(not n.endswith("e_score_correction_bias")) for n, t in params.items()}
    micro_batches = list(batches(tokens, windows, a.seq, a.micro))
    total_loss, total_ce, total_mtp = 0.0, 0.0, 0.0
    for t, l in micro_batches:
        loss, ce, mean = forward(cfg, trainable, t, l, mtp)
        total_mtp += float(mean) / len(micro_batches) if mean is not None else 0.0
        if a.mode == "step":
            (loss / len(micro_batches)).backward()
        total_loss += float(loss) / len(micro_batches)
        total_ce += float(ce) / len(micro_batches)
    if a.mode == "loss":
        print(json.dumps({"loss": total_loss, "ce": total_ce, "mtp": total_mtp if mtp[0] else None}))
        return 0
    st = json.load(open(os.path.join(a.ckpt, "trainer_state.json")))
    s = st.get("settings", st)
    plist = [p for p in trainable.values() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(plist, s["grad_clip"]) if s["grad_clip"] > 0 else None
    decay = [p for p in plist if p.dim() >= 2]
    nodecay = [p for p in plist if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s["weight_decay"]},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(s["beta1"], s["beta2"]), eps=s["adam_eps"])
    if a.grads:
        write_safetensors(a.grads, {n: p.grad for n, p in trainable.items() if p.requires_grad})
    opt.step()
    # Aux-free balancing (DeepSeek-V3): b += gamma * sign(mean(load) - load), the
    # step's token counts per expert, outside the optimizer.
    gamma = cfg.get("aux_free_bias_update_speed", 0.0) or 0.0
    with torch.no_grad():
        for pre, load in LOADS.items():
            name = pre + "mlp.gate.e_score_correction_bias"
            if gamma > 0 and name in trainable:
                d = load.double().mean() - load.double()
                trainable[name] += (gamma * torch.sign(d)).float()
    write_safetensors(a.out, trainable)
    print(json.dumps({"loss": total_loss, "ce": total_ce, "mtp": total_mtp if mtp[0] else None,
                      "grad_norm": float(norm) if norm is not None else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
