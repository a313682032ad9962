/* passes/plan_memory.h — the memory plan that the "plan-memory" pass records
 * in a module, and the readers of it (codegen, `xmoec compile`'s report).
 *
 * The plan lives in the IR itself so it prints, parses back and travels
 * through MLIR with the module; nothing else has to be kept in sync:
 *
 *   op attr "mem" = [arena, offset, bytes] per result, flattened, on every
 *       op with results.
 *       A weight gradient that fold-accumulate marked (attr accumulate:
 *       the GEMM adds into its grad state) is never written and gets 0
 *       bytes.
 *   op attr "ws" = [offset, bytes] in the activation arena, on an op whose
 *       attr "workspace" (bytes, set by the pass that chose the kernel)
 *       asks for scratch: a buffer live during that op only, so kernels
 *       never allocate. arena 0 is the persistent arena (params, states),
 *       arena 1 the activation arena (everything else). offset is a byte
 *       offset into that arena, aligned to the pass's alignment; bytes is
 *       the result's size at the upper bound of its dynamic dims, rounded
 *       up to the alignment. A reshape result has its operand's offset.
 *   module attrs (ints, bytes):
 *       mem_persistent_bytes, mem_activation_bytes  arena sizes;
 *       mem_weights, mem_grads, mem_optimizer       the persistent arena by
 *           category (params; states of kind grad; every other state);
 *       mem_activations  forward-phase buffers live at the activation peak
 *           (the inputs included);
 *       mem_inputs       the part of mem_activations held by the inputs;
 *       mem_workspace    the rest of the activation arena: backward- and
 *           step-phase buffers live at the peak plus the arena's
 *           fragmentation, so that weights + grads + optimizer +
 *           activations + workspace is exactly the memory a rank holds.
 */
#ifndef XM_PASSES_PLAN_MEMORY_H
#define XM_PASSES_PLAN_MEMORY_H

#include <stdbool.h>
#include <stdint.h>

#include "ir/ir.h"
#include "support/diag.h"
#include "support/status.h"
#include "support/strbuf.h"

enum { XM_MEM_ARENA_PERSISTENT = 0, XM_MEM_ARENA_ACTIVATION = 1 };

/* Where one op result lives. */
typedef struct {
  int arena;      /* XM_MEM_ARENA_* */
  int64_t offset; /* bytes into the arena */
  int64_t bytes;  /* reserved extent (aligned) */
} xm_mem_place_t;

/* The module-level summary of a plan. */
typedef struct {
  int64_t persistent_bytes;
  int64_t activation_bytes;
  int64_t weights;
  int64_t grads;
  int64_t optimizer;
  int64_t activations;
  int64_t workspace;
  int64_t inputs;
} xm_mem_report_t;

#define XM_PLAN_MEMORY_DEFAULT_ALIGNMENT 64

/* Plans `m` in place (what the pass does): `alignment` must be a power of
 * two in [1, 1 << 20]. Problems (a value too large, an operand that no
 * earlier op defines, a micro-batch op that reads a step value, an unknown
 * phase) go to `diag` with the op's place; XM_ERR_INVALID_INPUT then, and
 * the module is left unchanged. */
xm_status_t xm_plan_memory(xm_ir_module_t *m, int64_t alignment, xm_diag_t *diag);

/* Reads result `result` of `op` from its "mem" attr; false when the op has
 * no plan (or a malformed one) or `result` is out of range. */
bool xm_plan_memory_place(const xm_ir_op_t *op, int result, xm_mem_place_t *out_place);

/* Reads an op's workspace from its "ws" attr; false when it has none. */
bool xm_plan_memory_workspace(const xm_ir_op_t *op, xm_mem_place_t *out_place);

/* Reads the module attrs back. XM_ERR_INVALID_INPUT (with a message in
 * `diag`, which may be NULL) when the module has not been planned. */
xm_status_t xm_plan_memory_read_report(const xm_ir_module_t *m, xm_diag_t *diag,
                                       xm_mem_report_t *out_report);

/* Appends "peak memory per rank: weights X, gradients Y, optimizer Z,
 * activations A, workspace W, total T" (no newline), in human units. */
void xm_plan_memory_print_report(const xm_mem_report_t *r, xm_strbuf_t *out);

/* Appends a byte count in human units: "512 B", "1.50 KiB", "2.00 GiB". */
void xm_plan_memory_format_bytes(int64_t bytes, xm_strbuf_t *out);

#endif /* XM_PASSES_PLAN_MEMORY_H */
