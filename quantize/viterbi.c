/* quantize/viterbi.c — see viterbi.h. The two-pass tail-biting Viterbi
 * driver around trellis_viterbi_step, per-thread scratch, and the
 * tile/matrix entry points. */
#include "quantize/viterbi.h"

#include <math.h>
#include <string.h>

#include "common/alloc.h"

typedef struct viterbi_slot {
    float *cost[2]; /* 2^(16−K) + 8 padding each */
    uint8_t *back;  /* 256 × 2^(16−K) */
} viterbi_slot;

struct viterbi_enc {
    int K;
    trellis_codebook cb;
    trellis_path path;
    float *table; /* 65536 codebook values */
    int n_slots;
    viterbi_slot *slots;
};

void viterbi_free(viterbi_enc *enc)
{
    if (!enc) return;
    for (int i = 0; enc->slots && i < enc->n_slots; i++) {
        sparq_aligned_free(enc->slots[i].cost[0]);
        sparq_aligned_free(enc->slots[i].cost[1]);
        sparq_aligned_free(enc->slots[i].back);
    }
    sparq_free(enc->slots);
    sparq_aligned_free(enc->table);
    sparq_free(enc);
}

sparq_status viterbi_create(viterbi_enc **out, int K, trellis_codebook cb, int max_threads)
{
    *out = NULL;
    RETURN_IF(K < 1 || K > TRELLIS_K_MAX, SPARQ_E_ARG, "viterbi: %d bits per weight, expected 1..8", K);
    RETURN_IF((unsigned)cb >= TRELLIS_CB_COUNT_, SPARQ_E_ARG, "viterbi: unknown codebook %d", (int)cb);
    RETURN_IF(max_threads < 1, SPARQ_E_ARG, "viterbi: max_threads %d < 1", max_threads);
    viterbi_enc *enc = sparq_calloc(1, sizeof *enc);
    if (!enc) return sparq_err(SPARQ_E_NOMEM, "viterbi: no memory for the encoder");
    enc->K = K;
    enc->cb = cb;
    enc->path = trellis_path_best();
    enc->n_slots = max_threads;
    const size_t nodes = (size_t)1 << (16 - K);
    enc->table = sparq_aligned_alloc(64, 65536 * sizeof(float));
    enc->slots = sparq_calloc((size_t)max_threads, sizeof *enc->slots);
    bool ok = enc->table && enc->slots;
    for (int i = 0; ok && i < max_threads; i++) {
        viterbi_slot *s = &enc->slots[i];
        s->cost[0] = sparq_aligned_alloc(64, (nodes + 8) * sizeof(float));
        s->cost[1] = sparq_aligned_alloc(64, (nodes + 8) * sizeof(float));
        s->back = sparq_aligned_alloc(64, 256 * nodes);
        ok = s->cost[0] && s->cost[1] && s->back;
        if (ok) {
            /* the padding is read (not used) by the SIMD step */
            memset(s->cost[0] + nodes, 0, 8 * sizeof(float));
            memset(s->cost[1] + nodes, 0, 8 * sizeof(float));
        }
    }
    if (!ok) {
        viterbi_free(enc);
        return sparq_err(SPARQ_E_NOMEM, "viterbi: no memory for K=%d scratch (%zu bytes per thread)", K,
                         256 * nodes);
    }
    trellis_cb_table(cb, enc->table);
    *out = enc;
    return SPARQ_OK;
}

sparq_status viterbi_set_path(viterbi_enc *enc, trellis_path path)
{
    RETURN_IF(!trellis_path_available(path), SPARQ_E_UNSUPPORTED, "viterbi: code path '%s' not available",
              trellis_path_name(path) ? trellis_path_name(path) : "?");
    enc->path = path;
    return SPARQ_OK;
}

/* Forward over positions order[0..255] from cost_init; returns the cost
 * array holding the final costs. back[i·nodes + e] is step i's choice. */
static float *forward(const viterbi_enc *enc, viterbi_slot *s, int roll, const float *x, const float *w)
{
    const size_t nodes = (size_t)1 << (16 - enc->K);
    float *cin = s->cost[0], *cout = s->cost[1];
    for (int i = 0; i < 256; i++) {
        const int p = (i + roll) & 255;
        trellis_viterbi_step(enc->table, cin, cout, s->back + (size_t)i * nodes, enc->K, x[p], w ? w[p] : 1.0f,
                             enc->path);
        float *t = cin;
        cin = cout;
        cout = t;
    }
    return cin;
}

float viterbi_encode_tile(viterbi_enc *enc, int slot, const float *x, const float *weight, uint16_t *states,
                          float *decoded)
{
    viterbi_slot *s = &enc->slots[slot];
    const int K = enc->K, shift = 16 - K;
    const size_t nodes = (size_t)1 << shift;

    /* pass 1: rotated by 128, free start; trace back to the wrap point */
    memset(s->cost[0], 0, nodes * sizeof(float));
    const float *fin = forward(enc, s, 128, x, weight);
    uint32_t e = 0;
    for (uint32_t i = 1; i < nodes; i++)
        if (fin[i] < fin[e]) e = i;
    for (int i = 255; i >= 128; i--) { /* steps 255..128 are positions 127..0 */
        const uint32_t st = ((uint32_t)s->back[(size_t)i * nodes + e] << shift) | e;
        e = st >> K;
    }
    const uint32_t wrap = e; /* node before position 0 = node at position 255 */

    /* pass 2: positions 0..255, start and end at the wrap node */
    for (size_t i = 0; i < nodes; i++) s->cost[0][i] = INFINITY;
    s->cost[0][wrap] = 0.0f;
    fin = forward(enc, s, 0, x, weight);
    const float err = fin[wrap];
    e = wrap;
    for (int i = 255; i >= 0; i--) {
        const uint32_t st = ((uint32_t)s->back[(size_t)i * nodes + e] << shift) | e;
        states[i] = (uint16_t)st;
        if (decoded) decoded[i] = enc->table[st];
        e = st >> K;
    }
    return err;
}

typedef struct tiles_ctx {
    viterbi_enc *enc;
    const float *x, *w;
    uint16_t *states;
    float *decoded;
    double *err; /* per tile */
} tiles_ctx;

static void tiles_task(void *vctx, size_t t, int tid)
{
    const tiles_ctx *c = vctx;
    c->err[t] = viterbi_encode_tile(c->enc, tid, c->x + t * 256, c->w ? c->w + t * 256 : NULL, c->states + t * 256,
                                    c->decoded ? c->decoded + t * 256 : NULL);
}

sparq_status viterbi_encode_tiles(viterbi_enc *enc, const float *x, const float *weight, size_t n_tiles,
                                  uint16_t *states, float *decoded, double *sq_err, sparq_pool *pool)
{
    RETURN_IF(pool && sparq_pool_size(pool) > enc->n_slots, SPARQ_E_ARG,
              "viterbi: pool of %d threads, encoder made for %d", sparq_pool_size(pool), enc->n_slots);
    double *err = sparq_calloc(n_tiles ? n_tiles : 1, sizeof(double));
    if (!err) return sparq_err(SPARQ_E_NOMEM, "viterbi: no memory for %zu tile errors", n_tiles);
    tiles_ctx c = {enc, x, weight, states, decoded, err};
    sparq_pool_for(pool, n_tiles, tiles_task, &c);
    double total = 0;
    for (size_t t = 0; t < n_tiles; t++) total += err[t];
    if (sq_err) *sq_err = total;
    sparq_free(err);
    return SPARQ_OK;
}

sparq_status viterbi_encode_matrix(viterbi_enc *enc, const float *m, int k, int n, uint16_t *trellis,
                                   float *decoded, sparq_pool *pool)
{
    RETURN_IF(k <= 0 || n <= 0 || k % 16 || n % 16, SPARQ_E_SHAPE,
              "viterbi: matrix %d×%d is not a multiple of 16 on both sides", k, n);
    const size_t kt_count = (size_t)k / 16, nt_count = (size_t)n / 16, n_tiles = kt_count * nt_count;
    float *x = sparq_malloc(n_tiles * 256 * sizeof(float));
    float *dec = decoded ? sparq_malloc(n_tiles * 256 * sizeof(float)) : NULL;
    uint16_t *st = sparq_malloc(n_tiles * 256 * sizeof(uint16_t));
    if (!x || !st || (decoded && !dec)) {
        sparq_free(x);
        sparq_free(dec);
        sparq_free(st);
        return sparq_err(SPARQ_E_NOMEM, "viterbi: no memory for a %d×%d matrix", k, n);
    }
    for (size_t kt = 0; kt < kt_count; kt++)
        for (size_t nt = 0; nt < nt_count; nt++)
            for (int p = 0; p < 256; p++)
                x[(kt * nt_count + nt) * 256 + p] =
                    m[(kt * 16 + trellis_pos_row(p)) * (size_t)n + nt * 16 + trellis_pos_col(p)];
    sparq_status rc = viterbi_encode_tiles(enc, x, NULL, n_tiles, st, dec, NULL, pool);
    if (rc == SPARQ_OK) {
        const size_t tw = (size_t)trellis_tile_words(enc->K);
        for (size_t t = 0; t < n_tiles; t++) trellis_tile_pack(st + t * 256, enc->K, trellis + t * tw);
        if (decoded)
            for (size_t kt = 0; kt < kt_count; kt++)
                for (size_t nt = 0; nt < nt_count; nt++)
                    for (int p = 0; p < 256; p++)
                        decoded[(kt * 16 + trellis_pos_row(p)) * (size_t)n + nt * 16 + trellis_pos_col(p)] =
                            dec[(kt * nt_count + nt) * 256 + p];
    }
    sparq_free(x);
    sparq_free(dec);
    sparq_free(st);
    return rc;
}
