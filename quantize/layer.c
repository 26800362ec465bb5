/* quantize/layer.c — the per-layer loop: qz_do_layer captures the layer's
 * Hessians, runs the reference path, quantizes every linear of the layer
 * (EXL3 through quantize/ldlq.h, or the RTN baseline), swaps them into the
 * model, advances the quantized path and checkpoints the layer; qz_do_head
 * does lm_head. Also here: the bits each tensor gets (qz_bits_for) and the
 * loading of one source linear as fp32. The order of steps is driver.h's. */
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/half.h"
#include "common/progress.h"
#include "kernels/cpu/ops.h"
#include "quantize/job.h"
#include "quantize/ldlq.h"
#include "runtime/eval.h"
#include "runtime/quantplan.h"

/* Run `hidden` (all rows) through layer L in batches; `quant`: the quantized path (per-sequence
 * calibration keeps each path's caches in its own slots, job.h). */
static sparq_status forward_all(qjob *j, int L, float *hidden, bool quant, const sq_observer *obs)
{
    int T = j->T, per = j->batch_seqs;
    for (int s0 = 0; s0 < j->rows; s0 += per) {
        int ns = j->rows - s0 < per ? j->rows - s0 : per;
        const int seq = j->per_seq ? (quant ? j->rows : 0) + s0 : -1;
        FORWARD_IF(sq_model_forward_layer(j->m, L, hidden + (size_t)s0 * T * j->w, ns * T, j->pos, seq, obs));
    }
    return SPARQ_OK;
}

/* --- bits ----------------------------------------------------------------------- */

int qz_bits_for(const qjob *j, const char *key, int layer, sq_lin_role role)
{
    /* the fraction rule and the per-role defaults are sparq plan's too (runtime/quantplan.h) */
    sq_bits_policy pol;
    sq_bits_policy_default(&pol, j->o->bits);
    pol.head_bits = j->o->head_bits;
    int K = sq_bits_for(&pol, key, layer, role);
    const qz_opts *o = j->o;
    const char *const *ad = j->arch ? j->arch->default_bits : NULL;
    for (int r = 0; ad && ad[r]; r++) { /* "GLOB=K", K one digit */
        const char *eq = strrchr(ad[r], '=');
        char pat[128];
        snprintf(pat, sizeof pat, "%.*s", (int)(eq - ad[r]), ad[r]);
        if (fnmatch(pat, key, 0) == 0) K = atoi(eq + 1);
    }
    for (int r = 0; r < j->recipe.n; r++)
        if (fnmatch(j->recipe.rules[r].pattern, key, 0) == 0) K = j->recipe.rules[r].K;
    for (int r = 0; r < o->n_rules; r++)
        if (fnmatch(o->rules[r].pattern, key, 0) == 0) K = o->rules[r].K;
    if (K < 1) K = 1;
    if (K > TRELLIS_K_MAX) K = TRELLIS_K_MAX;
    return K;
}

/* --- one linear --------------------------------------------------------------- */

static void qlin_free(qlin *q)
{
    sparq_free(q->key);
    sparq_free(q->trellis);
    sparq_free(q->suh);
    sparq_free(q->svh);
    sparq_free(q->bf16);
    memset(q, 0, sizeof *q);
}

/* Load linear `key` [out, in] from the source as fp32 (any stored form of
 * formats/weights.h), transposed to (in, out) when `transpose`; the source's
 * pages are released once read. */
sparq_status qz_load_weight(qjob *j, const char *key, int *out_n, int *in_n, float **w, bool transpose)
{
    sf_weight sw;
    const sq_quant_config *q = &j->cfg->quant; /* an FP8 block as the config gives it */
    FORWARD_IF(sf_weight_find_block(j->src, key, q->weight_block_size[0], q->weight_block_size[1], &sw));
    RETURN_IF(sw.out > (1u << 24) || sw.in > (1u << 24), SPARQ_E_SHAPE, "%s: '%s' is too large", j->o->model_dir,
              key);
    int out = (int)sw.out, in = (int)sw.in;
    size_t numel = (size_t)out * in;
    float *a = sparq_malloc(numel * sizeof(float));
    RETURN_IF(!a, SPARQ_E_NOMEM, "%s: out of memory", key);
    sparq_status st = sf_weight_to_f32(&sw, a);
    qz_release_weight(j, &sw);
    if (st != SPARQ_OK) {
        sparq_free(a);
        return sparq_err_context(st, "%s", key);
    }
    if ((st = qz_check_finite(j, key, a, numel)) != SPARQ_OK) {
        sparq_free(a);
        return st;
    }
    if (transpose) {
        float *b = sparq_malloc(numel * sizeof(float));
        if (!b) {
            sparq_free(a);
            return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", key);
        }
        for (int r = 0; r < out; r++)
            for (int c = 0; c < in; c++) b[(size_t)c * out + r] = a[(size_t)r * in + c];
        sparq_free(a);
        a = b;
    }
    *out_n = out, *in_n = in, *w = a;
    return SPARQ_OK;
}

static sparq_status get_enc(qjob *j, int K, viterbi_enc **out)
{
    if (!j->enc[K]) {
        /* One encoder at a time: each holds 256 bytes per state (2^(16-K)) and thread. */
        for (int k = 0; k <= TRELLIS_K_MAX; k++) {
            viterbi_free(j->enc[k]);
            j->enc[k] = NULL;
        }
        FORWARD_IF(viterbi_create(&j->enc[K], K, j->o->cb, sparq_pool_size(j->pool)));
    }
    *out = j->enc[K];
    return SPARQ_OK;
}

void qz_ldlq_opts(const qjob *j, const char *key, int K, ldlq_opts *lo)
{
    ldlq_opts_default(lo, K);
    lo->cb = j->o->cb;
    lo->seed = qz_hash_str(j->o->seed, key);
    lo->out_scales = 1; /* exllamav3 1.4.1: "always" */
    lo->g_fixed = j->o->scale_search == QZ_SCALE_FIXED ? ldlq_default_g(K, j->o->cb) : 0.0;
}

/* RTN: per-group (along the input dim) asymmetric min/max, 2^K levels. */
static void rtn_quantize(const float *w, int out, int in, int K, int group, float *deq)
{
    int levels = (1 << K) - 1;
    for (int r = 0; r < out; r++)
        for (int g0 = 0; g0 < in; g0 += group) {
            int g1 = g0 + group < in ? g0 + group : in;
            const float *x = w + (size_t)r * in;
            float lo = x[g0], hi = x[g0];
            for (int c = g0; c < g1; c++) lo = fminf(lo, x[c]), hi = fmaxf(hi, x[c]);
            float scale = (hi - lo) / (float)levels;
            for (int c = g0; c < g1; c++) {
                float q = scale > 0 ? roundf((x[c] - lo) / scale) : 0.0f;
                deq[(size_t)r * in + c] = sparq_bf16_to_f32(sparq_f32_to_bf16(lo + q * scale));
            }
        }
}

/* Quantize one linear `key` with prepared Hessian hs (NULL for RTN); h_mean
 * (may be NULL) is the undamped mean Hessian for RTN's error metric. */
static sparq_status quantize_linear(qjob *j, const char *key, int K, const ldlq_hessian *hs, const float *h_mean,
                                    double g_fixed, double *g_used, qlin *q)
{
    memset(q, 0, sizeof *q);
    q->key = sparq_strdup(key);
    RETURN_IF(!q->key, SPARQ_E_NOMEM, "out of memory");
    q->K = K;
    double t0 = sparq_now();
    float *w = NULL;
    int out, in;
    sparq_status st;
    if (j->o->method == QZ_METHOD_RTN) {
        FORWARD_IF(qz_load_weight(j, key, &out, &in, &w, false));
        q->k = in, q->n = out;
        float *deq = sparq_malloc((size_t)out * in * sizeof(float));
        q->bf16 = sparq_malloc((size_t)out * in * sizeof(uint16_t));
        if (!deq || !q->bf16) {
            sparq_free(w);
            sparq_free(deq);
            return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", key);
        }
        rtn_quantize(w, out, in, K, j->o->rtn_group, deq);
        for (size_t i = 0; i < (size_t)out * in; i++) q->bf16[i] = sparq_f32_to_bf16(deq[i]);
        /* Error metric: relative error weighted by the input Hessian when we have one. */
        double num = 0, den = 0;
        for (size_t i = 0; i < (size_t)out * in; i++) {
            double e = (double)w[i] - deq[i];
            num += e * e, den += (double)w[i] * w[i];
        }
        sparq_free(deq);
        (void)h_mean;
        q->proxy = den > 0 ? num / den : 0.0;
        sparq_free(w);
    } else {
        FORWARD_IF(qz_load_weight(j, key, &out, &in, &w, true));
        q->k = in, q->n = out;
        RETURN_IF(in != ldlq_hessian_k(hs), SPARQ_E_STATE, "%s: input size %d but Hessian is %d", key, in,
                  ldlq_hessian_k(hs));
        q->trellis = sparq_malloc((size_t)in * out / 256 * 16 * K * sizeof(uint16_t));
        q->suh = sparq_malloc((size_t)in * sizeof(uint16_t));
        q->svh = sparq_malloc((size_t)out * sizeof(uint16_t));
        if (!q->trellis || !q->suh || !q->svh) {
            sparq_free(w);
            return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", key);
        }
        viterbi_enc *enc = NULL;
        st = get_enc(j, K, &enc);
        ldlq_opts lo;
        qz_ldlq_opts(j, key, K, &lo);
        if (!(lo.g_fixed > 0)) lo.g_fixed = g_fixed;
        ldlq_result res = {.trellis = q->trellis, .suh = q->suh, .svh = q->svh};
        if (st == SPARQ_OK) st = ldlq_quantize(hs, w, out, &lo, enc, j->pool, key, &res);
        sparq_free(w);
        FORWARD_IF(st);
        q->proxy = res.proxy_err;
        if (g_used) *g_used = res.g_scale;
        q->tl = (trellis_linear){.k = in, .n = out, .K = K, .cb = j->o->cb, .trellis = q->trellis,
                                 .suh = q->suh, .svh = q->svh};
    }
    j->t_quant += sparq_now() - t0;
    j->rep->n_weights += (uint64_t)q->k * q->n;
    return SPARQ_OK;
}

/* Swap q into the model's linear l. */
static sparq_status swap_in(qjob *j, sq_linear *l, qlin *q)
{
    (void)j;
    RETURN_IF(!l, SPARQ_E_STATE, "%s: the model has no such linear", q->key);
    if (q->bf16) {
        /* the bf16 values are exactly the RTN grid points (rtn_quantize rounds to bf16) */
        l->kind = SQ_LINEAR_BF16;
        l->w = q->bf16;
        l->impl = NULL;
        l->forward = NULL;
        return SPARQ_OK;
    }
    return sq_cpu_linear_exl3_bind(l, &q->tl, q->key);
}

/* --- the layer loop --------------------------------------------------------------- */

/* The quantized path against the reference after a layer; false when either
 * holds NaN / Inf (the metrics would say nothing). */
static bool hidden_metrics(const qjob *j, qz_layer_stat *ls)
{
    size_t rows = (size_t)j->rows * j->T;
    double num = 0, den = 0, cos_sum = 0;
    for (size_t r = 0; r < rows; r++) {
        const float *a = j->hq + r * j->w, *b = j->href + r * j->w;
        double ab = 0, aa = 0, bb = 0, e = 0;
        for (int c = 0; c < j->cmp; c++) {
            ab += (double)a[c] * b[c], aa += (double)a[c] * a[c], bb += (double)b[c] * b[c];
            e += ((double)a[c] - b[c]) * ((double)a[c] - b[c]);
        }
        num += e, den += bb;
        cos_sum += (aa > 0 && bb > 0) ? ab / sqrt(aa * bb) : 1.0;
    }
    ls->rel_err = den > 0 ? sqrt(num / den) : 0.0;
    ls->cosine = cos_sum / (double)rows;
    ls->sqnr_db = num > 0 ? 10.0 * log10(den / num) : 999.0;
    return isfinite(num) && isfinite(den);
}

/* The linears of a layer the quantizer converts, in its order: the slots in
 * their order, each run of consecutive per-expert slots expert by expert (so
 * gate, up, down of expert 0, then of expert 1, ...). refs may be NULL (count
 * only). */
static int layer_refs(const sq_layer_desc *d, layer_capture *cap, lin_ref *refs)
{
    int n = 0;
    for (int s = 0; s < d->n_slots;) {
        int t = s + 1;
        if (d->slot[s].instances > 1)
            while (t < d->n_slots && d->slot[t].instances == d->slot[s].instances) t++;
        for (int e = 0; e < d->slot[s].instances; e++)
            for (int u = s; u < t; u++) {
                if (!d->slot[u].quantize) continue;
                if (refs) refs[n] = (lin_ref){u, e, cap ? qz_capture_hessian(cap, u, e) : NULL};
                n++;
            }
        s = t;
    }
    return n;
}

/* Skeleton: bind the layer's FP8/MXFP4 linears (their 1-bit placeholders) as fp32 while it runs;
 * bound[i] gets the buffer (NULL: dense in the source, mapped as is). */
static sparq_status bind_source(qjob *j, int L, const lin_ref *refs, int n_lin, float **bound)
{
    for (int i = 0; i < n_lin && j->skeleton; i++) {
        sq_linear *l = sq_model_linear(j->m, L, refs[i].slot, refs[i].inst);
        if (!l || l->kind != SQ_LINEAR_EXL3) continue;
        int out, in;
        FORWARD_IF(qz_load_weight(j, l->name, &out, &in, &bound[i], false));
        RETURN_IF(out != l->out || in != l->in, SPARQ_E_SHAPE, "%s: '%s' is %d -> %d, expected %d -> %d",
                  j->o->model_dir, l->name, in, out, l->in, l->out);
        l->kind = SQ_LINEAR_F32;
        l->w = bound[i];
        l->impl = NULL;
        l->forward = NULL;
    }
    return SPARQ_OK;
}

/* Resume of an architecture with per-sequence calibration (job.h): the caches later layers read
 * (V4.1's pools and selections) are not in the checkpoint, so the finished layer L runs again on
 * both paths — the reference with the source weights, the quantized path with the checkpoint's
 * quantized linears — rebuilding them and the hidden states exactly as the first run had them. */
sparq_status qz_replay_layer(qjob *j, int L)
{
    const sq_layer_desc *desc = sq_model_layer_desc(j->m, L);
    RETURN_IF(!desc, SPARQ_E_STATE, "layer %d: not held by the model", L);
    const int n_lin = layer_refs(desc, NULL, NULL);
    lin_ref *refs = sparq_calloc((size_t)n_lin, sizeof *refs);
    float **bound = sparq_calloc((size_t)n_lin, sizeof *bound);
    qlin *ql = sparq_calloc((size_t)n_lin, sizeof *ql);
    sf_model *wf = NULL;
    char *path = qz_work_file(j, L);
    sparq_status st = refs && bound && ql && path ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "out of memory");
    if (st == SPARQ_OK) layer_refs(desc, NULL, refs);
    if (st == SPARQ_OK) st = bind_source(j, L, refs, n_lin, bound);
    if (st == SPARQ_OK) st = forward_all(j, L, j->href, false, NULL);
    if (st == SPARQ_OK) st = sf_open(&wf, path);
    for (int i = 0; i < n_lin && st == SPARQ_OK; i++) {
        sq_linear *l = sq_model_linear(j->m, L, refs[i].slot, refs[i].inst);
        RETURN_IF(!l, SPARQ_E_STATE, "layer %d: linear %d/%d missing", L, refs[i].slot, refs[i].inst);
        char nm[600];
        qlin *q = &ql[i];
        q->key = (char *)l->name; /* borrowed for swap_in's message; not freed */
        q->k = l->in, q->n = l->out;
        snprintf(nm, sizeof nm, "%s.weight", l->name);
        const sf_tensor *bw = sf_find(wf, nm);
        if (bw) {
            q->bf16 = (uint16_t *)bw->data;
        } else {
            snprintf(nm, sizeof nm, "%s.trellis", l->name);
            const sf_tensor *t = sf_find(wf, nm);
            snprintf(nm, sizeof nm, "%s.suh", l->name);
            const sf_tensor *su = sf_find(wf, nm);
            snprintf(nm, sizeof nm, "%s.svh", l->name);
            const sf_tensor *sv = sf_find(wf, nm);
            if (!t || !su || !sv || t->ndim != 3) {
                st = sparq_err(SPARQ_E_FORMAT, "%s: no quantized '%s' (the checkpoint is damaged; start again "
                               "without --resume)", path, l->name);
                break;
            }
            q->tl = (trellis_linear){.k = l->in, .n = l->out, .K = (int)(t->shape[2] / 16), .cb = j->o->cb,
                                     .trellis = t->data, .suh = su->data, .svh = sv->data};
        }
        st = swap_in(j, l, q);
    }
    if (st == SPARQ_OK) st = forward_all(j, L, j->hq, true, NULL);
    for (int i = 0; i < n_lin && bound; i++) sparq_free(bound[i]);
    sf_close(wf); /* layer L is never run again: the model's pointers into it are not used */
    sparq_free(path);
    sparq_free(bound);
    sparq_free(ql);
    sparq_free(refs);
    return st;
}

sparq_status qz_do_layer(qjob *j, int L, int n_total)
{
    qz_memdbg("layer start", L);
    qz_layer_stat *ls = &j->rep->layers[L];
    memset(ls, 0, sizeof *ls);
    ls->layer = L;
    double t0 = sparq_now(), tq0 = j->t_quant;
    uint64_t nw0 = j->rep->n_weights;
    const sq_layer_desc *desc = sq_model_layer_desc(j->m, L);
    RETURN_IF(!desc, SPARQ_E_STATE, "layer %d: not held by the model", L);
    size_t nh = (size_t)j->rows * j->T * j->w;
    bool calibrated = j->o->method == QZ_METHOD_TRELLIS;

    layer_capture cap;
    sparq_status st = qz_capture_init(&cap, L, desc, calibrated);

    /* The linears of this layer, grouped by Hessian. */
    int n_lin = layer_refs(desc, &cap, NULL);
    lin_ref *refs = sparq_calloc((size_t)n_lin, sizeof *refs);
    qlin *ql = sparq_calloc((size_t)n_lin, sizeof *ql);
    float **bound = sparq_calloc((size_t)n_lin, sizeof *bound); /* skeleton: dequantised fp32 linears */
    if (st == SPARQ_OK && (!refs || !ql || !bound)) st = sparq_err(SPARQ_E_NOMEM, "out of memory");
    if (st == SPARQ_OK) layer_refs(desc, &cap, refs);
    if (st == SPARQ_OK) st = bind_source(j, L, refs, n_lin, bound);
    if (calibrated && st == SPARQ_OK) {
        /* --device cuda: the routed experts' all-experts loop on the GPU (calib_gpu.c), in passes when
         * their weights and Hessians do not fit at once */
        calib_moe cm;
        bool gpu_moe = false;
        st = qz_calib_gpu_setup(j, L, desc, &cap, &cm, &gpu_moe);
        const int n_pass = gpu_moe ? cm.n_pass : 1;
        for (int p = 0; p < n_pass && st == SPARQ_OK; p++) {
            if (gpu_moe) qz_calib_moe_pass(&cm, p);
            memcpy(j->tmp, j->hq, nh * sizeof(float));
            sq_observer obs = {.user = &cap, .linear_input = qz_capture_cb, .moe_all = gpu_moe ? qz_calib_moe_cb : NULL,
                               .all_experts = true};
            st = forward_all(j, L, j->tmp, true, &obs);
            if (st == SPARQ_OK) st = cap.st;
            if (st == SPARQ_OK && gpu_moe) st = qz_calib_moe_pass_end(&cm);
        }
        if (gpu_moe) qz_calib_moe_free(&cm);
        qz_capture_finish(&cap);
    }
    qz_memdbg("after capture", L);
    /* Reference path through the original layer. */
    if (st == SPARQ_OK) st = forward_all(j, L, j->href, false, NULL);
    qz_memdbg("after ref fwd", L);
    /* The original linears are not run again: drop their pages (quantization reads
     * the source tensor by tensor) and the fp32 copies bound for the skeleton. */
    for (int i = 0; i < n_lin && refs && bound; i++) {
        sq_linear *l = sq_model_linear(j->m, L, refs[i].slot, refs[i].inst);
        if (bound[i]) {
            if (l) l->w = NULL;
            sparq_free(bound[i]);
            bound[i] = NULL;
        } else if (l && l->w && l->kind != SQ_LINEAR_EXL3) {
            uint64_t nb = (uint64_t)l->in * l->out * (l->kind == SQ_LINEAR_F32 ? 4 : 2);
            qz_release_mapped(j, l->w, nb);
            qz_span_add(j, l->w, nb);
        }
    }
    sparq_free(bound);
    char label[64], eta[32] = "?";
    if (L > 0 && j->rep->total_seconds > 0) {
        double per = j->rep->total_seconds / (L - j->rep->resumed_layers > 0 ? L - j->rep->resumed_layers : 1);
        sparq_format_duration(eta, sizeof eta, per * (n_total - L));
    }
    snprintf(label, sizeof label, "layer %d/%d eta %s", L + 1, n_total, eta);
    sparq_progress pb;
    sparq_progress_begin(&pb, label, (uint64_t)n_lin, SPARQ_PROGRESS_ITEMS);
    sparq_progress_set_unit_name(&pb, "tensors");
    ldlq_hessian *hs = NULL;
    const hess_acc *hs_for = NULL;
    double psum = 0, pmax = 0;
    double g_shared[SQ_LAYER_MAX_SLOTS][TRELLIS_K_MAX + 1] = {{0}}; /* per expert slot × K, from expert 0 */
    /* j->gctx: --device cuda with a trellis method (the driver makes none for RTN) */
    if (st == SPARQ_OK && j->gctx) st = qz_quantize_layer_cuda(j, L, desc, refs, n_lin, ql, &pb, &psum, &pmax);
    for (int i = 0; i < n_lin && st == SPARQ_OK && !j->gctx; i++) {
        sq_linear *l = sq_model_linear(j->m, L, refs[i].slot, refs[i].inst);
        if (!l) {
            st = sparq_err(SPARQ_E_STATE, "layer %d: linear %s/%d missing", L, desc->slot[refs[i].slot].name,
                           refs[i].inst);
            break;
        }
        const char *key = l->name;
        const sq_lin_role role = desc->slot[refs[i].slot].role;
        int K = qz_bits_for(j, key, L, role);
        if (j->o->method != QZ_METHOD_RTN && (hs == NULL || hs_for != refs[i].h)) {
            ldlq_hessian_free(hs);
            hs = NULL;
            hs_for = refs[i].h;
            int k = l->in;
            char hname[600];
            snprintf(hname, sizeof hname, "%s (input Hessian)", key);
            st = ldlq_hessian_prepare(&hs, calibrated ? refs[i].h->h : NULL, k, 0.0f,
                                      qz_hash_str(j->o->seed, hname), hname);
            if (st != SPARQ_OK) break;
        }
        double *gs = NULL, g_fixed = 0.0;
        if (role == SQ_ROLE_EXPERT && j->o->scale_search == QZ_SCALE_SHARED) {
            gs = &g_shared[refs[i].slot][K];
            g_fixed = *gs;
        }
        st = quantize_linear(j, key, K, hs, calibrated ? refs[i].h->h : NULL, g_fixed, gs, &ql[i]);
        if (st == SPARQ_OK) {
            psum += ql[i].proxy;
            pmax = fmax(pmax, ql[i].proxy);
        }
        sparq_progress_add(&pb, 1);
    }
    sparq_progress_end(&pb);
    ldlq_hessian_free(hs);
    qz_capture_free(&cap);

    /* Swap in and advance the quantized path with normal routing. */
    for (int i = 0; i < n_lin && st == SPARQ_OK; i++)
        st = swap_in(j, sq_model_linear(j->m, L, refs[i].slot, refs[i].inst), &ql[i]);
    if (st == SPARQ_OK) st = forward_all(j, L, j->hq, true, NULL);
    qz_memdbg("after hq fwd", L);
    /* the linears kept as they are (a router) are not run again either */
    for (int s = 0; s < desc->n_slots; s++)
        for (int e = 0; !desc->slot[s].quantize && e < desc->slot[s].instances; e++) {
            const sq_linear *kept = sq_model_linear(j->m, L, s, e);
            if (kept && kept->w && kept->kind != SQ_LINEAR_EXL3)
                qz_span_add(j, kept->w, (uint64_t)kept->in * kept->out * (kept->kind == SQ_LINEAR_F32 ? 4 : 2));
        }
    qz_spans_release(j);
    if (st == SPARQ_OK && !hidden_metrics(j, ls))
        st = sparq_err(SPARQ_E_FORMAT, "%s: layer %d: the hidden states are not finite (NaN / Inf) after it; "
                       "`sparq inspect --check %s` scans the weights", j->o->model_dir, L, j->o->model_dir);
    if (st == SPARQ_OK) {
        ls->mean_proxy = psum / n_lin;
        ls->max_proxy = pmax;
        ls->seconds = sparq_now() - t0;
        ls->quant_seconds = j->t_quant - tq0;
        ls->n_weights = j->rep->n_weights - nw0;
        for (int i = 0; i < n_lin && st == SPARQ_OK; i++)
            st = qz_report_add_tensor(j->rep, ql[i].key, ql[i].K, ql[i].k, ql[i].n, ql[i].proxy);
    }
    /* Checkpoint: the layer's tensors, then the hidden states. */
    if (st == SPARQ_OK) {
        char *path = qz_work_file(j, L);
        sf_writer *w = NULL;
        st = path ? sf_writer_create(&w, path) : sparq_err(SPARQ_E_NOMEM, "out of memory");
        for (int i = 0; i < n_lin && st == SPARQ_OK; i++) {
            st = qz_add_qlin_tensors(w, &ql[i], j->o->cb);
            if (st == SPARQ_OK) st = qz_meta_num(w, "proxy.", ql[i].key, ql[i].proxy);
            if (st == SPARQ_OK) st = qz_meta_num(w, "K.", ql[i].key, ql[i].K);
        }
        if (st == SPARQ_OK) st = qz_meta_num(w, "layer.", "rel_err", ls->rel_err);
        if (st == SPARQ_OK) st = qz_meta_num(w, "layer.", "cosine", ls->cosine);
        if (st == SPARQ_OK) st = qz_meta_num(w, "layer.", "sqnr_db", ls->sqnr_db);
        if (st == SPARQ_OK) st = qz_meta_num(w, "layer.", "mean_proxy", ls->mean_proxy);
        if (st == SPARQ_OK) st = qz_meta_num(w, "layer.", "max_proxy", ls->max_proxy);
        if (st == SPARQ_OK) st = sf_writer_finish(w);
        else sf_writer_free(w);
        sparq_free(path);
    }
    if (st == SPARQ_OK) st = qz_save_hidden(j, L);
    /* The model keeps pointing at ql's buffers until the next layer is run;
     * layer L is never run again, so they can go now. */
    for (int i = 0; i < n_lin && ql; i++) qlin_free(&ql[i]);
    sparq_free(ql);
    sparq_free(refs);
    return st;
}

/* The end-of-run figures (qz_report.quality_*): the reference path's final
 * hidden states through the source head against the quantized path's through
 * the quantized head q, on the text rows, 32 rows of logits at a time. */
static sparq_status head_quality(qjob *j, qlin *q)
{
    sq_linear *hl = sq_model_head_linear(j->m);
    RETURN_IF(!hl, SPARQ_E_STATE, "quality: the model has no head");
    const int V = (int)j->cfg->vocab_size, T = j->T, CH = 32;
    const size_t text_rows = (size_t)(j->rows - j->rep->random_rows) * T;
    float *lr = sparq_malloc((size_t)CH * V * sizeof(float)), *lq = sparq_malloc((size_t)CH * V * sizeof(float));
    float *pr = sparq_malloc((size_t)V * sizeof(float)), *pq = sparq_malloc((size_t)V * sizeof(float));
    sparq_status st = lr && lq && pr && pq ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "quality: out of memory");
    const sq_linear source = *hl;
    double kl = 0, nll_r = 0, nll_q = 0;
    long agree = 0, n = 0, n_next = 0;
    for (size_t r0 = 0; r0 < text_rows && st == SPARQ_OK; r0 += CH) {
        const int nr = (int)(text_rows - r0 < (size_t)CH ? text_rows - r0 : (size_t)CH);
        *hl = source;
        st = sq_model_head(j->m, j->href + r0 * j->w, nr, lr);
        if (st == SPARQ_OK) st = swap_in(j, hl, q);
        if (st == SPARQ_OK) st = sq_model_head(j->m, j->hq + r0 * j->w, nr, lq);
        for (int r = 0; r < nr && st == SPARQ_OK; r++) {
            const int ar = sq_eval_log_softmax(lr + (size_t)r * V, V, pr);
            const int aq = sq_eval_log_softmax(lq + (size_t)r * V, V, pq);
            kl += sq_eval_kl(pr, pq, V);
            agree += ar == aq;
            n++;
            const size_t row = r0 + (size_t)r;
            if ((int)(row % (size_t)T) + 1 < T) {
                const int32_t next = j->tokens[row + 1];
                if (next >= 0 && next < V) nll_r -= pr[next], nll_q -= pq[next], n_next++;
            }
        }
    }
    *hl = source;
    if (st == SPARQ_OK && n > 0) {
        j->rep->quality_kld = kl / (double)n;
        j->rep->quality_top1 = (double)agree / (double)n;
        j->rep->quality_ppl_source = n_next ? exp(nll_r / (double)n_next) : 0.0;
        j->rep->quality_ppl_output = n_next ? exp(nll_q / (double)n_next) : 0.0;
        j->rep->quality_tokens = n;
    }
    sparq_free(lr);
    sparq_free(lq);
    sparq_free(pr);
    sparq_free(pq);
    return st;
}

/* lm_head: Hessian of final_norm(h_q), weight lm_head.weight or the tied embedding. */
sparq_status qz_do_head(qjob *j)
{
    const char *hkey = j->arch->head_key;
    char hw[256], nk[256];
    snprintf(hw, sizeof hw, "%s.weight", hkey);
    snprintf(nk, sizeof nk, "%s.weight", j->arch->norm_key);
    const char *wkey = sf_find(j->src, hw) ? hkey : j->arch->embed_key;
    const sf_tensor *nw = sf_find(j->src, nk);
    RETURN_IF(!nw || nw->numel != (uint64_t)j->d, SPARQ_E_NOTFOUND, "%s: %s missing or wrong size", j->o->model_dir,
              nk);
    size_t rows = (size_t)j->rows * j->T;
    float *norm = sparq_malloc((size_t)j->d * sizeof(float));
    hess_acc h = {0};
    sparq_status st = norm ? sf_to_f32(nw, norm) : sparq_err(SPARQ_E_NOMEM, "out of memory");
    bool calibrated = j->o->method == QZ_METHOD_TRELLIS;
    if (st == SPARQ_OK && calibrated) {
        st = qz_hess_init(&h, j->d);
        /* the head's own input when the architecture gives it (V4.1: the collapsed streams), else the final norm */
        bool own = false;
        if (st == SPARQ_OK) {
            sparq_status hi = sq_model_head_input(j->m, j->hq, (int)rows, j->tmp);
            own = hi == SPARQ_OK;
            if (hi == SPARQ_E_UNSUPPORTED) sparq_err_clear();
            else st = hi;
        }
        for (size_t r = 0; r < rows && st == SPARQ_OK && !own; r++) {
            const float *x = j->hq + r * j->d;
            float *y = j->tmp + r * j->d;
            double ss = 0;
            for (int c = 0; c < j->d; c++) ss += (double)x[c] * x[c];
            float inv = (float)(1.0 / sqrt(ss / j->d + j->cfg->rms_norm_eps));
            for (int c = 0; c < j->d; c++) y[c] = x[c] * inv * norm[c];
        }
        if (st == SPARQ_OK) {
            for (size_t r0 = 0; r0 < rows; r0 += 4096)
                qz_hess_add(&h, j->tmp + r0 * j->d, (int)(rows - r0 < 4096 ? rows - r0 : 4096), j->d);
            qz_hess_finish(&h);
        }
    }
    sparq_free(norm);
    ldlq_hessian *hs = NULL;
    qlin q = {0};
    if (st == SPARQ_OK && j->o->method != QZ_METHOD_RTN)
        st = ldlq_hessian_prepare(&hs, calibrated ? h.h : NULL, j->d, 0.0f, qz_hash_str(j->o->seed, "lm_head (input)"),
                                  "lm_head (input Hessian)");
    if (st == SPARQ_OK) {
        int K = qz_bits_for(j, hkey, -1, SQ_ROLE_COUNT_);
        if (j->gctx && hs) st = qz_quantize_linear_cuda(j, wkey, wkey, K, hs, &q);
        else st = quantize_linear(j, wkey, K, hs, h.h, 0.0, NULL, &q);
        if (st == SPARQ_OK) {
            sparq_free(q.key);
            q.key = sparq_strdup(hkey);
            if (!q.key) st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        }
    }
    ldlq_hessian_free(hs);
    qz_hess_free(&h);
    if (st == SPARQ_OK) st = qz_report_add_tensor(j->rep, hkey, q.K, q.k, q.n, q.proxy);
    if (st == SPARQ_OK && j->o->method != QZ_METHOD_RTN) st = head_quality(j, &q);
    if (st == SPARQ_OK) {
        char *path = qz_work_file(j, -1);
        sf_writer *w = NULL;
        st = path ? sf_writer_create(&w, path) : sparq_err(SPARQ_E_NOMEM, "out of memory");
        if (st == SPARQ_OK) st = qz_add_qlin_tensors(w, &q, j->o->cb);
        if (st == SPARQ_OK) st = qz_meta_num(w, "proxy.", hkey, q.proxy);
        if (st == SPARQ_OK) st = qz_meta_num(w, "K.", hkey, q.K);
        const double qv[] = {j->rep->quality_kld, j->rep->quality_top1, j->rep->quality_ppl_source,
                             j->rep->quality_ppl_output, (double)j->rep->quality_tokens};
        static const char *const qk[] = {"kld", "top1", "ppl_source", "ppl_output", "tokens"};
        for (int i = 0; i < 5 && st == SPARQ_OK; i++) st = qz_meta_num(w, "quality.", qk[i], qv[i]);
        if (st == SPARQ_OK) st = sf_writer_finish(w);
        else if (w) sf_writer_free(w);
        sparq_free(path);
    }
    qlin_free(&q);
    return st;
}
