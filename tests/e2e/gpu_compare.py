#!/usr/bin/env python3
"""tests/e2e/gpu_compare.py — compares two dumps of tests/e2e/gpu_step_main.c
(a reference, the CPU program, and a candidate, the GPU program) and bounds
the differences.

usage: gpu_compare.py REF.bin CAND.bin TOL_LOSS TOL_GRAD [BASELINE.bin] [--verbose]

The loss and the cross-entropy must agree to TOL_LOSS (relative), and so
must the gradient norm to TOL_GRAD. Each gradient tensor is compared by its
relative L2 error ||cand - ref|| / ||ref|| (the largest absolute
difference is printed too), bounded by TOL_GRAD. With a BASELINE (the fp32
CPU program of the same model, when REF and CAND are bf16 programs) a
tensor's bound is also at least 1.5 times bf16's own error on it, the
relative L2 distance between REF and BASELINE: the GPU program may differ
from the CPU one by about as much as bf16 rounding differs from fp32, not
more. The parameters after the optimizer step are printed (their largest
difference) but not bounded: the first AdamW step moves every weight by
about lr * sign(g), so a gradient entry near zero whose sign differs flips
that weight by 2 lr whatever the precision.
"""
import array
import math
import sys


def load(path):
    data = array.array("f")
    with open(path, "rb") as f:
        data.frombytes(f.read())
    if sys.byteorder != "little":
        data.byteswap()
    entries = []
    with open(path + ".idx") as f:
        for line in f:
            kind, name, n = line.split()
            entries.append((kind, name, int(n)))
    return data, entries


def rel_l2(a, b):
    num = math.sqrt(sum((x - y) * (x - y) for x, y in zip(a, b)))
    den = math.sqrt(sum(y * y for y in b))
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def sections(data, entries):
    """{(kind, name): values}, the two losses and the gradient norm."""
    out, off = {}, 2
    ngrads = sum(1 for e in entries if e[0] == "grad")
    norm = None
    for j, (kind, name, n) in enumerate(entries):
        if j == ngrads:
            norm = data[off]
            off += 1
        out[(kind, name)] = data[off:off + n]
        off += n
    return data[0], data[1], norm, out


def main():
    args = [a for a in sys.argv[1:] if a != "--verbose"]
    verbose = "--verbose" in sys.argv
    ref_path, cand_path = args[0], args[1]
    tol_loss, tol_grad = float(args[2]), float(args[3])
    ref, entries = load(ref_path)
    cand, entries2 = load(cand_path)
    if entries != entries2 or len(ref) != len(cand):
        print("FAIL the two programs have different tensor tables")
        return 1
    base = None
    if len(args) > 4:
        bdata, bentries = load(args[4])
        if bentries != entries:
            print("FAIL the baseline has a different tensor table")
            return 1
        base = sections(bdata, bentries)[3]
    r_loss, r_ce, r_norm, r = sections(ref, entries)
    c_loss, c_ce, c_norm, c = sections(cand, entries)
    failures = 0
    for what, a, b, tol in (("loss", r_loss, c_loss, tol_loss), ("ce_loss", r_ce, c_ce, tol_loss),
                            ("grad_norm", r_norm, c_norm, tol_grad)):
        rel = abs(b - a) / max(abs(a), 1e-30)
        ok = rel <= tol and math.isfinite(b)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what:12s} ref {a:.7f} got {b:.7f} rel {rel:.2e} (bound {tol:g})")
    worst, worst_name, worst_param = 0.0, "", 0.0
    for kind, name, n in entries:
        rv, cv = r[(kind, name)], c[(kind, name)]
        diff = max((abs(x - y) for x, y in zip(cv, rv)), default=0.0)
        finite = all(math.isfinite(v) for v in cv)
        if kind == "param":
            worst_param = max(worst_param, diff)
            failures += not finite
            continue
        err = rel_l2(cv, rv)
        bound = tol_grad
        if base is not None:
            bound = max(bound, 1.5 * rel_l2(rv, base[(kind, name)]))
        ok = finite and err <= bound
        failures += not ok
        if err / bound > worst:
            worst, worst_name = err / bound, name
        if not ok or verbose:
            print(f"{'ok  ' if ok else 'FAIL'} {name:50s} rel L2 {err:.2e} (bound {bound:.2e}) max|diff| {diff:.2e}")
    print(f"{'FAIL' if failures else 'ok'}: gradients at worst {worst:.2f} of their bound ({worst_name}); "
          f"parameters after the step differ by at most {worst_param:.2e}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
