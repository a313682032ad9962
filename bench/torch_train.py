"""bench/torch_train.py — the PyTorch baseline of bench/train.sh.

Trains the same model as a compiled xmoec program, from the same initial
checkpoint (config.json + model.safetensors, read by tests/e2e/torch_ref.py),
on the same data windows, with the same micro-batch, gradient accumulation,
AdamW settings and thread count, in fp32. Experts run as a dropless loop over
experts (index the rows routed to each expert, run its MLP, index_add the
weighted result back), which is how DeepSpeed-MoE's and X-MoE's reference
MoE layers compute when capacity is unlimited. Prints one JSON line:
{"tokens_per_s": ..., "step_s": ..., "final_loss": ...}.

Usage: torch_train.py CKPT DATA --steps N --micro B --accum G --seq S --threads T
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
import torch_ref as R  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--micro", type=int, required=True)
    ap.add_argument("--accum", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg, params = R.read_checkpoint(a.ckpt)
    st = json.load(open(os.path.join(a.ckpt, "trainer_state.json")))["settings"]
    tokens = R.read_tokens(a.data)
    p = {n: t.clone().requires_grad_(not n.endswith("e_score_correction_bias")) for n, t in params.items()}
    plist = [t for t in p.values() if t.requires_grad]
    opt = torch.optim.AdamW([{"params": [t for t in plist if t.dim() >= 2], "weight_decay": st["weight_decay"]},
                             {"params": [t for t in plist if t.dim() < 2], "weight_decay": 0.0}],
                            lr=st["lr"], betas=(st["beta1"], st["beta2"]), eps=st["adam_eps"])
    per_step = a.micro * a.accum
    nwin = (len(tokens) - 1) // a.seq
    pos, t0, loss_v = 0, None, 0.0
    for s in range(a.warm + a.steps):
        if s == a.warm:
            t0 = time.perf_counter()
        windows = [(pos + i) % nwin for i in range(per_step)]
        pos += per_step
        opt.zero_grad(set_to_none=True)
        loss_v = 0.0
        for tk, lb in R.batches(tokens, windows, a.seq, a.micro):
            loss = R.forward(cfg, p, tk, lb)[0]
            (loss / a.accum).backward()
            loss_v += float(loss) / a.accum
        if st["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(plist, st["grad_clip"])
        opt.step()
    dt = time.perf_counter() - t0
    print(json.dumps({"tokens_per_s": a.steps * per_step * a.seq / dt, "step_s": dt / a.steps,
                      "final_loss": loss_v, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
