/* runtime/abi/kernels.h — the kernel table of a backend, generated from
 * the signature table runtime/abi/kernels.def.
 *
 * xm_rt_kernels_t has one function pointer per kernel, typed from its line
 * in kernels.def; a backend fills one (runtime/cpu/backend.c points every
 * entry at its xm_k_* function, so the compiler checks those against the
 * table) and the conformance suite (tests/backend) runs each entry against
 * the reference. xm_rt_kernel_signatures lists every kernel's name and
 * argument text for tools and checks that want the table as data.
 */
#ifndef XM_RUNTIME_ABI_KERNELS_H
#define XM_RUNTIME_ABI_KERNELS_H

#include <stdint.h>

/* The `scoring` argument of the router kernels (same numbering as the
 * frontend's xm_scoring_t). */
enum { XM_K_SOFTMAX = 0, XM_K_SIGMOID = 1 };

/* A bf16 value as its 16 raw bits (the upper half of the f32's bits). */
typedef uint16_t xm_bf16_t;

#define XM_KT_f32 float
#define XM_KT_bf16 xm_bf16_t
#define XM_KT_i32 int32_t
#define XM_KT_f64 double

/* One tensor of a multi-tensor AdamW launch (XM_HOST(adamw_tensor, ...)):
 * the param, its gradient and the two moments, n elements each (device
 * addresses), and whether weight decay applies. The array of them is a
 * host array: a GPU backend copies it into its launches' arguments, so no
 * device buffer holds it. */
typedef struct {
  float *p;
  const float *g;
  float *m, *v;
  int64_t n;
  int32_t decay; /* 1: p *= 1 - lr * weight_decay first; 0: no decay */
  int32_t pad_;
} xm_rt_adamw_tensor_t;

#define XM_IN(dt, n) const XM_KT_##dt *n
#define XM_OUT(dt, n) XM_KT_##dt *n
#define XM_I64(n) int64_t n
#define XM_F32(n) float n
#define XM_INT(n) int n
#define XM_HOST(type, n) const xm_rt_##type##_t *n

typedef struct xm_rt_kernels {
#define XM_KERNEL(name, ret, args) ret(*name) args;
#include "runtime/abi/kernels.def"
#undef XM_KERNEL
} xm_rt_kernels_t;

#undef XM_IN
#undef XM_OUT
#undef XM_I64
#undef XM_F32
#undef XM_INT
#undef XM_HOST

typedef enum {
#define XM_KERNEL(name, ret, args) XM_RT_KERNEL_##name,
#include "runtime/abi/kernels.def"
#undef XM_KERNEL
  XM_RT_KERNEL_COUNT_
} xm_rt_kernel_id_t;

typedef struct {
  const char *name;
  const char *ret;
  const char *args; /* the argument list as written in kernels.def */
} xm_rt_kernel_signature_t;

static const xm_rt_kernel_signature_t xm_rt_kernel_signatures[] = {
#define XM_KERNEL(name, ret, args) {#name, #ret, #args},
#include "runtime/abi/kernels.def"
#undef XM_KERNEL
};

#endif /* XM_RUNTIME_ABI_KERNELS_H */
