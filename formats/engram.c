/* formats/engram.c — Engram table files: header (de)serialisation, the
 * streaming writer with per-block XXH3-128, the pread reader with an LRU row
 * cache, and the DeepSeek V4.1 hash. Layout: engram.h, docs/engram-format.md. */
#include "formats/engram.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/bytes.h"
#include "common/alloc.h"
#include "formats/safetensors.h"
#include "common/file.h"

#define LAYER_ENTRY 40u
#define COLUMN_ENTRY 24u


uint32_t sq_engram_dtype_bytes(sq_engram_dtype dt)
{
    switch (dt) {
    case SQ_ENGRAM_F8_E4M3:
    case SQ_ENGRAM_UE8M0: return 1;
    case SQ_ENGRAM_F16:
    case SQ_ENGRAM_BF16: return 2;
    case SQ_ENGRAM_F32: return 4;
    default: return 0;
    }
}

/* ---- layout ---- */

/* The compressed ids of a token map must be numbered in order of first
 * appearance (sq_engram_vocab_build's rule), n_compressed of them, so a
 * damaged map is refused rather than hashed. Entries are read with get(i). */
static sparq_status token_map_check(const sq_engram_layout *lay, const uint8_t *le, const uint32_t *map,
                                    const char *name)
{
    uint64_t next = 0; /* the id a new key would get */
    for (uint32_t i = 0; i < lay->n_tokens; i++) {
        const uint32_t v = le ? sparq_get_le32(le + 4 * (size_t)i) : map[i];
        RETURN_IF(v > next || v >= lay->n_compressed, SPARQ_E_FORMAT,
                  "%s: token map entry %u is %u, but only ids 0..%llu may appear there (compressed ids are numbered "
                  "in order of first appearance, %u of them)", name, i, v,
                  (unsigned long long)(next < lay->n_compressed ? next : lay->n_compressed - 1), lay->n_compressed);
        if (v == next) next++;
    }
    RETURN_IF(lay->n_tokens && next != lay->n_compressed, SPARQ_E_FORMAT,
              "%s: the token map has %llu distinct compressed ids, the header says %u", name,
              (unsigned long long)next, lay->n_compressed);
    return SPARQ_OK;
}

static sparq_status layout_check(const sq_engram_layout *lay, const char *name)
{
    RETURN_IF(lay->n_layers < 1 || lay->n_layers > SQ_ENGRAM_MAX_LAYERS, SPARQ_E_FORMAT,
              "%s: %u Engram tables (1..%d allowed)", name, lay->n_layers, SQ_ENGRAM_MAX_LAYERS);
    RETURN_IF(lay->n_columns < 1 || lay->n_columns > SQ_ENGRAM_MAX_COLUMNS, SPARQ_E_FORMAT,
              "%s: %u hash columns (1..%d allowed)", name, lay->n_columns, SQ_ENGRAM_MAX_COLUMNS);
    RETURN_IF(lay->max_ngram < 2 || lay->max_ngram > SQ_ENGRAM_ORDERS || lay->n_heads < 1 ||
                  (uint64_t)(lay->max_ngram - 1) * lay->n_heads != lay->n_columns,
              SPARQ_E_FORMAT, "%s: %u columns, but n-gram orders 2..%u x %u heads give %llu", name, lay->n_columns,
              lay->max_ngram, lay->n_heads, (unsigned long long)(lay->max_ngram - 1) * lay->n_heads);
    RETURN_IF(lay->n_compressed < 1 || lay->pad_id >= lay->n_compressed, SPARQ_E_FORMAT,
              "%s: pad id %u with %u compressed ids", name, lay->pad_id, lay->n_compressed);
    RETURN_IF(lay->n_tokens > SQ_ENGRAM_MAX_TOKENS, SPARQ_E_FORMAT,
              "%s: token map of %u entries (at most %u)", name, lay->n_tokens, SQ_ENGRAM_MAX_TOKENS);
    uint32_t vb = sq_engram_dtype_bytes((sq_engram_dtype)lay->value_dtype);
    RETURN_IF(!vb || lay->value_dtype == SQ_ENGRAM_UE8M0, SPARQ_E_FORMAT, "%s: unknown value dtype %u", name,
              lay->value_dtype);
    RETURN_IF(lay->values_per_row < 1 || lay->values_per_row > (1u << 20), SPARQ_E_FORMAT,
              "%s: %u values per row", name, lay->values_per_row);
    uint64_t rb = (uint64_t)vb * lay->values_per_row;
    if (lay->scale_dtype == SQ_ENGRAM_NONE) {
        RETURN_IF(lay->scales_per_row != 0, SPARQ_E_FORMAT, "%s: scales_per_row %u without a scale dtype", name,
                  lay->scales_per_row);
    } else {
        uint32_t sb = sq_engram_dtype_bytes((sq_engram_dtype)lay->scale_dtype);
        RETURN_IF(!sb, SPARQ_E_FORMAT, "%s: unknown scale dtype %u", name, lay->scale_dtype);
        RETURN_IF(lay->scales_per_row < 1 || lay->values_per_row % lay->scales_per_row, SPARQ_E_FORMAT,
                  "%s: %u scales do not divide %u values per row into equal groups", name, lay->scales_per_row,
                  lay->values_per_row);
        rb += (uint64_t)sb * lay->scales_per_row;
    }
    RETURN_IF(rb != lay->row_bytes, SPARQ_E_FORMAT, "%s: row_bytes %u but the dtypes and counts give %llu", name,
              lay->row_bytes, (unsigned long long)rb);
    /* the hash multiplies compressed ids by the multipliers in int64 (the
     * vendor's numpy): the products must not overflow, or unsigned and signed
     * arithmetic would give different buckets */
    const uint64_t mmax = (uint64_t)INT64_MAX / (lay->n_compressed > 1 ? lay->n_compressed - 1 : 1);
    uint64_t total_bytes = 0; /* all tables: bounded so that no file offset can overflow */
    for (uint32_t l = 0; l < lay->n_layers; l++) {
        RETURN_IF(l && lay->layer_ids[l] <= lay->layer_ids[l - 1], SPARQ_E_FORMAT,
                  "%s: table %u is model layer %d, after layer %d (tables go in increasing layer order)", name, l,
                  lay->layer_ids[l], lay->layer_ids[l - 1]);
        RETURN_IF(lay->layer_ids[l] < 0, SPARQ_E_FORMAT, "%s: table %u has model layer %d", name, l,
                  lay->layer_ids[l]);
        for (uint32_t k = 0; k < SQ_ENGRAM_ORDERS; k++) {
            const uint64_t m = lay->multipliers[l][k];
            RETURN_IF(k < lay->max_ngram ? (!(m & 1) || m > mmax) : m != 0, SPARQ_E_FORMAT,
                      "%s: table %u multiplier %u is %llu (used ones odd and at most %llu, unused ones 0)", name, l,
                      k, (unsigned long long)m, (unsigned long long)mmax);
        }
        uint64_t off = 0;
        for (uint32_t c = 0; c < lay->n_columns; c++) {
            RETURN_IF(lay->primes[l][c] < 1 || lay->primes[l][c] > ((uint64_t)1 << 40), SPARQ_E_FORMAT,
                      "%s: table %u column %u has %llu buckets (1..2^40)", name, l, c,
                      (unsigned long long)lay->primes[l][c]);
            uint64_t cb;
            RETURN_IF(!sparq_mul_u64(lay->primes[l][c], lay->row_bytes, &cb) ||
                          !sparq_add_u64(total_bytes, cb, &total_bytes) || total_bytes > ((uint64_t)1 << 56),
                      SPARQ_E_FORMAT, "%s: tables larger than 2^56 bytes", name);
            RETURN_IF(lay->row_offset[l][c] != off, SPARQ_E_FORMAT,
                      "%s: table %u column %u row offset %llu, expected %llu (sum of earlier columns)", name, l, c,
                      (unsigned long long)lay->row_offset[l][c], (unsigned long long)off);
            off += lay->primes[l][c];
        }
    }
    return lay->token_map ? token_map_check(lay, NULL, lay->token_map, name) : SPARQ_OK;
}

/* A layout the caller built is an argument error, not a format error. */
static sparq_status as_arg_error(sparq_status st)
{
    if (st == SPARQ_OK) return st;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", sparq_errmsg());
    return sparq_err(SPARQ_E_ARG, "%s", msg);
}

sparq_status sq_engram_layout_finish(sq_engram_layout *lay)
{
    RETURN_IF(lay->n_layers > SQ_ENGRAM_MAX_LAYERS || lay->n_columns > SQ_ENGRAM_MAX_COLUMNS, SPARQ_E_ARG,
              "Engram layout: %u tables x %u columns is more than %d x %d", lay->n_layers, lay->n_columns,
              SQ_ENGRAM_MAX_LAYERS, SQ_ENGRAM_MAX_COLUMNS);
    for (uint32_t l = 0; l < lay->n_layers; l++) {
        uint64_t off = 0;
        for (uint32_t c = 0; c < lay->n_columns; c++) {
            lay->row_offset[l][c] = off;
            off += lay->primes[l][c];
        }
    }
    return as_arg_error(layout_check(lay, "Engram layout"));
}

uint64_t sq_engram_layer_rows(const sq_engram_layout *lay, uint32_t layer)
{
    uint64_t s = 0;
    for (uint32_t c = 0; c < lay->n_columns; c++) s += lay->primes[layer][c];
    return s;
}

int sq_engram_table_of(const sq_engram_layout *lay, int L)
{
    for (uint32_t i = 0; i < lay->n_layers; i++)
        if (lay->layer_ids[i] == L) return (int)i;
    return -1;
}

void sq_engram_layout_subset(const sq_engram_layout *lay, int first, int end, sq_engram_layout *out)
{
    sq_engram_layout o = *lay;
    o.n_layers = 0;
    memset(o.layer_ids, 0, sizeof o.layer_ids);
    memset(o.multipliers, 0, sizeof o.multipliers);
    memset(o.primes, 0, sizeof o.primes);
    memset(o.row_offset, 0, sizeof o.row_offset);
    for (uint32_t l = 0; l < lay->n_layers; l++) {
        if (lay->layer_ids[l] < first || lay->layer_ids[l] >= end) continue;
        const uint32_t k = o.n_layers++;
        o.layer_ids[k] = lay->layer_ids[l];
        memcpy(o.multipliers[k], lay->multipliers[l], sizeof o.multipliers[k]);
        memcpy(o.primes[k], lay->primes[l], sizeof o.primes[k]);
        memcpy(o.row_offset[k], lay->row_offset[l], sizeof o.row_offset[k]);
    }
    *out = o;
}

bool sq_engram_layout_equal(const sq_engram_layout *a, const sq_engram_layout *b, bool maps)
{
    sq_engram_layout x = *a, y = *b;
    x.token_map = y.token_map = NULL;
    x.n_tokens = y.n_tokens = 0;
    if (memcmp(&x, &y, sizeof x)) return false;
    if (!maps) return true;
    return a->n_tokens == b->n_tokens &&
           (!a->n_tokens || !memcmp(a->token_map, b->token_map, (size_t)a->n_tokens * sizeof *a->token_map));
}

/* The released multipliers (reference.md §3.1), by model layer. */
static const struct {
    int layer;
    uint64_t m[4];
} v41_mult[] = {{1, {76632096046245ull, 4839876093313ull, 35959672319349ull, 73987337458391ull}},
                {14, {67716810739261ull, 51510806800915ull, 30921347202721ull, 82619226485591ull}}};

sparq_status sq_engram_layout_from_config(sq_engram_layout *lay, const sq_model_config *c, const char *name)
{
    const sq_v41_config *v = &c->v41;
    memset(lay, 0, sizeof *lay);
    if (c->arch != SQ_ARCH_DEEPSEEK_V41 || !v->n_engram) return SPARQ_OK;
    RETURN_IF(v->n_engram != 2 || v->engram_layer[0] != 1 || v->engram_layer[1] != 14 ||
                  v->engram_max_ngram != 4 || v->engram_n_heads != SQ_ENGRAM_V41_HEADS ||
                  (v->engram_compressed_vocab && v->engram_compressed_vocab != 99092),
              SPARQ_E_UNSUPPORTED,
              "%s: Engram on layers %d%s of n-gram order %d x %d heads (compressed vocabulary %lld): sparq knows the "
              "hash multipliers of the released layout only (layers 1 and 14, orders 2..4, 8 heads, 99092 "
              "compressed ids)", name, v->engram_layer[0], v->n_engram > 1 ? " and more" : "", v->engram_max_ngram,
              v->engram_n_heads, (long long)v->engram_compressed_vocab);
    RETURN_IF(v->engram_head_dim < 32 || v->engram_head_dim % 32 || v->engram_vocab_size < 2 ||
                  v->engram_pad_id < 0 || v->engram_pad_id >= 99092,
              SPARQ_E_FORMAT, "%s: Engram head_dim %d (a multiple of 32), vocab_size %lld, pad id %lld", name,
              v->engram_head_dim, (long long)v->engram_vocab_size, (long long)v->engram_pad_id);
    lay->value_dtype = SQ_ENGRAM_F8_E4M3;
    lay->values_per_row = (uint32_t)v->engram_head_dim;
    lay->scale_dtype = SQ_ENGRAM_UE8M0;
    lay->scales_per_row = lay->values_per_row / 32;
    lay->row_bytes = lay->values_per_row + lay->scales_per_row;
    lay->max_ngram = (uint32_t)v->engram_max_ngram;
    lay->n_heads = (uint32_t)v->engram_n_heads;
    lay->n_columns = (lay->max_ngram - 1) * lay->n_heads;
    lay->pad_id = (uint32_t)v->engram_pad_id;
    lay->n_compressed = 99092;
    lay->n_layers = (uint32_t)v->n_engram;
    /* the consecutive primes >= engram_vocab_size, in (table, order, head) order */
    uint64_t p = (uint64_t)v->engram_vocab_size - 1;
    for (uint32_t l = 0; l < lay->n_layers; l++) {
        lay->layer_ids[l] = v->engram_layer[l];
        for (size_t k = 0; k < sizeof v41_mult / sizeof v41_mult[0]; k++)
            if (v41_mult[k].layer == v->engram_layer[l]) memcpy(lay->multipliers[l], v41_mult[k].m, sizeof v41_mult[k].m);
        for (uint32_t col = 0; col < lay->n_columns; col++) lay->primes[l][col] = p = sq_engram_next_prime(p);
    }
    FORWARD_IF(sq_engram_layout_finish(lay));
    for (uint32_t l = 0; l < lay->n_layers; l++)
        RETURN_IF(v->engram_rows[l] && v->engram_rows[l] != sq_engram_layer_rows(lay, l), SPARQ_E_FORMAT,
                  "%s: engram_num_embeddings[%u] is %llu, but the %u consecutive primes from engram_vocab_size %lld "
                  "on sum to %llu", name, l, (unsigned long long)v->engram_rows[l], lay->n_columns,
                  (long long)v->engram_vocab_size, (unsigned long long)sq_engram_layer_rows(lay, l));
    return SPARQ_OK;
}

/* ---- header ---- */

static uint64_t header_size_for(const sq_engram_layout *lay)
{
    uint64_t n = SQ_ENGRAM_FIXED_BYTES + (uint64_t)lay->n_layers * LAYER_ENTRY +
                 (uint64_t)lay->n_layers * lay->n_columns * COLUMN_ENTRY + 4ull * lay->n_tokens + 8;
    return (n + 4095u) & ~(uint64_t)4095u;
}

/* Byte offset of the token map in the header. */
static size_t token_map_at(const sq_engram_layout *lay)
{
    return SQ_ENGRAM_FIXED_BYTES + (size_t)lay->n_layers * LAYER_ENTRY +
           (size_t)lay->n_layers * lay->n_columns * COLUMN_ENTRY;
}

/* Fill the node-dependent part of h (sizes, offsets) from h->layout. */
static void header_place(sq_engram_header *h, uint32_t node, uint32_t nodes, uint32_t block_bytes)
{
    const sq_engram_layout *lay = &h->layout;
    h->header_bytes = (uint32_t)header_size_for(lay);
    h->node_index = node;
    h->node_count = nodes;
    h->block_bytes = block_bytes;
    h->data_offset = h->header_bytes;
    uint64_t off = h->data_offset;
    for (uint32_t l = 0; l < lay->n_layers; l++)
        for (uint32_t c = 0; c < lay->n_columns; c++) {
            h->file_offset[l][c] = off;
            off += lay->primes[l][c] * lay->row_bytes;
        }
    h->data_bytes = off - h->data_offset;
    h->checksum_offset = off;
    h->n_blocks = h->data_bytes / block_bytes + (h->data_bytes % block_bytes != 0);
}

static void header_serialise(const sq_engram_header *h, uint8_t *buf)
{
    const sq_engram_layout *lay = &h->layout;
    memset(buf, 0, h->header_bytes);
    memcpy(buf, SQ_ENGRAM_MAGIC, 8);
    const uint32_t f32[] = {SQ_ENGRAM_VERSION, h->header_bytes, lay->row_bytes,     lay->value_dtype,
                            lay->values_per_row, lay->scale_dtype, lay->scales_per_row, lay->n_layers,
                            lay->n_columns,     h->node_index,    h->node_count,      h->block_bytes};
    for (int i = 0; i < 12; i++) sparq_put_le32(buf + 8 + 4 * i, f32[i]);
    sparq_put_le64(buf + 56, h->data_offset);
    sparq_put_le64(buf + 64, h->data_bytes);
    sparq_put_le64(buf + 72, h->checksum_offset);
    sparq_put_le64(buf + 80, h->n_blocks);
    const uint32_t hash32[] = {lay->max_ngram, lay->n_heads, lay->pad_id, lay->n_tokens, lay->n_compressed, 0};
    for (int i = 0; i < 6; i++) sparq_put_le32(buf + 88 + 4 * i, hash32[i]);
    uint8_t *p = buf + SQ_ENGRAM_FIXED_BYTES;
    for (uint32_t l = 0; l < lay->n_layers; l++, p += LAYER_ENTRY) {
        sparq_put_le32(p, (uint32_t)lay->layer_ids[l]);
        for (int k = 0; k < SQ_ENGRAM_ORDERS; k++) sparq_put_le64(p + 8 + 8 * k, lay->multipliers[l][k]);
    }
    for (uint32_t l = 0; l < lay->n_layers; l++)
        for (uint32_t c = 0; c < lay->n_columns; c++, p += COLUMN_ENTRY) {
            sparq_put_le64(p, lay->primes[l][c]);
            sparq_put_le64(p + 8, lay->row_offset[l][c]);
            sparq_put_le64(p + 16, h->file_offset[l][c]);
        }
    for (uint32_t i = 0; i < lay->n_tokens; i++, p += 4) sparq_put_le32(p, lay->token_map[i]);
    sparq_put_le64(buf + h->header_bytes - 8, XXH3_64bits(buf, h->header_bytes - 8));
}

sparq_status sq_engram_header_parse(sq_engram_header *h, const uint8_t *buf, size_t len, uint64_t file_size,
                                    const char *name)
{
    memset(h, 0, sizeof *h);
    sq_engram_layout *lay = &h->layout;
    RETURN_IF(len < SQ_ENGRAM_FIXED_BYTES, SPARQ_E_FORMAT, "%s: %zu bytes is too short for an Engram header", name,
              len);
    RETURN_IF(memcmp(buf, SQ_ENGRAM_MAGIC, 8), SPARQ_E_FORMAT, "%s: not an Engram table file (bad magic)", name);
    uint32_t version = sparq_get_le32(buf + 8);
    RETURN_IF(version != SQ_ENGRAM_VERSION, SPARQ_E_UNSUPPORTED,
              "%s: Engram file version %u; this sparq reads %d (pack the model again)", name, version,
              SQ_ENGRAM_VERSION);
    h->header_bytes = sparq_get_le32(buf + 12);
    lay->row_bytes = sparq_get_le32(buf + 16);
    lay->value_dtype = sparq_get_le32(buf + 20);
    lay->values_per_row = sparq_get_le32(buf + 24);
    lay->scale_dtype = sparq_get_le32(buf + 28);
    lay->scales_per_row = sparq_get_le32(buf + 32);
    lay->n_layers = sparq_get_le32(buf + 36);
    lay->n_columns = sparq_get_le32(buf + 40);
    h->node_index = sparq_get_le32(buf + 44);
    h->node_count = sparq_get_le32(buf + 48);
    h->block_bytes = sparq_get_le32(buf + 52);
    h->data_offset = sparq_get_le64(buf + 56);
    h->data_bytes = sparq_get_le64(buf + 64);
    h->checksum_offset = sparq_get_le64(buf + 72);
    h->n_blocks = sparq_get_le64(buf + 80);
    lay->max_ngram = sparq_get_le32(buf + 88);
    lay->n_heads = sparq_get_le32(buf + 92);
    lay->pad_id = sparq_get_le32(buf + 96);
    lay->n_tokens = sparq_get_le32(buf + 100);
    lay->n_compressed = sparq_get_le32(buf + 104);
    RETURN_IF(sparq_get_le32(buf + 108) != 0, SPARQ_E_FORMAT, "%s: reserved header field is not 0", name);
    RETURN_IF(lay->n_layers < 1 || lay->n_layers > SQ_ENGRAM_MAX_LAYERS || lay->n_columns < 1 ||
                  lay->n_columns > SQ_ENGRAM_MAX_COLUMNS,
              SPARQ_E_FORMAT, "%s: %u tables x %u columns (at most %d x %d)", name, lay->n_layers, lay->n_columns,
              SQ_ENGRAM_MAX_LAYERS, SQ_ENGRAM_MAX_COLUMNS);
    RETURN_IF(lay->n_tokens < 1 || lay->n_tokens > SQ_ENGRAM_MAX_TOKENS, SPARQ_E_FORMAT,
              "%s: token map of %u entries (1..%u)", name, lay->n_tokens, SQ_ENGRAM_MAX_TOKENS);
    RETURN_IF(h->header_bytes != header_size_for(lay), SPARQ_E_FORMAT,
              "%s: header_bytes %u, expected %llu for %u tables x %u columns and %u tokens", name, h->header_bytes,
              (unsigned long long)header_size_for(lay), lay->n_layers, lay->n_columns, lay->n_tokens);
    RETURN_IF(len < h->header_bytes || file_size < h->header_bytes, SPARQ_E_FORMAT,
              "%s: header of %u bytes but only %llu available (truncated file?)", name, h->header_bytes,
              (unsigned long long)(len < file_size ? len : file_size));
    RETURN_IF(sparq_get_le64(buf + h->header_bytes - 8) != XXH3_64bits(buf, h->header_bytes - 8), SPARQ_E_CHECKSUM,
              "%s: Engram header checksum mismatch (damaged header)", name);
    const uint8_t *p = buf + SQ_ENGRAM_FIXED_BYTES;
    for (uint32_t l = 0; l < lay->n_layers; l++, p += LAYER_ENTRY) {
        lay->layer_ids[l] = (int32_t)sparq_get_le32(p);
        RETURN_IF(sparq_get_le32(p + 4) != 0, SPARQ_E_FORMAT, "%s: table %u: reserved field is not 0", name, l);
        for (int k = 0; k < SQ_ENGRAM_ORDERS; k++) lay->multipliers[l][k] = sparq_get_le64(p + 8 + 8 * k);
    }
    for (uint32_t l = 0; l < lay->n_layers; l++)
        for (uint32_t c = 0; c < lay->n_columns; c++, p += COLUMN_ENTRY) {
            lay->primes[l][c] = sparq_get_le64(p);
            lay->row_offset[l][c] = sparq_get_le64(p + 8);
            h->file_offset[l][c] = sparq_get_le64(p + 16);
        }
    FORWARD_IF(layout_check(lay, name)); /* token_map is NULL: checked from the bytes below */
    FORWARD_IF(token_map_check(lay, buf + token_map_at(lay), NULL, name));
    for (size_t i = token_map_at(lay) + 4ull * lay->n_tokens; i < h->header_bytes - 8; i++)
        RETURN_IF(buf[i], SPARQ_E_FORMAT, "%s: header padding byte %zu is not 0", name, i);
    RETURN_IF(h->node_count < 1 || h->node_index >= h->node_count || h->node_count > 1024, SPARQ_E_FORMAT,
              "%s: node %u of %u", name, h->node_index, h->node_count);
    RETURN_IF(h->block_bytes < 4096 || (h->block_bytes & (h->block_bytes - 1)), SPARQ_E_FORMAT,
              "%s: block_bytes %u is not a power of two >= 4096", name, h->block_bytes);
    /* every derived offset must be exactly what the writer computes */
    sq_engram_header want;
    memset(&want, 0, sizeof want);
    want.layout = *lay;
    header_place(&want, h->node_index, h->node_count, h->block_bytes);
    RETURN_IF(h->data_offset != want.data_offset || h->data_bytes != want.data_bytes ||
                  h->checksum_offset != want.checksum_offset || h->n_blocks != want.n_blocks,
              SPARQ_E_FORMAT, "%s: data/checksum offsets do not match the layout", name);
    for (uint32_t l = 0; l < lay->n_layers; l++)
        for (uint32_t c = 0; c < lay->n_columns; c++)
            RETURN_IF(h->file_offset[l][c] != want.file_offset[l][c], SPARQ_E_FORMAT,
                      "%s: table %u column %u: file offset %llu, expected %llu", name, l, c,
                      (unsigned long long)h->file_offset[l][c], (unsigned long long)want.file_offset[l][c]);
    uint64_t end = h->checksum_offset + h->n_blocks * 16;
    RETURN_IF(file_size != end, SPARQ_E_FORMAT, "%s: file is %llu bytes but its header describes %llu (%s)", name,
              (unsigned long long)file_size, (unsigned long long)end, file_size < end ? "truncated" : "trailing data");
    return SPARQ_OK;
}

/* ---- writer ---- */

typedef struct wstate {
    const sq_engram_header *h;
    sparq_atomic_file f;
    uint8_t *block;            /* block_bytes */
    uint64_t fill;             /* bytes in block */
    XXH128_canonical_t *sums;  /* n_blocks */
    uint64_t n_sums;
} wstate;

static sparq_status flush_block(wstate *w)
{
    if (!w->fill) return SPARQ_OK;
    XXH128_canonicalFromHash(&w->sums[w->n_sums++], XXH3_128bits(w->block, (size_t)w->fill));
    sparq_status st = sparq_atomic_write(&w->f, w->block, (size_t)w->fill);
    w->fill = 0;
    return st;
}

static sparq_status put_data(wstate *w, const uint8_t *p, uint64_t n)
{
    while (n) {
        uint64_t k = w->h->block_bytes - w->fill;
        if (k > n) k = n;
        memcpy(w->block + w->fill, p, (size_t)k);
        w->fill += k;
        p += k;
        n -= k;
        if (w->fill == w->h->block_bytes) FORWARD_IF(flush_block(w));
    }
    return SPARQ_OK;
}

sparq_status sq_engram_write(const char *path, const sq_engram_layout *lay, uint32_t node, uint32_t nodes,
                             uint32_t block_bytes, sq_engram_row_fn fn, void *ctx)
{
    RETURN_IF(nodes < 1 || node >= nodes || nodes > 1024, SPARQ_E_ARG, "%s: node %u of %u", path, node, nodes);
    RETURN_IF(lay->n_tokens < 1 || !lay->token_map, SPARQ_E_ARG,
              "%s: an Engram file needs the token -> compressed id map (none given)", path);
    RETURN_IF(block_bytes < 4096 || (block_bytes & (block_bytes - 1)), SPARQ_E_ARG,
              "%s: block size %u is not a power of two >= 4096", path, block_bytes);
    sparq_status st = as_arg_error(layout_check(lay, path));
    if (st != SPARQ_OK) return st;
    sq_engram_header *h = sparq_calloc(1, sizeof *h);
    RETURN_IF(!h, SPARQ_E_NOMEM, "%s: out of memory", path);
    h->layout = *lay;
    header_place(h, node, nodes, block_bytes);
    wstate w;
    memset(&w, 0, sizeof w);
    w.h = h;
    const uint64_t chunk_rows = 4096;
    uint8_t *hdr = sparq_calloc(1, h->header_bytes);
    uint8_t *rows = sparq_malloc((size_t)(chunk_rows * lay->row_bytes));
    w.block = sparq_malloc(block_bytes);
    w.sums = sparq_calloc(h->n_blocks ? (size_t)h->n_blocks : 1, sizeof *w.sums);
    bool open = false;
    if (!hdr || !rows || !w.block || !w.sums) {
        st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    header_serialise(h, hdr);
    st = sparq_atomic_open(&w.f, path);
    if (st != SPARQ_OK) goto done;
    open = true;
    st = sparq_atomic_write(&w.f, hdr, h->header_bytes);
    for (uint32_t l = 0; l < lay->n_layers && st == SPARQ_OK; l++)
        for (uint32_t c = 0; c < lay->n_columns && st == SPARQ_OK; c++) {
            for (uint64_t b = 0; b < lay->primes[l][c] && st == SPARQ_OK; b += chunk_rows) {
                uint64_t n = lay->primes[l][c] - b < chunk_rows ? lay->primes[l][c] - b : chunk_rows;
                st = fn(ctx, l, c, b, n, rows);
                if (st == SPARQ_OK) st = put_data(&w, rows, n * lay->row_bytes);
            }
        }
    if (st == SPARQ_OK) st = flush_block(&w);
    if (st == SPARQ_OK && w.n_sums != h->n_blocks)
        st = sparq_err(SPARQ_E_STATE, "%s: wrote %llu blocks, expected %llu", path, (unsigned long long)w.n_sums,
                       (unsigned long long)h->n_blocks);
    if (st == SPARQ_OK) st = sparq_atomic_write(&w.f, w.sums, (size_t)(h->n_blocks * 16));
    if (st == SPARQ_OK) {
        open = false;
        st = sparq_atomic_commit(&w.f);
    }
done:
    if (open) sparq_atomic_abort(&w.f);
    sparq_free(hdr);
    sparq_free(rows);
    sparq_free(w.block);
    sparq_free(w.sums);
    sparq_free(h);
    return st;
}

/* ---- reader with an LRU row cache ---- */

/* Open addressing (linear probing, backward-shift deletion) from key to
 * cache slot; slots form a doubly linked list, most recent first. */
struct sq_engram_reader {
    char *path;
    int fd;
    sq_engram_header h;
    uint64_t cap;          /* slots */
    uint8_t *rows;         /* cap * row_bytes */
    uint64_t *slot_key;    /* cap */
    int64_t *prev, *next;  /* cap, LRU list */
    int64_t head, tail;    /* most / least recent, -1 if empty */
    uint64_t used;
    int64_t *table;        /* tsize, slot index or -1 */
    uint64_t tmask;
    uint64_t hits, misses;
    uint32_t *token_map;   /* the header's map, h.layout.token_map points here */
    /* sq_engram_open_mapped: the checkpoint's tables, values and scales apart */
    const uint8_t *mvals[SQ_ENGRAM_MAX_LAYERS], *mscales[SQ_ENGRAM_MAX_LAYERS];
    bool mapped;
};

static uint64_t key_of(const sq_engram_key *k) { return (uint64_t)k->layer << 56 | (uint64_t)k->column << 48 | k->bucket; }

static uint64_t hash_key(uint64_t k)
{
    k ^= k >> 31;
    k *= 0x9E3779B97F4A7C15ull;
    return k ^ (k >> 29);
}

static int64_t table_find(const sq_engram_reader *r, uint64_t key, uint64_t *pos)
{
    uint64_t i = hash_key(key) & r->tmask;
    while (r->table[i] >= 0) {
        if (r->slot_key[r->table[i]] == key) {
            *pos = i;
            return r->table[i];
        }
        i = (i + 1) & r->tmask;
    }
    *pos = i;
    return -1;
}

static void table_remove(sq_engram_reader *r, uint64_t i)
{
    r->table[i] = -1;
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & r->tmask;
        if (r->table[j] < 0) return;
        uint64_t home = hash_key(r->slot_key[r->table[j]]) & r->tmask;
        /* move j back to i if its home is not in (i, j] cyclically */
        bool between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            r->table[i] = r->table[j];
            r->table[j] = -1;
            i = j;
        }
    }
}

static void lru_unlink(sq_engram_reader *r, int64_t s)
{
    if (r->prev[s] >= 0) r->next[r->prev[s]] = r->next[s];
    else r->head = r->next[s];
    if (r->next[s] >= 0) r->prev[r->next[s]] = r->prev[s];
    else r->tail = r->prev[s];
}

static void lru_push_front(sq_engram_reader *r, int64_t s)
{
    r->prev[s] = -1;
    r->next[s] = r->head;
    if (r->head >= 0) r->prev[r->head] = s;
    r->head = s;
    if (r->tail < 0) r->tail = s;
}

void sq_engram_close(sq_engram_reader *r)
{
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    sparq_free(r->path);
    sparq_free(r->rows);
    sparq_free(r->slot_key);
    sparq_free(r->prev);
    sparq_free(r->next);
    sparq_free(r->table);
    sparq_free(r->token_map);
    sparq_free(r);
}

sparq_status sq_engram_open(sq_engram_reader **out, const char *path, uint64_t cache_rows)
{
    *out = NULL;
    sq_engram_reader *r = sparq_calloc(1, sizeof *r);
    RETURN_IF(!r, SPARQ_E_NOMEM, "%s: out of memory", path);
    r->fd = -1;
    r->head = r->tail = -1;
    sparq_status st = SPARQ_OK;
    uint8_t *hdr = NULL;
    r->path = sparq_strdup(path);
    if (!r->path) {
        st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    uint64_t fsize = 0;
    st = sparq_open_regular(path, &r->fd, &fsize);
    if (st != SPARQ_OK) goto fail;
    /* the fixed part says how long the header is; then the whole header */
    uint8_t fixed[SQ_ENGRAM_FIXED_BYTES];
    if (fsize < SQ_ENGRAM_FIXED_BYTES) {
        st = sparq_err(SPARQ_E_FORMAT, "%s: %llu bytes is too short for an Engram table file (truncated?)", path,
                       (unsigned long long)fsize);
        goto fail;
    }
    st = sparq_pread_full(r->fd, fixed, sizeof fixed, 0, path);
    if (st != SPARQ_OK) goto fail;
    size_t hl = sparq_get_le32(fixed + 12);
    if (hl < SQ_ENGRAM_FIXED_BYTES || hl > fsize || hl > ((size_t)32 << 20)) hl = SQ_ENGRAM_FIXED_BYTES;
    hdr = sparq_malloc(hl);
    if (!hdr) {
        st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    st = sparq_pread_full(r->fd, hdr, hl, 0, path);
    if (st == SPARQ_OK) st = sq_engram_header_parse(&r->h, hdr, hl, fsize, path);
    if (st != SPARQ_OK) goto fail;
    r->token_map = sparq_malloc((size_t)r->h.layout.n_tokens * sizeof *r->token_map);
    if (!r->token_map) {
        st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (uint32_t i = 0; i < r->h.layout.n_tokens; i++)
        r->token_map[i] = sparq_get_le32(hdr + token_map_at(&r->h.layout) + 4 * (size_t)i);
    r->h.layout.token_map = r->token_map;
    if (cache_rows) {
        r->cap = cache_rows;
        uint64_t ts = 2;
        while (ts < 2 * cache_rows) ts <<= 1;
        r->tmask = ts - 1;
        uint64_t rb;
        if (!sparq_mul_u64(cache_rows, r->h.layout.row_bytes, &rb) || rb > SIZE_MAX) {
            st = sparq_err(SPARQ_E_RANGE, "%s: cache of %llu rows is too large", path, (unsigned long long)cache_rows);
            goto fail;
        }
        r->rows = sparq_malloc((size_t)rb);
        r->slot_key = sparq_calloc((size_t)cache_rows, sizeof *r->slot_key);
        r->prev = sparq_calloc((size_t)cache_rows, sizeof *r->prev);
        r->next = sparq_calloc((size_t)cache_rows, sizeof *r->next);
        r->table = sparq_malloc((size_t)ts * sizeof *r->table);
        if (!r->rows || !r->slot_key || !r->prev || !r->next || !r->table) {
            st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory for a cache of %llu rows", path,
                           (unsigned long long)cache_rows);
            goto fail;
        }
        memset(r->table, 0xFF, (size_t)ts * sizeof *r->table);
    }
    sparq_free(hdr);
    *out = r;
    return SPARQ_OK;
fail:
    sparq_free(hdr);
    sq_engram_close(r);
    return st;
}

const sq_engram_header *sq_engram_reader_header(const sq_engram_reader *r) { return &r->h; }

void sq_engram_cache_stats(const sq_engram_reader *r, uint64_t *hits, uint64_t *misses)
{
    *hits = r->hits;
    *misses = r->misses;
}

sparq_status sq_engram_open_mapped(sq_engram_reader **out, const sq_engram_layout *lay, const uint8_t *const *values,
                                   const uint8_t *const *scales, const char *name)
{
    *out = NULL;
    RETURN_IF(lay->n_layers > SQ_ENGRAM_MAX_LAYERS || lay->value_dtype != SQ_ENGRAM_F8_E4M3 ||
                  (lay->scales_per_row && lay->scale_dtype != SQ_ENGRAM_UE8M0),
              SPARQ_E_UNSUPPORTED, "%s: mapped Engram tables must be F8_E4M3 values with UE8M0 scales", name);
    sq_engram_reader *r = sparq_calloc(1, sizeof *r);
    RETURN_IF(!r, SPARQ_E_NOMEM, "%s: out of memory", name);
    r->fd = -1;
    r->head = r->tail = -1;
    r->path = sparq_strdup(name);
    if (!r->path) {
        sparq_free(r);
        return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", name);
    }
    r->h.layout = *lay;
    r->h.node_count = 1;
    r->mapped = true;
    for (uint32_t l = 0; l < lay->n_layers; l++) {
        r->mvals[l] = values[l];
        r->mscales[l] = scales[l];
        for (uint32_t c = 0; c < lay->n_columns; c++) r->h.file_offset[l][c] = lay->row_offset[l][c];
    }
    *out = r;
    return SPARQ_OK;
}

void sq_engram_row_to_f32(const sq_engram_layout *lay, const uint8_t *row, float *out)
{
    const uint32_t nv = lay->values_per_row, ns = lay->scales_per_row, g = ns ? nv / ns : nv;
    for (uint32_t i = 0; i < nv; i++)
        out[i] = sf_e4m3_to_f32(row[i]) * (ns ? sf_e8m0_to_f32(row[nv + i / g]) : 1.0f);
}

/* One row, no cache: pread from the file or a copy from the mapping. */
static sparq_status read_row(const sq_engram_reader *r, const sq_engram_key *k, uint8_t *dst)
{
    const sq_engram_layout *lay = &r->h.layout;
    RETURN_IF(k->layer >= lay->n_layers || k->column >= lay->n_columns ||
                  k->bucket >= lay->primes[k->layer][k->column],
              SPARQ_E_RANGE, "%s: row (table %u, column %u, bucket %llu) is outside the layout", r->path, k->layer,
              k->column, (unsigned long long)k->bucket);
    if (r->mapped) { /* the global row: values, then its scales, from the mapping */
        const uint64_t row = lay->row_offset[k->layer][k->column] + k->bucket;
        memcpy(dst, r->mvals[k->layer] + row * lay->values_per_row, lay->values_per_row);
        memcpy(dst + lay->values_per_row, r->mscales[k->layer] + row * lay->scales_per_row, lay->scales_per_row);
        return SPARQ_OK;
    }
    const uint32_t rb = lay->row_bytes;
    return sparq_pread_full(r->fd, dst, rb, r->h.file_offset[k->layer][k->column] + k->bucket * rb, r->path);
}

sparq_status sq_engram_read(const sq_engram_reader *r, size_t n, const sq_engram_key *keys, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) FORWARD_IF(read_row(r, &keys[i], out + i * (size_t)r->h.layout.row_bytes));
    return SPARQ_OK;
}

/* Store one row under key (evicting the least recent when full). */
static void cache_put_one(sq_engram_reader *r, uint64_t key, const uint8_t *row)
{
    const uint32_t rb = r->h.layout.row_bytes;
    uint64_t pos = 0;
    int64_t s = table_find(r, key, &pos);
    if (s >= 0) { /* already there (a row put twice): refresh it */
        lru_unlink(r, s);
    } else if (r->used < r->cap) {
        s = (int64_t)r->used++;
        r->slot_key[s] = key;
        r->table[pos] = s;
    } else {
        s = r->tail; /* evict the least recent */
        uint64_t opos;
        if (table_find(r, r->slot_key[s], &opos) == s) table_remove(r, opos);
        lru_unlink(r, s);
        table_find(r, key, &pos); /* the removal may have moved entries */
        r->slot_key[s] = key;
        r->table[pos] = s;
    }
    memcpy(r->rows + (size_t)s * rb, row, rb);
    lru_push_front(r, s);
}

size_t sq_engram_cache_take(sq_engram_reader *r, size_t n, const sq_engram_key *keys, uint8_t *out, uint8_t *hit)
{
    const uint32_t rb = r->h.layout.row_bytes;
    size_t miss = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t pos = 0;
        const int64_t s = r->cap && !r->mapped ? table_find(r, key_of(&keys[i]), &pos) : -1;
        hit[i] = s >= 0;
        if (s < 0) {
            miss++;
            continue;
        }
        memcpy(out + i * (size_t)rb, r->rows + (size_t)s * rb, rb);
        lru_unlink(r, s);
        lru_push_front(r, s);
    }
    r->hits += n - miss;
    r->misses += miss;
    return miss;
}

void sq_engram_cache_put(sq_engram_reader *r, size_t n, const sq_engram_key *keys, const uint8_t *rows)
{
    if (!r->cap || r->mapped) return;
    for (size_t i = 0; i < n; i++) cache_put_one(r, key_of(&keys[i]), rows + i * (size_t)r->h.layout.row_bytes);
}

uint64_t sq_engram_cache_rows_for(uint64_t bytes, uint32_t row_bytes)
{
    /* a slot: its row, key and two LRU links (8 bytes each), and at most 4 hash entries of 8 bytes
     * (the table is the power of two >= 2 slots) */
    return row_bytes ? bytes / ((uint64_t)row_bytes + 24 + 32) : 0;
}

uint64_t sq_engram_cache_bytes(const sq_engram_reader *r)
{
    return r->cap ? r->cap * ((uint64_t)r->h.layout.row_bytes + 24) + (r->tmask + 1) * 8 : 0;
}

sparq_status sq_engram_fetch(sq_engram_reader *r, size_t n, const sq_engram_key *keys, uint8_t *out)
{
    const uint32_t rb = r->h.layout.row_bytes;
    for (size_t i = 0; i < n; i++) {
        uint8_t *dst = out + i * (size_t)rb, hit = 0;
        if (sq_engram_cache_take(r, 1, &keys[i], dst, &hit) == 0) continue;
        FORWARD_IF(read_row(r, &keys[i], dst));
        sq_engram_cache_put(r, 1, &keys[i], dst);
    }
    return SPARQ_OK;
}

/* ---- the asynchronous fetcher ---- */

/* Batches live in a ring of SQ_ENGRAM_FETCH_QUEUE slots; a worker takes the
 * next unread row of the oldest unfinished batch under the lock, reads it
 * without the lock, and counts it done. */
typedef struct fetch_batch {
    const sq_engram_key *keys;
    uint8_t *out;
    size_t n, next, done;
    int ticket;            /* -1: slot free */
    sparq_status st;
    char msg[256];         /* the first error's message (sparq_errmsg is per thread) */
    double t_submit, t_done;
} fetch_batch;

struct sq_engram_fetcher {
    const sq_engram_reader *r;
    pthread_t *th;
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t work, finished;
    fetch_batch q[SQ_ENGRAM_FETCH_QUEUE];
    int next_ticket;
    bool stop;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The batch with work left that was submitted first, or NULL. */
static fetch_batch *oldest_with_work(sq_engram_fetcher *f)
{
    fetch_batch *best = NULL;
    for (int i = 0; i < SQ_ENGRAM_FETCH_QUEUE; i++) {
        fetch_batch *b = &f->q[i];
        if (b->ticket >= 0 && b->next < b->n && (!best || b->ticket < best->ticket)) best = b;
    }
    return best;
}

static void *fetch_worker(void *arg)
{
    sq_engram_fetcher *f = arg;
    const uint32_t rb = f->r->h.layout.row_bytes;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        fetch_batch *b;
        while (!(b = oldest_with_work(f)) && !f->stop) pthread_cond_wait(&f->work, &f->mu);
        if (!b) break;
        const size_t i = b->next++;
        const sq_engram_key k = b->keys[i];
        uint8_t *dst = b->out + i * (size_t)rb;
        pthread_mutex_unlock(&f->mu);
        const sparq_status st = read_row(f->r, &k, dst);
        char msg[256] = "";
        if (st != SPARQ_OK) snprintf(msg, sizeof msg, "%s", sparq_errmsg());
        pthread_mutex_lock(&f->mu);
        if (st != SPARQ_OK && b->st == SPARQ_OK) {
            b->st = st;
            memcpy(b->msg, msg, sizeof msg);
        }
        if (++b->done == b->n) {
            b->t_done = now_s();
            pthread_cond_broadcast(&f->finished);
        }
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

sparq_status sq_engram_fetcher_create(sq_engram_fetcher **out, const sq_engram_reader *r, int n_threads)
{
    *out = NULL;
    RETURN_IF(n_threads < 1 || n_threads > 64, SPARQ_E_ARG, "Engram fetcher: %d threads (1..64)", n_threads);
    sq_engram_fetcher *f = sparq_calloc(1, sizeof *f);
    RETURN_IF(!f, SPARQ_E_NOMEM, "out of memory");
    f->th = sparq_calloc((size_t)n_threads, sizeof *f->th);
    if (!f->th) {
        sparq_free(f);
        return sparq_err(SPARQ_E_NOMEM, "out of memory");
    }
    f->r = r;
    for (int i = 0; i < SQ_ENGRAM_FETCH_QUEUE; i++) f->q[i].ticket = -1;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->work, NULL);
    pthread_cond_init(&f->finished, NULL);
    for (int i = 0; i < n_threads; i++) {
        if (pthread_create(&f->th[i], NULL, fetch_worker, f) != 0) {
            sq_engram_fetcher_free(f);
            return sparq_err(SPARQ_E_STATE, "Engram fetcher: cannot start thread %d of %d", i + 1, n_threads);
        }
        f->n_threads++;
    }
    *out = f;
    return SPARQ_OK;
}

void sq_engram_fetcher_free(sq_engram_fetcher *f)
{
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < SQ_ENGRAM_FETCH_QUEUE; i++) /* finish what is in flight: its buffers are the caller's */
        while (f->q[i].ticket >= 0 && f->q[i].done < f->q[i].n) pthread_cond_wait(&f->finished, &f->mu);
    f->stop = true;
    pthread_cond_broadcast(&f->work);
    pthread_mutex_unlock(&f->mu);
    for (int i = 0; i < f->n_threads; i++) pthread_join(f->th[i], NULL);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->work);
    pthread_cond_destroy(&f->finished);
    sparq_free(f->th);
    sparq_free(f);
}

sparq_status sq_engram_fetcher_submit(sq_engram_fetcher *f, size_t n, const sq_engram_key *keys, uint8_t *out,
                                      int *ticket)
{
    pthread_mutex_lock(&f->mu);
    fetch_batch *b = NULL;
    for (int i = 0; i < SQ_ENGRAM_FETCH_QUEUE && !b; i++)
        if (f->q[i].ticket < 0) b = &f->q[i];
    if (!b) {
        pthread_mutex_unlock(&f->mu);
        return sparq_err(SPARQ_E_STATE, "Engram fetcher: %d batches already in flight", SQ_ENGRAM_FETCH_QUEUE);
    }
    *b = (fetch_batch){.keys = keys, .out = out, .n = n, .ticket = f->next_ticket++, .st = SPARQ_OK,
                       .t_submit = now_s()};
    if (!n) b->t_done = b->t_submit;
    *ticket = b->ticket;
    pthread_cond_broadcast(&f->work);
    pthread_mutex_unlock(&f->mu);
    return SPARQ_OK;
}

sparq_status sq_engram_fetcher_wait(sq_engram_fetcher *f, int ticket, double *fetch_s, double *wait_s)
{
    const double t0 = now_s();
    pthread_mutex_lock(&f->mu);
    fetch_batch *b = NULL;
    for (int i = 0; i < SQ_ENGRAM_FETCH_QUEUE && !b; i++)
        if (f->q[i].ticket == ticket && ticket >= 0) b = &f->q[i];
    if (!b) {
        pthread_mutex_unlock(&f->mu);
        return sparq_err(SPARQ_E_STATE, "Engram fetcher: no batch %d in flight", ticket);
    }
    while (b->done < b->n) pthread_cond_wait(&f->finished, &f->mu);
    const sparq_status st = b->st;
    char msg[256];
    memcpy(msg, b->msg, sizeof msg);
    if (fetch_s) *fetch_s = b->t_done - b->t_submit;
    b->ticket = -1;
    pthread_mutex_unlock(&f->mu);
    if (wait_s) *wait_s = now_s() - t0;
    return st == SPARQ_OK ? SPARQ_OK : sparq_err(st, "%s", msg);
}

sparq_status sq_engram_verify(sq_engram_reader *r)
{
    const sq_engram_header *h = &r->h;
    uint8_t *buf = sparq_malloc(h->block_bytes);
    uint8_t *sums = sparq_malloc(h->n_blocks ? (size_t)h->n_blocks * 16 : 1);
    sparq_status st = (buf && sums) ? SPARQ_OK : sparq_err(SPARQ_E_NOMEM, "%s: out of memory", r->path);
    if (st == SPARQ_OK) st = sparq_pread_full(r->fd, sums, h->n_blocks * 16, h->checksum_offset, r->path);
    for (uint64_t b = 0; b < h->n_blocks && st == SPARQ_OK; b++) {
        uint64_t off = b * h->block_bytes;
        uint64_t n = h->data_bytes - off < h->block_bytes ? h->data_bytes - off : h->block_bytes;
        st = sparq_pread_full(r->fd, buf, n, h->data_offset + off, r->path);
        if (st != SPARQ_OK) break;
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits(buf, (size_t)n));
        if (memcmp(c.digest, sums + b * 16, 16)) {
            /* name the table and column the block starts in */
            uint64_t at = h->data_offset + off;
            uint32_t tl = 0, tc = 0;
            for (uint32_t l = 0; l < h->layout.n_layers; l++)
                for (uint32_t c2 = 0; c2 < h->layout.n_columns; c2++)
                    if (h->file_offset[l][c2] <= at) {
                        tl = l;
                        tc = c2;
                    }
            st = sparq_err(SPARQ_E_CHECKSUM,
                           "%s: data block %llu (file bytes %llu..%llu, table %u column %u): checksum mismatch", r->path,
                           (unsigned long long)b, (unsigned long long)at, (unsigned long long)(at + n - 1), tl, tc);
        }
    }
    sparq_free(buf);
    sparq_free(sums);
    return st;
}

/* ---- DeepSeek V4.1 hash ---- */

static uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) { return (uint64_t)((unsigned __int128)a * b % m); }

static uint64_t powmod(uint64_t a, uint64_t e, uint64_t m)
{
    uint64_t r = 1;
    a %= m;
    while (e) {
        if (e & 1) r = mulmod(r, a, m);
        a = mulmod(a, a, m);
        e >>= 1;
    }
    return r;
}

/* Deterministic Miller-Rabin for 64-bit n. */
static bool is_prime(uint64_t n)
{
    static const uint64_t bases[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
    if (n < 2) return false;
    for (int i = 0; i < 12; i++) {
        if (n == bases[i]) return true;
        if (n % bases[i] == 0) return false;
    }
    uint64_t d = n - 1;
    int s = 0;
    while (!(d & 1)) {
        d >>= 1;
        s++;
    }
    for (int i = 0; i < 12; i++) {
        uint64_t x = powmod(bases[i], d, n);
        if (x == 1 || x == n - 1) continue;
        bool comp = true;
        for (int j = 1; j < s && comp; j++) {
            x = mulmod(x, x, n);
            if (x == n - 1) comp = false;
        }
        if (comp) return false;
    }
    return true;
}

uint64_t sq_engram_next_prime(uint64_t n)
{
    uint64_t p = n + 1;
    while (!is_prime(p)) p++;
    return p;
}

void sq_engram_v41_layout(sq_engram_layout *lay, uint64_t prime_base)
{
    memset(lay, 0, sizeof *lay);
    lay->value_dtype = SQ_ENGRAM_F8_E4M3;
    lay->values_per_row = 256;
    lay->scale_dtype = SQ_ENGRAM_UE8M0;
    lay->scales_per_row = 8;
    lay->row_bytes = 264;
    lay->n_layers = 2;
    lay->max_ngram = SQ_ENGRAM_ORDERS;
    lay->n_heads = SQ_ENGRAM_V41_HEADS;
    lay->n_columns = SQ_ENGRAM_V41_COLUMNS;
    lay->pad_id = SQ_ENGRAM_V41_PAD;
    lay->n_compressed = 99092;
    uint64_t p = prime_base;
    for (int l = 0; l < 2; l++) {
        lay->layer_ids[l] = v41_mult[l].layer;
        memcpy(lay->multipliers[l], v41_mult[l].m, sizeof v41_mult[l].m);
        uint64_t off = 0;
        for (int c = 0; c < SQ_ENGRAM_V41_COLUMNS; c++) {
            p = sq_engram_next_prime(p);
            lay->primes[l][c] = p;
            lay->row_offset[l][c] = off;
            off += p;
        }
    }
}

void sq_engram_buckets(const sq_engram_layout *lay, uint32_t layer, const uint32_t *cids, size_t n, size_t t,
                       uint64_t bucket[SQ_ENGRAM_MAX_COLUMNS])
{
    uint64_t tok[SQ_ENGRAM_ORDERS];
    for (size_t k = 0; k < lay->max_ngram; k++) tok[k] = (t >= k && t - k < n) ? cids[t - k] : lay->pad_id;
    const uint64_t *m = lay->multipliers[layer];
    uint64_t h = tok[0] * m[0]; /* products below 2^63: layout_check bounds the multipliers */
    for (uint32_t i = 1; i < lay->max_ngram; i++) {
        h ^= tok[i] * m[i];
        for (uint32_t j = 0; j < lay->n_heads; j++) {
            const uint32_t c = (i - 1) * lay->n_heads + j;
            bucket[c] = h % lay->primes[layer][c];
        }
    }
}
