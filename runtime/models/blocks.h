/* runtime/models/blocks.h — blocks the architecture graphs compose, beside
 * the backend ops (kernels/backend.h): today the routed-expert feed-forward
 * with its calibration observers, which every MoE architecture runs the same
 * way (router → top-k → experts grouped by rows → weighted sum). */
#ifndef SPARQ_RUNTIME_MODELS_BLOCKS_H
#define SPARQ_RUNTIME_MODELS_BLOCKS_H

#include "kernels/backend.h"
#include "runtime/model.h"

/* Report x[rows, in], the input of instance `inst` of slot `slot`, to obs. */
static inline void sq_observe(const sq_observer *obs, int layer, int slot, int inst, const float *x, int rows, int in)
{
    if (obs && obs->linear_input) obs->linear_input(obs->user, layer, slot, inst, x, rows, in);
}

/* Workspace of sq_block_moe, rows R (max rows of a step), experts E, top-k k,
 * hidden d, widest expert I: rl [R, E]; rw, lw [R, k]; xg, dn, mo [R, d];
 * g, u [R, I]; ridx, rows_of [R, k]; cnt, off [E + 1]. On a device exec
 * these are device memory (the backend's `moe` op uses the first nine). */
typedef struct sq_block_moe_bufs {
    float *rl, *rw, *lw, *xg, *g, *u, *dn, *mo;
    int *ridx, *rows_of, *cnt, *off;
} sq_block_moe_bufs;

/* The layer's slots (runtime/arch.h) the observers name: router (-1 for a
 * dense MLP), the experts' gate, up and down. */
typedef struct sq_block_moe_slots {
    int router, gate, up, down;
} sq_block_moe_slots;

/* b->mo[rows, d] = Σ_{e ∈ topk(router(xn))} w_e · down_e(silu(gate_e(xn)) ⊙ up_e(xn)),
 * or the dense MLP (ml->router NULL: expert 0, weight 1); with `residual`
 * non-NULL that is added to residual[rows, d] instead (b->mo is then
 * scratch: a device's `moe` op adds into the residual stream directly, the
 * host adds b->mo with axpy). A device backend
 * with a `moe` op runs it there (no observers). On the CPU the rows are
 * grouped by expert (counting sort), each expert runs once on its gathered
 * rows, and the weighted outputs are added in expert order, as transformers
 * does. obs->all_experts (a routed layer): sq_block_moe_all below, every
 * expert on every row (calibration), the output still from the routed rows
 * only. */
void sq_block_moe(sq_exec *ex, const sq_moe_layer *ml, int layer, const sq_block_moe_slots *sl, int d,
                  const float *xn, int rows, const sq_block_moe_bufs *b, const sq_observer *obs, float *residual);

/* out[i] = silu(g[i])·u[i], or with limit > 0 silu(min(g[i], limit))·clamp(u[i], −limit, limit)
 * (DeepSeek V4.1's swiglu_limit): a / (1 + expf(−a)) · u in fp32. out may equal g. */
void sq_swiglu_limit(const float *g, const float *u, size_t n, float limit, float *out);

/* The routed (row, k) pairs of job grouped by expert (a stable counting sort):
 * pairs[cnt[e] .. cnt[e+1]) are the flat indices r·top_k + k with idx = e, in
 * ascending r. cnt [n_exp + 1], pairs [rows·top_k]. SPARQ_E_RANGE for an id
 * outside [0, n_exp) (cnt and pairs then undefined). */
sparq_status sq_calib_moe_group(const sq_calib_moe *job, int *cnt, int *pairs);

/* The all-experts step of a routed MoE layer (model.h, sq_calib_moe): handed
 * to obs->moe_all when the observer has one, else run here — each expert on
 * all rows, gate/up/down inputs reported to obs, the routed rows' outputs
 * added in expert order with the backend's axpy. Scratch: g, u [rows, inter],
 * dn [rows, d], cnt [n_exp + 1], pairs [rows·top_k]. The hook's failure is
 * returned. */
typedef struct sq_calib_moe_ws {
    float *g, *u, *dn;
    int *cnt, *pairs;
} sq_calib_moe_ws;
sparq_status sq_block_moe_all(sq_exec *ex, int layer, const sq_calib_moe *job, const sq_observer *obs,
                              const sq_calib_moe_ws *ws);

#endif
