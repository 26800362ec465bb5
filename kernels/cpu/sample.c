/* kernels/cpu/sample.c — the `sample_select` op on host memory (kernels/backend.h):
 * the repetition penalty in place, then the argmax or the k best candidates
 * in the sampler's order (logit descending, id ascending). The reference the
 * CUDA op is checked against (tests/gpu/test_sample_cuda.c), and what the
 * sampler's split path runs on a CPU exec when SPARQ_DEVICE_SAMPLING=1 asks
 * for it (runtime/sampler.h). The same comparisons as runtime/sampler.c, so
 * the same ids come out. */
#include <math.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "kernels/cpu/ops.h"

/* a ranks before b: higher logit, then lower id (-0 and +0 compare equal) */
static inline bool before(const float *l, int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); }

/* min-heap on `before` (the worst kept id at the root) */
static void heap_down(const float *l, int32_t *h, int n, int i)
{
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && before(l, h[c], h[c + 1])) c++;
        if (!before(l, h[i], h[c])) return;
        const int32_t t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

void sq_cpu_topk(const float *l, int32_t V, int k, int32_t *o)
{
    for (int i = 0; i < k; i++) o[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) heap_down(l, o, k, i);
    for (int32_t i = k; i < V; i++)
        if (before(l, i, o[0])) {
            o[0] = i;
            heap_down(l, o, k, 0);
        }
    /* pop the worst to the back: the heap sorted best first */
    for (int n = k - 1; n > 0; n--) {
        const int32_t t = o[0];
        o[0] = o[n];
        o[n] = t;
        heap_down(l, o, n, 0);
    }
}

void sq_cpu_penalise(float *l, float penalty, int n_pen, const int32_t *pen)
{
    if (penalty == 1.0f) return;
    for (int j = 0; j < n_pen; j++) {
        float *v = l + pen[j];
        *v = *v > 0 ? *v / penalty : *v * penalty;
    }
}

sparq_status sq_cpu_sample_select(sq_exec *ex, float *logits, int rows, int ld, const sq_sample_req *req,
                                  int32_t *const *ids, float *const *vals, uint8_t *bad)
{
    (void)ex;
    for (int r = 0; r < rows; r++) {
        const sq_sample_req *q = &req[r];
        RETURN_IF(q->n_vocab < 1 || q->n_vocab > ld || q->k < 0 || q->k > q->n_vocab || q->k > SQ_SAMPLE_MAX_K,
                  SPARQ_E_ARG, "sample_select: row %d asks for %d of %d ids (row length %d)", r, q->k, q->n_vocab, ld);
        float *l = logits + (size_t)r * (size_t)ld;
        float z = 0.0f; /* 0 · x is NaN exactly when x is NaN or Inf */
        for (int v = 0; v < ld; v++) z += l[v] * 0.0f;
        bad[r] = z != 0.0f;
        sq_cpu_penalise(l, q->penalty, q->n_pen, q->pen);
        int32_t *o = ids[r];
        float *ov = vals[r];
        const int V = q->n_vocab;
        if (q->k == 0) {
            int32_t best = 0;
            for (int32_t i = 1; i < V; i++)
                if (l[i] > l[best]) best = i;
            o[0] = best;
            ov[0] = l[best];
            continue;
        }
        const int k = q->k;
        sq_cpu_topk(l, V, k, o);
        for (int i = 0; i < k; i++) ov[i] = l[o[i]];
    }
    return SPARQ_OK;
}
