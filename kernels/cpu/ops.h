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

/* FP8 / MXFP4 linears (ops_fp8.c) with at most this many rows use their GEMV
 * (each weight decoded once in registers for all rows); more rows decode
 * SQ_CPU_GEMM_TILE-row fp32 tiles for cblas_sgemm, as bf16 does above
 * SQ_CPU_GEMV_MAX_ROWS. Measured in docs/benchmarks-runtime.md. */
#define SQ_CPU_BLOCK_GEMV_MAX_ROWS 8

/* True when the AVX2+FMA+F16C kernels are compiled in and the CPU has them. */
bool sq_cpu_have_avx2(void);

/* True when the AVX2 kernels are the ones in use: sq_cpu_have_avx2() and the
 * scalar path not forced. */
bool sq_cpu_use_avx2(void);

/* Force the portable scalar kernels (true) or use the best available (false).
 * Process-wide; for tests and benchmarks. */
void sq_cpu_force_scalar(bool on);

/* Dot products of an fp32 vector with one weight row of n elements. */
float sq_cpu_dot_f32(const float *x, const float *w, size_t n);
float sq_cpu_dot_bf16(const float *x, const uint16_t *w, size_t n);
float sq_cpu_dot_f16(const float *x, const uint16_t *w, size_t n);

/* Convert n weights of a dense kind to fp32 (F32 copies). */
void sq_cpu_to_f32(sq_linear_kind kind, const void *w, size_t n, float *out);

/* --- FP8 / MXFP4 (ops_fp8.c) ---------------------------------------------- */

/* y[rows, out] = x · Wᵀ (+ bias) for an FP8 or MXFP4 linear by the GEMV
 * (more than SQ_CPU_BLOCK_GEMV_MAX_ROWS rows: in runs of that many). The
 * backend's linear calls it up to that many rows; exposed for tests and
 * benchmarks. */
void sq_cpu_block_gemv(sq_exec *ex, const sq_linear *l, const float *x, int rows, float *y);

/* Rows [row0, row0 + rows) of an FP8 / MXFP4 linear as fp32 (rows × in
 * floats): exactly the value each code and scale encode (the GEMM tile). */
void sq_cpu_block_to_f32(const sq_linear *l, int row0, int rows, float *out);

/* Index of the first E4M3 NaN code ((c & 0x7F) == 0x7F) of p[0, n), or n.
 * Reads each byte once, 128 a step with AVX2. */
size_t sq_cpu_find_e4m3_nan(const uint8_t *p, size_t n);

/* Check a bound FP8 / MXFP4 linear before it runs: its block geometry
 * (MXFP4: even in, 1×32 groups) and every code — no UE8M0 255 in its scale
 * grid, no E4M3 NaN code in an FP8 weight (every byte read once). Errors are
 * SPARQ_E_SHAPE / SPARQ_E_FORMAT naming the tensor (w_name / s_name) and the
 * first bad element [row, column]. */
sparq_status sq_cpu_linear_block_check(const sq_linear *l, const char *w_name, const char *s_name);

/* Make l an EXL3 linear over t (kernels/cpu/trellis.h; validated here, the
 * message names `name`): kind SQ_LINEAR_EXL3, in = t->k, out = t->n, impl = t,
 * forward = trellis GEMV/GEMM in blocks of TRELLIS_GEMM_MAX_ROWS rows. t and
 * the tensors it points to must outlive l; l->bias and l->name are kept. */
sparq_status sq_cpu_linear_exl3_bind(sq_linear *l, const trellis_linear *t, const char *name);

/* The `sample_select` op on host memory (kernels/cpu/sample.c; kernels/backend.h
 * says what it does). */
sparq_status sq_cpu_sample_select(sq_exec *ex, float *logits, int rows, int ld, const sq_sample_req *req,
                                  int32_t *const *ids, float *const *vals, uint8_t *bad);
/* The k (1 ≤ k ≤ V) best ids of logits l[0..V) into o, best first: higher logit, then lower id
 * (the sampler's order; a heap of k, O(V log k)). */
void sq_cpu_topk(const float *l, int32_t V, int k, int32_t *o);
/* l[pen[j]] > 0 ? divided by penalty : multiplied, for j < n_pen (distinct ids); 1 = none. */
void sq_cpu_penalise(float *l, float penalty, int n_pen, const int32_t *pen);

#endif
