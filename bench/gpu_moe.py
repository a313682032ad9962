#!/usr/bin/env python3
"""bench/gpu_moe.py - the PyTorch baseline of bench/gpu_moe.cu on the same shapes.

    python3 bench/gpu_moe.py OUT.json [BUDGET_S]

H = 7168, F = 2048, k = 8, E in {8, 16, 32}, T in {4096, 16384, 32768},
routing uniform or zipf1.2 (k distinct experts per token drawn without
replacement with popularity 1/(e+1)^1.2; E = 8 = k is uniform only), bf16.

  eager       a dropless MoE layer as users write it: sort the slots by expert,
              then per expert index_select its tokens, x @ W1[e]^T (W1 [E, 2F, H],
              gate and up stacked), silu(gate) * up, @ W2[e]^T, index_add_ back
              scaled by the routing weights; forward, and forward + backward
              (out.backward(dout), gradients of x, W1, W2 and the routing weights).
  grouped_mm  torch._grouped_mm (when this build has it) for the forward grouped
              GEMMs on expert-sorted rows: up (K = H, M = F, one of gate/up) and
              down (K = F, M = H), as gpu_moe.cu's "up" and "down".

Times: median ms of >= 10 torch.cuda.Event-timed runs after warm-up; TFLOP/s
with 2*rows*K*M per GEMM, 18*T*k*H*F for the layer forward + backward.
Time budget: argv[2] or XM_TORCH_BUDGET_S (default 150 s); a configuration
whose predicted time would overrun it is skipped and listed. Exit 3: no CUDA.
Only torch is needed.
"""
import datetime
import json
import os
import sys
import time

H, F, TOPK = 7168, 2048, 8
TS, ES = (4096, 16384, 32768), (8, 16, 32)
WARM = 2


def main():
    if len(sys.argv) not in (2, 3):
        print("usage: gpu_moe.py OUT.json [BUDGET_S]", file=sys.stderr)
        return 2
    out_path = sys.argv[1]
    budget = float(sys.argv[2]) if len(sys.argv) == 3 else float(
        os.environ.get("XM_TORCH_BUDGET_S", "150"))
    iters = max(10, int(os.environ.get("XM_BENCH_ITERS", "10")))
    try:
        import torch
        import torch.nn.functional as Fn
    except ImportError as e:
        print("gpu_moe.py: PyTorch is not installed (%s); nothing measured" % e, file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("gpu_moe.py: no CUDA device visible to torch %s; nothing measured"
              % torch.__version__, file=sys.stderr)
        return 3
    start = time.time()
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(0)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print("device: %s, torch %s, run at %s" % (name, torch.__version__, stamp))
    print("H=%d F=%d k=%d bf16; median of %d runs after %d warm-up; budget %.0f s"
          % (H, F, TOPK, iters, WARM, budget))
    has_gmm = hasattr(torch, "_grouped_mm")

    def time_ms(fn):
        for _ in range(WARM):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(iters):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        ts.sort()
        n = len(ts)
        return ts[n // 2] if n % 2 else 0.5 * (ts[n // 2 - 1] + ts[n // 2])

    def tflops(flops, ms):
        return flops / (ms * 1e-3) / 1e12 if ms and ms > 0 else 0.0

    def routing(T, E, skewed, gen):
        pop = torch.ones(E, device=dev)
        if skewed:
            pop = 1.0 / torch.arange(1, E + 1, device=dev, dtype=torch.float32) ** 1.2
        experts = torch.multinomial(pop.expand(T, E), TOPK, replacement=False, generator=gen)
        w = torch.rand(T, TOPK, device=dev, generator=gen) + 0.05
        return experts, w / w.sum(-1, keepdim=True)

    def moe_eager(x, experts, weights, w1, w2):
        """Dropless MoE, a loop over the experts."""
        E = w1.shape[0]
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E).tolist()  # host sync, as users do
        tok = order // TOPK
        wts = weights.reshape(-1)[order]
        out = torch.zeros_like(x)
        r0 = 0
        for e in range(E):
            n = counts[e]
            if n == 0:
                continue
            idx = tok[r0:r0 + n]
            xe = x.index_select(0, idx)
            gate, up = (xe @ w1[e].t()).chunk(2, dim=-1)
            y = (Fn.silu(gate) * up) @ w2[e].t()
            out.index_add_(0, idx, y * wts[r0:r0 + n, None].to(y.dtype))
            r0 += n
        return out

    results, skipped = [], []
    header = "%-6s %-3s %-8s | %-22s | %-26s | %-26s" % (
        "T", "E", "routing", "eager fwd / f+b ms", "f+b TF/s", "grouped_mm up/down ms TF/s")
    print("\n" + header)
    last_wall = last_flops = 0.0
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    for T in TS:
        for E in ES:
            for skewed in (False, True):
                if skewed and E == TOPK:
                    continue
                rname = "zipf1.2" if skewed else "uniform"
                label = "T=%d E=%d %s" % (T, E, rname)
                flops = 18.0 * T * TOPK * H * F
                pred = last_wall * flops / last_flops if last_flops else 0.0
                if time.time() - start + pred > budget:
                    print("%-40s skipped: time budget (%.0f s) would run out (predicted %.1f s)"
                          % (label, budget, pred))
                    skipped.append(label)
                    continue
                t0 = time.time()
                r = {"T": T, "E": E, "k": TOPK, "routing": rname, "rows": T * TOPK}
                experts, weights = routing(T, E, skewed, gen)
                counts = torch.bincount(experts.reshape(-1), minlength=E)
                r["tpe_min"], r["tpe_max"] = int(counts.min()), int(counts.max())
                bf = torch.bfloat16
                x = torch.randn(T, H, device=dev, dtype=bf, requires_grad=True)
                w1 = (0.02 * torch.randn(E, 2 * F, H, device=dev, dtype=bf)).requires_grad_()
                w2 = (0.02 * torch.randn(E, H, F, device=dev, dtype=bf)).requires_grad_()
                rw = weights.clone().requires_grad_()
                dout = torch.randn(T, H, device=dev, dtype=bf)
                with torch.no_grad():
                    fwd = time_ms(lambda: moe_eager(x, experts, rw, w1, w2))

                def step():
                    x.grad = w1.grad = w2.grad = rw.grad = None
                    moe_eager(x, experts, rw, w1, w2).backward(dout)
                fb = time_ms(step)
                r["eager"] = {"fwd_ms": fwd, "fwd_bwd_ms": fb, "flops": flops,
                              "tflops": tflops(flops, fb)}
                x.grad = w1.grad = w2.grad = rw.grad = None

                gm = None
                if has_gmm:
                    gm = {}
                    try:
                        with torch.no_grad():
                            offs = torch.cumsum(counts, 0).to(torch.int32)
                            n = T * TOPK
                            xs = torch.randn(n, H, device=dev, dtype=bf)
                            wu = w1.detach()[:, :F, :].contiguous()      # [E, F, H]
                            hs = torch.randn(n, F, device=dev, dtype=bf)
                            wd = w2.detach()                              # [E, H, F]
                            up = lambda: torch._grouped_mm(xs, wu.transpose(-2, -1), offs=offs)
                            dn = lambda: torch._grouped_mm(hs, wd.transpose(-2, -1), offs=offs)
                            f1 = 2.0 * n * H * F
                            gm["up_ms"] = time_ms(up)
                            gm["up_tflops"] = tflops(f1, gm["up_ms"])
                            gm["down_ms"] = time_ms(dn)
                            gm["down_tflops"] = tflops(f1, gm["down_ms"])
                            del xs, hs, wu
                    except Exception as e:  # unsupported shapes/arch in this build
                        gm = {"error": ("%s: %s" % (type(e).__name__, e))[:300]}
                r["grouped_mm"] = gm
                del x, w1, w2, rw, dout
                torch.cuda.empty_cache()
                r["wall_s"] = time.time() - t0
                last_wall, last_flops = r["wall_s"], flops
                results.append(r)
                if gm and "up_ms" in gm:
                    gs = "%7.3f/%7.3f %4.0f/%4.0f" % (gm["up_ms"], gm["down_ms"],
                                                     gm["up_tflops"], gm["down_tflops"])
                else:
                    gs = "n/a" if gm is None else "error (see JSON)"
                print("%-6d %-3d %-8s | %9.3f / %9.3f | %26.0f | %s"
                      % (T, E, rname, fwd, fb, r["eager"]["tflops"], gs))
                sys.stdout.flush()
    if not has_gmm:
        print("torch._grouped_mm: not in this torch build")
    if skipped:
        print("%d configuration(s) skipped for the time budget" % len(skipped))
    doc = {"bench": "gpu_moe_torch", "device": name, "torch": torch.__version__,
           "cuda": torch.version.cuda, "run_utc": stamp, "H": H, "F": F, "k": TOPK,
           "iters": iters, "warmup": WARM, "budget_s": budget, "wall_s": time.time() - start,
           "has_grouped_mm": has_gmm,
           "notes": "eager fwd_ms under torch.no_grad; eager = loop over experts (index_select, x@W1^T with W1=[gate;up], "
                    "silu(gate)*up, @W2^T, index_add with routing weights), bf16; "
                    "fwd_bwd flops = 18*T*k*H*F; grouped_mm = torch._grouped_mm forward only, "
                    "up K=H M=F, down K=F M=H, bf16 out",
           "configs": results, "skipped": skipped}
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
    print("wrote %s" % out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
