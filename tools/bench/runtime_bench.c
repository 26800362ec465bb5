/* tools/bench/runtime_bench.c — CPU runtime speed: prefill and decode tokens/s
 * of a model, and decode bytes-read/s as a fraction of this machine's memory
 * bandwidth, measured in the same run by a streaming-read loop on the same
 * thread pool (so the ratio does not depend on what else the machine is doing
 * as much as two separate runs would).
 *
 *   runtime_bench MODEL [--threads N] [--prompt N] [--decode N] [--reps N] [--bw-mib N] [--gemv N]
 *                 [--device cpu|cuda] [--compare-cpu N] [--users N]
 *
 * --users N also decodes N sequences together, the step `sparq serve` and
 * `run --parallel` run (sq_model_decode_sample: one batched decode step of N
 * rows, the head, and the greedy token of each row sampled where the logits
 * are: on the device with --device cuda). Each sequence is first prefilled
 * with its own prompt of --prompt tokens; then --decode steps are timed
 * (best of --reps) and printed as per-user and aggregate tokens/s. Steps of
 * up to 8 rows replay CUDA graphs, larger ones run launch by launch.
 *
 * --compare-cpu N (with --device cuda) also loads the model on the CPU and
 * checks the GPU against it: the prompt's last logits, then N decode steps
 * fed the GPU's greedy token on both; prints the worst relative error
 * max|gpu - cpu| / max|cpu| and how many greedy tokens agree.
 *
 * --device cuda runs the model on the GPU (kernels/cuda/) and skips the
 * host bandwidth and GEMV figures; the load time and the bytes the model
 * holds are printed for either device.
 *
 * --gemv N (default 8192) also times the decode GEMV alone on a synthetic
 * bf16 N×N matrix much larger than the caches (one row, best of 10), which is
 * what decode of a real model is made of: its bytes/s against the same
 * bandwidth says how close the kernel gets to the memory limit.
 *
 * Bytes read per decoded token = the weights one token touches (attention,
 * router, top_k experts of each MoE layer or the dense MLP, final norm,
 * lm_head, one embedding row) + the KV cache it attends over (K and V of
 * every layer at the mean cached length). Prints one `key value` per line. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "sparq_version.h"
#include "common/progress.h"
#include "common/threadpool.h"
#include "kernels/cpu/trellis.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#if SPARQ_HAVE_CUDA
#include "kernels/cuda/trellis_cuda.h"
#endif

typedef struct bw_job {
    const float *buf;
    size_t n_per;
    double sums[256];
} bw_job;

static void bw_item(void *ctx, size_t i, int tid)
{
    (void)tid;
    bw_job *j = ctx;
    const float *p = j->buf + i * j->n_per;
    float s[8] = {0};
    for (size_t k = 0; k + 8 <= j->n_per; k += 8)
        for (int q = 0; q < 8; q++) s[q] += p[k + q];
    j->sums[i % 256] += s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

/* Best of 5 passes of a parallel sum over `mib` MiB: bytes/s. */
static double measure_bandwidth(sparq_pool *pool, size_t mib)
{
    size_t n = mib << 18; /* floats */
    float *buf = sparq_aligned_alloc(64, n * sizeof(float));
    if (!buf) return 0;
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7);
    const size_t chunks = 256;
    bw_job j = {buf, n / chunks, {0}};
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = sparq_now();
        sparq_pool_for(pool, chunks, bw_item, &j);
        double dt = sparq_now() - t0;
        double bps = (double)(j.n_per * chunks * sizeof(float)) / dt;
        if (bps > best) best = bps;
    }
    volatile double sink = j.sums[0];
    (void)sink;
    sparq_aligned_free(buf);
    return best;
}

static uint64_t lin_bytes(const sq_linear *l)
{
    if (!l) return 0;
    switch (l->kind) {
    case SQ_LINEAR_F32: return (uint64_t)l->in * l->out * 4;
    case SQ_LINEAR_BF16:
    case SQ_LINEAR_F16: return (uint64_t)l->in * l->out * 2;
    case SQ_LINEAR_EXL3: {
        const trellis_linear *t = l->impl; /* K bits per weight + fp16 suh/svh */
        return (uint64_t)l->in * l->out * (uint64_t)t->K / 8 + ((uint64_t)l->in + l->out) * 2;
    }
    default: return 0;
    }
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* max|a - b| / max|b| over n */
static double rel_err(const float *a, const float *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return den > 0 ? num / den : num;
}

/* The model on the GPU (m) against the same model on the CPU: see the header. */
static int compare_cpu(sq_model *m, const char *dir, const sq_model_opts *o, const int32_t *toks, int n_prompt,
                       int steps)
{
    sq_model_opts oc = *o;
    oc.device = SQ_DEVICE_CPU;
    sq_model *mc;
    if (sq_model_load(&mc, dir, &oc) != SPARQ_OK) {
        fprintf(stderr, "cpu load: %s\n", sparq_errmsg());
        return 1;
    }
    const int V = (int)sq_model_cfg(m)->vocab_size;
    float *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4);
    sq_model_seq_reset(m, 0);
    sq_model_seq_reset(mc, 0);
    int agree = 0, done = 0, rc = 0;
    double worst = 0;
    if (sq_model_forward(m, 0, toks, n_prompt, SQ_LOGITS_LAST, a) != SPARQ_OK ||
        sq_model_forward(mc, 0, toks, n_prompt, SQ_LOGITS_LAST, b) != SPARQ_OK) {
        fprintf(stderr, "compare: %s\n", sparq_errmsg());
        rc = 1;
    }
    for (int s = 0; rc == 0 && s <= steps; s++) {
        worst = fmax(worst, rel_err(a, b, V));
        const int32_t t = argmax(a, V);
        agree += t == argmax(b, V);
        done++;
        if (s == steps) break;
        if (sq_model_forward(m, 0, &t, 1, SQ_LOGITS_LAST, a) != SPARQ_OK ||
            sq_model_forward(mc, 0, &t, 1, SQ_LOGITS_LAST, b) != SPARQ_OK) {
            fprintf(stderr, "compare: %s\n", sparq_errmsg());
            rc = 1;
        }
    }
    printf("cpu_compare positions %d greedy_agree %d worst_rel_err %.3g\n", done, agree, worst);
    free(a);
    free(b);
    sq_model_free(mc);
    return rc;
}

/* --users N: N sequences prefilled, then decoded together n_decode steps (greedy, sampled in the step);
 * the best of reps. Returns nonzero on an error. */
static int bench_users(sq_model *m, int users, const int32_t *toks, int n_prompt, int n_decode, int reps)
{
    const int V = (int)sq_model_cfg(m)->vocab_size;
    int *seqs = malloc((size_t)users * sizeof(int));
    int32_t *tok = malloc((size_t)users * sizeof(int32_t)), *next = malloc((size_t)users * sizeof(int32_t));
    int32_t *prompt = malloc((size_t)n_prompt * sizeof(int32_t));
    float *lg = malloc((size_t)users * (size_t)V * sizeof(float));
    sq_sampler **smp = calloc((size_t)users, sizeof *smp);
    int rc = !seqs || !tok || !next || !prompt || !lg || !smp;
    sq_sampler_params sp;
    sq_sampler_params_default(&sp);
    sp.temp = 0; /* greedy */
    for (int u = 0; !rc && u < users; u++) {
        seqs[u] = u;
        rc = sq_sampler_create(&smp[u], &sp, V) != SPARQ_OK;
    }
    double best = 0, pf_s = 0;
    uint64_t cap0 = 0, rep0 = 0, cap1 = 0, rep1 = 0;
    for (int r = 0; !rc && r < reps; r++) {
        const double t0 = sparq_now();
        for (int u = 0; !rc && u < users; u++) { /* each user its own prompt: the shared one shifted */
            for (int i = 0; i < n_prompt; i++) prompt[i] = (toks[i] + u * 7919) % V;
            sq_model_seq_reset(m, u);
            rc = sq_model_forward(m, u, prompt, n_prompt, SQ_LOGITS_LAST, lg) != SPARQ_OK;
            if (!rc) tok[u] = sq_sampler_sample(smp[u], lg); /* the greedy first token */
        }
        const double t1 = sparq_now();
        sq_model_graph_counts(m, &cap0, &rep0);
        for (int i = 0; !rc && i < n_decode; i++) {
            int bad = -1;
            rc = sq_model_decode_sample(m, users, seqs, tok, smp, lg, next, &bad) != SPARQ_OK || bad >= 0;
            memcpy(tok, next, (size_t)users * sizeof(int32_t));
        }
        const double t2 = sparq_now();
        sq_model_graph_counts(m, &cap1, &rep1);
        if (rc) fprintf(stderr, "--users %d: %s\n", users, sparq_errmsg());
        pf_s = t1 - t0;
        best = fmax(best, n_decode / (t2 - t1));
    }
    if (!rc) {
        printf("users %d\n", users);
        printf("users_prefill_s %.2f (%d prompts of %d tokens, one after another)\n", pf_s, users, n_prompt);
        printf("users_decode_steps %d (rows %d a step; graphs captured %llu replayed %llu in the last rep)\n", n_decode,
               users, (unsigned long long)(cap1 - cap0), (unsigned long long)(rep1 - rep0));
        printf("users_decode_tok_s_per_user %.1f\n", best);
        printf("users_decode_tok_s_aggregate %.1f\n", best * users);
    }
    for (int u = 0; smp && u < users; u++) sq_sampler_free(smp[u]);
    free(smp);
    free(seqs);
    free(tok);
    free(next);
    free(prompt);
    free(lg);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: runtime_bench MODEL [--threads N] [--prompt N] [--decode N] [--reps N] [--bw-mib N] "
                        "[--gemv N] [--device cpu|cuda] [--compare-cpu N] [--users N]\n");
        return 2;
    }
    int threads = 0, n_prompt = 512, n_decode = 128, reps = 3, bw_mib = 512, gemv_n = 8192, compare = 0, users = 0;
    sq_device dev = SQ_DEVICE_CPU;
    for (int i = 2; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--device")) {
            if (sq_device_parse(argv[i + 1], &dev) != SPARQ_OK) {
                fprintf(stderr, "--device %s: cpu or cuda\n", argv[i + 1]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--threads")) threads = v;
        else if (!strcmp(argv[i], "--prompt")) n_prompt = v;
        else if (!strcmp(argv[i], "--decode")) n_decode = v;
        else if (!strcmp(argv[i], "--reps")) reps = v;
        else if (!strcmp(argv[i], "--bw-mib")) bw_mib = v;
        else if (!strcmp(argv[i], "--gemv")) gemv_n = v;
        else if (!strcmp(argv[i], "--compare-cpu")) compare = v;
        else if (!strcmp(argv[i], "--users")) users = v;
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    sq_model_opts o;
    sq_model_opts_default(&o);
    o.ctx = n_prompt + n_decode + 1;
    o.max_rows = n_prompt < 512 ? n_prompt : 512;
    o.n_threads = threads;
    o.device = dev;
    if (users < 0 || users > 4096 || n_prompt < 1 || n_decode < 1) {
        fprintf(stderr, "--users 0..4096, --prompt and --decode at least 1\n");
        return 2;
    }
    if (users > 0) {
        o.n_seq = users;
        if (o.max_rows < users) o.max_rows = users;
    }
    sq_model *m;
    size_t gpu_free0 = 0, gpu_total = 0;
#if SPARQ_HAVE_CUDA
    if (dev == SQ_DEVICE_CUDA) trellis_cuda_mem_info(&gpu_free0, &gpu_total); /* after the context is made */
#endif
    const double tl0 = sparq_now();
    if (sq_model_load(&m, argv[1], &o) != SPARQ_OK) {
        fprintf(stderr, "load: %s\n", sparq_errmsg());
        return 1;
    }
    const double load_s = sparq_now() - tl0;
    size_t gpu_free = 0;
#if SPARQ_HAVE_CUDA
    if (dev == SQ_DEVICE_CUDA) trellis_cuda_mem_info(&gpu_free, &gpu_total);
#endif
    const sq_model_config *c = sq_model_cfg(m);
    const int V = (int)c->vocab_size;
    int32_t *toks = malloc((size_t)(n_prompt + n_decode) * 4);
    for (int i = 0; i < n_prompt + n_decode; i++) toks[i] = (int32_t)((i * 2654435761u) % (unsigned)V);
    float *lg = malloc((size_t)V * 4);

    /* bytes one decoded token reads */
    uint64_t per_tok = 0;
    for (int L = 0; L < c->num_hidden_layers; L++) {
        /* every slot once; a routed expert's slots top_k times */
        const sq_layer_desc *d = sq_model_layer_desc(m, L);
        for (int s = 0; s < d->n_slots; s++) {
            const int k = d->slot[s].role == SQ_ROLE_EXPERT ? (int)c->num_experts_per_tok : 1;
            per_tok += (uint64_t)k * lin_bytes(sq_model_linear(m, L, s, 0));
        }
    }
    per_tok += lin_bytes(sq_model_head_linear(m)) + (uint64_t)c->hidden_size * 2; /* + one bf16 embedding row */
    const double kv_row = 2.0 * c->num_hidden_layers * c->num_key_value_heads * c->head_dim * 4;

    double best_pf = 0, best_dc = 0;
    for (int r = 0; r < reps; r++) {
        sq_model_seq_reset(m, 0);
        double t0 = sparq_now();
        if (sq_model_forward(m, 0, toks, n_prompt, SQ_LOGITS_LAST, lg) != SPARQ_OK) {
            fprintf(stderr, "prefill: %s\n", sparq_errmsg());
            return 1;
        }
        double t1 = sparq_now();
        for (int i = 0; i < n_decode; i++) sq_model_forward(m, 0, toks + n_prompt + i, 1, SQ_LOGITS_LAST, lg);
        double t2 = sparq_now();
        best_pf = fmax(best_pf, n_prompt / (t1 - t0));
        best_dc = fmax(best_dc, n_decode / (t2 - t1));
    }
    const double kv_read = kv_row * (n_prompt + n_decode / 2.0);
    const double bytes_tok = (double)per_tok + kv_read;
    const bool host = dev == SQ_DEVICE_CPU;
    const double bw = host ? measure_bandwidth(sq_model_exec(m)->pool, (size_t)bw_mib) : 0;
    double gemv_bps = 0;
    if (gemv_n > 0 && host) {
        /* a bf16 N×N weight (N² × 2 bytes), one input row */
        size_t nn = (size_t)gemv_n * gemv_n;
        uint16_t *w = sparq_aligned_alloc(64, nn * 2);
        float *x = malloc((size_t)gemv_n * 4), *y = malloc((size_t)gemv_n * 4);
        if (w && x && y) {
            for (size_t i = 0; i < nn; i++) w[i] = (uint16_t)(0x3C00 + (i & 0xFF));
            for (int i = 0; i < gemv_n; i++) x[i] = 1.0f / (float)(i + 1);
            sq_linear l = {SQ_LINEAR_BF16, gemv_n, gemv_n, w, NULL, NULL, NULL, "bench"};
            for (int r = 0; r < 10; r++) {
                double t0 = sparq_now();
                sq_linear_forward(sq_model_exec(m), &l, x, 1, y);
                double dt = sparq_now() - t0;
                gemv_bps = fmax(gemv_bps, (double)nn * 2 / dt);
            }
        }
        sparq_aligned_free(w);
        free(x);
        free(y);
    }
    sq_model_mem mm;
    sq_model_mem_report(m, &mm);
    bool finite = true;
    for (int i = 0; i < V; i++) finite &= isfinite(lg[i]) != 0;
    printf("model %s\n", argv[1]);
    printf("device %s\n", sq_model_exec(m)->be->name);
    printf("threads %d\n", sq_model_exec(m)->n_threads);
    printf("load_s %.2f\n", load_s);
    printf("bytes weights %llu kv %llu workspace %llu (plan: kv %llu workspace %llu)\n",
           (unsigned long long)mm.weights, (unsigned long long)mm.kv, (unsigned long long)mm.workspace,
           (unsigned long long)mm.plan_kv, (unsigned long long)mm.plan_workspace);
    printf("logits_finite %s\n", finite ? "yes" : "NO");
    if (mm.device_plan)
        printf("device_bytes planned %llu used %llu (used / planned %.3f; used / (weights + kv + the model's "
               "workspace) %.3f, the rest the backend's planned workspace: prefill scratch, cuBLAS, staging)\n",
               (unsigned long long)mm.device_plan, (unsigned long long)mm.device_used,
               (double)mm.device_used / (double)mm.device_plan,
               (double)mm.device_used / (double)(mm.weights + mm.kv + mm.workspace));
    if (gpu_total)
        printf("gpu_bytes_loaded %zu (in use %zu before the load, %zu after, of %zu)\n", gpu_free0 - gpu_free,
               gpu_total - gpu_free0, gpu_total - gpu_free, gpu_total);
    printf("prefill_tokens %d\nprefill_tok_s %.1f\n", n_prompt, best_pf);
    printf("decode_tokens %d\ndecode_tok_s %.1f\n", n_decode, best_dc);
    uint64_t g_cap, g_rep;
    sq_model_graph_counts(m, &g_cap, &g_rep);
    if (g_cap || g_rep) printf("graph_steps captured %llu replayed %llu\n", (unsigned long long)g_cap, (unsigned long long)g_rep);
    printf("decode_bytes_per_token %.0f (weights %llu, kv %.0f)\n", bytes_tok, (unsigned long long)per_tok, kv_read);
    printf("decode_bytes_s %.3g\n", bytes_tok * best_dc);
    if (host) printf("memory_bw_bytes_s %.3g (streaming read of %d MiB, best of 5)\n", bw, bw_mib);
    if (host) printf("decode_fraction_of_bw %.3f\n", bw > 0 ? bytes_tok * best_dc / bw : 0.0);
    if (gemv_n > 0 && host)
        printf("gemv_bf16_%dx%d_bytes_s %.3g\ngemv_fraction_of_bw %.3f\n", gemv_n, gemv_n, gemv_bps,
               bw > 0 ? gemv_bps / bw : 0.0);
    int bad = finite ? 0 : 1;
    if (compare > 0 && !host) bad |= compare_cpu(m, argv[1], &o, toks, n_prompt, compare);
    if (users > 0) bad |= bench_users(m, users, toks, n_prompt, n_decode, reps);
    free(toks);
    free(lg);
    sq_model_free(m);
    return bad;
}
