/* tests/backend/conformance.h — the backend conformance suite: every kernel
 * of runtime/abi/kernels.def, and the memory, copy, fill, read, stream and
 * event calls of runtime/abi/backend.h, run through one backend's table and
 * compared with the naive reference of tests/backend/reference.c (after
 * ggml's test-backend-ops and IREE's HAL CTS: one suite, instantiated once
 * per backend).
 *
 * A new backend instantiates it with one file, tests/backend/test_<name>_backend.c,
 * modelled on test_cpu_backend.c: main() gets the backend's table (for
 * example xm_rt_hip_backend()) and returns xm_conformance_run(be, argv[1]
 * or NULL, stdout) != 0; tests/CMakeLists.txt declares it as the ctest
 * `backend_<name>`, built from that file, conformance.c and reference.c and
 * linked with the backend's library (the block of backend_cpu). The suite
 * calls be->init(be, 0, 1, ...) itself, once, before anything else, so the
 * file must not. Nothing in the suite assumes host-visible memory: inputs
 * go in with copy_h2d, results come back with copy_d2h after sync (or with
 * read), and kernels only see pointers that alloc returned, or offsets
 * into them.
 *
 * What it runs: for each kernel a handful of cases with randomised inputs
 * from a fixed seed per entry (the same numbers on every run and backend,
 * whether an entry runs alone or in the whole suite), including the edges
 * the generated code produces: experts with no rows or one row, capacity
 * dropping with tied weights, n == 0 routed rows, k == 1, GQA and MQA with
 * Dv != D, S == 1, ties in top-k, group-limited top-k under both scorings,
 * RoPE on part of a head (MLA's rotary dims at an offset) or none (rd 0), with
 * interleaved pairs and with YaRN's frequencies and attention factor,
 * concat and split with b per head and broadcast over the heads, the
 * accumulating variants (*_acc, beta = 1) onto non-zero buffers, and
 * for the fused kernels tile_rows 1, 4, 5, 7, 64 and slots 1, 2, 3 with
 * runs that are no multiple of the tile. Shapes are small, plus one per
 * family above the CPU kernels' thresholds for OpenMP teams, so their
 * threaded paths go through the seam too. Outputs a kernel must overwrite
 * are handed over full of NaNs (the memory planner gives kernels dirty
 * buffers); routed inputs are NaN past row n, and routed outputs past row
 * n, like the words after an elementwise output, must keep their NaNs
 * (only n rows are read or written). The fused kernels' scratch
 * (tile_rows * slots * W floats), the bf16 GEMMs' workspace
 * (xm_bf16_gemm_ws_floats of runtime/abi/bf16.h, rows the routed bound)
 * and the workspaces of rope, rope_grad, attention, attention_grad and
 * rmsnorm_grad (xm_ws_* of runtime/abi/workspace.h) are exactly the
 * documented size, NaN, and followed by a guard that must survive: for
 * the per-thread ones one thread's slice more than the scratch, so a
 * kernel that uses one thread too many (attention with a single slot,
 * above the CPU's threshold for a team) writes into the guard, not past
 * the buffer.
 *
 * Tolerances (|got - want| <= atol + rtol |want|, inputs of order 1, the
 * reference in double): integer outputs (permute, topk_route's experts,
 * accumulate_i32), data movement (copy, fill, gather_rows, embedding,
 * sort_chunks, concat, split's parts per head, the memory calls) and both
 * bf16 casts are exact (the cast to bf16 bit for bit, ties to even; any
 * quiet NaN for a NaN); one rounding per element (add, mul, mul_rows,
 * scale, accumulate, the combine's dy) 1e-6 relative; transcendental elementwise
 * kernels, rope and the router scores 1e-5 relative + 1e-6; sums of a few
 * terms (gather_rows_grad, embedding_grad, scatter_combine, top-k weights,
 * aux_loss_grad, split's broadcast part, summed over the heads) 1e-6 +
 * 1e-6; cross_entropy_grad (values of order 1/rows) 1e-5 + 1e-7; sums of up
 * to 64 products (GEMMs, norms, attention, the losses, the fused kernels)
 * 1e-5 + 1e-5, both scaled by sqrt(terms / 64) for longer sums (weight
 * gradients over many rows, reduce_to, reduce_rows); gradients that
 * subtract such sums (attention_grad,
 * rmsnorm_grad's dx, router_score_grad, topk_route_grad) 1e-4 + 1e-5;
 * adamw 2e-6 relative (plus an ulp of the terms that make m and v);
 * sum_sq_acc, in double, 1e-10 relative; bf16 GEMM
 * outputs one bf16 ulp (2^-7 relative + 1e-5), their f32 dw 1e-5 + 1e-5.
 * On the CPU backend the worst error seen is about a quarter of its
 * tolerance. The GEMM tolerances mean fp32 accumulation: a backend that
 * runs f32 GEMMs in TF32 or bf16 fails here by design. A value that is
 * zero by structure (a dropped slot's combine-weight gradient, a token
 * with no kept slot, an empty expert under beta 0, a top-k score gradient
 * of an expert not picked, an unused embedding row) must be exactly 0, and
 * what must be left alone (an empty expert under beta 1, a bias at sign 0)
 * bit for bit unchanged.
 *
 * Each entry prints one line to `log`: "ok matmul 7 cases (max error: abs
 * 2.38e-06, rel 1.22e-04, 0.08 of the tolerance)" for a kernel (its
 * largest absolute error over every float compared, the largest relative
 * one among elements with |want| >= 1e-6, and the largest as a share of
 * that element's tolerance), or "FAIL
 * matmul 1/7 cases: case 3 (M=7 K=16 N=9): y first mismatch at index 4:
 * got 1.25 want 1.5 (tol 1e-05 + 1e-05|want|)". The entries are "memory"
 * (alloc zeroed and aligned, alloc(0), free(NULL), allocated_bytes where
 * the backend keeps it, fill32 with 0 and with a float's bits, copies at
 * odd offsets, d2d, read and its `reads` count), "streams" (two streams
 * ordered by an event, create and destroy), one per kernel under its
 * kernels.def name, and "coverage", which fails when a line of kernels.def
 * has no entry here (a kernel added to the table without a conformance
 * case fails the suite); a NULL pointer in the backend's table fails that
 * kernel's entry.
 */
#ifndef XM_TESTS_BACKEND_CONFORMANCE_H
#define XM_TESTS_BACKEND_CONFORMANCE_H

#include <stdio.h>

#include "runtime/abi/backend.h"

/* Runs the suite on `be`: every entry when `only` is NULL, else the entries
 * named in `only` (comma-separated, e.g. "matmul,permute"; a name that is
 * no entry is a failure). Writes one line per entry to `log` and returns
 * the number of failed entries (0: the backend conforms). */
int xm_conformance_run(xm_rt_backend_t *be, const char *only, FILE *log);

#endif /* XM_TESTS_BACKEND_CONFORMANCE_H */
