/* quantize/memory.c — keeping the run inside its memory (docs/quantization.md
 * "Memory"): a layer's weights are resident only while it runs, because the
 * model's and the source's mapped pages are released after use
 * (qz_release_mapped, and qz_spans_release after every layer against the
 * kernel's fault-around); the resident set is measured from /proc/self/status;
 * and before any work an itemised upper estimate of the peak is checked
 * against --max-mem (qz_mem_estimate) and a run that cannot fit is refused
 * with its terms named (qz_mem_refuse). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "quantize/job.h"

/* Drop the pages of a read-only file mapping from this process (they stay in
 * the page cache; a later read faults them back in). This is what keeps the
 * resident set to one layer: the model's and the source's mappings are
 * released as soon as a layer (or a tensor) has been read. Rounded outward to
 * pages: a neighbour's page dropped too is merely re-read. */
void qz_release_mapped(const qjob *j, const void *p, uint64_t n)
{
    if (!p || !n) return;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(j->page - 1);
    uintptr_t e = ((uintptr_t)p + (uintptr_t)n + j->page - 1) & ~(uintptr_t)(j->page - 1);
    (void)madvise((void *)a, e - a, MADV_DONTNEED);
}

void qz_span_add(qjob *j, const void *p, uint64_t n)
{
    if (!p || !n) return;
    if (j->n_spans == j->cap_spans) {
        int cap = j->cap_spans ? 2 * j->cap_spans : 64;
        uintptr_t(*x)[2] = sparq_realloc(j->spans, (size_t)cap * sizeof *x);
        if (!x) return; /* only a release hint is lost */
        j->spans = x, j->cap_spans = cap;
    }
    j->spans[j->n_spans][0] = (uintptr_t)p;
    j->spans[j->n_spans][1] = (uintptr_t)p + (uintptr_t)n;
    j->n_spans++;
}

static int cmp_span(const void *a, const void *b)
{
    uintptr_t x = ((const uintptr_t *)a)[0], y = ((const uintptr_t *)b)[0];
    return x < y ? -1 : x > y;
}

/* Release every recorded span (all finished layers). Spans are sorted and
 * merged only where they touch (gap under a page), so a merged range never
 * covers memory that is not one of the mapped files. */
void qz_spans_release(qjob *j)
{
    if (j->n_spans == 0) return;
    qsort(j->spans, (size_t)j->n_spans, sizeof *j->spans, cmp_span);
    int m = 0;
    for (int i = 1; i < j->n_spans; i++) {
        if (j->spans[i][0] <= j->spans[m][1] + j->page) {
            if (j->spans[i][1] > j->spans[m][1]) j->spans[m][1] = j->spans[i][1];
        } else {
            m++;
            j->spans[m][0] = j->spans[i][0], j->spans[m][1] = j->spans[i][1];
        }
    }
    j->n_spans = m + 1;
    for (int i = 0; i < j->n_spans; i++)
        qz_release_mapped(j, (const void *)j->spans[i][0], j->spans[i][1] - j->spans[i][0]);
}

void qz_release_weight(qjob *j, const sf_weight *w)
{
    qz_release_mapped(j, w->w->data, w->w->nbytes);
    qz_span_add(j, w->w->data, w->w->nbytes);
    if (w->scale) {
        qz_release_mapped(j, w->scale->data, w->scale->nbytes);
        qz_span_add(j, w->scale->data, w->scale->nbytes);
    }
}

/* A "Vm...:  N kB" field of /proc/self/status, bytes; 0 if unknown. */
static uint64_t proc_status_bytes(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t n = strlen(field);
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':' && sscanf(line + n + 1, " %llu", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb * 1024;
}

/* Peak resident set of this process so far (VmHWM; ru_maxrss as fallback), bytes. */
uint64_t qz_peak_rss_bytes(void)
{
    uint64_t b = proc_status_bytes("VmHWM");
    struct rusage ru;
    if (!b && getrusage(RUSAGE_SELF, &ru) == 0) b = (uint64_t)ru.ru_maxrss * 1024;
    return b;
}

/* Current resident set (VmRSS), bytes; 0 if unknown. */
uint64_t qz_cur_rss_bytes(void) { return proc_status_bytes("VmRSS"); }

/* SPARQ_QZ_MEMDEBUG=1: the resident set at each phase on stderr (docs/quantization.md). */
void qz_memdbg(const char *what, int L)
{
    if (!getenv("SPARQ_QZ_MEMDEBUG")) return;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256], out[512] = "";
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "Rss", 3) == 0 || strncmp(line, "VmHWM", 5) == 0) {
            line[strcspn(line, "\n")] = 0;
            strncat(out, line, sizeof out - strlen(out) - 2);
            strcat(out, " |");
        }
    if (f) fclose(f);
    fprintf(stderr, "[mem] %-16s %3d %s\n", what, L, out);
}

/* --- memory estimate ---------------------------------------------------------------- */

static void mem_add(qz_report *r, const char *what, uint64_t bytes)
{
    if (r->n_mem_parts < QZ_MEM_PARTS) r->mem_parts[r->n_mem_parts++] = (qz_mem_part){what, bytes};
    r->mem_estimate += bytes;
}

/* Stored bytes of linear `key` in the source and its in/out (0 if absent). */
static uint64_t src_linear(const qjob *j, const char *key, uint64_t *k, uint64_t *n)
{
    sf_weight w;
    *k = *n = 0;
    if (!key || sf_weight_find(j->src, key, &w) != SPARQ_OK) {
        sparq_err_clear();
        return 0;
    }
    *k = w.in, *n = w.out;
    return w.nbytes;
}

/* An upper estimate of the run's peak resident set, term by term (what each
 * phase holds at once; docs/quantization.md "Memory"): the process as loaded,
 * the runtime's KV cache and workspace, the three calibration hidden-state
 * sets, the Viterbi encoder, the embedding rows the calibration tokens touch,
 * then the largest of: one layer (its mapped or fp32-bound weights and
 * Hessians during the forwards; Hessians + one linear's work + the layer's
 * quantized output while quantizing), the head, one output shard. */
void qz_mem_estimate(qjob *j, uint64_t base_rss)
{
    const qz_opts *o = j->o;
    qz_report *r = j->rep;
    r->mem_estimate = 0;
    r->n_mem_parts = 0;
    bool calibrated = o->method == QZ_METHOD_TRELLIS, rtn = o->method == QZ_METHOD_RTN;
    uint64_t nh = (uint64_t)j->rows * j->T * (uint64_t)j->w;
    sq_model_mem mm;
    sq_model_mem_report(j->m, &mm);
    mem_add(r, "process so far (code, libraries, model index, tokenizer run)", base_rss);
    mem_add(r, "runtime KV cache and workspace", mm.kv + mm.workspace);
    mem_add(r, "calibration hidden states (3 sets: quantized path, reference, scratch)", 3 * nh * 4);
    char ekey[256];
    snprintf(ekey, sizeof ekey, "%s.weight", j->arch->embed_key);
    const sf_tensor *emb = sf_find(j->src, ekey);
    uint64_t emb_touch = emb ? emb->nbytes : 0;
    if (emb && emb->shape[0] > 0) {
        uint64_t rowb = emb->nbytes / emb->shape[0] + j->page;
        if ((uint64_t)j->rows * j->T * rowb < emb_touch) emb_touch = (uint64_t)j->rows * j->T * rowb;
    }
    mem_add(r, "embedding rows of the calibration tokens", emb_touch);

    uint64_t worst_layer = 0;
    int kmin = o->head_bits; /* the smallest K sizes the Viterbi encoder: 2^(16-K) states */
    for (int L = 0; L < j->n_layers; L++) {
        const sq_layer_desc *ld = sq_model_layer_desc(j->m, L);
        if (!ld) continue;
        /* Hessians: one per group of slots reading one input (per instance where each has its own) */
        uint64_t hess = 0;
        for (int s = 0; calibrated && s < ld->n_slots; s++) {
            bool quant = false;
            for (int t = 0; t < ld->n_slots; t++) quant |= ld->slot[t].group == s && ld->slot[t].quantize;
            if (ld->slot[s].group != s || !quant) continue;
            const uint64_t in = (uint64_t)ld->slot[s].in, n = ld->slot[s].own_input ? ld->slot[s].instances : 1;
            hess += 4 * n * in * in;
        }
        uint64_t fwd = 0, outputs = 0, work = 0, kmax = 0;
        for (int s = 0; s < ld->n_slots; s++) {
            for (int e = 0; e < ld->slot[s].instances; e++) {
                sq_linear *l = sq_model_linear(j->m, L, s, e);
                uint64_t k, n, b = src_linear(j, l ? l->name : NULL, &k, &n);
                /* bound as fp32 (skeleton) or mapped as stored */
                fwd += l && l->kind == SQ_LINEAR_EXL3 ? 4 * k * n : b;
                if (!ld->slot[s].quantize) continue;
                int K = qz_bits_for(j, l ? l->name : "", L, ld->slot[s].role);
                if (K < kmin) kmin = K;
                outputs += rtn ? 2 * k * n : (uint64_t)K * k * n / 8 + 2 * (k + n);
                uint64_t w = b + 4 * k * n * (rtn ? 3 : 7);
                if (w > work) work = w;
                if (k > kmax) kmax = k;
            }
        }
        uint64_t prep = rtn ? 0 : 2 * 4 * kmax * kmax + 16 * kmax;
        if (o->device == QZ_DEVICE_CUDA && !rtn) {
            /* a GPU batch holds several linears' fp32 weights and regularised copies at once
             * (layer_cuda.c), up to its host budget; the Hessians are prepared on the device */
            uint64_t all = 0;
            for (int s = 0; s < ld->n_slots; s++)
                if (ld->slot[s].quantize)
                    all += 8ull * (uint64_t)ld->slot[s].in * (uint64_t)ld->slot[s].out * (uint64_t)ld->slot[s].instances;
            const uint64_t cap = qz_cuda_host_budget(j);
            work = all < cap ? all : cap;
        }
        uint64_t quant = hess + prep + work + outputs;
        /* --device cuda: the GPU capture's pinned staging and per-call outputs (calib_gpu.c) */
        const uint64_t capture = fwd + hess + qz_calib_gpu_host_bytes(j, ld);
        uint64_t peak = capture > quant ? capture : quant;
        if (peak > worst_layer) worst_layer = peak;
    }
    /* per thread: 256 back-pointer bytes and two fp32 costs per state; one 64K-entry table */
    uint64_t states = 1ull << (16 - (kmin < 1 ? 1 : kmin));
    uint64_t enc = rtn ? 0 : (uint64_t)sparq_pool_size(j->pool) * (256 * states + 2 * (states + 8) * 4) + 65536 * 4;
    mem_add(r, "Viterbi encoder (per thread)", enc);
    char hw[256], hblk[256];
    snprintf(hw, sizeof hw, "%s.weight", j->arch->head_key);
    snprintf(hblk, sizeof hblk, "%s_blocks", j->arch->head_key);
    uint64_t hk, hn, hb = src_linear(j, sf_find(j->src, hw) || sf_find(j->src, hblk) ? j->arch->head_key
                                                                                      : j->arch->embed_key, &hk, &hn);
    const uint64_t d = (uint64_t)j->d;
    uint64_t head = hb + 4 * hk * hn * (rtn ? 3 : 7) + (calibrated ? 3 * 4 * d * d : 0) + 2 * 4 * d * d +
                    (rtn ? 2 : 1) * hk * hn;
    /* the largest output (or skeleton) shard: at most the cap, at most the whole
     * output, which is bounded by 2 bytes per weight for the quantized linears
     * (bf16 RTN; EXL3 is less) and the stored size (F32 when dequantised) otherwise */
    uint64_t out_upper = 0;
    for (size_t i = 0; i < sf_count(j->src); i++) {
        const sf_tensor *x = sf_at(j->src, i);
        bool dense = x->dtype == SF_BF16 || x->dtype == SF_F16 || x->dtype == SF_F32;
        out_upper += dense ? x->nbytes : 8 * x->numel;
    }
    uint64_t shard = qz_shard_cap(j);
    if (out_upper < shard) shard = out_upper;
    const char *what = "largest layer (weights, Hessians, quantization work, its output)";
    uint64_t big = worst_layer;
    if (head > big) big = head, what = "lm_head (fp32 copies and quantization work)";
    if (shard > big) big = shard, what = "one output shard while it is written";
    mem_add(r, what, big);
    mem_add(r, "allocator and thread-stack slack", 8ull << 20);
}

/* The refusal: every term, the largest named, with what lowers it. */
sparq_status qz_mem_refuse(const qjob *j)
{
    const qz_report *r = j->rep;
    char msg[2048], a[32], b[32];
    int n = 0, big = 0;
    for (int i = 1; i < r->n_mem_parts; i++)
        if (r->mem_parts[i].bytes > r->mem_parts[big].bytes) big = i;
    sparq_format_bytes(a, sizeof a, (double)r->mem_estimate);
    sparq_format_bytes(b, sizeof b, (double)j->o->max_mem);
    n += snprintf(msg + n, sizeof msg - (size_t)n, "--max-mem %s is too small: the estimated peak is %s =", b, a);
    for (int i = 0; i < r->n_mem_parts && n < (int)sizeof msg; i++) {
        sparq_format_bytes(a, sizeof a, (double)r->mem_parts[i].bytes);
        n += snprintf(msg + n, sizeof msg - (size_t)n, "%s %s %s", i ? " +" : "", a, r->mem_parts[i].what);
    }
    const char *w = r->mem_parts[big].what, *hint = "";
    if (strstr(w, "hidden")) hint = "; lower --calib-rows / --calib-len";
    else if (strstr(w, "encoder")) hint = "; use fewer --threads";
    else if (strstr(w, "process")) hint = "; the process itself needs that much before any layer";
    else if (strstr(w, "layer") || strstr(w, "lm_head")) hint = "; one layer must fit (it is the streaming unit)";
    sparq_format_bytes(a, sizeof a, (double)r->mem_parts[big].bytes);
    if (n < (int)sizeof msg)
        snprintf(msg + n, sizeof msg - (size_t)n, ". Largest: %s (%s)%s", w, a, hint);
    return sparq_err(SPARQ_E_FIT, "%s", msg);
}
