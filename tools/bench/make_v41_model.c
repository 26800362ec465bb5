/* tools/bench/make_v41_model.c — write a random-weight DeepSeek V4.1 Flash
 * checkpoint in the native release layout at any shape, so plan, inspect,
 * run and quantize can be exercised at the sizes users have without a
 * download (and, with --sparse, at full size without the disk).
 *
 *   make_v41_model OUT [--preset real|q128|qtest] [--layers N] [--hidden N] [--heads N]
 *                  [--experts N] [--topk N] [--inter N] [--vocab N] [--tokenizer DIR]
 *                  [--sparse] [--shard-mb N] [--seed N]
 *
 * What it writes is what the released folder has (reference.md §3.1/3.2,
 * tools/fixtures/dsv41/make_tiny.py for the small fixture made the same way):
 * config.json with the release's keys (preset real: the released config
 * byte for byte, tests/data/deepseek-v41/config.json), safetensors shards
 * with model.safetensors.index.json, DeepSeek's tensor names and dtypes:
 * dense linears FP8-E4M3 + `.scale` F8_E8M0 of 32×32 blocks, routed experts
 * FP4-E2M1 two per I8 byte (low nibble = even column) + F8_E8M0 per row
 * group of 32, Engram tables FP8 + per-row-group scales, BF16 norms,
 * embedding, head, router, compressor and indexer projections, F32 hc_*,
 * attention sinks, router biases and Engram q/k weights. Not written: the
 * MTP stages (mtp.*; preset qtest writes one tensor of them) and the vision
 * tower, which sparq skips.
 *
 * Values: each linear is N(0, σ²)-like with σ = c/√fan_in, so every sublayer
 * output is O(1) whatever the shape; the UE8M0 block exponent is the
 * smallest that holds the block's bound (the generator is bounded by 2√3σ)
 * raised by 0..2 at random per block, so blocks carry different scale bytes
 * and a misindexed scale shows. No E4M3 NaN code (0x7F/0xFF) and no scale
 * byte 255 is ever written.
 *
 * Presets: real = DeepSeek-V4.1-Flash (40 layers, hidden 5120, 384 experts ×
 * 2304 top-6, Engram tables of 384M rows: 750 GB, use --sparse); q128 = a
 * 16-layer model of hidden 128 whose every linear is quantizable (head_dim
 * 128 with rope 32, q/o lora 128, 2 output groups, 4 heads, 8 experts of 128
 * top-2 + 1 shared, indexer 4 × 32) with the layer kinds of
 * tests/data/tiny-dsv41 (compress ratios 0/2/1, kv sources 2, 6, 10, index
 * sources 2, 6, 10, 12, 14, candidates from 10, Engram on layers 1 and 14
 * with 14,032 and 17,774 rows of 32) and the real vocabulary (129,280);
 * qtest = the 3-layer fixture of sparq quantize's V4.1 test (preset_qtest
 * says what it covers: FP8 router and head, an mtp.0 tensor, vocabulary 256).
 * --layers trims (or extends, repeating the last layer's kind) the layer
 * lists; the other overrides change one size.
 * --sparse writes every header and leaves the tensor data a hole (ftruncate):
 * the files have their full size and cost ~no disk; reading a tensor's
 * values gives zeros. --tokenizer DIR copies DIR/tokenizer.json and
 * DIR/tokenizer_config.json beside the model. Deterministic by --seed. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/half.h"
#include "common/progress.h"
#include "formats/safetensors.h"
#include "tools/bench/model_writer.h"

#define MAX_LAYERS 256

typedef struct v41_shape {
    int layers, hidden, heads, head_dim, rope, q_lora, o_lora, o_groups;
    int experts, topk, inter, idx_heads, idx_dim, idx_topk, window, cand_blocks, cand_size;
    int max_pos, rope_orig;
    int ratio[MAX_LAYERS];
    bool kv[MAX_LAYERS], index[MAX_LAYERS];
    int candidate;                   /* -1: none */
    int vocab;
    bool fp8_router, fp8_head;       /* FP8 + block scales instead of the release's BF16 (preset qtest) */
    bool mtp;                        /* one mtp.0.* tensor, which sparq skips (preset qtest) */
    float head_c;                    /* the head's σ·√hidden: logits of deviation ~head_c */
    int engram_layer[2], n_engram;   /* the layers of the tables (in order) */
    int ehd;                         /* engram_head_dim */
    long long evocab;                /* engram_vocab_size */
    unsigned long long erows[2];     /* engram_num_embeddings */
} v41_shape;

static void preset_real(v41_shape *s)
{
    memset(s, 0, sizeof *s);
    *s = (v41_shape){.layers = 40, .hidden = 5120, .heads = 64, .head_dim = 512, .rope = 64, .q_lora = 1280,
                     .o_lora = 1024, .o_groups = 8, .experts = 384, .topk = 6, .inter = 2304, .idx_heads = 32,
                     .idx_dim = 128, .idx_topk = 512, .window = 128, .cand_blocks = 2048, .cand_size = 8,
                     .max_pos = 1048576, .rope_orig = 65536, .candidate = 20, .engram_layer = {1, 14},
                     .n_engram = 2, .ehd = 256, .evocab = 16000000, .erows = {384006168ull, 384016682ull}};
    s->vocab = 129280;
    s->head_c = 2.8f;
    for (int L = 0; L < 40; L++) s->ratio[L] = L < 2 ? 0 : L < 20 ? 2 : 1;
    for (int L = 2; L <= 20; L += 6) s->kv[L] = s->index[L] = true;
    for (int L = 24; L <= 36; L += 4) s->index[L] = true;
}

static void preset_q128(v41_shape *s)
{
    memset(s, 0, sizeof *s);
    *s = (v41_shape){.layers = 16, .hidden = 128, .heads = 4, .head_dim = 128, .rope = 32, .q_lora = 128,
                     .o_lora = 128, .o_groups = 2, .experts = 8, .topk = 2, .inter = 128, .idx_heads = 4,
                     .idx_dim = 32, .idx_topk = 8, .window = 16, .cand_blocks = 4, .cand_size = 4, .max_pos = 4096,
                     .rope_orig = 256, .candidate = 10, .engram_layer = {1, 14}, .n_engram = 2, .ehd = 32,
                     .evocab = 500, .erows = {14032ull, 17774ull}};
    s->vocab = 129280;
    s->head_c = 2.8f;
    for (int L = 0; L < 16; L++) s->ratio[L] = L < 2 ? 0 : L < 10 ? 2 : 1;
    s->kv[2] = s->kv[6] = s->kv[10] = true;
    s->index[2] = s->index[6] = s->index[10] = s->index[12] = s->index[14] = true;
}

/* The fixture of sparq quantize's V4.1 test (tests/quantize/test_v41.c): 3
 * layers of compress ratios 0, 2, 2 (layer 1 the kv, index and candidate
 * source whose pool and selection layer 2 reads), every linear 128 wide (2
 * heads, 2 experts top-2 + 1 shared), no Engram (its hash needs the layers 1
 * and 14 and the real vocabulary), vocabulary 256 (a byte tokenizer), the
 * router and head FP8 with block scales and one mtp.0 tensor, so that the
 * test sees FP8 tensors kept byte-exact beside quantized ones and a dropped
 * stage. */
static void preset_qtest(v41_shape *s)
{
    memset(s, 0, sizeof *s);
    *s = (v41_shape){.layers = 3, .hidden = 128, .heads = 2, .head_dim = 128, .rope = 64, .q_lora = 128,
                     .o_lora = 128, .o_groups = 2, .experts = 2, .topk = 2, .inter = 128, .idx_heads = 2,
                     .idx_dim = 64, .idx_topk = 8, .window = 16, .cand_blocks = 4, .cand_size = 4, .max_pos = 4096,
                     .rope_orig = 256, .candidate = 1, .vocab = 256, .fp8_router = true, .fp8_head = true,
                     .mtp = true, .head_c = 1.0f, .ehd = 32, .evocab = 500};
    s->ratio[1] = s->ratio[2] = 2;
    s->kv[1] = s->index[1] = true;
}

/* Trim or extend the layer lists to n layers: sources, candidates and Engram
 * layers past the end go (the hash knows only the release's two Engram layers,
 * so losing one drops both); new layers repeat the last one's ratio and read
 * the sources before them. */
static void set_layers(v41_shape *s, int n)
{
    for (int L = s->layers; L < n; L++) {
        s->ratio[L] = s->ratio[s->layers - 1];
        s->kv[L] = s->index[L] = false;
    }
    for (int L = n; L < MAX_LAYERS; L++) s->ratio[L] = 0, s->kv[L] = s->index[L] = false;
    if (s->candidate >= n) s->candidate = -1;
    if (s->n_engram && s->engram_layer[s->n_engram - 1] >= n) s->n_engram = 0;
    s->layers = n;
}

/* --- values ----------------------------------------------------------------------- */

/* Nearest FP8-E4M3 code of x (|x| <= 448; the NaN codes are never produced). */
static uint8_t e4m3_of(float x)
{
    const uint8_t sign = x < 0 ? 0x80 : 0;
    float a = fabsf(x);
    if (!(a > 0)) return sign;
    int p;
    (void)frexpf(a, &p); /* a = m·2^p, m in [0.5, 1): the leading bit is 2^(p-1) */
    p -= 1;
    unsigned code;
    if (p < -6) { /* subnormal: steps of 2^-9 */
        const long q = lrintf(ldexpf(a, 9));
        code = (unsigned)q; /* q == 8 is the smallest normal, 0x08, as it should be */
    } else {
        long q = lrintf(ldexpf(a, 3 - p)); /* 8..16 */
        if (q == 16) q = 8, p++;
        code = p + 7 > 15 ? 0x7E : (unsigned)((p + 7) << 3 | (q - 8));
    }
    if (code > 0x7E) code = 0x7E;
    return (uint8_t)(sign | code);
}

/* Nearest FP4-E2M1 code (sign in bit 3) of x (|x| <= 6). */
static uint8_t e2m1_of(float x)
{
    static const float lv[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float a = fabsf(x);
    int best = 0;
    for (int i = 1; i < 8; i++)
        if (fabsf(a - lv[i]) < fabsf(a - lv[best])) best = i;
    return (uint8_t)(best | (x < 0 && best ? 8 : 0));
}

/* The smallest exponent e with bound·σ / 2^e <= fmax. */
static int exp_for(float sd, float fmax)
{
    return (int)ceilf(log2f(2.0f * 1.7320508f * sd / fmax));
}

/* UE8M0 byte of exponent e raised by 0..2 at random. */
static int block_exp(int e) { return e + (int)(mw_rnd() % 3); }

static uint8_t ue8m0(int e)
{
    if (e < -127) e = -127;
    if (e > 127) e = 127; /* never 255 */
    return (uint8_t)(e + 127);
}

typedef struct gen {
    mw_job *j;
    bool sparse;
} gen;

/* Heap buffer of n bytes, or NULL on a sparse job (the tensor becomes a hole). */
static sparq_status buf(const gen *g, uint64_t n, void **out)
{
    *out = NULL;
    if (g->sparse || !n) return SPARQ_OK;
    RETURN_IF(n > SIZE_MAX, SPARQ_E_RANGE, "tensor of %llu bytes", (unsigned long long)n);
    *out = sparq_malloc((size_t)n);
    RETURN_IF(!*out, SPARQ_E_NOMEM, "out of memory (%llu bytes)", (unsigned long long)n);
    return SPARQ_OK;
}

static sparq_status put(const gen *g, const char *name, sf_dtype dt, int ndim, uint64_t d0, uint64_t d1, void *data,
                        uint64_t nbytes)
{
    const uint64_t sh[2] = {d0, d1};
    return mw_add(g->j, name, dt, ndim, sh, data, nbytes);
}

/* BF16 [d0] or [d0, d1] of mean + N(0, sd²). */
static sparq_status bf16(const gen *g, const char *name, uint64_t d0, uint64_t d1, float mean, float sd)
{
    const uint64_t n = d0 * (d1 ? d1 : 1);
    uint16_t *b;
    FORWARD_IF(buf(g, n * 2, (void **)&b));
    for (uint64_t i = 0; b && i < n; i++) b[i] = sparq_f32_to_bf16(mean + (sd > 0 ? mw_gauss(sd) : 0.0f));
    return put(g, name, SF_BF16, d1 ? 2 : 1, d0, d1, b, n * 2);
}

/* F32 [d0] or [d0, d1] of mean + N(0, sd²). */
static sparq_status f32(const gen *g, const char *name, uint64_t d0, uint64_t d1, float mean, float sd)
{
    const uint64_t n = d0 * (d1 ? d1 : 1);
    float *f;
    FORWARD_IF(buf(g, n * 4, (void **)&f));
    for (uint64_t i = 0; f && i < n; i++) f[i] = mean + mw_gauss(sd);
    return put(g, name, SF_F32, d1 ? 2 : 1, d0, d1, f, n * 4);
}

/* F32 [n] uniform in [lo, hi]. */
static sparq_status f32_uniform(const gen *g, const char *name, uint64_t n, float lo, float hi)
{
    float *f;
    FORWARD_IF(buf(g, n * 4, (void **)&f));
    for (uint64_t i = 0; f && i < n; i++) f[i] = lo + (hi - lo) * (float)((double)(mw_rnd() >> 11) / 9007199254740992.0);
    return put(g, name, SF_F32, 1, n, 0, f, n * 4);
}

/* Dense FP8 `base`.weight [rows, cols] + `base`.scale [⌈rows/32⌉, ⌈cols/32⌉]. */
static sparq_status fp8(const gen *g, const char *base, uint64_t rows, uint64_t cols, float sd)
{
    char name[256];
    const uint64_t br = (rows + 31) / 32, bc = (cols + 31) / 32;
    uint8_t *w, *s;
    FORWARD_IF(buf(g, rows * cols, (void **)&w));
    FORWARD_IF(buf(g, br * bc, (void **)&s));
    if (w) {
        const int e = exp_for(sd, 448.0f);
        for (uint64_t b = 0; b < br * bc; b++) s[b] = ue8m0(block_exp(e));
        for (uint64_t r = 0; r < rows; r++)
            for (uint64_t c = 0; c < cols; c++)
                w[r * cols + c] = e4m3_of(ldexpf(mw_gauss(sd), 127 - s[(r / 32) * bc + c / 32]));
    }
    snprintf(name, sizeof name, "%s.weight", base);
    sparq_status st = put(g, name, SF_F8_E4M3, 2, rows, cols, w, rows * cols);
    if (st != SPARQ_OK) {
        sparq_free(s);
        return st;
    }
    snprintf(name, sizeof name, "%s.scale", base);
    return put(g, name, SF_F8_E8M0, 2, br, bc, s, br * bc);
}

/* Per-row groups of 32: FP4 experts (I8 [rows, cols/2]) or FP8 tables (F8_E4M3 [rows, cols]),
 * with `base`.scale F8_E8M0 [rows, cols/32]. */
static sparq_status grouped(const gen *g, const char *base, uint64_t rows, uint64_t cols, float sd, bool fp4)
{
    char name[256];
    const uint64_t G = cols / 32, wbytes = fp4 ? rows * cols / 2 : rows * cols;
    uint8_t *w, *s;
    FORWARD_IF(buf(g, wbytes, (void **)&w));
    FORWARD_IF(buf(g, rows * G, (void **)&s));
    if (w) {
        const int e = exp_for(sd, fp4 ? 6.0f : 448.0f);
        for (uint64_t i = 0; i < rows * G; i++) s[i] = ue8m0(fp4 ? e + (int)(mw_rnd() % 2) : block_exp(e));
        for (uint64_t r = 0; r < rows; r++)
            for (uint64_t c = 0; c < cols; c += 2) {
                const int sh = 127 - s[r * G + c / 32];
                const float a = ldexpf(mw_gauss(sd), sh), b = ldexpf(mw_gauss(sd), sh);
                if (fp4) {
                    w[(r * cols + c) / 2] = (uint8_t)(e2m1_of(a) | e2m1_of(b) << 4);
                } else {
                    w[r * cols + c] = e4m3_of(a);
                    w[r * cols + c + 1] = e4m3_of(b);
                }
            }
    }
    snprintf(name, sizeof name, "%s.weight", base);
    sparq_status st = put(g, name, fp4 ? SF_I8 : SF_F8_E4M3, 2, rows, fp4 ? cols / 2 : cols, w, wbytes);
    if (st != SPARQ_OK) {
        sparq_free(s);
        return st;
    }
    snprintf(name, sizeof name, "%s.scale", base);
    return put(g, name, SF_F8_E8M0, 2, rows, G, s, rows * G);
}

/* --- the checkpoint ------------------------------------------------------------------ */

static float isq(uint64_t n) { return 1.0f / sqrtf((float)n); }

static sparq_status layer(const gen *g, const v41_shape *s, int L)
{
    char k[256];
    const uint64_t d = (uint64_t)s->hidden, hc = 4, mix = (2 + hc) * hc, hd = (uint64_t)s->head_dim;
    const uint64_t nh = (uint64_t)s->heads, qr = (uint64_t)s->q_lora, G = (uint64_t)s->o_groups;
    const uint64_t ol = (uint64_t)s->o_lora, I = (uint64_t)s->inter, E = (uint64_t)s->experts;
#define K(...) (snprintf(k, sizeof k, __VA_ARGS__), k)
    FORWARD_IF(bf16(g, K("layers.%d.attn_norm.weight", L), d, 0, 1.0f, 0.05f));
    FORWARD_IF(bf16(g, K("layers.%d.ffn_norm.weight", L), d, 0, 1.0f, 0.05f));
    static const char *const which[2] = {"attn", "ffn"};
    for (int w = 0; w < 2; w++) {
        FORWARD_IF(f32(g, K("layers.%d.hc_%s_fn", L, which[w]), mix, hc * d, 0.0f, 0.48f * isq(hc * d)));
        FORWARD_IF(f32(g, K("layers.%d.hc_%s_base", L, which[w]), mix, 0, 0.0f, 0.5f));
        FORWARD_IF(f32_uniform(g, K("layers.%d.hc_%s_scale", L, which[w]), 3, 0.3f, 1.0f));
    }
    FORWARD_IF(fp8(g, K("layers.%d.attn.wq_a", L), qr, d, isq(d)));
    FORWARD_IF(bf16(g, K("layers.%d.attn.q_norm.weight", L), qr, 0, 1.0f, 0.05f));
    FORWARD_IF(fp8(g, K("layers.%d.attn.wq_b", L), nh * hd, qr, 1.2f * isq(qr)));
    FORWARD_IF(fp8(g, K("layers.%d.attn.wkv", L), hd, d, isq(d)));
    FORWARD_IF(bf16(g, K("layers.%d.attn.kv_norm.weight", L), hd, 0, 1.0f, 0.05f));
    FORWARD_IF(fp8(g, K("layers.%d.attn.wo_a", L), G * ol, nh * hd / G, isq(nh * hd / G)));
    FORWARD_IF(fp8(g, K("layers.%d.attn.wo_b", L), d, G * ol, isq(G * ol)));
    FORWARD_IF(f32(g, K("layers.%d.attn.attn_sink", L), nh, 0, 0.0f, 0.5f));
    const int r = s->ratio[L];
    if (r && s->kv[L]) {
        FORWARD_IF(bf16(g, K("layers.%d.attn.compressor.wkv.weight", L), hd, d, 0.0f, isq(d)));
        if (r > 1) FORWARD_IF(bf16(g, K("layers.%d.attn.compressor.wgate.weight", L), hd, d, 0.0f, isq(d)));
        FORWARD_IF(bf16(g, K("layers.%d.attn.compressor.norm.weight", L), hd, 0, 1.0f, 0.05f));
    }
    if (r && s->index[L]) {
        const uint64_t ih = (uint64_t)s->idx_heads, id = (uint64_t)s->idx_dim;
        FORWARD_IF(fp8(g, K("layers.%d.attn.indexer.wq_b", L), ih * id, qr, isq(qr)));
        FORWARD_IF(bf16(g, K("layers.%d.attn.indexer.weights_proj.weight", L), ih, d, 0.0f, isq(d)));
        if (s->kv[L]) {
            FORWARD_IF(bf16(g, K("layers.%d.attn.indexer.wk.weight", L), id, hd, 0.0f, isq(hd)));
            FORWARD_IF(bf16(g, K("layers.%d.attn.indexer.k_norm.weight", L), id, 0, 1.0f, 0.05f));
        }
    }
    if (s->fp8_router) FORWARD_IF(fp8(g, K("layers.%d.ffn.gate", L), E, d, 2.4f * isq(d)));
    else FORWARD_IF(bf16(g, K("layers.%d.ffn.gate.weight", L), E, d, 0.0f, 2.4f * isq(d)));
    FORWARD_IF(f32(g, K("layers.%d.ffn.gate.bias", L), E, 0, 0.0f, 0.1f));
    FORWARD_IF(f32(g, K("layers.%d.ffn.gate.bias_vl", L), E, 0, 0.0f, 0.1f));
    for (uint64_t e = 0; e < E; e++) {
        FORWARD_IF(grouped(g, K("layers.%d.ffn.experts.%llu.w1", L, (unsigned long long)e), I, d, isq(d), true));
        FORWARD_IF(grouped(g, K("layers.%d.ffn.experts.%llu.w3", L, (unsigned long long)e), I, d, isq(d), true));
        FORWARD_IF(grouped(g, K("layers.%d.ffn.experts.%llu.w2", L, (unsigned long long)e), d, I, isq(I), true));
    }
    FORWARD_IF(fp8(g, K("layers.%d.ffn.shared_experts.w1", L), I, d, isq(d)));
    FORWARD_IF(fp8(g, K("layers.%d.ffn.shared_experts.w3", L), I, d, isq(d)));
    FORWARD_IF(fp8(g, K("layers.%d.ffn.shared_experts.w2", L), d, I, isq(I)));
    for (int t = 0; t < s->n_engram; t++) {
        if (s->engram_layer[t] != L) continue;
        const uint64_t in = 24 * (uint64_t)s->ehd;
        FORWARD_IF(grouped(g, K("layers.%d.engram.embed", L), s->erows[t], (uint64_t)s->ehd, 0.5f, false));
        FORWARD_IF(fp8(g, K("layers.%d.engram.wkv", L), (hc + 1) * d, in, 1.4f * isq(in)));
        FORWARD_IF(f32(g, K("layers.%d.engram.q_weight", L), hc, d, 1.0f, 0.1f));
        FORWARD_IF(f32(g, K("layers.%d.engram.k_weight", L), hc, d, 1.0f, 0.1f));
    }
#undef K
    return SPARQ_OK;
}

/* --- config.json, in the release's key order and layout -------------------------------- */

typedef struct text {
    char *p;
    size_t n, cap;
} text;

static void tput(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tput(text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    const int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->n + (size_t)n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8192;
        while (cap < t->n + (size_t)n + 1) cap *= 2;
        char *p = sparq_realloc(t->p, cap);
        if (!p) abort(); /* a tool: the config is a few kB */
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->n, tmp, (size_t)n + 1);
    t->n += (size_t)n;
}

/* A list as Python's json.dump(indent=2) writes it inside text_config. */
static void tlist(text *t, const char *key, const long long *v, int n, bool last)
{
    tput(t, "    \"%s\": [", key);
    for (int i = 0; i < n; i++) tput(t, "%s\n      %lld", i ? "," : "", v[i]);
    tput(t, n ? "\n    ]%s\n" : "]%s\n", last ? "" : ",");
}

static char *config_json(const v41_shape *s)
{
    const int vocab = s->vocab;
    text t = {0};
    long long v[MAX_LAYERS];
    int n;
    tput(&t, "{\n  \"architectures\": [\n    \"DeepseekV41ForCausalLM\"\n  ],\n  \"model_type\": \"deepseek_v41\",\n"
             "  \"text_config\": {\n    \"model_type\": \"deepseek_v41\",\n");
    tput(&t, "    \"vocab_size\": %d,\n    \"hidden_size\": %d,\n    \"num_hidden_layers\": %d,\n", vocab, s->hidden,
         s->layers);
    tput(&t, "    \"num_attention_heads\": %d,\n    \"num_key_value_heads\": 1,\n    \"head_dim\": %d,\n", s->heads,
         s->head_dim);
    tput(&t, "    \"qk_rope_head_dim\": %d,\n    \"q_lora_rank\": %d,\n    \"o_groups\": %d,\n    \"o_lora_rank\": %d,\n",
         s->rope, s->q_lora, s->o_groups, s->o_lora);
    tput(&t, "    \"rms_norm_eps\": 1e-20,\n    \"rope_theta\": 10000.0,\n    \"compress_rope_theta\": 160000.0,\n"
             "    \"rope_scaling\": {\n      \"rope_type\": \"yarn\",\n      \"factor\": 16,\n      \"beta_fast\": 32,\n"
             "      \"beta_slow\": 1,\n      \"original_max_position_embeddings\": %d\n    },\n", s->rope_orig);
    tput(&t, "    \"max_position_embeddings\": %d,\n    \"sliding_window\": %d,\n", s->max_pos, s->window);
    for (int L = 0; L < s->layers; L++) v[L] = s->ratio[L];
    tlist(&t, "compress_ratios", v, s->layers, false);
    n = 0;
    for (int L = 0; L < s->layers; L++)
        if (s->kv[L]) v[n++] = L;
    tlist(&t, "kv_source_layer_ids", v, n, false);
    n = 0;
    for (int L = 0; L < s->layers; L++)
        if (s->index[L]) v[n++] = L;
    tlist(&t, "index_source_layer_ids", v, n, false);
    tput(&t, "    \"index_n_heads\": %d,\n    \"index_head_dim\": %d,\n    \"index_topk\": %d,\n", s->idx_heads,
         s->idx_dim, s->idx_topk);
    tput(&t, "    \"candidate_source_layer_id\": %d,\n    \"candidate_topk_blocks\": %d,\n"
             "    \"candidate_block_size\": %d,\n", s->candidate, s->cand_blocks, s->cand_size);
    tput(&t, "    \"hc_mult\": 4,\n    \"hc_sinkhorn_iters\": 20,\n    \"hc_eps\": 1e-06,\n");
    tput(&t, "    \"n_routed_experts\": %d,\n    \"n_shared_experts\": 1,\n    \"num_experts_per_tok\": %d,\n"
             "    \"moe_intermediate_size\": %d,\n", s->experts, s->topk, s->inter);
    tput(&t, "    \"scoring_func\": \"sqrtsoftplus\",\n    \"topk_method\": \"noaux_tc\",\n"
             "    \"norm_topk_prob\": true,\n    \"routed_scaling_factor\": 1.5,\n    \"swiglu_limit\": 10.0,\n"
             "    \"num_nextn_predict_layers\": 3,\n");
    for (int i = 0; i < s->n_engram; i++) v[i] = s->engram_layer[i];
    tlist(&t, "engram_layer_ids", v, s->n_engram, false);
    tput(&t, "    \"engram_max_ngram_size\": 4,\n    \"engram_n_heads\": 8,\n    \"engram_head_dim\": %d,\n"
             "    \"engram_vocab_size\": %lld,\n", s->ehd, s->evocab);
    for (int i = 0; i < s->n_engram; i++) v[i] = (long long)s->erows[i];
    tlist(&t, "engram_num_embeddings", v, s->n_engram, false);
    tput(&t, "    \"engram_pad_token_id\": 2,\n    \"engram_compressed_vocab_size\": 99092,\n"
             "    \"tie_word_embeddings\": false\n  },\n");
    tput(&t, "  \"vision_config\": {\n    \"model_type\": \"deepseek_v41_vision\"\n  },\n"
             "  \"bos_token_id\": 0,\n  \"eos_token_id\": 1,\n  \"pad_token_id\": 2,\n"
             "  \"torch_dtype\": \"bfloat16\",\n");
    tput(&t, "  \"quantization_config\": {\n    \"quant_method\": \"fp8\",\n    \"fmt\": \"e4m3\",\n"
             "    \"weight_block_size\": [\n      32,\n      32\n    ],\n    \"scale_fmt\": \"ue8m0\",\n"
             "    \"activation_scheme\": \"dynamic\",\n    \"expert_dtype\": \"fp4\"\n  }\n}\n");
    return t.p;
}

static sparq_status copy_file(const char *from_dir, const char *out, const char *file, bool required)
{
    char *src = sparq_path_join(from_dir, file);
    RETURN_IF(!src, SPARQ_E_NOMEM, "out of memory");
    if (!required && !sparq_path_exists(src)) {
        sparq_free(src);
        return SPARQ_OK;
    }
    char *data = NULL;
    size_t n = 0;
    sparq_status st = sparq_file_read_all(src, 0, &data, &n);
    sparq_free(src);
    if (st == SPARQ_OK) {
        char *dst = sparq_path_join(out, file);
        st = dst ? sparq_file_write_atomic(dst, data, n) : sparq_err(SPARQ_E_NOMEM, "out of memory");
        sparq_free(dst);
    }
    sparq_free(data);
    return st;
}

static sparq_status make(mw_job *j, const v41_shape *s)
{
    const int vocab = s->vocab;
    const gen g = {j, j->sparse};
    const uint64_t d = (uint64_t)s->hidden;
    sparq_progress pb;
    sparq_progress_begin(&pb, "make_v41_model", (uint64_t)s->layers + 2, SPARQ_PROGRESS_ITEMS);
    sparq_progress_set_unit_name(&pb, "layers");
    FORWARD_IF(bf16(&g, "embed.weight", (uint64_t)vocab, d, 0.0f, 1.0f));
    sparq_progress_add(&pb, 1);
    for (int L = 0; L < s->layers; L++) {
        FORWARD_IF(layer(&g, s, L));
        sparq_progress_add(&pb, 1);
    }
    FORWARD_IF(bf16(&g, "norm.weight", d, 0, 1.0f, 0.05f));
    if (s->fp8_head) FORWARD_IF(fp8(&g, "head", (uint64_t)vocab, d, s->head_c * isq(d)));
    else FORWARD_IF(bf16(&g, "head.weight", (uint64_t)vocab, d, 0.0f, s->head_c * isq(d)));
    if (s->mtp) FORWARD_IF(bf16(&g, "mtp.0.norm.weight", d, 0, 1.0f, 0.0f));
    sparq_progress_add(&pb, 1);
    sparq_progress_end(&pb);
    char *cfg = config_json(s);
    sparq_status st = mw_write_text(j->out, "config.json", cfg);
    sparq_free(cfg);
    return st;
}

static void usage(void)
{
    fprintf(stderr, "usage: make_v41_model OUT [--preset real|q128|qtest] [--layers N] [--hidden N] [--heads N] "
                    "[--experts N] [--topk N] [--inter N] [--vocab N] [--tokenizer DIR] [--sparse] "
                    "[--shard-mb N] [--seed N]\n");
}

int main(int argc, char **argv)
{
    static const char prog[] = "make_v41_model";
    v41_shape s;
    preset_real(&s);
    const char *out = NULL, *tok = NULL;
    int shard_mb = 4096, vocab = 0, layers = 0;
    bool sparse = false;
    mw_seed(1);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--preset") && i + 1 < argc) {
            const char *p = argv[++i];
            if (!strcmp(p, "q128")) preset_q128(&s);
            else if (!strcmp(p, "qtest")) preset_qtest(&s);
            else if (!strcmp(p, "real")) preset_real(&s);
            else {
                fprintf(stderr, "%s: unknown preset '%s' (real, q128, qtest)\n", prog, p);
                return 2;
            }
        } else if (!strcmp(a, "--layers")) layers = mw_arg_int(prog, argc, argv, &i, 1, MAX_LAYERS);
        else if (!strcmp(a, "--hidden")) s.hidden = mw_arg_int(prog, argc, argv, &i, 32, 65536);
        else if (!strcmp(a, "--heads")) s.heads = mw_arg_int(prog, argc, argv, &i, 1, 1024);
        else if (!strcmp(a, "--experts")) s.experts = mw_arg_int(prog, argc, argv, &i, 1, 65536);
        else if (!strcmp(a, "--topk")) s.topk = mw_arg_int(prog, argc, argv, &i, 1, 64);
        else if (!strcmp(a, "--inter")) s.inter = mw_arg_int(prog, argc, argv, &i, 32, 1 << 20);
        else if (!strcmp(a, "--vocab")) vocab = mw_arg_int(prog, argc, argv, &i, 3, 1 << 24);
        else if (!strcmp(a, "--shard-mb")) shard_mb = mw_arg_int(prog, argc, argv, &i, 1, 1 << 20);
        else if (!strcmp(a, "--seed")) mw_seed((uint64_t)mw_arg_int(prog, argc, argv, &i, 0, 1 << 30));
        else if (!strcmp(a, "--tokenizer") && i + 1 < argc) tok = argv[++i];
        else if (!strcmp(a, "--sparse")) sparse = true;
        else if (a[0] != '-' && !out) out = a;
        else {
            usage();
            return 2;
        }
    }
    if (layers) set_layers(&s, layers);
    if (vocab) s.vocab = vocab;
    if (!out || s.hidden % 32 || s.inter % 32 || (s.heads * s.head_dim) % s.o_groups || s.topk > s.experts) {
        fprintf(stderr, "%s: OUT missing, hidden / inter not a multiple of 32, or inconsistent heads / experts\n",
                prog);
        usage();
        return 2;
    }
    mw_job j;
    sparq_status st = mw_begin(&j, out, (uint64_t)shard_mb << 20, sparse);
    if (st == SPARQ_OK) st = make(&j, &s);
    st = mw_end(&j, st);
    if (st == SPARQ_OK && tok) st = copy_file(tok, out, "tokenizer.json", true);
    if (st == SPARQ_OK && tok) st = copy_file(tok, out, "tokenizer_config.json", false);
    if (st != SPARQ_OK) {
        fprintf(stderr, "%s: %s\n", prog, sparq_errmsg());
        return 1;
    }
    char total[32];
    sparq_format_bytes(total, sizeof total, (double)j.total_bytes);
    printf("%s: %d layers, hidden %d, %d experts top-%d of width %d, vocab %d; %s of tensors in %d shards%s\n", out,
           s.layers, s.hidden, s.experts, s.topk, s.inter, s.vocab, total, j.n_shards, sparse ? " (sparse)" : "");
    return 0;
}
