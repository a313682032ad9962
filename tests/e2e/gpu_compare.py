#!/usr/bin/env python3
"""tests/e2e/gpu_compare.py — compares two dumps of tests/e2e/gpu_step_main.c
(a reference, the CPU program, and a candidate, the GPU program) and bounds
the differences.

usage: gpu_compare.py REF.bin CAND.bin TOL_LOSS TOL_GRAD TOL_PARAM

Per tensor it prints the largest absolute difference and that difference
relative to the tensor's largest |reference| value (the scale of a gradient
varies by orders of magnitude between tensors, and single entries near zero
make an element-wise relative error meaningless). Fails (exit 1) when the
relative loss difference exceeds TOL_LOSS, a gradient tensor's (or the
gradient norm's) relative difference TOL_GRAD, or a parameter tensor's after
the optimizer step TOL_PARAM (relative to its largest |value|).
"""
import sys

import numpy as np


def load(path):
    data = np.fromfile(path, dtype="<f4")
    entries = []
    with open(path + ".idx") as f:
        for line in f:
            kind, name, n = line.split()
            entries.append((kind, name, int(n)))
    return data, entries


def main():
    ref_path, cand_path = sys.argv[1], sys.argv[2]
    tol_loss, tol_grad, tol_param = (float(v) for v in sys.argv[3:6])
    ref, entries = load(ref_path)
    cand, entries2 = load(cand_path)
    if entries != entries2 or ref.size != cand.size:
        print("FAIL the two programs have different tensor tables")
        return 1
    failures = 0
    worst = {"grad": 0.0, "param": 0.0}
    for i, what in enumerate(("loss", "ce_loss")):
        rel = abs(float(cand[i]) - float(ref[i])) / max(abs(float(ref[i])), 1e-30)
        ok = rel <= tol_loss and np.isfinite(cand[i])
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what:40s} ref {ref[i]:.7f} got {cand[i]:.7f} rel {rel:.2e}")
    off = 2
    ngrads = sum(1 for e in entries if e[0] == "grad")
    for j, (kind, name, n) in enumerate(entries):
        if kind == "param" and j == ngrads:
            rel = abs(float(cand[off]) - float(ref[off])) / max(abs(float(ref[off])), 1e-30)
            ok = rel <= tol_grad
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {'grad_norm':40s} ref {ref[off]:.6g} got {cand[off]:.6g} rel {rel:.2e}")
            off += 1
        r, c = ref[off:off + n], cand[off:off + n]
        off += n
        scale = float(np.max(np.abs(r))) if n else 0.0
        diff = float(np.max(np.abs(c - r))) if n else 0.0
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))
        tol = tol_grad if kind == "grad" else tol_param
        ok = rel <= tol and bool(np.all(np.isfinite(c)))
        worst[kind] = max(worst[kind], rel)
        failures += not ok
        if not ok or "--verbose" in sys.argv:
            print(f"{'ok  ' if ok else 'FAIL'} {kind} {name:35s} max|diff| {diff:.3e} rel {rel:.2e}")
    if ngrads == len(entries):  # no params: the norm comes last
        off += 0
    print(f"{'FAIL' if failures else 'ok'}: worst gradient {worst['grad']:.2e} (bound {tol_grad:g}), "
          f"worst parameter after the step {worst['param']:.2e} (bound {tol_param:g})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
