/* formats/engram.c — Engram table files: header (de)serialisation, the
 * streaming writer with per-block XXH3-128, the pread reader with an LRU row
 * cache, and the DeepSeek V4.1 hash. Layout: engram.h, docs/engram-format.md. */
#include "formats/engram.h"

#include <errno.h>
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

#define FIXED_BYTES 88u
#define LAYER_ENTRY 40u
#define COLUMN_ENTRY 24u
#define MAX_HEADER (64u << 10)
#define NO_OFFSET UINT64_MAX


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

static sparq_status layout_check(const sq_engram_layout *lay, const char *name)
{
    RETURN_IF(lay->n_layers < 1 || lay->n_layers > SQ_ENGRAM_MAX_LAYERS, SPARQ_E_FORMAT,
              "%s: %u Engram tables (1..%d allowed)", name, lay->n_layers, SQ_ENGRAM_MAX_LAYERS);
    RETURN_IF(lay->n_columns < 1 || lay->n_columns > SQ_ENGRAM_MAX_COLUMNS, SPARQ_E_FORMAT,
              "%s: %u hash columns (1..%d allowed)", name, lay->n_columns, SQ_ENGRAM_MAX_COLUMNS);
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
    uint64_t total_bytes = 0; /* all tables: bounded so that no file offset can overflow */
    for (uint32_t l = 0; l < lay->n_layers; l++) {
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
    return SPARQ_OK;
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

/* ---- header ---- */

static uint32_t header_size_for(const sq_engram_layout *lay)
{
    uint32_t n = FIXED_BYTES + lay->n_layers * LAYER_ENTRY + lay->n_layers * lay->n_columns * COLUMN_ENTRY + 8;
    return (n + 4095u) & ~4095u;
}

/* Fill the shard-dependent part of h (sizes, offsets) from h->layout. */
static void header_place(sq_engram_header *h, uint32_t shard, uint32_t shards, uint32_t block_bytes)
{
    const sq_engram_layout *lay = &h->layout;
    h->header_bytes = header_size_for(lay);
    h->shard_index = shard;
    h->shard_count = shards;
    h->block_bytes = block_bytes;
    h->data_offset = h->header_bytes;
    uint64_t off = h->data_offset;
    for (uint32_t l = 0; l < lay->n_layers; l++)
        for (uint32_t c = 0; c < lay->n_columns; c++) {
            if (sq_engram_column_shard(c, shards) != shard) {
                h->file_offset[l][c] = NO_OFFSET;
                continue;
            }
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
                            lay->n_columns,     h->shard_index,   h->shard_count,     h->block_bytes};
    for (int i = 0; i < 12; i++) sparq_put_le32(buf + 8 + 4 * i, f32[i]);
    sparq_put_le64(buf + 56, h->data_offset);
    sparq_put_le64(buf + 64, h->data_bytes);
    sparq_put_le64(buf + 72, h->checksum_offset);
    sparq_put_le64(buf + 80, h->n_blocks);
    uint8_t *p = buf + FIXED_BYTES;
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
    sparq_put_le64(buf + h->header_bytes - 8, XXH3_64bits(buf, h->header_bytes - 8));
}

sparq_status sq_engram_header_parse(sq_engram_header *h, const uint8_t *buf, size_t len, uint64_t file_size,
                                    const char *name)
{
    memset(h, 0, sizeof *h);
    sq_engram_layout *lay = &h->layout;
    RETURN_IF(len < FIXED_BYTES, SPARQ_E_FORMAT, "%s: %zu bytes is too short for an Engram header", name, len);
    RETURN_IF(memcmp(buf, SQ_ENGRAM_MAGIC, 8), SPARQ_E_FORMAT, "%s: not an Engram table file (bad magic)", name);
    uint32_t version = sparq_get_le32(buf + 8);
    RETURN_IF(version != SQ_ENGRAM_VERSION, SPARQ_E_UNSUPPORTED, "%s: Engram file version %u; this sparq reads %d",
              name, version, SQ_ENGRAM_VERSION);
    h->header_bytes = sparq_get_le32(buf + 12);
    lay->row_bytes = sparq_get_le32(buf + 16);
    lay->value_dtype = sparq_get_le32(buf + 20);
    lay->values_per_row = sparq_get_le32(buf + 24);
    lay->scale_dtype = sparq_get_le32(buf + 28);
    lay->scales_per_row = sparq_get_le32(buf + 32);
    lay->n_layers = sparq_get_le32(buf + 36);
    lay->n_columns = sparq_get_le32(buf + 40);
    h->shard_index = sparq_get_le32(buf + 44);
    h->shard_count = sparq_get_le32(buf + 48);
    h->block_bytes = sparq_get_le32(buf + 52);
    h->data_offset = sparq_get_le64(buf + 56);
    h->data_bytes = sparq_get_le64(buf + 64);
    h->checksum_offset = sparq_get_le64(buf + 72);
    h->n_blocks = sparq_get_le64(buf + 80);
    RETURN_IF(lay->n_layers < 1 || lay->n_layers > SQ_ENGRAM_MAX_LAYERS || lay->n_columns < 1 ||
                  lay->n_columns > SQ_ENGRAM_MAX_COLUMNS,
              SPARQ_E_FORMAT, "%s: %u tables x %u columns (at most %d x %d)", name, lay->n_layers, lay->n_columns,
              SQ_ENGRAM_MAX_LAYERS, SQ_ENGRAM_MAX_COLUMNS);
    RETURN_IF(h->header_bytes != header_size_for(lay), SPARQ_E_FORMAT,
              "%s: header_bytes %u, expected %u for %u tables x %u columns", name, h->header_bytes,
              header_size_for(lay), lay->n_layers, lay->n_columns);
    RETURN_IF(len < h->header_bytes || file_size < h->header_bytes, SPARQ_E_FORMAT,
              "%s: header of %u bytes but only %llu available (truncated file?)", name, h->header_bytes,
              (unsigned long long)(len < file_size ? len : file_size));
    RETURN_IF(sparq_get_le64(buf + h->header_bytes - 8) != XXH3_64bits(buf, h->header_bytes - 8), SPARQ_E_CHECKSUM,
              "%s: Engram header checksum mismatch (damaged header)", name);
    const uint8_t *p = buf + FIXED_BYTES;
    for (uint32_t l = 0; l < lay->n_layers; l++, p += LAYER_ENTRY) {
        lay->layer_ids[l] = (int32_t)sparq_get_le32(p);
        for (int k = 0; k < SQ_ENGRAM_ORDERS; k++) lay->multipliers[l][k] = sparq_get_le64(p + 8 + 8 * k);
    }
    for (uint32_t l = 0; l < lay->n_layers; l++)
        for (uint32_t c = 0; c < lay->n_columns; c++, p += COLUMN_ENTRY) {
            lay->primes[l][c] = sparq_get_le64(p);
            lay->row_offset[l][c] = sparq_get_le64(p + 8);
            h->file_offset[l][c] = sparq_get_le64(p + 16);
        }
    FORWARD_IF(layout_check(lay, name));
    RETURN_IF(h->shard_count < 1 || h->shard_index >= h->shard_count || h->shard_count > SQ_ENGRAM_MAX_COLUMNS,
              SPARQ_E_FORMAT, "%s: shard %u of %u", name, h->shard_index, h->shard_count);
    RETURN_IF(h->block_bytes < 4096 || (h->block_bytes & (h->block_bytes - 1)), SPARQ_E_FORMAT,
              "%s: block_bytes %u is not a power of two >= 4096", name, h->block_bytes);
    /* every derived offset must be exactly what the writer computes */
    sq_engram_header want;
    memset(&want, 0, sizeof want);
    want.layout = *lay;
    header_place(&want, h->shard_index, h->shard_count, h->block_bytes);
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

sparq_status sq_engram_write(const char *path, const sq_engram_layout *lay, uint32_t shard, uint32_t shards,
                             uint32_t block_bytes, sq_engram_row_fn fn, void *ctx)
{
    RETURN_IF(shards < 1 || shard >= shards || shards > SQ_ENGRAM_MAX_COLUMNS, SPARQ_E_ARG,
              "%s: shard %u of %u", path, shard, shards);
    RETURN_IF(block_bytes < 4096 || (block_bytes & (block_bytes - 1)), SPARQ_E_ARG,
              "%s: block size %u is not a power of two >= 4096", path, block_bytes);
    sparq_status st = as_arg_error(layout_check(lay, path));
    if (st != SPARQ_OK) return st;
    sq_engram_header *h = sparq_calloc(1, sizeof *h);
    RETURN_IF(!h, SPARQ_E_NOMEM, "%s: out of memory", path);
    h->layout = *lay;
    header_place(h, shard, shards, block_bytes);
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
            if (h->file_offset[l][c] == NO_OFFSET) continue;
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
    size_t hl = fsize < MAX_HEADER ? (size_t)fsize : MAX_HEADER;
    hdr = sparq_malloc(hl ? hl : 1);
    if (!hdr) {
        st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    st = sparq_pread_full(r->fd, hdr, hl, 0, path);
    if (st == SPARQ_OK) st = sq_engram_header_parse(&r->h, hdr, hl, fsize, path);
    if (st != SPARQ_OK) goto fail;
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
    r->h.shard_count = 1;
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

sparq_status sq_engram_fetch(sq_engram_reader *r, size_t n, const sq_engram_key *keys, uint8_t *out)
{
    const sq_engram_layout *lay = &r->h.layout;
    const uint32_t rb = lay->row_bytes;
    for (size_t i = 0; i < n; i++) {
        const sq_engram_key *k = &keys[i];
        uint8_t *dst = out + i * (size_t)rb;
        RETURN_IF(k->layer >= lay->n_layers || k->column >= lay->n_columns ||
                      k->bucket >= lay->primes[k->layer][k->column],
                  SPARQ_E_RANGE, "%s: row (table %u, column %u, bucket %llu) is outside the layout", r->path,
                  k->layer, k->column, (unsigned long long)k->bucket);
        if (r->mapped) { /* the global row: values, then its scales, from the mapping */
            const uint64_t row = lay->row_offset[k->layer][k->column] + k->bucket;
            memcpy(dst, r->mvals[k->layer] + row * lay->values_per_row, lay->values_per_row);
            memcpy(dst + lay->values_per_row, r->mscales[k->layer] + row * lay->scales_per_row, lay->scales_per_row);
            r->misses++;
            continue;
        }
        uint64_t base = r->h.file_offset[k->layer][k->column];
        RETURN_IF(base == NO_OFFSET, SPARQ_E_NOTFOUND, "%s: column %u is in shard %u, this file is shard %u of %u",
                  r->path, k->column, sq_engram_column_shard(k->column, r->h.shard_count), r->h.shard_index,
                  r->h.shard_count);
        uint64_t key = key_of(k), pos = 0;
        int64_t s = r->cap ? table_find(r, key, &pos) : -1;
        if (s >= 0) {
            r->hits++;
            memcpy(dst, r->rows + (size_t)s * rb, rb);
            lru_unlink(r, s);
            lru_push_front(r, s);
            continue;
        }
        r->misses++;
        FORWARD_IF(sparq_pread_full(r->fd, dst, rb, base + k->bucket * rb, r->path));
        if (!r->cap) continue;
        if (r->used < r->cap) {
            s = (int64_t)r->used++;
        } else {
            s = r->tail; /* evict the least recent */
            uint64_t opos;
            if (table_find(r, r->slot_key[s], &opos) == s) table_remove(r, opos);
            lru_unlink(r, s);
            table_find(r, key, &pos); /* the removal may have moved entries */
        }
        r->slot_key[s] = key;
        r->table[pos] = s;
        memcpy(r->rows + (size_t)s * rb, dst, rb);
        lru_push_front(r, s);
    }
    return SPARQ_OK;
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
                    if (h->file_offset[l][c2] != NO_OFFSET && h->file_offset[l][c2] <= at) {
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
    static const uint64_t mult[2][4] = {
        {76632096046245ull, 4839876093313ull, 35959672319349ull, 73987337458391ull},
        {67716810739261ull, 51510806800915ull, 30921347202721ull, 82619226485591ull}};
    memset(lay, 0, sizeof *lay);
    lay->value_dtype = SQ_ENGRAM_F8_E4M3;
    lay->values_per_row = 256;
    lay->scale_dtype = SQ_ENGRAM_UE8M0;
    lay->scales_per_row = 8;
    lay->row_bytes = 264;
    lay->n_layers = 2;
    lay->n_columns = SQ_ENGRAM_V41_COLUMNS;
    lay->layer_ids[0] = 1;
    lay->layer_ids[1] = 14;
    uint64_t p = prime_base;
    for (int l = 0; l < 2; l++) {
        memcpy(lay->multipliers[l], mult[l], sizeof mult[l]);
        uint64_t off = 0;
        for (int c = 0; c < SQ_ENGRAM_V41_COLUMNS; c++) {
            p = sq_engram_next_prime(p);
            lay->primes[l][c] = p;
            lay->row_offset[l][c] = off;
            off += p;
        }
    }
}

void sq_engram_v41_buckets(const sq_engram_layout *lay, uint32_t layer, const uint32_t *cids, size_t n, size_t t,
                           uint64_t bucket[SQ_ENGRAM_V41_COLUMNS])
{
    uint64_t tok[SQ_ENGRAM_ORDERS];
    for (size_t k = 0; k < SQ_ENGRAM_ORDERS; k++)
        tok[k] = (t >= k && t - k < n) ? cids[t - k] : SQ_ENGRAM_V41_PAD;
    const uint64_t *m = lay->multipliers[layer];
    uint64_t h = tok[0] * m[0]; /* products stay below 2^63 for ids < 2^17 and m < 2^47 */
    for (int i = 1; i < SQ_ENGRAM_ORDERS; i++) {
        h ^= tok[i] * m[i];
        for (int j = 0; j < SQ_ENGRAM_V41_HEADS; j++) {
            int c = (i - 1) * SQ_ENGRAM_V41_HEADS + j;
            bucket[c] = h % lay->primes[layer][c];
        }
    }
}
