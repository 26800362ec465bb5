/* quantize/capture.c — Hessian capture: the runtime's observer hands every
 * linear's input rows to qz_capture_cb while the calibration hidden states go
 * through one layer in all_experts mode; the rows are accumulated into the
 * mean xᵀx each linear group quantizes against (driver.h step 1: q/k/v share
 * the layer-input H, o_proj has its own, gate/up of all experts share one,
 * each expert's down_proj has its own). lm_head's Hessian uses the same
 * accumulator. */
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

void qz_capture_cb(void *user, int layer, sq_lin_id which, int expert, const float *x, int rows, int in)
{
    layer_capture *c = user;
    if (layer != c->layer) return;
    switch (which) {
    case SQ_LIN_Q: qz_hess_add(&c->attn, x, rows, in); break;
    case SQ_LIN_O: qz_hess_add(&c->o, x, rows, in); break;
    case SQ_LIN_GATE:
        if (expert <= 0) qz_hess_add(&c->mlp, x, rows, in);
        break;
    case SQ_LIN_DOWN:
        if (expert >= 0 && expert < c->n_down) {
            if (!c->down[expert].h && c->st == SPARQ_OK) c->st = qz_hess_init(&c->down[expert], in);
            qz_hess_add(&c->down[expert], x, rows, in);
        }
        break;
    default: break;
    }
}

void qz_capture_free(layer_capture *c)
{
    qz_hess_free(&c->attn);
    qz_hess_free(&c->o);
    qz_hess_free(&c->mlp);
    for (int e = 0; e < c->n_down; e++) qz_hess_free(&c->down[e]);
    sparq_free(c->down);
}
