/* kernels/cpu/ops.h — CPU backend specifics beyond kernels/backend.h.
 *
 * The CPU backend itself is reached through sq_backend_cpu(). This header
 * exposes the knobs tests and benchmarks need: which SIMD path is active,
 * a switch to force the scalar path (so both are tested against a naive
 * reference on an AVX2 machine), the row threshold between GEMV and GEMM, and
 * the single-row dot products the GEMV is built from. */
#ifndef SPARQ_KERNELS_CPU_OPS_H
#define SPARQ_KERNELS_CPU_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cpu/trellis.h"

/* Linears with at most this many rows use the GEMV path (weights read once,
 * converted lane by lane); more rows use bf16→fp32 tiles + cblas_sgemm. */
#define SQ_CPU_GEMV_MAX_ROWS 4

/* A GEMV (or a decode attention step) with fewer multiply-adds than this
 * runs on the calling thread: waking the pool's workers costs tens of µs,
 * more than the work (e.g. a 128×128 expert GEMV is 16K MACs). Measured on
 * the fixtures: 1.5-4.7× faster decode (docs/benchmarks-runtime.md). */
#define SQ_CPU_SERIAL_MACS (1u << 18)

/* Output rows per GEMM work item (one fp32 weight tile per thread). */
#define SQ_CPU_GEMM_TILE 64

/* True when the AVX2+FMA+F16C kernels are compiled in and the CPU has them. */
bool sq_cpu_have_avx2(void);

/* Force the portable scalar kernels (true) or use the best available (false).
 * Process-wide; for tests and benchmarks. */
void sq_cpu_force_scalar(bool on);

/* Dot products of an fp32 vector with one weight row of n elements. */
float sq_cpu_dot_f32(const float *x, const float *w, size_t n);
float sq_cpu_dot_bf16(const float *x, const uint16_t *w, size_t n);
float sq_cpu_dot_f16(const float *x, const uint16_t *w, size_t n);

/* Convert n weights of a dense kind to fp32 (F32 copies). */
void sq_cpu_to_f32(sq_linear_kind kind, const void *w, size_t n, float *out);

/* Make l an EXL3 linear over t (kernels/cpu/trellis.h; validated here, the
 * message names `name`): kind SQ_LINEAR_EXL3, in = t->k, out = t->n, impl = t,
 * forward = trellis GEMV/GEMM in blocks of TRELLIS_GEMM_MAX_ROWS rows. t and
 * the tensors it points to must outlive l; l->bias and l->name are kept. */
sparq_status sq_cpu_linear_exl3_bind(sq_linear *l, const trellis_linear *t, const char *name);

#endif
