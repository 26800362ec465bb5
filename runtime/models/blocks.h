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
 * or the dense MLP (ml->router NULL: expert 0, weight 1). A device backend
 * with a `moe` op runs it there (no observers). On the CPU the rows are
 * grouped by expert (counting sort), each expert runs once on its gathered
 * rows, and the weighted outputs are added in expert order, as transformers
 * does. obs->all_experts: every expert on every row (calibration), the
 * output still from the routed rows only. */
void sq_block_moe(sq_exec *ex, const sq_moe_layer *ml, int layer, const sq_block_moe_slots *sl, int d,
                  const float *xn, int rows, const sq_block_moe_bufs *b, const sq_observer *obs);

#endif
