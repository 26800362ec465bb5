/* quantize/capture.c — Hessian capture: the runtime's observer hands every
 * linear's input rows to qz_capture_cb while the calibration hidden states go
 * through one layer in all_experts mode; the rows are accumulated into the
 * mean xᵀx each linear group quantizes against. The groups are the layer
 * description's (runtime/arch.h): slots with the same `group` read one input
 * and share one Hessian; a group whose instances each read their own input
 * (`own_input`, an expert's down_proj) has one per instance (driver.h step 1:
 * for Qwen3-MoE q/k/v share the layer-input H, o_proj has its own, gate/up
 * of all experts share one, each expert's down_proj has its own). lm_head's
 * Hessian uses the same accumulator. */
#include <cblas.h>
#include <string.h>

#include "common/alloc.h"
#include "quantize/job.h"

void qz_hess_free(hess_acc *h)
{
    sparq_aligned_free(h->h);
    h->h = NULL;
}

sparq_status qz_hess_init(hess_acc *h, int k)
{
    h->k = k;
    h->count = 0;
    h->h = sparq_aligned_alloc(64, (size_t)k * k * sizeof(float));
    RETURN_IF(!h->h, SPARQ_E_NOMEM, "out of memory for a %d x %d Hessian", k, k);
    memset(h->h, 0, (size_t)k * k * sizeof(float));
    return SPARQ_OK;
}

void qz_hess_add(hess_acc *h, const float *x, int rows, int in)
{
    if (!h->h || in != h->k) return;
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, in, rows, 1.0f, x, in, 1.0f, h->h, in);
    h->count += (uint64_t)rows;
}

/* Symmetrise and divide by the count (the mean of xᵀx). */
void qz_hess_finish(hess_acc *h)
{
    if (!h->h) return;
    float inv = h->count ? 1.0f / (float)h->count : 0.0f;
    for (int r = 0; r < h->k; r++)
        for (int c = r; c < h->k; c++) {
            float v = h->h[(size_t)r * h->k + c] * inv;
            h->h[(size_t)r * h->k + c] = v;
            h->h[(size_t)c * h->k + r] = v;
        }
}

/* Which slots lead a Hessian group with something to quantize. */
static bool leads_quant_group(const sq_layer_desc *d, int s)
{
    if (d->slot[s].group != s) return false;
    for (int t = 0; t < d->n_slots; t++)
        if (d->slot[t].group == s && d->slot[t].quantize) return true;
    return false;
}

sparq_status qz_capture_init(layer_capture *c, int layer, const sq_layer_desc *d, bool calibrated)
{
    memset(c, 0, sizeof *c);
    c->layer = layer;
    c->desc = d;
    for (int s = 0; s < d->n_slots; s++) {
        if (!leads_quant_group(d, s)) continue;
        c->n_h[s] = d->slot[s].own_input ? d->slot[s].instances : 1;
        c->h[s] = sparq_calloc((size_t)c->n_h[s], sizeof *c->h[s]);
        RETURN_IF(!c->h[s], SPARQ_E_NOMEM, "out of memory");
        /* a shared input's Hessian exists even if no row reaches it; an own
         * input's is made by the first rows it sees */
        if (calibrated && !d->slot[s].own_input) FORWARD_IF(qz_hess_init(&c->h[s][0], d->slot[s].in));
    }
    return SPARQ_OK;
}

hess_acc *qz_capture_hessian(layer_capture *c, int slot, int inst)
{
    const sq_lin_desc *s = &c->desc->slot[slot];
    const int g = s->group, i = c->desc->slot[g].own_input ? inst : 0;
    return c->h[g] && i >= 0 && i < c->n_h[g] ? &c->h[g][i] : NULL;
}

void qz_capture_finish(layer_capture *c)
{
    for (int s = 0; s < c->desc->n_slots; s++)
        for (int i = 0; c->h[s] && i < c->n_h[s]; i++) qz_hess_finish(&c->h[s][i]);
}

/* Members of a group report the same input: only the leader's is counted,
 * and only instance 0's unless each instance has its own. */
hess_acc *qz_capture_target(layer_capture *c, int layer, int slot, int inst, int in)
{
    if (layer != c->layer || slot < 0 || slot >= c->desc->n_slots || !c->h[slot]) return NULL;
    const sq_lin_desc *s = &c->desc->slot[slot];
    if (s->group != slot || (!s->own_input && inst > 0)) return NULL;
    const int i = s->own_input ? inst : 0;
    if (i < 0 || i >= c->n_h[slot]) return NULL;
    hess_acc *h = &c->h[slot][i];
    if (!h->h && c->st == SPARQ_OK) c->st = qz_hess_init(h, in);
    return h->h ? h : NULL;
}

void qz_capture_cb(void *user, int layer, int slot, int inst, const float *x, int rows, int in)
{
    layer_capture *c = user;
    if (c->pass > 0) return; /* counted in pass 0 */
    hess_acc *h = qz_capture_target(c, layer, slot, inst, in);
    if (h) qz_hess_add(h, x, rows, in);
}

void qz_capture_free(layer_capture *c)
{
    for (int s = 0; c->desc && s < c->desc->n_slots; s++) {
        for (int i = 0; c->h[s] && i < c->n_h[s]; i++) qz_hess_free(&c->h[s][i]);
        sparq_free(c->h[s]);
        c->h[s] = NULL;
    }
}
