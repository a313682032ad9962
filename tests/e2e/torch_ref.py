"""tests/e2e/torch_ref.py — an independent PyTorch implementation of the
xmoec model family (docs/design.md, Model semantics), used to check what out/train
computes: the forward loss of a checkpoint and one full AdamW step.

It reads only public formats: a checkpoint directory's config.json (DeepSeek-V3
field names) and model.safetensors (Hugging Face tensor names), and the
training windows of a data file. Nothing here imports xmoec code.

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


def rope(x, theta):
    b, s, h, d = x.shape
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.outer(torch.arange(s, dtype=torch.float64), inv)
    ang = torch.cat([ang, ang], dim=-1)
    cos = ang.cos().float()[None, :, None, :]
    sin = ang.sin().float()[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


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
        s = pre + "mlp.shared_experts."
        out = out + swiglu(t, p[s + "gate_proj.weight"], p[s + "up_proj.weight"], p[s + "down_proj.weight"])
    aux = torch.zeros(())
    alpha = cfg.get("aux_loss_alpha", 0.0) or 0.0
    if alpha > 0:
        counts = torch.bincount(idx.flatten(), minlength=e).float()
        f = counts * e / (k * T)
        aux = alpha * (f * scores.mean(0)).sum()
    return out, aux


def forward(cfg, p, tokens, labels):
    B, S = tokens.shape
    H = cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps = cfg["rms_norm_eps"]
    x = p["model.embed_tokens.weight"][tokens]
    aux_total = torch.zeros(())
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        hn = rmsnorm(x, p[pre + "input_layernorm.weight"], eps)
        at = pre + "self_attn."
        q, k, v = (hn @ p[at + n + "_proj.weight"].T for n in ("q", "k", "v"))
        if cfg.get("attention_bias"):
            q, k, v = (t + p[at + n + "_proj.bias"] for t, n in zip((q, k, v), "qkv"))
        qk_norm = cfg.get("qk_norm", "none")
        if qk_norm == "full":  # OLMoE: over the whole projection
            q, k = rmsnorm(q, p[at + "q_norm.weight"], eps), rmsnorm(k, p[at + "k_norm.weight"], eps)
        q, k, v = q.view(B, S, nh, hd), k.view(B, S, nkv, hd), v.view(B, S, nkv, hd)
        if qk_norm == "head":  # Qwen3: per head
            q, k = rmsnorm(q, p[at + "q_norm.weight"], eps), rmsnorm(k, p[at + "k_norm.weight"], eps)
        q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        a = attention(q, k, v, 1.0 / math.sqrt(hd)).reshape(B, S, nh * hd)
        h = x + a @ p[pre + "self_attn.o_proj.weight"].T
        hn2 = rmsnorm(h, p[pre + "post_attention_layernorm.weight"], eps)
        if i < cfg.get("first_k_dense_replace", 0) or not cfg.get("n_routed_experts"):
            m = swiglu(hn2, p[pre + "mlp.gate_proj.weight"], p[pre + "mlp.up_proj.weight"], p[pre + "mlp.down_proj.weight"])
        else:
            m, aux = moe(cfg, p, pre, hn2.reshape(B * S, H))
            m = m.view(B, S, H)
            aux_total = aux_total + aux
        x = h + m
    xn = rmsnorm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    logits = xn @ head.T
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    return ce + aux_total, ce


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
    tokens = read_tokens(a.data)
    windows = [int(w) for w in a.windows.split(",")]
    trainable = {n: t.clone().requires_grad_(not n.endswith("e_score_correction_bias")) for n, t in params.items()}
    micro_batches = list(batches(tokens, windows, a.seq, a.micro))
    total_loss, total_ce = 0.0, 0.0
    for t, l in micro_batches:
        loss, ce = forward(cfg, trainable, t, l)
        if a.mode == "step":
            (loss / len(micro_batches)).backward()
        total_loss += float(loss) / len(micro_batches)
        total_ce += float(ce) / len(micro_batches)
    if a.mode == "loss":
        print(json.dumps({"loss": total_loss, "ce": total_ce}))
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
    write_safetensors(a.out, trainable)
    print(json.dumps({"loss": total_loss, "ce": total_ce,
                      "grad_norm": float(norm) if norm is not None else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
