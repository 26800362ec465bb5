/* runtime/models/deepseek_v41.c — the DeepSeek V4.1 Flash graph, read from the
 * checkpoint as it ships (DeepSeek's tensor names, FP8 32×32 / FP4 experts,
 * Engram tables), and its row of the architecture table (runtime/arch.h).
 *
 * The forward, as the vendor's model.py computes it (reference.md §3.1–3.2;
 * held to an independent torch reference by tests/runtime/test_dsv41.c), fp32:
 *
 *  hyper-connections: the residual is hc = 4 streams h[s]. Each sublayer mixes
 *    mixes = fn · flat(h) · rsqrt(mean(flat(h)²) + eps), split into
 *    pre = σ(mix·scale0 + base) + hc_eps, post = 2σ(…), comb = row softmax +
 *    hc_eps then alternating column / row normalisations (Sinkhorn).
 *    Lagged: a sublayer's input collapses the streams with the `pre` of the
 *    sublayer before it (the embedding's is e0), its output is written back as
 *    h'[j] = post[j]·y + Σ_i comb[i][j]·h[i]; the last FFN's pre collapses the
 *    streams for the head.
 *  attention (MQA, one latent kv of head_dim, K = V): q = wq_b(q_norm(wq_a x))
 *    in heads, kv = kv_norm(wkv x), interleaved RoPE on the last rope_dim of
 *    each (compressing layers: compress_rope_theta with YaRN; window layers:
 *    rope_theta, no YaRN). Keys: the last `window` tokens, plus — on a layer of
 *    compress ratio r > 0 — pool entries of its kv source (the latest kv-source
 *    layer at or before it): a compressor pools each group of r tokens (softmax
 *    gate weights per channel; r = 1: one entry per token), RMSNorm, RoPE at
 *    the group's first position. Which pool entries: the indexer of the latest
 *    index-source layer scores entries t < (pos+1)/r as Σ_h relu(q_h·k_t)·w_h
 *    and keeps the top index_topk; the candidate layer keeps, per row, the
 *    top candidate_topk_blocks blocks of candidate_block_size entries (the
 *    last block always) and later index layers choose only inside them.
 *    Softmax with a per-head sink in the denominator, inverse RoPE on the
 *    output's rope part, then wo_b(concat_g wo_a[g] · o[g]) (8 groups).
 *  MoE: s = sqrt(softplus(gate x)); top-k of s + bias (bias only selects);
 *    weights s renormalised × routed_scaling_factor; experts SwiGLU with
 *    gate ≤ limit and up in ±limit; plus the shared expert.
 *  Engram (its layers, before the attention): 24 rows gathered by the n-gram
 *    hash of the compressed token ids (formats/engram.h), key/value from wkv,
 *    per stream gate σ(signed-sqrt(⟨h, q⊙k⊙key⟩ · rstd(h) · rstd(key) / √d)),
 *    h[s] += gate·value.
 *
 * The hidden row between layers (what embed writes, forward_layer changes,
 * head reads and pipeline nodes exchange) is hidden_width floats: the hc
 * streams [hc·d], the lagged pre mix [hc], the token's compressed id (exact as
 * a float) for the Engram hash, padding to 16.
 *
 * State per sequence and layer (the KV plan, v41_kv_bytes): a window ring of
 * window + max_rows latents; on kv-source layers the pool and the indexer's
 * keys, ctx / r entries each, and the compressor's partial group; the last
 * compressed ids for the hash. Rows of one step may belong to several
 * sequences; each row is processed with exactly the causal view a one-token
 * decode at its position would have, so chunked prefill, batched decode and
 * the reference's single-chunk prefill agree.
 *
 * Not here yet: the MTP stages (mtp.*) and the vision tower (vision.*) are
 * shipped in the checkpoint and skipped (sq_arch_info.skipped_prefixes); the
 * graph runs on the CPU only; a pipeline node must hold every kv / index /
 * candidate source its layers read (load refuses otherwise). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/half.h"
#include "formats/engram.h"
#include "formats/engram_vocab.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "kernels/cpu/ops.h"
#include "runtime/models/blocks.h"
#include "runtime/models/model_impl.h"

/* Engram rows in flight at once: the fetcher's pread workers (an NVMe drive
 * reaches its random-read rate at a queue depth of tens; idle workers sleep). */
#define V41_FETCH_THREADS 16

#define MUL sparq_sat_mul_u64
#define ADD sparq_sat_add_u64

/* --- the description (runtime/arch.h) ------------------------------------------ */

static bool v41_is_engram(const sq_model_config *c, int L, int *table)
{
    for (int i = 0; i < c->v41.n_engram; i++)
        if (c->v41.engram_layer[i] == L) {
            if (table) *table = i;
            return true;
        }
    return false;
}

/* The latest layer <= L with flag set, or -1. */
static int latest(const bool *flag, int L)
{
    for (int i = L; i >= 0; i--)
        if (flag[i]) return i;
    return -1;
}

/* A node may start at L when no layer from L on reads the pool, indexer keys,
 * selection or candidates of a layer before L: the caches live with their
 * source layer's node. */
static bool v41_split_ok(const sq_model_config *c, int L)
{
    const sq_v41_config *v = &c->v41;
    for (int j = L; j < c->num_hidden_layers; j++) {
        if (!v->compress_ratio[j]) continue;
        if (latest(v->kv_source, j) < L || latest(v->index_source, j) < L) return false;
        if (v->index_source[j] && v->candidate_source >= 0 && v->candidate_source < j && v->candidate_source < L)
            return false;
    }
    return true;
}

static int64_t v41_hidden_width(const sq_model_config *c)
{
    const int64_t w = (int64_t)c->v41.hc_mult * c->hidden_size + c->v41.hc_mult + 1;
    return (w + 15) / 16 * 16;
}

static int engram_cols(const sq_model_config *c) { return (c->v41.engram_max_ngram - 1) * c->v41.engram_n_heads; }

/* The Engram layout config.json implies (formats/engram.h: the one function
 * pack and the load use too) must exist and match engram_num_embeddings. */
static sparq_status check_engram(const sq_model_config *c, const char *dir)
{
    sq_engram_layout lay;
    return sq_engram_layout_from_config(&lay, c, dir);
}

static sparq_status v41_check(const sq_model_config *c, const char *dir)
{
    const sq_v41_config *v = &c->v41;
    RETURN_IF(c->hidden_size % 2 || v->hc_mult < 1 || c->num_attention_heads * c->head_dim > (1 << 22) ||
                  v->index_n_heads < 0 || (v->index_n_heads && (v->index_head_dim < v->rope_dim ||
                                                                 v->index_head_dim % 2)),
              SPARQ_E_FORMAT, "%s: config.json: inconsistent V4.1 sizes (hidden %lld, heads %lld x %lld, indexer "
              "%d x %d, rope %d)", dir, (long long)c->hidden_size, (long long)c->num_attention_heads,
              (long long)c->head_dim, v->index_n_heads, v->index_head_dim, v->rope_dim);
    for (int L = 0; L < c->num_hidden_layers; L++)
        RETURN_IF(v->kv_source[L] && !v->index_source[L], SPARQ_E_UNSUPPORTED,
                  "%s: layer %d is a kv source without an indexer; sparq reads the indexer keys from kv-source "
                  "layers that are index sources (as the release has them)", dir, L);
    return check_engram(c, dir);
}

/* Slot names (sq_layer_find looks them up; the optional ones only on some layers). */
#define N_WQA "wq_a"
#define N_WKV "wkv"
#define N_WQB "wq_b"
#define N_WOA "wo_a"
#define N_WOB "wo_b"
#define N_CWKV "compressor.wkv"
#define N_CWG "compressor.wgate"
#define N_IWQB "indexer.wq_b"
#define N_IWP "indexer.weights_proj"
#define N_IWK "indexer.wk"
#define N_GATE "gate"
#define N_W1 "experts.w1"
#define N_W3 "experts.w3"
#define N_W2 "experts.w2"
#define N_SW1 "shared_experts.w1"
#define N_SW3 "shared_experts.w3"
#define N_SW2 "shared_experts.w2"
#define N_EWKV "engram.wkv"

static sparq_status v41_layer(const sq_model_config *c, int L, sq_layer_desc *out)
{
    memset(out, 0, sizeof *out);
    const sq_v41_config *v = &c->v41;
    const int d = (int)c->hidden_size, hd = (int)c->head_dim, nh = (int)c->num_attention_heads;
    const int qr = v->q_lora_rank, G = v->o_groups, E = (int)c->num_experts, I = (int)c->moe_intermediate_size;
    const int r = v->compress_ratio[L];
    sq_lin_desc *s = out->slot;
    int n = 0;
#define SLOT(nm, key, role, in, o, inst, grp, own, q) \
    (s[n] = (sq_lin_desc){nm, key, role, in, o, inst, grp, own, q}, n++)
    const int a = n;
    SLOT(N_WQA, "layers.{L}.attn.wq_a", SQ_ROLE_ATTN, d, qr, 1, a, false, true);
    SLOT(N_WKV, "layers.{L}.attn.wkv", SQ_ROLE_ATTN, d, hd, 1, a, false, true);
    const int b = n;
    SLOT(N_WQB, "layers.{L}.attn.wq_b", SQ_ROLE_ATTN, qr, nh * hd, 1, b, false, true);
    SLOT(N_WOA, "layers.{L}.attn.wo_a", SQ_ROLE_ATTN, nh * hd / G, G * v->o_lora_rank, 1, n, false, true);
    SLOT(N_WOB, "layers.{L}.attn.wo_b", SQ_ROLE_ATTN, G * v->o_lora_rank, d, 1, n, false, true);
    if (r && v->kv_source[L]) {
        SLOT(N_CWKV, "layers.{L}.attn.compressor.wkv", SQ_ROLE_ATTN, d, hd, 1, a, false, false);
        if (r > 1) SLOT(N_CWG, "layers.{L}.attn.compressor.wgate", SQ_ROLE_ATTN, d, hd, 1, a, false, false);
    }
    if (r && v->index_source[L]) {
        SLOT(N_IWQB, "layers.{L}.attn.indexer.wq_b", SQ_ROLE_ATTN, qr, v->index_n_heads * v->index_head_dim, 1, b,
             false, false);
        SLOT(N_IWP, "layers.{L}.attn.indexer.weights_proj", SQ_ROLE_ATTN, d, v->index_n_heads, 1, a, false, false);
        if (v->kv_source[L])
            SLOT(N_IWK, "layers.{L}.attn.indexer.wk", SQ_ROLE_ATTN, hd, v->index_head_dim, 1, n, false, false);
    }
    out->moe = true;
    out->n_experts = E;
    SLOT(N_GATE, "layers.{L}.ffn.gate", SQ_ROLE_ROUTER, d, E, 1, n, false, false);
    const int e1 = n;
    SLOT(N_W1, "layers.{L}.ffn.experts.{E}.w1", SQ_ROLE_EXPERT, d, I, E, e1, false, true);
    SLOT(N_W3, "layers.{L}.ffn.experts.{E}.w3", SQ_ROLE_EXPERT, d, I, E, e1, false, true);
    SLOT(N_W2, "layers.{L}.ffn.experts.{E}.w2", SQ_ROLE_EXPERT, I, d, E, n, true, true);
    if (v->n_shared_experts > 0) {
        const int Is = I * v->n_shared_experts, s1 = n;
        SLOT(N_SW1, "layers.{L}.ffn.shared_experts.w1", SQ_ROLE_SHARED, d, Is, 1, s1, false, true);
        SLOT(N_SW3, "layers.{L}.ffn.shared_experts.w3", SQ_ROLE_SHARED, d, Is, 1, s1, false, true);
        SLOT(N_SW2, "layers.{L}.ffn.shared_experts.w2", SQ_ROLE_SHARED, Is, d, 1, n, false, true);
    }
    if (v41_is_engram(c, L, NULL))
        SLOT(N_EWKV, "layers.{L}.engram.wkv", SQ_ROLE_ENGRAM, engram_cols(c) * v->engram_head_dim,
             (v->hc_mult + 1) * d, 1, n, false, true);
#undef SLOT
    out->n_slots = n;
    return SPARQ_OK;
}

static const sq_tensor_desc v41_tensors[] = {
    {"embed.weight", SQ_PLACE_EMBED, 2, {SQ_DIM_VOCAB, SQ_DIM_HIDDEN}, false, false},
    {"norm.weight", SQ_PLACE_HEAD, 1, {SQ_DIM_HIDDEN}, false, false},
    {"head", SQ_PLACE_HEAD, 2, {SQ_DIM_VOCAB, SQ_DIM_HIDDEN}, true, true},
};

/* The quantizer's defaults (the community's two-box pack, reference.md §3.2): attention 5 bits,
 * shared experts 4, the Engram fusion 4; routed experts take --bits and the head --head-bits. The
 * kept tensors (router, norms, hc_*, attn_sink, compressor / indexer, Engram q/k and tables) are
 * the slots marked quantize = false and the tensors that are not slots. */
static const char *const v41_default_bits[] = {"layers.*.attn.*=5", "layers.*.ffn.shared_experts.*=4",
                                               "layers.*.engram.wkv=4", NULL};

static const char *const v41_skipped[] = {"mtp.", "vision.", "aligner.", "image_", NULL};

static void put(sq_tensor_shape *t, int *n, int L, const char *suffix, int ndim, uint64_t d0, uint64_t d1)
{
    snprintf(t[*n].key, sizeof t[*n].key, "layers.%d.%s", L, suffix);
    t[*n].ndim = ndim;
    t[*n].shape[0] = d0;
    t[*n].shape[1] = d1;
    (*n)++;
}

static uint64_t engram_table_rows(const sq_model_config *c, int table)
{
    if (c->v41.engram_rows[table]) return c->v41.engram_rows[table];
    sq_engram_layout lay;
    return sq_engram_layout_from_config(&lay, c, "config.json") == SPARQ_OK && (uint32_t)table < lay.n_layers
               ? sq_engram_layer_rows(&lay, (uint32_t)table)
               : 0;
}

static int v41_layer_tensors(const sq_model_config *c, int L, sq_tensor_shape *t)
{
    const sq_v41_config *v = &c->v41;
    const uint64_t d = (uint64_t)c->hidden_size, hc = (uint64_t)v->hc_mult, mix = (2 + hc) * hc;
    int n = 0;
    put(t, &n, L, "attn_norm.weight", 1, d, 0);
    put(t, &n, L, "ffn_norm.weight", 1, d, 0);
    put(t, &n, L, "attn.q_norm.weight", 1, (uint64_t)v->q_lora_rank, 0);
    put(t, &n, L, "attn.kv_norm.weight", 1, (uint64_t)c->head_dim, 0);
    put(t, &n, L, "attn.attn_sink", 1, (uint64_t)c->num_attention_heads, 0);
    static const char *const which[2] = {"attn", "ffn"};
    for (int w = 0; w < 2; w++) {
        char k[64];
        snprintf(k, sizeof k, "hc_%s_fn", which[w]);
        put(t, &n, L, k, 2, mix, hc * d);
        snprintf(k, sizeof k, "hc_%s_base", which[w]);
        put(t, &n, L, k, 1, mix, 0);
        snprintf(k, sizeof k, "hc_%s_scale", which[w]);
        put(t, &n, L, k, 1, 3, 0);
    }
    put(t, &n, L, "ffn.gate.bias", 1, (uint64_t)c->num_experts, 0);
    put(t, &n, L, "ffn.gate.bias_vl", 1, (uint64_t)c->num_experts, 0);
    if (v->compress_ratio[L] && v->kv_source[L]) {
        put(t, &n, L, "attn.compressor.norm.weight", 1, (uint64_t)c->head_dim, 0);
        if (v->index_source[L]) put(t, &n, L, "attn.indexer.k_norm.weight", 1, (uint64_t)v->index_head_dim, 0);
    }
    int table;
    if (v41_is_engram(c, L, &table)) {
        put(t, &n, L, "engram.q_weight", 2, hc, d);
        put(t, &n, L, "engram.k_weight", 2, hc, d);
        const uint64_t rows = engram_table_rows(c, table), ehd = (uint64_t)v->engram_head_dim;
        put(t, &n, L, "engram.embed.weight", 2, rows, ehd);
        put(t, &n, L, "engram.embed.scale", 2, rows, ehd / 32);
    }
    return n;
}

/* --- the memory plan ------------------------------------------------------------- */

/* Entries of a pool of ratio r for ctx tokens. */
static uint64_t pool_entries(uint64_t ctx, int r) { return r > 0 ? ctx / (uint64_t)r : 0; }

/* State of one sequence for layer L, in floats (v41_state_carve lays it out). */
static uint64_t layer_state_floats(const sq_model_config *c, int L, uint64_t ctx, uint64_t rows)
{
    const sq_v41_config *v = &c->v41;
    const uint64_t hd = (uint64_t)c->head_dim, r = (uint64_t)v->compress_ratio[L];
    uint64_t f = MUL((uint64_t)v->window + rows, hd); /* window ring */
    if (r && v->kv_source[L]) {
        const uint64_t P = pool_entries(ctx, (int)r);
        f = ADD(f, MUL(P, hd));                                        /* pool */
        if (v->index_source[L]) f = ADD(f, MUL(P, (uint64_t)v->index_head_dim)); /* indexer keys */
        f = ADD(f, MUL(2 * r, hd));                                    /* partial group: kv and gate */
    }
    if (r && v->index_source[L]) { /* the selection of the last rows, for the layers reading it (ints) */
        f = ADD(f, MUL(rows, (uint64_t)v->index_topk + 1));
        if (v->candidate_source == L) f = ADD(f, MUL(rows, (uint64_t)v->candidate_topk_blocks + 1));
    }
    return f;
}

static uint64_t v41_kv_bytes(const sq_model_config *c, int64_t first, int64_t n, const sq_memplan_params *p)
{
    const uint64_t ctx = sq_memplan_pos(p->ctx), rows = sq_memplan_pos(sq_memplan_rows(p));
    uint64_t f = 0;
    bool engram = false;
    for (int64_t L = first; L < first + n && L < c->num_hidden_layers; L++) {
        f = ADD(f, layer_state_floats(c, (int)L, ctx, rows));
        engram |= v41_is_engram(c, (int)L, NULL);
    }
    if (engram) f = ADD(f, rows + SQ_ENGRAM_ORDERS); /* compressed-id history */
    /* the what-if of shipped caches: a copy of the pool and indexer keys of every kv source
     * before `first` that a layer of the range reads (the compressor's open group stays home) */
    const sq_v41_config *v = &c->v41;
    for (int s = 0; p->ship_sources && s < first && s < c->num_hidden_layers; s++) {
        if (!v->kv_source[s] || !v->compress_ratio[s]) continue;
        bool read = false;
        for (int64_t L = first; L < first + n && L < c->num_hidden_layers && !read; L++)
            read = v->compress_ratio[L] && latest(v->kv_source, (int)L) == s;
        if (!read) continue;
        const uint64_t P = pool_entries(ctx, v->compress_ratio[s]);
        f = ADD(f, MUL(P, (uint64_t)c->head_dim));
        if (v->index_source[s]) f = ADD(f, MUL(P, (uint64_t)v->index_head_dim));
    }
    return sq_memplan_prod(3, (const uint64_t[]){f, sq_memplan_pos(p->users), 4});
}

/* The sizes a step's workspace depends on (from the config alone). */
typedef struct v41_dims {
    int d, hc, W, nh, hd, rd, qr, G, olora, E, k, I, Is, mix, inh, ihd, itopk, ctb, window, ecols, ehd, vocab;
    int ntables;        /* Engram tables of the model */
    int max_ratio_pool; /* most pool entries any layer's indexer scores (ctx / smallest ratio) */
} v41_dims;

static void v41_dims_of(const sq_model_config *c, int ctx, v41_dims *g)
{
    const sq_v41_config *v = &c->v41;
    memset(g, 0, sizeof *g);
    g->d = (int)c->hidden_size;
    g->hc = v->hc_mult;
    g->W = (int)v41_hidden_width(c);
    g->nh = (int)c->num_attention_heads;
    g->hd = (int)c->head_dim;
    g->rd = v->rope_dim;
    g->qr = v->q_lora_rank;
    g->G = v->o_groups;
    g->olora = v->o_lora_rank;
    g->E = (int)c->num_experts;
    g->k = (int)c->num_experts_per_tok;
    g->I = (int)c->moe_intermediate_size;
    g->Is = g->I * (v->n_shared_experts > 0 ? v->n_shared_experts : 1);
    g->mix = (2 + g->hc) * g->hc;
    g->inh = v->index_n_heads;
    g->ihd = v->index_head_dim;
    g->itopk = v->index_topk;
    g->ctb = v->candidate_source >= 0 ? v->candidate_topk_blocks : 0;
    g->window = v->window;
    g->ecols = v->n_engram ? engram_cols(c) : 0;
    g->ehd = v->engram_head_dim;
    g->ntables = v->n_engram;
    g->vocab = (int)c->vocab_size;
    int rmin = 0;
    for (int L = 0; L < c->num_hidden_layers; L++)
        if (v->compress_ratio[L] && (rmin == 0 || v->compress_ratio[L] < rmin)) rmin = v->compress_ratio[L];
    g->max_ratio_pool = rmin ? ctx / rmin : 0;
}

/* The Engram reads of one step for one table: every (row, column) key, the
 * distinct ones (read once each, by the fetcher's workers), and which
 * distinct row each (row, column) takes. */
typedef struct v41_key_at {
    uint64_t key; /* column << 48 | bucket */
    int32_t at;   /* row * ecols + column */
} v41_key_at;

typedef struct v41_fetch_buf {
    v41_key_at *sorted;   /* [R, ecols]; after the deduplication, the keys of the cache's misses */
    sq_engram_key *uniq;  /* [R, ecols] the distinct keys, first nuniq */
    int32_t *uidx;        /* [R, ecols] index into uniq */
    uint8_t *urows;       /* [R, ecols, row_bytes] the rows read */
    uint8_t *hit;         /* [R, ecols] row cache: uniq[i] was in it (its row already in urows) */
    int32_t *miss_at;     /* [R, ecols] row cache: the uniq index of each miss */
    uint8_t *mrows;       /* [R, ecols, row_bytes] row cache: the misses' rows, as read */
    size_t nmiss;         /* row cache: misses queued (-> urows and into the cache when they arrive) */
} v41_fetch_buf;

/* Buffers of one step of R rows (fp32 unless said). */
typedef struct v41_bufs {
    float *res;           /* [R, hc·d] the residual streams before a sublayer */
    float *mixv;          /* [R, mix] raw mixes */
    float *pre_a, *post_a, *comb_a; /* [R, hc], [R, hc], [R, hc·hc] the attention sublayer's mix */
    float *pre_f, *post_f, *comb_f; /* the FFN sublayer's */
    float *flat;          /* [R, hc·d] the streams, contiguous, for the mix linear */
    float *y, *yn, *out;  /* [R, d] sublayer input, normed input, output */
    float *qr, *q, *kv, *o; /* [R, qr], [R, nh·hd], [R, hd], [R, nh·hd] */
    float *og, *gin;      /* [R, G·olora] grouped output; [R, nh·hd/G] one group's input */
    float *ckv, *cg;      /* [R, hd] compressor kv and gate */
    float *lat, *latk;    /* [R + 1, hd], [R + 1, ihd] new pool entries of this step, pre-RoPE, and their indexer keys */
    float *iq, *iw;       /* [R, inh·ihd], [R, inh] */
    float *score;         /* [pool] one row's index scores */
    float *bscore;        /* [pool] one row's candidate block maxima */
    int *ent_seq, *ent_idx; /* [R] the sequence and index of each new pool entry */
    float *att;           /* [window + itopk] one row's attention weights */
    int *topk, *ntopk;    /* [R, itopk] selected pool entries of each row, [R] how many */
    int *cand, *ncand;    /* [R, ctb] candidate blocks of each row, [R] how many */
    int *order;           /* [pool] selection scratch */
    float *rl, *rw;       /* [R, E] router scores; [R, k] weights */
    int *ridx;            /* [R, k] selected experts */
    int *rows_of, *cnt, *off; /* [R·k], [E + 1], [E + 1] rows grouped by expert */
    float *xg, *g, *u, *dn; /* [R, d], [R, Is], [R, Is], [R, d] */
    float *erows, *ekv;   /* [R, ecols·ehd], [R, (hc + 1)·d] Engram */
    int64_t *erow_id;     /* [R, ecols] the global table rows gathered */
    v41_fetch_buf pf[SQ_V41_MAX_ENGRAM]; /* per Engram table: the step's row reads */
    float *x;             /* [R, W] the model's own hidden rows (hidden_buffer) */
} v41_bufs;

/* Lay out the buffers; base NULL only counts. Every buffer 64-byte aligned. */
static size_t v41_carve(const v41_dims *g, int R, v41_bufs *b, char *base)
{
    size_t o = 0;
    const size_t r = (size_t)R;
#define TAKE(ptr, type, n)                                \
    do {                                                  \
        size_t n_ = (size_t)(n);                          \
        if (base) b->ptr = (type *)(void *)(base + o);    \
        o += (((n_ ? n_ : 1) * sizeof(type)) + 63) & ~(size_t)63; \
    } while (0)
    TAKE(x, float, r * (size_t)g->W);
    TAKE(res, float, r * (size_t)g->hc * g->d);
    TAKE(flat, float, r * (size_t)g->hc * g->d);
    TAKE(mixv, float, r * (size_t)g->mix);
    TAKE(pre_a, float, r * (size_t)g->hc);
    TAKE(post_a, float, r * (size_t)g->hc);
    TAKE(comb_a, float, r * (size_t)g->hc * g->hc);
    TAKE(pre_f, float, r * (size_t)g->hc);
    TAKE(post_f, float, r * (size_t)g->hc);
    TAKE(comb_f, float, r * (size_t)g->hc * g->hc);
    TAKE(y, float, r * (size_t)g->d);
    TAKE(yn, float, r * (size_t)g->d);
    TAKE(out, float, r * (size_t)g->d);
    TAKE(qr, float, r * (size_t)g->qr);
    TAKE(q, float, r * (size_t)g->nh * g->hd);
    TAKE(kv, float, r * (size_t)g->hd);
    TAKE(o, float, r * (size_t)g->nh * g->hd);
    TAKE(og, float, r * (size_t)g->G * g->olora);
    TAKE(gin, float, r * (size_t)g->nh * g->hd / (size_t)g->G);
    TAKE(ckv, float, r * (size_t)g->hd);
    TAKE(cg, float, r * (size_t)g->hd);
    TAKE(lat, float, (r + 1) * (size_t)g->hd);
    TAKE(latk, float, (r + 1) * (size_t)g->ihd);
    TAKE(iq, float, r * (size_t)g->inh * g->ihd);
    TAKE(iw, float, r * (size_t)g->inh);
    TAKE(score, float, (size_t)g->max_ratio_pool);
    TAKE(bscore, float, (size_t)g->max_ratio_pool);
    TAKE(ent_seq, int, r);
    TAKE(ent_idx, int, r);
    TAKE(att, float, (size_t)g->window + r + (size_t)g->itopk);
    TAKE(topk, int, r * (size_t)g->itopk);
    TAKE(ntopk, int, r);
    TAKE(cand, int, r * (size_t)g->ctb);
    TAKE(ncand, int, r);
    TAKE(order, int, (size_t)g->max_ratio_pool);
    TAKE(rl, float, r * (size_t)g->E);
    TAKE(rw, float, r * (size_t)g->k);
    TAKE(ridx, int, r * (size_t)g->k);
    TAKE(rows_of, int, r * (size_t)g->k);
    TAKE(cnt, int, (size_t)g->E + 1);
    TAKE(off, int, (size_t)g->E + 1);
    TAKE(xg, float, r * (size_t)g->d);
    TAKE(g, float, r * (size_t)g->Is);
    TAKE(u, float, r * (size_t)g->Is);
    TAKE(dn, float, r * (size_t)g->d);
    TAKE(erows, float, r * (size_t)g->ecols * g->ehd);
    TAKE(ekv, float, r * (size_t)(g->hc + 1) * g->d);
    TAKE(erow_id, int64_t, r * (size_t)g->ecols);
    for (int t = 0; t < g->ntables; t++) {
        TAKE(pf[t].sorted, v41_key_at, r * (size_t)g->ecols);
        TAKE(pf[t].uniq, sq_engram_key, r * (size_t)g->ecols);
        TAKE(pf[t].uidx, int32_t, r * (size_t)g->ecols);
        TAKE(pf[t].urows, uint8_t, r * (size_t)g->ecols * (g->ehd + g->ehd / 32));
        TAKE(pf[t].hit, uint8_t, r * (size_t)g->ecols);
        TAKE(pf[t].miss_at, int32_t, r * (size_t)g->ecols);
        TAKE(pf[t].mrows, uint8_t, r * (size_t)g->ecols * (g->ehd + g->ehd / 32));
    }
#undef TAKE
    return o;
}

/* Small fp32 copies per layer (norms, sinks, mixes, gate bias, Engram q·k). */
static uint64_t v41_norm_floats(const sq_model_config *c)
{
    const v41_dims *gp;
    v41_dims g;
    v41_dims_of(c, 1, &g);
    gp = &g;
    uint64_t f = (uint64_t)gp->d; /* final norm */
    for (int L = 0; L < c->num_hidden_layers; L++) {
        f += 2 * (uint64_t)gp->d + (uint64_t)gp->qr + (uint64_t)gp->hd + (uint64_t)gp->nh + 2 * (uint64_t)gp->mix + 6 +
             (uint64_t)gp->E;
        if (c->v41.compress_ratio[L] && c->v41.kv_source[L]) f += (uint64_t)gp->hd + (uint64_t)gp->ihd;
        if (v41_is_engram(c, L, NULL)) f += (uint64_t)gp->hc * gp->d;
    }
    return f;
}

static void v41_workspace_terms(const sq_model_config *c, const sq_memplan_params *p, bool has_head,
                                sq_memplan_workspace *out)
{
    memset(out, 0, sizeof *out);
    v41_dims g;
    v41_dims_of(c, (int)sq_memplan_pos(p->ctx), &g);
    const uint64_t R = sq_memplan_pos(sq_memplan_rows(p));
    out->hidden = R > (1u << 20) ? UINT64_MAX : v41_carve(&g, (int)R, &(v41_bufs){0}, NULL);
    out->misc = SQ_MEMPLAN_WS_SLACK;
    out->norms = MUL(v41_norm_floats(c), 4);
    int max_in = g.d > g.Is ? g.d : g.Is;
    if (g.nh * g.hd > max_in) max_in = g.nh * g.hd;
    if (g.hc * g.d > max_in) max_in = g.hc * g.d;
    if (g.ecols * g.ehd > max_in) max_in = g.ecols * g.ehd;
    out->scratch = MUL(MUL(p->threads > 0 ? (uint64_t)p->threads : 1,
                           sq_exec_scratch_floats(max_in, (int)sq_memplan_pos(p->ctx))), 4);
    if (has_head) {
        const uint64_t lr = p->logits_rows > 0 ? (uint64_t)p->logits_rows : sq_memplan_pos(p->users);
        out->logits = sq_memplan_prod(3, (const uint64_t[]){lr, sq_memplan_pos(c->vocab_size), 4});
    }
    out->total = sq_memplan_sum(7, (const uint64_t[]){out->hidden, out->attn, out->moe, out->misc, out->norms,
                                                       out->scratch, out->logits});
}

/* --- the loaded model ------------------------------------------------------------ */

typedef struct v41_layer_w {
    int ratio;
    bool kv_src, idx_src, cand_src, cand_filter;
    int kv_of, ix_of;  /* the layer whose pool / index selection this layer reads (-1: none) */
    int table;         /* index in the node's Engram layout (m->lay), -1 */
    sq_linear *wq_a, *wkv, *wq_b, *wo_a, *wo_b, *cwkv, *cwg, *iwqb, *iwp, *iwk, *router, *w1, *w3, *w2, *sw1, *sw3,
        *sw2, *ewkv;
    sq_linear hc_fn[2]; /* attn, ffn: F32 [mix, hc·d] in the mapping */
    float *attn_norm, *ffn_norm, *q_norm, *kv_norm, *sink, *c_norm, *ik_norm, *gate_bias;
    float *hc_base[2], *hc_scale[2];
    float *eqk; /* Engram q_weight ⊙ k_weight [hc, d] */
} v41_layer_w;

/* One sequence's state for one layer (pointers into the state block). */
typedef struct v41_state {
    float *ring;          /* [window + max_rows, hd] latents by position mod ring */
    float *pool, *ikeys;  /* [ctx/r, hd], [ctx/r, ihd] (kv-source layers) */
    float *gkv, *gsc;     /* [r, hd] the group being pooled */
    /* index-source layers: each row's selection [max_rows, 1 + itopk] (count, entries) and, on the
     * candidate source, its candidate blocks [max_rows, 1 + ctb], by position mod max_rows. The layers
     * that read them may run in another call (one layer at a time for calibration, a pipeline stage). */
    int *sel, *cand;
} v41_state;

typedef struct v41 {
    sq_model *c;
    v41_dims g;
    float eps, hc_eps;
    int ring;             /* window + max_rows */
    const sf_tensor *embed;
    float *final_norm;
    float *inv_win, *inv_cmp; /* [rd/2] RoPE frequencies: window layers, compressing layers (YaRN) */
    v41_layer_w *layers;
    v41_state *st;        /* [n_seq][n_layers] (only [first, end) set) */
    float *state;         /* the state block */
    float *hist;          /* [n_seq][max_rows + 4] compressed ids by position mod that */
    int hist_len;
    uint32_t *cmap;       /* token id -> compressed id (Engram), [vocab] */
    sq_engram_layout lay; /* the tables this node reads: all (checkpoint) or its node file's (bundle) */
    sq_engram_reader *erd; /* over the node file, or the checkpoint's mapped tables (formats/engram.h) */
    sq_engram_fetcher *fetch; /* pread workers reading a step's rows ahead of the layers */
    bool ecache;              /* erd has a row cache (a bundle node with the plan's engram_cache) */
    const uint8_t *etab[SQ_ENGRAM_MAX_LAYERS], *escale[SQ_ENGRAM_MAX_LAYERS]; /* the mapped values / scales */
    int pf_ticket[SQ_ENGRAM_MAX_LAYERS]; /* the step's fetch of table t in flight, -1 none */
    void *ws;
    v41_bufs b;
    int *pos, *seqs;      /* [max_rows] */
    sparq_status err;     /* the first error a step met in a part that cannot return one (Engram reads) */
} v41;

static sparq_status bind_f32_linear(sq_model *c, sq_linear *l, const char *name, int out, int in)
{
    const sf_tensor *t;
    FORWARD_IF(sq_mdl_find_tensor(c, name, &t));
    FORWARD_IF(sq_mdl_check_shape(c, t, 2, (uint64_t)out, (uint64_t)in));
    memset(l, 0, sizeof *l);
    FORWARD_IF(sq_mdl_dense_kind(c, t, &l->kind));
    l->in = in;
    l->out = out;
    l->w = t->data;
    l->name = sparq_strdup(name);
    RETURN_IF(!l->name, SPARQ_E_NOMEM, "out of memory");
    c->weights_bytes += t->nbytes;
    return SPARQ_OK;
}

static sq_linear *slot_lin(sq_model *c, int L, const char *name)
{
    const int s = sq_layer_find(&c->layers[L].desc, name);
    return s < 0 ? NULL : c->layers[L].lin[s];
}

static sparq_status load_layer(v41 *m, int L)
{
    sq_model *c = m->c;
    const sq_model_config *cfg = &c->cfg;
    const sq_v41_config *v = &cfg->v41;
    const v41_dims *g = &m->g;
    v41_layer_w *w = &m->layers[L];
    char key[256];
#define KEY(...) (snprintf(key, sizeof key, __VA_ARGS__), key)
    w->ratio = v->compress_ratio[L];
    w->kv_src = w->ratio && v->kv_source[L];
    w->idx_src = w->ratio && v->index_source[L];
    w->cand_src = w->idx_src && v->candidate_source == L;
    w->cand_filter = w->idx_src && v->candidate_source >= 0 && v->candidate_source < L;
    w->kv_of = w->ratio ? latest(v->kv_source, L) : -1;
    w->ix_of = w->ratio ? latest(v->index_source, L) : -1;
    w->table = v41_is_engram(cfg, L, NULL) ? sq_engram_table_of(&m->lay, L) : -1;
    RETURN_IF(v41_is_engram(cfg, L, NULL) && w->table < 0, SPARQ_E_FORMAT,
              "%s: layer %d has an Engram table, but %s holds no table of layer %d", c->dir, L,
              c->engram_path ? c->engram_path : "the checkpoint", L);
    /* what this layer reads from earlier layers must be on this node */
    const int need[3] = {w->kv_of, w->ix_of, w->cand_filter ? v->candidate_source : -1};
    static const char *const what[3] = {"kv source (its compressed pool)", "index source (its selection)",
                                        "candidate source"};
    for (int i = 0; i < 3; i++)
        RETURN_IF(need[i] >= 0 && need[i] < c->first, SPARQ_E_UNSUPPORTED,
                  "layer %d reads the %s of layer %d, which another node holds: a V4.1 node must start at a layer "
                  "whose sources it holds (pack it again with a split that keeps them together)", L, what[i], need[i]);
    w->wq_a = slot_lin(c, L, N_WQA);
    w->wkv = slot_lin(c, L, N_WKV);
    w->wq_b = slot_lin(c, L, N_WQB);
    w->wo_a = slot_lin(c, L, N_WOA);
    w->wo_b = slot_lin(c, L, N_WOB);
    w->cwkv = slot_lin(c, L, N_CWKV);
    w->cwg = slot_lin(c, L, N_CWG);
    w->iwqb = slot_lin(c, L, N_IWQB);
    w->iwp = slot_lin(c, L, N_IWP);
    w->iwk = slot_lin(c, L, N_IWK);
    w->router = slot_lin(c, L, N_GATE);
    w->w1 = slot_lin(c, L, N_W1);
    w->w3 = slot_lin(c, L, N_W3);
    w->w2 = slot_lin(c, L, N_W2);
    w->sw1 = slot_lin(c, L, N_SW1);
    w->sw3 = slot_lin(c, L, N_SW3);
    w->sw2 = slot_lin(c, L, N_SW2);
    w->ewkv = slot_lin(c, L, N_EWKV);
    RETURN_IF(g->nh * g->hd < g->G * g->olora, SPARQ_E_UNSUPPORTED, "layer %d: wo_a has %d output rows, more "
              "than the %d of q (nh x head_dim), which its EXL3 forward uses as scratch", L, g->G * g->olora,
              g->nh * g->hd);
    static const char *const sub[2] = {"attn", "ffn"};
    for (int s = 0; s < 2; s++) {
        FORWARD_IF(bind_f32_linear(c, &w->hc_fn[s], KEY("layers.%d.hc_%s_fn", L, sub[s]), g->mix, g->hc * g->d));
        FORWARD_IF(sq_mdl_bind_vec(c, KEY("layers.%d.hc_%s_base", L, sub[s]), g->mix, &w->hc_base[s]));
        FORWARD_IF(sq_mdl_bind_vec(c, KEY("layers.%d.hc_%s_scale", L, sub[s]), 3, &w->hc_scale[s]));
    }
    FORWARD_IF(sq_mdl_bind_vec(c, KEY("layers.%d.attn_norm.weight", L), g->d, &w->attn_norm));
    FORWARD_IF(sq_mdl_bind_vec(c, KEY("layers.%d.ffn_norm.weight", L), g->d, &w->ffn_norm));
    FORWARD_IF(sq_mdl_bind_vec(c, KEY("layers.%d.attn.q_norm.weight", L), g->qr, &w->q_norm));
    FORWARD_IF(sq_mdl_bind_vec(c, KEY("layers.%d.attn.kv_norm.weight", L), g->hd, &w->kv_norm));
    FORWARD_IF(sq_mdl_bind_vec(c, KEY("layers.%d.attn.attn_sink", L), g->nh, &w->sink));
    FORWARD_IF(sq_mdl_bind_vec(c, KEY("layers.%d.ffn.gate.bias", L), g->E, &w->gate_bias));
    if (w->kv_src) {
        FORWARD_IF(sq_mdl_bind_vec(c, KEY("layers.%d.attn.compressor.norm.weight", L), g->hd, &w->c_norm));
        if (w->idx_src)
            FORWARD_IF(sq_mdl_bind_vec(c, KEY("layers.%d.attn.indexer.k_norm.weight", L), g->ihd, &w->ik_norm));
    }
    if (w->table >= 0) {
        float *qw = NULL, *kw = NULL;
        const sf_tensor *tq, *tk, *tv, *ts;
        FORWARD_IF(sq_mdl_find_tensor(c, KEY("layers.%d.engram.q_weight", L), &tq));
        FORWARD_IF(sq_mdl_find_tensor(c, KEY("layers.%d.engram.k_weight", L), &tk));
        FORWARD_IF(sq_mdl_check_shape(c, tq, 2, (uint64_t)g->hc, (uint64_t)g->d));
        FORWARD_IF(sq_mdl_check_shape(c, tk, 2, (uint64_t)g->hc, (uint64_t)g->d));
        const size_t n = (size_t)g->hc * g->d;
        qw = sparq_malloc(n * sizeof(float));
        kw = sparq_malloc(n * sizeof(float));
        sparq_status st = qw && kw ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "out of memory");
        if (st == SPARQ_OK) st = sf_to_f32(tq, qw);
        if (st == SPARQ_OK) st = sf_to_f32(tk, kw);
        if (st == SPARQ_OK)
            for (size_t i = 0; i < n; i++) qw[i] *= kw[i];
        sparq_free(kw);
        if (st != SPARQ_OK) {
            sparq_free(qw);
            return st;
        }
        w->eqk = qw;
        c->small_bytes += n * sizeof(float);
        c->weights_bytes += tq->nbytes + tk->nbytes;
        if (c->engram_path) goto engram_done; /* a bundle node reads its rows from its Engram file */
        FORWARD_IF(sq_mdl_find_tensor(c, KEY("layers.%d.engram.embed.weight", L), &tv));
        FORWARD_IF(sq_mdl_find_tensor(c, KEY("layers.%d.engram.embed.scale", L), &ts));
        const uint64_t rows = sq_engram_layer_rows(&m->lay, (uint32_t)w->table);
        FORWARD_IF(sq_mdl_check_shape(c, tv, 2, rows, (uint64_t)g->ehd));
        FORWARD_IF(sq_mdl_check_shape(c, ts, 2, rows, (uint64_t)g->ehd / 32));
        RETURN_IF(tv->dtype != SF_F8_E4M3 || ts->dtype != SF_F8_E8M0, SPARQ_E_UNSUPPORTED,
                  "tensor '%s': Engram tables must be F8_E4M3 with F8_E8M0 scales (got %s / %s)", tv->name,
                  sf_dtype_name(tv->dtype), sf_dtype_name(ts->dtype));
        m->etab[w->table] = tv->data;
        m->escale[w->table] = ts->data;
    }
engram_done:
#undef KEY
    return SPARQ_OK;
}

/* RoPE frequencies, as model.py's precompute_freqs_cis: base^(-2i/dim), and
 * with YaRN (when the model's positions exceed the original ones) blended
 * with freq/factor across the correction range of beta_fast .. beta_slow. */
static void rope_freqs(float *f, int dim, double base, const sq_model_config *c, bool yarn)
{
    for (int i = 0; i < dim / 2; i++) f[i] = 1.0f / powf((float)base, (float)(2 * i) / (float)dim);
    const sq_v41_config *v = &c->v41;
    if (!yarn || v->rope_original <= 0 || c->max_position_embeddings <= v->rope_original) return;
    const double two_pi = 2 * M_PI, lb = 2 * log(base);
    double lo = floor(dim * log((double)v->rope_original / (v->beta_fast * two_pi)) / lb);
    double hi = ceil(dim * log((double)v->rope_original / (v->beta_slow * two_pi)) / lb);
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    float mn = (float)lo, mx = (float)hi;
    if (mn == mx) mx += 0.001f;
    for (int i = 0; i < dim / 2; i++) {
        float ramp = ((float)i - mn) / (mx - mn);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const float smooth = 1 - ramp;
        f[i] = f[i] / (float)v->rope_factor * (1 - smooth) + f[i] * smooth;
    }
}

static void v41_free(sq_model *c);

/* The token map the embedding writes into each hidden row: the node file's
 * when it has one (a bundle), else built from the tokenizer as pack builds it. */
static sparq_status build_cmap(v41 *m)
{
    const sq_model *c = m->c;
    if (m->lay.token_map) {
        RETURN_IF(m->lay.n_tokens < (uint64_t)c->cfg.vocab_size, SPARQ_E_FORMAT,
                  "%s: token map of %u ids, but vocab_size is %lld", c->engram_path, m->lay.n_tokens,
                  (long long)c->cfg.vocab_size);
        m->cmap = sparq_malloc((size_t)m->lay.n_tokens * sizeof *m->cmap);
        RETURN_IF(!m->cmap, SPARQ_E_NOMEM, "out of memory");
        memcpy(m->cmap, m->lay.token_map, (size_t)m->lay.n_tokens * sizeof *m->cmap);
        return SPARQ_OK;
    }
    sq_tokenizer *tok = NULL;
    FORWARD_IF(sq_tokenizer_load(&tok, c->dir));
    sq_engram_layout lay = m->lay;
    sparq_status st = sq_engram_token_map(tok, &c->cfg, c->dir, &m->cmap, &lay);
    sq_tokenizer_free(tok);
    return st;
}

/* A bundle node's Engram file: it must hold exactly the tables of this
 * node's Engram layers, with the layout config.json implies (the token map
 * aside, which the file carries and config.json cannot). */
static sparq_status open_engram_file(v41 *m, const sq_engram_layout *want)
{
    sq_model *c = m->c;
    /* the row cache the plan sized for this node (sparq plan / pack --engram-cache), at most every row of
     * its tables (a small model's tables fit whole) */
    uint64_t rows = sq_engram_cache_rows_for(c->engram_cache, want->row_bytes), all = 0;
    for (uint32_t l = 0; l < want->n_layers; l++) all += sq_engram_layer_rows(want, l);
    if (rows > all) rows = all;
    FORWARD_IF(sq_engram_open(&m->erd, c->engram_path, rows));
    m->ecache = rows > 0;
    c->engram.cache_bytes = sq_engram_cache_bytes(m->erd);
    const sq_engram_layout *have = &sq_engram_reader_header(m->erd)->layout;
    RETURN_IF(!sq_engram_layout_equal(have, want, false), SPARQ_E_FORMAT,
              "%s: its Engram tables (%u, of layers %d..%d) are not those config.json gives node %d's layers "
              "[%d, %d) (%u tables): the bundle does not match its config (`sparq verify %s`)", c->engram_path,
              have->n_layers, have->layer_ids[0], have->layer_ids[have->n_layers ? have->n_layers - 1 : 0],
              c->opts.node, c->first, c->end, want->n_layers, c->dir);
    m->lay = *have;
    return SPARQ_OK;
}

static sparq_status v41_load(sq_model *c, int plan_threads)
{
    v41 *m = sparq_calloc(1, sizeof *m);
    RETURN_IF(!m, SPARQ_E_NOMEM, "model: out of memory");
    c->impl = m;
    m->c = c;
    const sq_model_config *cfg = &c->cfg;
    const sq_v41_config *v = &cfg->v41;
    v41_dims_of(cfg, c->opts.ctx, &m->g);
    const v41_dims *g = &m->g;
    m->eps = (float)cfg->rms_norm_eps;
    m->hc_eps = (float)v->hc_eps;
    m->ring = g->window + c->opts.max_rows;
    for (int t = 0; t < SQ_ENGRAM_MAX_LAYERS; t++) m->pf_ticket[t] = -1;
    if (v->n_engram) {
        FORWARD_IF(sq_engram_layout_from_config(&m->lay, cfg, c->dir));
        sq_engram_layout mine;
        sq_engram_layout_subset(&m->lay, c->first, c->end, &mine);
        if (c->engram_path) FORWARD_IF(open_engram_file(m, &mine));
        else
            RETURN_IF(c->bundle && mine.n_layers, SPARQ_E_FORMAT,
                      "%s: node %d holds Engram layer %d, but the manifest names no Engram file for it (packed by an "
                      "older sparq? pack the model again)", c->dir, c->opts.node, mine.layer_ids[0]);
    }
    if (c->has_embed) {
        FORWARD_IF(sq_mdl_find_tensor(c, "embed.weight", &m->embed));
        FORWARD_IF(sq_mdl_check_shape(c, m->embed, 2, (uint64_t)g->vocab, (uint64_t)g->d));
        sq_linear_kind k;
        FORWARD_IF(sq_mdl_dense_kind(c, m->embed, &k));
        c->weights_bytes += m->embed->nbytes;
    }
    if (c->has_embed && v->n_engram) FORWARD_IF(build_cmap(m)); /* the embedding writes each row's compressed id */
    if (c->has_head) {
        FORWARD_IF(sq_mdl_bind_linear(c, &c->head, "head", g->vocab, g->d));
        FORWARD_IF(sq_mdl_bind_vec(c, "norm.weight", g->d, &m->final_norm));
    }
    m->layers = sparq_calloc((size_t)c->n_layers, sizeof *m->layers);
    RETURN_IF(!m->layers, SPARQ_E_NOMEM, "out of memory");
    FORWARD_IF(sq_mdl_bind_layers(c));
    for (int L = c->first; L < c->end; L++) FORWARD_IF(load_layer(m, L));
    bool tables = false;
    for (int i = 0; i < v->n_engram; i++) tables |= m->etab[i] != NULL;
    if (tables) FORWARD_IF(sq_engram_open_mapped(&m->erd, &m->lay, m->etab, m->escale, c->dir));
    if (m->erd) FORWARD_IF(sq_engram_fetcher_create(&m->fetch, m->erd, V41_FETCH_THREADS));
    m->inv_win = sparq_malloc((size_t)(g->rd / 2 + 1) * sizeof(float));
    m->inv_cmp = sparq_malloc((size_t)(g->rd / 2 + 1) * sizeof(float));
    RETURN_IF(!m->inv_win || !m->inv_cmp, SPARQ_E_NOMEM, "out of memory");
    rope_freqs(m->inv_win, g->rd, cfg->rope_theta, cfg, false);
    rope_freqs(m->inv_cmp, g->rd, v->compress_rope_theta, cfg, true);

    /* sizes from the memory plan; the state block is exactly its KV term */
    sq_memplan_params p;
    sq_memplan_params_default(&p);
    p.ctx = c->opts.ctx;
    p.users = c->opts.n_seq;
    p.chunk = c->opts.max_rows;
    p.logits_rows = 0;
    p.kv_dtype = SQ_KV_F32;
    if (plan_threads > 0) p.threads = plan_threads;
    const int n_local = c->end - c->first;
    c->plan_kv = sq_memplan_kv_bytes_range(cfg, c->first, n_local, &p);
    c->plan_ws = sq_memplan_workspace_bytes(cfg, &p, c->has_head);
    FORWARD_IF(sq_exec_create_on(&c->ex, c->opts.device, c->opts.n_threads));
    RETURN_IF(c->ex->be->device, SPARQ_E_UNSUPPORTED,
              "deepseek_v41 runs on the CPU only for now (--device cpu); the CUDA graph is future work");
    uint64_t per_seq = 0;
    bool eng = false;
    for (int L = c->first; L < c->end; L++) {
        per_seq += layer_state_floats(cfg, L, (uint64_t)c->opts.ctx, (uint64_t)c->opts.max_rows);
        eng |= v41_is_engram(cfg, L, NULL);
    }
    m->hist_len = c->opts.max_rows + SQ_ENGRAM_ORDERS;
    const uint64_t hist = eng ? (uint64_t)m->hist_len : 0;
    uint64_t total;
    RETURN_IF(!sparq_mul_u64(per_seq + hist, (uint64_t)c->opts.n_seq, &total) || total > ((uint64_t)1 << 40),
              SPARQ_E_RANGE, "V4.1 state of %d sequences x %d tokens is too large", c->opts.n_seq, c->opts.ctx);
    c->kv_bytes = total * sizeof(float);
    m->state = sparq_calloc((size_t)(total ? total : 1), sizeof(float));
    m->st = sparq_calloc((size_t)c->opts.n_seq * (size_t)c->n_layers, sizeof *m->st);
    RETURN_IF(!m->state || !m->st, SPARQ_E_NOMEM, "cannot allocate the V4.1 state (%llu bytes)",
              (unsigned long long)c->kv_bytes);
    float *f = m->state;
    for (int s = 0; s < c->opts.n_seq; s++) {
        for (int L = c->first; L < c->end; L++) {
            v41_state *S = &m->st[(size_t)s * c->n_layers + L];
            const int r = v->compress_ratio[L];
            S->ring = f;
            f += (size_t)m->ring * g->hd;
            if (r && v->kv_source[L]) {
                const size_t P = (size_t)pool_entries((uint64_t)c->opts.ctx, r);
                S->pool = f;
                f += P * g->hd;
                if (v->index_source[L]) {
                    S->ikeys = f;
                    f += P * g->ihd;
                }
                S->gkv = f;
                f += (size_t)r * g->hd;
                S->gsc = f;
                f += (size_t)r * g->hd;
            }
            if (r && v->index_source[L]) {
                S->sel = (int *)(void *)f;
                f += (size_t)c->opts.max_rows * (size_t)(g->itopk + 1);
                if (v->candidate_source == L) {
                    S->cand = (int *)(void *)f;
                    f += (size_t)c->opts.max_rows * (size_t)(v->candidate_topk_blocks + 1);
                }
            }
        }
    }
    if (eng) m->hist = f;
    c->ws_bytes = v41_carve(g, c->opts.max_rows, &m->b, NULL);
    m->ws = sparq_calloc(1, (size_t)c->ws_bytes);
    m->pos = sparq_calloc((size_t)c->opts.max_rows, sizeof(int));
    m->seqs = sparq_calloc((size_t)c->opts.max_rows, sizeof(int));
    RETURN_IF(!m->ws || !m->pos || !m->seqs, SPARQ_E_NOMEM, "cannot allocate the workspace (%llu bytes)",
              (unsigned long long)c->ws_bytes);
    v41_carve(g, c->opts.max_rows, &m->b, m->ws);
    int max_in = g->d > g->Is ? g->d : g->Is;
    if (g->nh * g->hd > max_in) max_in = g->nh * g->hd;
    if (g->hc * g->d > max_in) max_in = g->hc * g->d;
    if (g->ecols * g->ehd > max_in) max_in = g->ecols * g->ehd;
    const size_t sf = sq_exec_scratch_floats(max_in, c->opts.ctx);
    FORWARD_IF(sq_exec_reserve(c->ex, sf));
    c->scratch_bytes = (uint64_t)sf * sizeof(float) * (uint64_t)c->ex->n_threads;
    return SPARQ_OK;
}

static void v41_free(sq_model *c)
{
    v41 *m = c->impl;
    if (!m) return;
    if (m->layers) {
        for (int L = 0; L < c->n_layers; L++) {
            v41_layer_w *w = &m->layers[L];
            for (int s = 0; s < 2; s++) {
                sq_mdl_free_linear(&w->hc_fn[s]);
                sparq_free(w->hc_base[s]);
                sparq_free(w->hc_scale[s]);
            }
            sparq_free(w->attn_norm);
            sparq_free(w->ffn_norm);
            sparq_free(w->q_norm);
            sparq_free(w->kv_norm);
            sparq_free(w->sink);
            sparq_free(w->c_norm);
            sparq_free(w->ik_norm);
            sparq_free(w->gate_bias);
            sparq_free(w->eqk);
        }
        sparq_free(m->layers);
    }
    sparq_free(m->final_norm);
    sparq_free(m->inv_win);
    sparq_free(m->inv_cmp);
    sparq_free(m->state);
    sparq_free(m->st);
    sparq_free(m->cmap);
    sq_engram_fetcher_free(m->fetch); /* waits for reads in flight into the workspace */
    sq_engram_close(m->erd);
    sparq_free(m->ws);
    sparq_free(m->pos);
    sparq_free(m->seqs);
    sparq_free(m);
    c->impl = NULL;
}

/* --- small math ------------------------------------------------------------------ */

static void rmsnorm_row(const float *x, int n, const float *w, float eps, float *y)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float r = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) y[i] = (w ? w[i] : 1.0f) * (x[i] * r);
}

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Interleaved RoPE (model.py apply_rotary_emb: pairs (2i, 2i+1)) on x[0..dim)
 * at position pos; inverse rotates back. */
static void rope_pairs(float *x, int dim, const float *freq, int pos, bool inverse)
{
    for (int i = 0; i < dim / 2; i++) {
        const float a = (float)pos * freq[i];
        const float cs = cosf(a), sn = inverse ? -sinf(a) : sinf(a);
        const float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cs - x1 * sn;
        x[2 * i + 1] = x0 * sn + x1 * cs;
    }
}

/* The mixes of one sublayer for each row: pre, post [hc], comb [hc, hc]
 * (kernel.py hc_split_sinkhorn). h: the rows' streams [rows, W]. */
static void hc_mixes(v41 *m, const v41_layer_w *w, int which, const float *h, int rows, float *pre, float *post,
                     float *comb)
{
    const v41_dims *g = &m->g;
    const int hc = g->hc, n = hc * g->d;
    v41_bufs *b = &m->b;
    for (int r = 0; r < rows; r++) memcpy(b->flat + (size_t)r * n, h + (size_t)r * g->W, (size_t)n * sizeof(float));
    sq_linear_forward(m->c->ex, &w->hc_fn[which], b->flat, rows, b->mixv);
    const float *sc = w->hc_scale[which], *base = w->hc_base[which];
    const float eps = m->hc_eps;
    for (int r = 0; r < rows; r++) {
        const float *f = b->flat + (size_t)r * n;
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)f[i] * f[i];
        const float rs = 1.0f / sqrtf((float)(ss / n) + m->eps);
        const float *mx = b->mixv + (size_t)r * g->mix;
        float *pr = pre + (size_t)r * hc, *po = post + (size_t)r * hc, *cb = comb + (size_t)r * hc * hc;
        for (int i = 0; i < hc; i++) {
            pr[i] = sigmoidf(mx[i] * rs * sc[0] + base[i]) + eps;
            po[i] = 2 * sigmoidf(mx[hc + i] * rs * sc[1] + base[hc + i]);
        }
        for (int i = 0; i < hc; i++) { /* row softmax */
            float *row = cb + i * hc, mxv = -INFINITY;
            for (int j = 0; j < hc; j++) {
                row[j] = mx[2 * hc + i * hc + j] * rs * sc[2] + base[2 * hc + i * hc + j];
                if (row[j] > mxv) mxv = row[j];
            }
            float s = 0;
            for (int j = 0; j < hc; j++) s += row[j] = expf(row[j] - mxv);
            for (int j = 0; j < hc; j++) row[j] = row[j] / s + eps;
        }
        for (int it = 0; it < m->c->cfg.v41.hc_sinkhorn_iters; it++) {
            if (it > 0)
                for (int i = 0; i < hc; i++) { /* rows */
                    float s = 0;
                    for (int j = 0; j < hc; j++) s += cb[i * hc + j];
                    for (int j = 0; j < hc; j++) cb[i * hc + j] /= s + eps;
                }
            for (int j = 0; j < hc; j++) { /* columns */
                float s = 0;
                for (int i = 0; i < hc; i++) s += cb[i * hc + j];
                for (int i = 0; i < hc; i++) cb[i * hc + j] /= s + eps;
            }
        }
    }
}

/* y[r] = Σ_i mix[r][i] · h[r][i] (the streams collapsed for a sublayer). */
static void hc_collapse(const v41 *m, const float *h, const float *mix, int rows, float *y)
{
    const v41_dims *g = &m->g;
    for (int r = 0; r < rows; r++) {
        const float *hr = h + (size_t)r * g->W, *mr = mix + (size_t)r * g->hc;
        float *yr = y + (size_t)r * g->d;
        for (int k = 0; k < g->d; k++) {
            float s = 0;
            for (int i = 0; i < g->hc; i++) s += mr[i] * hr[(size_t)i * g->d + k];
            yr[k] = s;
        }
    }
}

/* h[r][j] = post[r][j] · y[r] + Σ_i comb[r][i][j] · res[r][i]. */
static void hc_expand(const v41 *m, float *h, const float *y, const float *res, const float *post, const float *comb,
                      int rows)
{
    const v41_dims *g = &m->g;
    const int hc = g->hc, d = g->d;
    for (int r = 0; r < rows; r++) {
        float *hr = h + (size_t)r * g->W;
        const float *yr = y + (size_t)r * d, *rr = res + (size_t)r * hc * d;
        const float *po = post + (size_t)r * hc, *cb = comb + (size_t)r * hc * hc;
        for (int j = 0; j < hc; j++)
            for (int k = 0; k < d; k++) {
                float s = 0;
                for (int i = 0; i < hc; i++) s += cb[i * hc + j] * rr[(size_t)i * d + k];
                hr[(size_t)j * d + k] = po[j] * yr[k] + s;
            }
    }
}

static float *pre_mix_of(const v41 *m, float *h, int r) { return h + (size_t)r * m->g.W + (size_t)m->g.hc * m->g.d; }

/* --- Engram ------------------------------------------------------------------------ */

static void probe(const sq_observer *obs, int L, const char *name, char kind, const void *data, int rows, int width);

static int key_at_cmp(const void *a, const void *b)
{
    const v41_key_at *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key ? 1 : x->at - y->at;
}

/* Start reading the Engram rows every local Engram layer in [lo, hi) needs
 * for this step's rows: their compressed ids (carried in the hidden rows)
 * go into the per-sequence history, each (row, column)'s bucket is hashed
 * (sq_engram_buckets), the keys are deduplicated, and the distinct rows are
 * queued on the fetcher; engram() waits for them when its layer comes. Runs
 * before the first layer, so the reads overlap the layers before the Engram
 * layer (and, for a later table, the Engram layers before it). */
static void engram_prefetch(v41 *m, const float *h, int rows, const int *seqs, const int *pos, int lo, int hi)
{
    const v41_dims *g = &m->g;
    const int cols = g->ecols;
    const uint32_t pad = m->lay.pad_id;
    bool any = false;
    for (int L = lo; L < hi; L++) any |= m->layers[L].table >= 0;
    if (!any || !rows) return;
    for (int r = 0; r < rows; r++)
        m->hist[(size_t)seqs[r] * m->hist_len + (size_t)(pos[r] % m->hist_len)] =
            h[(size_t)r * g->W + (size_t)g->hc * g->d + (size_t)g->hc];
    for (int L = lo; L < hi; L++) {
        const int t = m->layers[L].table;
        if (t < 0 || m->pf_ticket[t] >= 0) continue;
        v41_fetch_buf *f = &m->b.pf[t];
        for (int r = 0; r < rows; r++) {
            uint32_t cid[SQ_ENGRAM_ORDERS];
            for (int k = 0; k < SQ_ENGRAM_ORDERS; k++) { /* cid[3 - k] = token at pos - k */
                const int p = pos[r] - k;
                cid[SQ_ENGRAM_ORDERS - 1 - k] =
                    p < 0 ? pad : (uint32_t)m->hist[(size_t)seqs[r] * m->hist_len + (size_t)(p % m->hist_len)];
            }
            uint64_t bucket[SQ_ENGRAM_MAX_COLUMNS];
            sq_engram_buckets(&m->lay, (uint32_t)t, cid, SQ_ENGRAM_ORDERS, SQ_ENGRAM_ORDERS - 1, bucket);
            for (int col = 0; col < cols; col++)
                f->sorted[r * cols + col] = (v41_key_at){(uint64_t)col << 48 | bucket[col], r * cols + col};
        }
        const size_t n = (size_t)rows * cols;
        qsort(f->sorted, n, sizeof *f->sorted, key_at_cmp);
        size_t u = 0;
        for (size_t i = 0; i < n; i++) {
            if (!i || f->sorted[i].key != f->sorted[i - 1].key)
                f->uniq[u++] = (sq_engram_key){(uint32_t)t, (uint32_t)(f->sorted[i].key >> 48),
                                               f->sorted[i].key & (((uint64_t)1 << 48) - 1)};
            f->uidx[f->sorted[i].at] = (int32_t)(u - 1);
        }
        m->c->engram.rows += n;
        m->c->engram.unique += u;
        /* the row cache (a bundle node's planned one): hits go to urows now, the misses are read into mrows
         * (keys in `sorted`, free after the deduplication: 16 bytes an entry either way) */
        const sq_engram_key *rk = f->uniq;
        uint8_t *dst = f->urows;
        f->nmiss = 0;
        if (m->ecache) {
            const size_t miss = sq_engram_cache_take(m->erd, u, f->uniq, f->urows, f->hit);
            sq_engram_key *mk = (sq_engram_key *)(void *)f->sorted;
            for (size_t i = 0, k = 0; i < u && k < miss; i++)
                if (!f->hit[i]) mk[k] = f->uniq[i], f->miss_at[k++] = (int32_t)i;
            f->nmiss = miss;
            m->c->engram.cache_hits += u - miss;
            m->c->engram.cache_misses += miss;
            rk = mk, dst = f->mrows, u = miss;
        }
        const sparq_status st = sq_engram_fetcher_submit(m->fetch, u, rk, dst, &m->pf_ticket[t]);
        if (st != SPARQ_OK && m->err == SPARQ_OK) m->err = st; /* reported by the step */
    }
}

/* Wait for every fetch still in flight (a step that ends early must not
 * leave reads into its workspace behind). */
static void engram_drain(v41 *m)
{
    for (int t = 0; t < SQ_ENGRAM_MAX_LAYERS; t++)
        if (m->pf_ticket[t] >= 0) {
            (void)sq_engram_fetcher_wait(m->fetch, m->pf_ticket[t], NULL, NULL);
            m->pf_ticket[t] = -1;
        }
}

static void engram(v41 *m, int L, float *h, int rows, const int *seqs, const int *pos, const sq_observer *obs)
{
    const v41_layer_w *w = &m->layers[L];
    const v41_dims *g = &m->g;
    v41_bufs *b = &m->b;
    const int hc = g->hc, d = g->d, cols = g->ecols, ehd = g->ehd;
    const size_t rbytes = m->lay.row_bytes;
    const int t = w->table;
    engram_prefetch(m, h, rows, seqs, pos, L, L + 1); /* a no-op when the step's prefetch queued it */
    v41_fetch_buf *f = &b->pf[t];
    double fetch_s = 0, wait_s = 0;
    sparq_status st = m->pf_ticket[t] >= 0 ? sq_engram_fetcher_wait(m->fetch, m->pf_ticket[t], &fetch_s, &wait_s)
                                           : SPARQ_OK;
    m->pf_ticket[t] = -1;
    m->c->engram.fetch_s += fetch_s;
    m->c->engram.wait_s += wait_s;
    if (st != SPARQ_OK && m->err == SPARQ_OK) m->err = st; /* reported by the step */
    if (st == SPARQ_OK && m->ecache && f->nmiss) { /* the misses: to their rows, and into the cache */
        for (size_t k = 0; k < f->nmiss; k++)
            memcpy(f->urows + (size_t)f->miss_at[k] * rbytes, f->mrows + k * rbytes, rbytes);
        sq_engram_cache_put(m->erd, f->nmiss, (const sq_engram_key *)(const void *)f->sorted, f->mrows);
    }
    f->nmiss = 0;
    for (int r = 0; r < rows; r++)
        for (int col = 0; col < cols; col++) {
            const size_t i = (size_t)r * cols + col;
            const sq_engram_key *k = &f->uniq[f->uidx[i]];
            b->erow_id[i] = (int64_t)(m->lay.row_offset[t][col] + k->bucket);
            if (st == SPARQ_OK)
                sq_engram_row_to_f32(&m->lay, f->urows + (size_t)f->uidx[i] * rbytes, b->erows + i * ehd);
            else
                memset(b->erows + i * ehd, 0, (size_t)ehd * sizeof(float));
        }
    probe(obs, L, "engram.rows", 'l', b->erow_id, rows, cols);
    sq_observe(obs, L, sq_layer_find(&m->c->layers[L].desc, N_EWKV), 0, b->erows, rows, cols * ehd);
    sq_linear_forward(m->c->ex, w->ewkv, b->erows, rows, b->ekv);
    for (int r = 0; r < rows; r++) {
        float *hr = h + (size_t)r * g->W;
        const float *kv = b->ekv + (size_t)r * (hc + 1) * d, *val = kv + (size_t)hc * d;
        for (int s = 0; s < hc; s++) {
            float *x = hr + (size_t)s * d;
            const float *key = kv + (size_t)s * d, *wq = w->eqk + (size_t)s * d;
            double xx = 0, kk = 0, dot = 0;
            for (int i = 0; i < d; i++) {
                xx += (double)x[i] * x[i];
                kk += (double)key[i] * key[i];
                dot += (double)x[i] * wq[i] * key[i];
            }
            const float rstd = (1.0f / sqrtf((float)(xx / d) + m->eps)) * (1.0f / sqrtf((float)(kk / d) + m->eps));
            const float dt = (float)dot * rstd / sqrtf((float)d);
            const float mag = sqrtf(fabsf(dt) > 1e-6f ? fabsf(dt) : 1e-6f);
            const float gate = sigmoidf(dt < 0 ? -mag : mag);
            for (int i = 0; i < d; i++) x[i] += gate * val[i];
        }
    }
}

/* --- attention --------------------------------------------------------------------- */

static void probe(const sq_observer *obs, int L, const char *name, char kind, const void *data, int rows, int width)
{
    if (obs && obs->probe) obs->probe(obs->user, L, name, kind, data, rows, width);
}

static v41_state *state_of(v41 *m, int seq, int L) { return &m->st[(size_t)seq * m->c->n_layers + L]; }

/* The top n of score[0..len) (descending; ties to the lower index), finite
 * scores only, into idx sorted ascending; returns how many. */
static int select_top(const float *score, int len, int n, int *order, int *idx)
{
    int m = 0;
    for (int t = 0; t < len; t++)
        if (score[t] > -INFINITY) order[m++] = t;
    if (n > m) n = m;
    /* partial selection sort: fine for the sizes an indexer sees per row */
    for (int i = 0; i < n; i++) {
        int best = i;
        for (int j = i + 1; j < m; j++) {
            const float a = score[order[j]], bb = score[order[best]];
            if (a > bb || (a == bb && order[j] < order[best])) best = j;
        }
        const int t = order[i];
        order[i] = order[best];
        order[best] = t;
    }
    for (int i = 0; i < n; i++) idx[i] = order[i];
    for (int i = 1; i < n; i++) /* ascending, as model.py sorts them */
        for (int j = i; j > 0 && idx[j - 1] > idx[j]; j--) {
            const int t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    return n;
}

/* The compressor of a kv-source layer: append this step's pool entries (and
 * their indexer keys) for every row that completes a group. */
static void compress(v41 *m, int L, int rows, const int *seqs, const int *pos)
{
    const v41_layer_w *w = &m->layers[L];
    const v41_dims *g = &m->g;
    v41_bufs *b = &m->b;
    const int hd = g->hd, r = w->ratio, rd = g->rd;
    sq_linear_forward(m->c->ex, w->cwkv, b->yn, rows, b->ckv);
    if (r > 1) sq_linear_forward(m->c->ex, w->cwg, b->yn, rows, b->cg);
    int ne = 0, *ent_seq = b->ent_seq, *ent_idx = b->ent_idx; /* new entries: at most one per row */
    for (int i = 0; i < rows; i++) {
        const float *kv = b->ckv + (size_t)i * hd;
        float *lat = b->lat + (size_t)ne * hd;
        if (r == 1) {
            rmsnorm_row(kv, hd, w->c_norm, m->eps, lat);
        } else {
            v41_state *S = state_of(m, seqs[i], L);
            const int slot = pos[i] % r;
            memcpy(S->gkv + (size_t)slot * hd, kv, (size_t)hd * sizeof(float));
            memcpy(S->gsc + (size_t)slot * hd, b->cg + (size_t)i * hd, (size_t)hd * sizeof(float));
            if ((pos[i] + 1) % r) continue;
            for (int k = 0; k < hd; k++) { /* softmax over the group, per channel */
                float mx = -INFINITY;
                for (int j = 0; j < r; j++) mx = fmaxf(mx, S->gsc[(size_t)j * hd + k]);
                float s = 0, acc = 0;
                for (int j = 0; j < r; j++) s += expf(S->gsc[(size_t)j * hd + k] - mx);
                for (int j = 0; j < r; j++) acc += S->gkv[(size_t)j * hd + k] * (expf(S->gsc[(size_t)j * hd + k] - mx) / s);
                lat[k] = acc;
            }
            rmsnorm_row(lat, hd, w->c_norm, m->eps, lat);
        }
        ent_seq[ne] = seqs[i];
        ent_idx[ne] = pos[i] / r;
        ne++;
    }
    if (!ne) return;
    if (w->idx_src) {
        sq_linear_forward(m->c->ex, w->iwk, b->lat, ne, b->latk);
        for (int e = 0; e < ne; e++) {
            float *k = b->latk + (size_t)e * g->ihd;
            rmsnorm_row(k, g->ihd, w->ik_norm, m->eps, k);
            rope_pairs(k + g->ihd - rd, rd, m->inv_cmp, ent_idx[e] * r, false);
            memcpy(state_of(m, ent_seq[e], L)->ikeys + (size_t)ent_idx[e] * g->ihd, k, (size_t)g->ihd * sizeof(float));
        }
    }
    for (int e = 0; e < ne; e++) {
        float *lat = b->lat + (size_t)e * hd;
        rope_pairs(lat + hd - rd, rd, m->inv_cmp, ent_idx[e] * r, false);
        memcpy(state_of(m, ent_seq[e], L)->pool + (size_t)ent_idx[e] * hd, lat, (size_t)hd * sizeof(float));
    }
}

/* A row's selection (n, then n entries of width w) to or from its slot of a
 * state's [max_rows, 1 + w] table, by position mod max_rows: rows of one
 * step of one sequence have distinct positions there. */
static void sel_put(int *tab, int max_rows, int w, int pos, int n, const int *idx)
{
    int *t = tab + (size_t)(pos % max_rows) * (size_t)(w + 1);
    t[0] = n;
    memcpy(t + 1, idx, (size_t)n * sizeof(int));
}

static int sel_get(const int *tab, int max_rows, int w, int pos, int *idx)
{
    if (!tab) return 0; /* a source without a compressor: nothing selected */
    const int *t = tab + (size_t)(pos % max_rows) * (size_t)(w + 1);
    memcpy(idx, t + 1, (size_t)t[0] * sizeof(int));
    return t[0];
}

/* The indexer of an index-source layer: each row's selected pool entries. */
static void indexer(v41 *m, int L, int rows, const int *seqs, const int *pos)
{
    const v41_layer_w *w = &m->layers[L];
    const v41_dims *g = &m->g;
    v41_bufs *b = &m->b;
    const sq_v41_config *v = &m->c->cfg.v41;
    const int inh = g->inh, ihd = g->ihd, rd = g->rd, r = w->ratio, cbs = v->candidate_block_size;
    sq_linear_forward(m->c->ex, w->iwqb, b->qr, rows, b->iq);
    sq_linear_forward(m->c->ex, w->iwp, b->yn, rows, b->iw);
    const float wscale = 1.0f / sqrtf((float)ihd) / sqrtf((float)inh);
    const int mr = m->c->opts.max_rows;
    for (int i = 0; i < rows; i++) {
        float *q = b->iq + (size_t)i * inh * ihd;
        for (int h = 0; h < inh; h++) rope_pairs(q + (size_t)h * ihd + ihd - rd, rd, m->inv_cmp, pos[i], false);
        const float *wt = b->iw + (size_t)i * inh;
        const int lens = (pos[i] + 1) / r;
        const float *keys = state_of(m, seqs[i], w->kv_of)->ikeys;
        float *sc = b->score;
        for (int t = 0; t < lens; t++) {
            const float *k = keys + (size_t)t * ihd;
            float s = 0;
            for (int h = 0; h < inh; h++) {
                float dt = 0;
                for (int e = 0; e < ihd; e++) dt += q[(size_t)h * ihd + e] * k[e];
                s += (dt > 0 ? dt : 0) * (wt[h] * wscale);
            }
            sc[t] = s;
        }
        if (w->cand_src) { /* model.py select_candidate_blocks */
            const int nb = (lens + cbs - 1) / cbs;
            int *cand = b->cand + (size_t)i * g->ctb;
            float *bmax = b->bscore;
            for (int k = 0; k < nb; k++) {
                float mx = -INFINITY;
                for (int t = k * cbs; t < (k + 1) * cbs && t < lens; t++) mx = fmaxf(mx, sc[t]);
                bmax[k] = k == (lens - 1) / cbs ? INFINITY : mx;
            }
            b->ncand[i] = select_top(bmax, nb, g->ctb, b->order, cand);
            sel_put(state_of(m, seqs[i], L)->cand, mr, g->ctb, pos[i], b->ncand[i], cand);
        } else if (w->cand_filter) {
            int *cand = b->cand + (size_t)i * g->ctb;
            b->ncand[i] = sel_get(state_of(m, seqs[i], v->candidate_source)->cand, mr, g->ctb, pos[i], cand);
            int c = 0;
            for (int t = 0; t < lens; t++) {
                while (c < b->ncand[i] && cand[c] < t / cbs) c++;
                if (c >= b->ncand[i] || cand[c] != t / cbs) sc[t] = -INFINITY;
            }
        }
        b->ntopk[i] = select_top(sc, lens, g->itopk, b->order, b->topk + (size_t)i * g->itopk);
        sel_put(state_of(m, seqs[i], L)->sel, mr, g->itopk, pos[i], b->ntopk[i], b->topk + (size_t)i * g->itopk);
    }
}

/* out[rows, d] = attention of yn. */
static void attention(v41 *m, int L, int rows, const int *seqs, const int *pos, const sq_observer *obs)
{
    const v41_layer_w *w = &m->layers[L];
    const v41_dims *g = &m->g;
    v41_bufs *b = &m->b;
    sq_exec *ex = m->c->ex;
    const int nh = g->nh, hd = g->hd, rd = g->rd, win = g->window;
    const float *freq = w->ratio ? m->inv_cmp : m->inv_win;
    sq_linear_forward(ex, w->wq_a, b->yn, rows, b->qr);
    for (int i = 0; i < rows; i++) rmsnorm_row(b->qr + (size_t)i * g->qr, g->qr, w->q_norm, m->eps, b->qr + (size_t)i * g->qr);
    sq_observe(obs, L, sq_layer_find(&m->c->layers[L].desc, N_WQB), 0, b->qr, rows, g->qr);
    sq_linear_forward(ex, w->wq_b, b->qr, rows, b->q);
    sq_linear_forward(ex, w->wkv, b->yn, rows, b->kv);
    for (int i = 0; i < rows; i++) {
        for (int h = 0; h < nh; h++) rope_pairs(b->q + ((size_t)i * nh + h) * hd + hd - rd, rd, freq, pos[i], false);
        float *kv = b->kv + (size_t)i * hd;
        rmsnorm_row(kv, hd, w->kv_norm, m->eps, kv);
        rope_pairs(kv + hd - rd, rd, freq, pos[i], false);
        memcpy(state_of(m, seqs[i], L)->ring + (size_t)(pos[i] % m->ring) * hd, kv, (size_t)hd * sizeof(float));
    }
    if (w->kv_src) compress(m, L, rows, seqs, pos);
    if (w->idx_src) indexer(m, L, rows, seqs, pos);
    else if (w->ratio) /* the selection of this layer's index source, made when that layer ran these rows */
        for (int i = 0; i < rows; i++)
            b->ntopk[i] = sel_get(state_of(m, seqs[i], w->ix_of)->sel, m->c->opts.max_rows, g->itopk, pos[i],
                                  b->topk + (size_t)i * g->itopk);
    if (w->ratio && obs && obs->probe) { /* the selection, -1 padded to index_topk */
        for (int i = 0; i < rows; i++)
            for (int j = b->ntopk[i]; j < g->itopk; j++) b->topk[(size_t)i * g->itopk + j] = -1;
        probe(obs, L, "index.topk", 'i', b->topk, rows, g->itopk);
    }
    const float scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < rows; i++) {
        const v41_state *S = state_of(m, seqs[i], L);
        const float *pool = w->ratio ? state_of(m, seqs[i], w->kv_of)->pool : NULL;
        const int p0 = pos[i] - win + 1 > 0 ? pos[i] - win + 1 : 0, nw = pos[i] - p0 + 1;
        const int nt = w->ratio ? b->ntopk[i] : 0;
        const int *tk = b->topk + (size_t)i * g->itopk;
        for (int h = 0; h < nh; h++) {
            const float *q = b->q + ((size_t)i * nh + h) * hd;
            float *o = b->o + ((size_t)i * nh + h) * hd;
            float *a = b->att, mx = -1e30f;
            for (int j = 0; j < nw + nt; j++) {
                const float *k = j < nw ? S->ring + (size_t)((p0 + j) % m->ring) * hd : pool + (size_t)tk[j - nw] * hd;
                float s = 0;
                for (int e = 0; e < hd; e++) s += q[e] * k[e];
                a[j] = s * scale;
                if (a[j] > mx) mx = a[j];
            }
            float den = expf(w->sink[h] - mx);
            for (int j = 0; j < nw + nt; j++) den += a[j] = expf(a[j] - mx);
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int j = 0; j < nw + nt; j++) {
                const float *k = j < nw ? S->ring + (size_t)((p0 + j) % m->ring) * hd : pool + (size_t)tk[j - nw] * hd;
                const float p = a[j] / den;
                for (int e = 0; e < hd; e++) o[e] += p * k[e];
            }
            rope_pairs(o + hd - rd, rd, freq, pos[i], true);
        }
    }
    /* grouped low-rank output: og[:, g] = wo_a[g] · o[:, g]. The group's rows of wo_a as a row view
     * (dense, FP8, MXFP4), taken now because the linear may have been swapped since load (the
     * quantizer binds its own); an EXL3 wo_a has no row views (its 16x16 tiles run across the rows),
     * so it runs whole on each group's input into q (free now; nh*hd >= G*olora, v41_check) and the
     * group's rows are kept: G times its arithmetic, exact. */
    const int gi = nh * hd / g->G, ow = g->G * g->olora;
    const int slot_woa = sq_layer_find(&m->c->layers[L].desc, N_WOA);
    for (int k = 0; k < g->G; k++) {
        for (int i = 0; i < rows; i++)
            memcpy(b->gin + (size_t)i * gi, b->o + (size_t)i * nh * hd + (size_t)k * gi, (size_t)gi * sizeof(float));
        sq_observe(obs, L, slot_woa, 0, b->gin, rows, gi);
        sq_linear view;
        const bool whole = sq_linear_rows_view(w->wo_a, k * g->olora, g->olora, &view) != SPARQ_OK;
        if (whole) sparq_err_clear();
        const float *src = whole ? b->q + (size_t)k * g->olora : b->xg;
        const int stride = whole ? ow : g->olora;
        if (whole) sq_linear_forward(ex, w->wo_a, b->gin, rows, b->q);
        else sq_linear_forward(ex, &view, b->gin, rows, b->xg); /* xg: [rows, olora] scratch (olora <= d) */
        for (int i = 0; i < rows; i++)
            memcpy(b->og + (size_t)i * ow + (size_t)k * g->olora, src + (size_t)i * stride,
                   (size_t)g->olora * sizeof(float));
    }
    sq_observe(obs, L, sq_layer_find(&m->c->layers[L].desc, N_WOB), 0, b->og, rows, ow);
    sq_linear_forward(ex, w->wo_b, b->og, rows, b->out);
}

/* --- MoE ----------------------------------------------------------------------------- */

static float softplusf(float x) { return x > 20 ? x : log1pf(expf(x)); }

static void moe(v41 *m, int L, int rows, const sq_observer *obs)
{
    const v41_layer_w *w = &m->layers[L];
    const v41_dims *g = &m->g;
    v41_bufs *b = &m->b;
    sq_exec *ex = m->c->ex;
    const sq_model_config *cfg = &m->c->cfg;
    const int E = g->E, K = g->k, d = g->d, I = g->I;
    const float limit = (float)cfg->v41.swiglu_limit;
    const sq_layer_desc *desc = &m->c->layers[L].desc;
    sq_observe(obs, L, sq_layer_find(desc, N_GATE), 0, b->yn, rows, d);
    sq_linear_forward(ex, w->router, b->yn, rows, b->rl);
    for (int r = 0; r < rows; r++) {
        float *s = b->rl + (size_t)r * E;
        for (int e = 0; e < E; e++) s[e] = sqrtf(softplusf(s[e]));
        int *idx = b->ridx + (size_t)r * K;
        float *wt = b->rw + (size_t)r * K, sum = 0;
        for (int k = 0; k < K; k++) { /* top-k of s + bias, ties to the lower index */
            int best = -1;
            float bv = -INFINITY;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int j = 0; j < k; j++) taken |= idx[j] == e;
                const float v = s[e] + w->gate_bias[e];
                if (!taken && (best < 0 || v > bv)) best = e, bv = v;
            }
            idx[k] = best;
            wt[k] = s[best];
            sum += wt[k];
        }
        for (int k = 0; k < K; k++) {
            if (cfg->norm_topk_prob && K > 1) wt[k] /= sum + 1e-20f;
            wt[k] *= (float)cfg->v41.routed_scaling_factor;
        }
    }
    if (obs && obs->router) obs->router(obs->user, L, rows, K, b->ridx, b->rw);
    memset(b->out, 0, (size_t)rows * d * sizeof(float));
    const int s1 = sq_layer_find(desc, N_W1), s3 = sq_layer_find(desc, N_W3), s2 = sq_layer_find(desc, N_W2);
    if (obs && obs->all_experts) {
        /* calibration: every expert on every row, its inputs observed (or a hook's, runtime/model.h); the
         * output still sums the routed rows only */
        const sq_calib_moe job = {.rows = rows, .d = d, .inter = I, .n_exp = E, .top_k = K, .xn = b->yn,
                                  .gate = w->w1, .up = w->w3, .down = w->w2, .slot_gate = s1, .slot_up = s3,
                                  .slot_down = s2, .idx = b->ridx, .w = b->rw, .limit = limit, .out = b->out};
        const sq_calib_moe_ws ws = {b->g, b->u, b->dn, b->cnt, b->rows_of};
        const sparq_status st = sq_block_moe_all(ex, L, &job, obs, &ws);
        if (st != SPARQ_OK && m->err == SPARQ_OK) m->err = st;
    } else {
        /* rows grouped by expert (counting sort) */
        memset(b->cnt, 0, (size_t)(E + 1) * sizeof(int));
        for (int i = 0; i < rows * K; i++) b->cnt[b->ridx[i] + 1]++;
        for (int e = 0; e < E; e++) b->cnt[e + 1] += b->cnt[e];
        memcpy(b->off, b->cnt, (size_t)(E + 1) * sizeof(int));
        for (int i = 0; i < rows * K; i++) b->rows_of[b->off[b->ridx[i]]++] = i;
        for (int e = 0; e < E; e++) {
            const int n0 = b->cnt[e], n = b->cnt[e + 1] - n0;
            if (!n) continue;
            for (int j = 0; j < n; j++)
                memcpy(b->xg + (size_t)j * d, b->yn + (size_t)(b->rows_of[n0 + j] / K) * d, (size_t)d * sizeof(float));
            sq_observe(obs, L, s1, e, b->xg, n, d);
            sq_observe(obs, L, s3, e, b->xg, n, d);
            sq_linear_forward(ex, &w->w1[e], b->xg, n, b->g);
            sq_linear_forward(ex, &w->w3[e], b->xg, n, b->u);
            sq_swiglu_limit(b->g, b->u, (size_t)n * I, limit, b->g);
            sq_observe(obs, L, s2, e, b->g, n, I);
            sq_linear_forward(ex, &w->w2[e], b->g, n, b->dn);
            for (int j = 0; j < n; j++) {
                const int slot = b->rows_of[n0 + j];
                const float wt = b->rw[slot];
                float *o = b->out + (size_t)(slot / K) * d;
                const float *x = b->dn + (size_t)j * d;
                for (int k = 0; k < d; k++) o[k] += wt * x[k];
            }
        }
    }
    if (w->sw1) {
        const int Is = g->Is;
        sq_observe(obs, L, sq_layer_find(desc, N_SW1), 0, b->yn, rows, d);
        sq_observe(obs, L, sq_layer_find(desc, N_SW3), 0, b->yn, rows, d);
        sq_linear_forward(ex, w->sw1, b->yn, rows, b->g);
        sq_linear_forward(ex, w->sw3, b->yn, rows, b->u);
        sq_swiglu_limit(b->g, b->u, (size_t)rows * Is, limit, b->g);
        sq_observe(obs, L, sq_layer_find(desc, N_SW2), 0, b->g, rows, Is);
        sq_linear_forward(ex, w->sw2, b->g, rows, b->dn);
        for (size_t i = 0; i < (size_t)rows * d; i++) b->out[i] += b->dn[i];
    }
}

/* --- the layer and the graph ops -------------------------------------------------- */

static void layer_rows(v41 *m, int L, float *h, int rows, const int *seqs, const int *pos, const sq_observer *obs)
{
    const v41_layer_w *w = &m->layers[L];
    const v41_dims *g = &m->g;
    v41_bufs *b = &m->b;
    const size_t n = (size_t)g->hc * g->d;
    if (w->table >= 0) engram(m, L, h, rows, seqs, pos, obs);
    for (int r = 0; r < rows; r++) memcpy(b->res + (size_t)r * n, h + (size_t)r * g->W, n * sizeof(float));
    hc_mixes(m, w, 0, h, rows, b->pre_a, b->post_a, b->comb_a);
    float *pm = b->pre_f; /* the lagged pre mix from the hidden rows (pre_f is free until the FFN's mixes) */
    for (int r = 0; r < rows; r++) memcpy(pm + (size_t)r * g->hc, pre_mix_of(m, h, r), (size_t)g->hc * sizeof(float));
    hc_collapse(m, h, pm, rows, b->y);
    for (int r = 0; r < rows; r++) rmsnorm_row(b->y + (size_t)r * g->d, g->d, w->attn_norm, m->eps, b->yn + (size_t)r * g->d);
    const sq_layer_desc *desc = &m->c->layers[L].desc;
    sq_observe(obs, L, sq_layer_find(desc, N_WQA), 0, b->yn, rows, g->d);
    probe(obs, L, "hc_attn.pre", 'f', b->pre_a, rows, g->hc);
    probe(obs, L, "hc_attn.post", 'f', b->post_a, rows, g->hc);
    probe(obs, L, "hc_attn.comb", 'f', b->comb_a, rows, g->hc * g->hc);
    attention(m, L, rows, seqs, pos, obs);
    hc_expand(m, h, b->out, b->res, b->post_a, b->comb_a, rows);

    for (int r = 0; r < rows; r++) memcpy(b->res + (size_t)r * n, h + (size_t)r * g->W, n * sizeof(float));
    hc_mixes(m, w, 1, h, rows, b->pre_f, b->post_f, b->comb_f);
    hc_collapse(m, h, b->pre_a, rows, b->y);
    for (int r = 0; r < rows; r++) rmsnorm_row(b->y + (size_t)r * g->d, g->d, w->ffn_norm, m->eps, b->yn + (size_t)r * g->d);
    moe(m, L, rows, obs);
    hc_expand(m, h, b->out, b->res, b->post_f, b->comb_f, rows);
    for (int r = 0; r < rows; r++) memcpy(pre_mix_of(m, h, r), b->pre_f + (size_t)r * g->hc, (size_t)g->hc * sizeof(float));
}

static sparq_status v41_embed(const sq_model *mc, const int32_t *tokens, int n, float *hidden)
{
    const v41 *m = mc->impl;
    const v41_dims *g = &m->g;
    sq_linear_kind k;
    FORWARD_IF(sq_mdl_dense_kind(mc, m->embed, &k));
    const size_t es = k == SQ_LINEAR_F32 ? 4 : 2;
    for (int i = 0; i < n; i++) {
        RETURN_IF(tokens[i] < 0 || tokens[i] >= g->vocab, SPARQ_E_RANGE, "token id %d at %d outside vocabulary [0, %d)",
                  (int)tokens[i], i, g->vocab);
        float *h = hidden + (size_t)i * g->W;
        memset(h, 0, (size_t)g->W * sizeof(float));
        sq_cpu_to_f32(k, (const char *)m->embed->data + (size_t)tokens[i] * (size_t)g->d * es, (size_t)g->d, h);
        for (int s = 1; s < g->hc; s++) memcpy(h + (size_t)s * g->d, h, (size_t)g->d * sizeof(float));
        float *pm = h + (size_t)g->hc * g->d;
        pm[0] = 1.0f; /* the embedding's pre mix: stream 0 */
        pm[g->hc] = m->cmap ? (float)m->cmap[tokens[i]] : 0.0f;
    }
    return SPARQ_OK;
}


/* The error a step's Engram reads met (its message already set), once. */
static sparq_status step_status(v41 *m)
{
    const sparq_status st = m->err;
    m->err = SPARQ_OK;
    return st;
}

static sparq_status v41_forward_layer(sq_model *mc, int L, float *hidden, int rows, const int *pos, int seq,
                                      const sq_observer *obs)
{
    v41 *m = mc->impl;
    RETURN_IF(seq < 0, SPARQ_E_UNSUPPORTED, "deepseek_v41: forward_layer needs a sequence (its caches hold the "
              "compressed pools); calibration without one is not built yet");
    RETURN_IF(rows < 0 || rows > mc->opts.max_rows, SPARQ_E_RANGE, "forward_layer: %d rows, at most %d (max_rows)",
              rows, mc->opts.max_rows);
    for (int r = 0; r < rows; r++) m->seqs[r] = seq;
    FORWARD_IF(sq_mdl_check_rows(mc, rows, m->seqs, pos));
    if (rows) layer_rows(m, L, hidden, rows, m->seqs, pos, obs);
    engram_drain(m);
    return step_status(m);
}

static sparq_status v41_forward_rows(sq_model *mc, float *hidden, int rows, const int *seqs, const int *pos)
{
    v41 *m = mc->impl;
    FORWARD_IF(sq_mdl_check_rows(mc, rows, seqs, pos));
    engram_prefetch(m, hidden, rows, seqs, pos, mc->first, mc->end); /* read ahead of the layers */
    for (int L = mc->first; L < mc->end && rows; L++) layer_rows(m, L, hidden, rows, seqs, pos, NULL);
    engram_drain(m);
    FORWARD_IF(step_status(m));
    for (int r = 0; r < rows; r++) mc->seq_len[seqs[r]]++;
    return SPARQ_OK;
}

/* yn[n, d] = final_norm(the streams of hidden[n] collapsed with their lagged pre mix), n <= max_rows. */
static void head_rows(v41 *m, const float *hidden, int n, float *yn)
{
    const v41_dims *g = &m->g;
    for (int r = 0; r < n; r++) {
        const float *h = hidden + (size_t)r * g->W;
        memcpy(m->b.pre_a + (size_t)r * g->hc, h + (size_t)g->hc * g->d, (size_t)g->hc * sizeof(float));
    }
    hc_collapse(m, hidden, m->b.pre_a, n, m->b.y); /* reads rows of W floats */
    for (int r = 0; r < n; r++) rmsnorm_row(m->b.y + (size_t)r * g->d, g->d, m->final_norm, m->eps, yn + (size_t)r * g->d);
}

static sparq_status v41_head(sq_model *mc, const float *hidden, int rows, float *logits)
{
    v41 *m = mc->impl;
    const v41_dims *g = &m->g;
    for (int r0 = 0; r0 < rows; r0 += mc->opts.max_rows) {
        const int n = rows - r0 < mc->opts.max_rows ? rows - r0 : mc->opts.max_rows;
        head_rows(m, hidden + (size_t)r0 * g->W, n, m->b.yn);
        sq_linear_forward(mc->ex, &mc->head, m->b.yn, n, logits + (size_t)r0 * g->vocab);
    }
    return SPARQ_OK;
}

static sparq_status v41_head_input(sq_model *mc, const float *hidden, int rows, float *out)
{
    v41 *m = mc->impl;
    for (int r0 = 0; r0 < rows; r0 += mc->opts.max_rows) {
        const int n = rows - r0 < mc->opts.max_rows ? rows - r0 : mc->opts.max_rows;
        head_rows(m, hidden + (size_t)r0 * m->g.W, n, out + (size_t)r0 * m->g.d);
    }
    return SPARQ_OK;
}

static sparq_status v41_forward(sq_model *mc, int seq, const int32_t *tokens, int n, sq_logits_mode mode,
                                float *logits)
{
    v41 *m = mc->impl;
    return sq_mdl_forward_chunked(mc, seq, tokens, n, mode, logits, m->b.x, m->pos, m->g.W);
}

static sparq_status v41_decode_batch(sq_model *mc, int n, const int *seqs, const int32_t *tokens, float *logits)
{
    v41 *m = mc->impl;
    return sq_mdl_decode_batch(mc, n, seqs, tokens, logits, m->b.x, m->pos);
}

static float *v41_hidden_buffer(sq_model *mc) { return ((v41 *)mc->impl)->b.x; }

static const sq_graph_ops v41_graph = {
    .load = v41_load,
    .free = v41_free,
    .embed = v41_embed,
    .forward_layer = v41_forward_layer,
    .forward_rows = v41_forward_rows,
    .head = v41_head,
    .head_input = v41_head_input,
    .forward = v41_forward,
    .decode_batch = v41_decode_batch,
    .hidden_buffer = v41_hidden_buffer,
};

const sq_arch_info sq_arch_deepseek_v41 = {
    .id = SQ_ARCH_DEEPSEEK_V41,
    .model_type = "deepseek_v41",
    .layer_prefix = "layers.",
    .embed_key = "embed",
    .head_key = "head",
    .norm_key = "norm",
    .check = v41_check,
    .layer = v41_layer,
    .tensors = v41_tensors,
    .n_tensors = (int)(sizeof v41_tensors / sizeof v41_tensors[0]),
    .layer_tensors = v41_layer_tensors,
    .skipped_prefixes = v41_skipped,
    .hidden_width = v41_hidden_width,
    .split_ok = v41_split_ok,
    .calib_per_seq = true,
    .expert_split_why = "its MoE (hash-routed first layers, the shared expert, the clamped SwiGLU) runs in "
                        "runtime/models/deepseek_v41.c's own block, which does not skip the experts a rank does "
                        "not hold",
    .default_bits = v41_default_bits,
    .kv_bytes = v41_kv_bytes,
    .workspace_terms = v41_workspace_terms,
    .graph = &v41_graph,
};
