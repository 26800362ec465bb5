/* runtime/sampler.c — see sampler.h for the chain and its order.
 *
 * Top-k uses a partial selection (a small binary heap) so a 150k vocabulary
 * costs O(V log k) per token; without top-k the candidates are fully sorted.
 * Probabilities are computed in double. */
#include "kernels/cpu/ops.h"
#include "runtime/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "kernels/backend.h"

struct sq_sampler {
    sq_sampler_params p;
    int n_vocab;
    uint64_t rng[4];
    float *work;     /* [n_vocab] penalised logits */
    int32_t *cand;   /* [n_vocab] candidate ids */
    double *prob;    /* [n_vocab] */
    float *cval;     /* [n_vocab] the candidates' penalised logits, in candidate order */
    int32_t *pen;    /* [repeat_last_n] distinct penalised ids (the device request) */
    int32_t *hist;   /* ring of the last repeat_last_n tokens */
    int n_hist, hist_pos;
};

void sq_sampler_params_default(sq_sampler_params *p)
{
    p->temp = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->seed = 0;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4])
{
    const uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double sq_sampler_uniform(sq_sampler *s) { return (double)(xoshiro_next(s->rng) >> 11) * 0x1.0p-53; }

void sq_sampler_reset(sq_sampler *s, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    s->n_hist = s->hist_pos = 0;
}

sparq_status sq_sampler_create(sq_sampler **out, const sq_sampler_params *p, int n_vocab)
{
    *out = NULL;
    RETURN_IF(n_vocab <= 0, SPARQ_E_ARG, "sampler: vocabulary size %d", n_vocab);
    RETURN_IF(p->top_k < 0 || p->top_p <= 0 || p->top_p > 1 || p->min_p < 0 || p->min_p > 1 ||
                  p->repeat_penalty <= 0 || p->repeat_last_n < 0 || isnan(p->temp),
              SPARQ_E_ARG, "sampler: parameter out of range (top_k %d, top_p %g, min_p %g, repeat_penalty %g)",
              p->top_k, (double)p->top_p, (double)p->min_p, (double)p->repeat_penalty);
    sq_sampler *s = sparq_calloc(1, sizeof *s);
    RETURN_IF(!s, SPARQ_E_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->work = sparq_malloc((size_t)n_vocab * sizeof(float));
    s->cand = sparq_malloc((size_t)n_vocab * sizeof(int32_t));
    s->prob = sparq_malloc((size_t)n_vocab * sizeof(double));
    s->cval = sparq_malloc((size_t)n_vocab * sizeof(float));
    s->hist = sparq_malloc((size_t)(p->repeat_last_n > 0 ? p->repeat_last_n : 1) * sizeof(int32_t));
    s->pen = sparq_malloc((size_t)(p->repeat_last_n > 0 ? p->repeat_last_n : 1) * sizeof(int32_t));
    if (!s->work || !s->cand || !s->prob || !s->cval || !s->hist || !s->pen) {
        sq_sampler_free(s);
        return sparq_err(SPARQ_E_NOMEM, "sampler: out of memory");
    }
    sq_sampler_reset(s, p->seed);
    *out = s;
    return SPARQ_OK;
}

int sq_sampler_vocab(int64_t head_rows, int32_t tokenizer_ids)
{
    return tokenizer_ids > 0 && tokenizer_ids < head_rows ? (int)tokenizer_ids : (int)head_rows;
}

void sq_sampler_free(sq_sampler *s)
{
    if (!s) return;
    sparq_free(s->work);
    sparq_free(s->cand);
    sparq_free(s->prob);
    sparq_free(s->cval);
    sparq_free(s->hist);
    sparq_free(s->pen);
    sparq_free(s);
}

void sq_sampler_accept(sq_sampler *s, int32_t token)
{
    if (s->p.repeat_last_n <= 0) return;
    s->hist[s->hist_pos] = token;
    s->hist_pos = (s->hist_pos + 1) % s->p.repeat_last_n;
    if (s->n_hist < s->p.repeat_last_n) s->n_hist++;
}

/* a ranks before b: higher logit, then lower id */
static inline bool before(const float *l, int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); }

static int cmp_cand(const void *pa, const void *pb, void *ctx)
{
    const float *l = ctx;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return before(l, a, b) ? -1 : before(l, b, a) ? 1 : 0;
}


/* The distinct ids of the history in [0, V), each once, in s->pen. */
static int distinct_history(sq_sampler *s)
{
    int n = 0;
    for (int i = 0; i < s->n_hist; i++) {
        const int32_t t = s->hist[i];
        if (t < 0 || t >= s->n_vocab) continue;
        /* a token repeated in the window is penalised once (as transformers) */
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= s->hist[j] == t;
        if (!seen) s->pen[n++] = t;
    }
    return n;
}

/* The candidates the chain starts from: every id unless top-k keeps fewer. */
static int n_candidates(const sq_sampler *s)
{
    return s->p.top_k > 0 && s->p.top_k < s->n_vocab ? s->p.top_k : s->n_vocab;
}

int32_t sq_sampler_sample(sq_sampler *s, const float *logits)
{
    const int V = s->n_vocab;
    float *l = s->work;
    memcpy(l, logits, (size_t)V * sizeof(float));
    if (s->p.repeat_penalty != 1.0f) {
        const int n_pen = distinct_history(s);
        for (int j = 0; j < n_pen; j++) {
            const int32_t t = s->pen[j];
            l[t] = l[t] > 0 ? l[t] / s->p.repeat_penalty : l[t] * s->p.repeat_penalty;
        }
    }
    if (s->p.temp <= 0) {
        int32_t best = 0;
        for (int32_t i = 1; i < V; i++)
            if (l[i] > l[best]) best = i;
        return best;
    }
    const int n = n_candidates(s);
    if (n < V) {
        sq_cpu_topk(l, V, n, s->cand); /* the n best, already in order */
    } else {
        for (int32_t i = 0; i < V; i++) s->cand[i] = i;
        qsort_r(s->cand, (size_t)n, sizeof(int32_t), cmp_cand, l);
    }
    for (int i = 0; i < n; i++) s->cval[i] = l[s->cand[i]];
    return sq_sampler_finish(s, s->cand, s->cval, n);
}

int32_t sq_sampler_finish(sq_sampler *s, const int32_t *cand, const float *val, int n)
{
    if (s->p.temp <= 0) return cand[0];
    /* softmax at temperature */
    const double inv_t = 1.0 / s->p.temp, mx = val[0];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = exp(((double)val[i] - mx) * inv_t);
        sum += s->prob[i];
    }
    for (int i = 0; i < n; i++) s->prob[i] /= sum;
    /* top-p */
    if (s->p.top_p < 1.0f) {
        double c = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            c += s->prob[i];
            if (c >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    /* min-p (prob[0] is the max) */
    if (s->p.min_p > 0) {
        const double th = s->p.min_p * s->prob[0];
        int keep = 1;
        while (keep < n && s->prob[keep] >= th) keep++;
        n = keep;
    }
    double tot = 0;
    for (int i = 0; i < n; i++) tot += s->prob[i];
    double u = sq_sampler_uniform(s) * tot, c = 0;
    for (int i = 0; i < n; i++) {
        c += s->prob[i];
        if (u < c) return cand[i];
    }
    return cand[n - 1];
}

bool sq_sampler_request(sq_sampler *s, sq_sample_req *req)
{
    const bool greedy = s->p.temp <= 0;
    const int k = greedy ? 0 : n_candidates(s);
    if (k > SQ_SAMPLE_MAX_K) return false;
    *req = (sq_sample_req){.n_vocab = s->n_vocab, .k = k, .penalty = s->p.repeat_penalty, .pen = s->pen};
    if (s->p.repeat_penalty != 1.0f) req->n_pen = distinct_history(s);
    return true;
}

int sq_device_sampling_mode(void)
{
    const char *e = getenv("SPARQ_DEVICE_SAMPLING");
    if (!e || !*e) return -1;
    return strcmp(e, "0") == 0 ? 0 : 1;
}

/* up to this many rows per sample_select call (its request array is on the stack) */
#define ROWS_AT_ONCE 32

sparq_status sq_sampler_sample_rows(sq_exec *ex, sq_sampler *const *smp, float *logits, int rows, int ld,
                                    float *host, int32_t *ids, int *bad_row)
{
    *bad_row = -1;
    const sq_backend *be = ex->be;
    const int mode = sq_device_sampling_mode();
    const bool want = be->sample_select && (mode == 1 || (mode < 0 && be->device));
    for (int r0 = 0; r0 < rows; r0 += ROWS_AT_ONCE) {
        const int n = rows - r0 < ROWS_AT_ONCE ? rows - r0 : ROWS_AT_ONCE;
        float *lg = logits + (size_t)r0 * (size_t)ld;
        sq_sample_req req[ROWS_AT_ONCE];
        bool ok = want;
        for (int r = 0; ok && r < n; r++) ok = sq_sampler_request(smp[r0 + r], &req[r]);
        if (ok) {
            int32_t *cid[ROWS_AT_ONCE];
            float *cv[ROWS_AT_ONCE];
            uint8_t bad[ROWS_AT_ONCE];
            for (int r = 0; r < n; r++) {
                cid[r] = smp[r0 + r]->cand;
                cv[r] = smp[r0 + r]->cval;
            }
            FORWARD_IF(be->sample_select(ex, lg, n, ld, req, cid, cv, bad));
            for (int r = 0; r < n; r++)
                if (bad[r]) {
                    *bad_row = r0 + r;
                    return SPARQ_OK;
                }
            for (int r = 0; r < n; r++)
                ids[r0 + r] = sq_sampler_finish(smp[r0 + r], cid[r], cv[r], req[r].k > 0 ? req[r].k : 1);
            continue;
        }
        /* the logits to the host, the whole chain there */
        float *h = lg;
        if (be->device) {
            h = host + (size_t)r0 * (size_t)ld;
            FORWARD_IF(be->to_host(ex, h, lg, (size_t)n * (size_t)ld * sizeof(float)));
        }
        FORWARD_IF(sq_sampler_sample_host(smp + r0, h, n, ld, ids + r0, bad_row));
        if (*bad_row >= 0) {
            *bad_row += r0;
            return SPARQ_OK;
        }
    }
    return SPARQ_OK;
}

sparq_status sq_sampler_sample_host(sq_sampler *const *smp, const float *logits, int rows, int ld, int32_t *ids,
                                    int *bad_row)
{
    *bad_row = -1;
    for (int r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * (size_t)ld;
        float z = 0.0f; /* 0 · x is NaN exactly when x is NaN or Inf */
        for (int v = 0; v < ld; v++) z += row[v] * 0.0f;
        if (z != 0.0f) {
            *bad_row = r;
            return SPARQ_OK;
        }
    }
    for (int r = 0; r < rows; r++) ids[r] = sq_sampler_sample(smp[r], logits + (size_t)r * (size_t)ld);
    return SPARQ_OK;
}
