/* runtime/eval.c — perplexity / KL scoring and the reference log-prob file;
 * see eval.h for the exact scoring and the file layout.
 *
 * The evaluation streams: each window runs in chunks of the model's max_rows,
 * both models (or the model and the file) advance together, and only one
 * chunk of logits per model is ever held. KL values are kept (one float per
 * scored position) for the median and tail quantiles. */
#include "runtime/eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>
#include <zstd.h>

#include "common/bytes.h"
#include "common/alloc.h"
#include "common/file.h"
#include "common/half.h"

/* --- scoring helpers ----------------------------------------------------------- */

int64_t sq_eval_n_windows(int64_t n_tokens, int ctx)
{
    if (ctx < 2 || n_tokens < 2) return 0;
    int64_t full = n_tokens / ctx, rest = n_tokens % ctx;
    return full + (rest >= 2 ? 1 : 0);
}

void sq_eval_window(int64_t n_tokens, int ctx, int64_t i, int64_t *first, int *len)
{
    *first = i * ctx;
    int64_t l = n_tokens - *first;
    *len = (int)(l < ctx ? l : ctx);
}

int64_t sq_eval_n_rows(int64_t n_tokens, const sq_eval_opts *o, int64_t *n_tokens_used)
{
    int64_t nw = sq_eval_n_windows(n_tokens, o->ctx);
    if (o->max_windows > 0 && nw > o->max_windows) nw = o->max_windows;
    int64_t rows = 0, used = 0;
    for (int64_t i = 0; i < nw; i++) {
        int64_t f;
        int len;
        sq_eval_window(n_tokens, o->ctx, i, &f, &len);
        rows += len - 1;
        used = f + len;
    }
    if (n_tokens_used) *n_tokens_used = used;
    return rows;
}

int sq_eval_log_softmax(const float *logits, int vocab, float *out)
{
    int best = 0;
    for (int v = 1; v < vocab; v++)
        if (logits[v] > logits[best]) best = v;
    const double mx = logits[best];
    double sum = 0;
    for (int v = 0; v < vocab; v++) sum += exp((double)logits[v] - mx);
    const double lse = mx + log(sum);
    for (int v = 0; v < vocab; v++) out[v] = (float)((double)logits[v] - lse);
    return best;
}

double sq_eval_kl(const float *lp, const float *lq, int vocab)
{
    double kl = 0;
    for (int v = 0; v < vocab; v++) {
        double p = exp((double)lp[v]);
        if (p > 0) kl += p * ((double)lp[v] - (double)lq[v]);
    }
    return kl;
}

void sq_eval_topk(const float *row, int vocab, int k, int *ids)
{
    if (k > 16) k = 16;
    int n = 0;
    for (int v = 0; v < vocab; v++) {
        if (n == k && !(row[v] > row[ids[k - 1]])) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && row[v] > row[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = v;
    }
}

/* --- the file ----------------------------------------------------------------- */

#define LP_MAGIC "SQREFLP1"
#define LP_HEADER 64

typedef struct lp_header {
    uint32_t version, vocab, ctx, dtype;
    uint64_t n_tokens, n_rows, tok_hash;
    uint32_t compression;
} lp_header;


struct sq_reflp_writer {
    sparq_atomic_file f;
    lp_header h;
    int64_t rows_done;
    ZSTD_CCtx *cctx;
    XXH3_state_t *xx;
    uint64_t payload;   /* bytes of rows as stored (compressed) */
    void *row;          /* one encoded row */
    uint8_t *zbuf;
    size_t zcap;
};

void sq_reflp_abort(sq_reflp_writer *w)
{
    if (!w) return;
    sparq_atomic_abort(&w->f);
    ZSTD_freeCCtx(w->cctx);
    XXH3_freeState(w->xx);
    sparq_free(w->row);
    sparq_free(w->zbuf);
    sparq_free(w);
}

sparq_status sq_reflp_create(sq_reflp_writer **out, const char *path, int vocab, int ctx, const int32_t *tokens,
                             int64_t n_tokens, int64_t n_rows, bool fp16)
{
    *out = NULL;
    RETURN_IF(vocab <= 0 || ctx <= 0 || n_tokens < 0 || n_rows < 0, SPARQ_E_ARG, "%s: bad reference file parameters",
              path);
    sq_reflp_writer *w = sparq_calloc(1, sizeof *w);
    RETURN_IF(!w, SPARQ_E_NOMEM, "%s: out of memory", path);
    w->h = (lp_header){1, (uint32_t)vocab, (uint32_t)ctx, fp16 ? 1u : 2u, (uint64_t)n_tokens, (uint64_t)n_rows,
                       XXH3_64bits(tokens, (size_t)n_tokens * sizeof(int32_t)), 1};
    sparq_status st = sparq_atomic_open(&w->f, path);
    if (st != SPARQ_OK) {
        sparq_free(w);
        return st;
    }
    w->cctx = ZSTD_createCCtx();
    w->xx = XXH3_createState();
    w->row = sparq_malloc((size_t)vocab * 4);
    w->zcap = ZSTD_CStreamOutSize();
    w->zbuf = sparq_malloc(w->zcap);
    if (!w->cctx || !w->xx || !w->row || !w->zbuf) {
        sq_reflp_abort(w);
        return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path);
    }
    ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, 3);
    XXH3_64bits_reset(w->xx);
    uint8_t hdr[LP_HEADER] = {0};
    memcpy(hdr, LP_MAGIC, 8);
    sparq_put_le32(hdr + 8, w->h.version);
    sparq_put_le32(hdr + 12, w->h.vocab);
    sparq_put_le32(hdr + 16, w->h.ctx);
    sparq_put_le32(hdr + 20, w->h.dtype);
    sparq_put_le64(hdr + 24, w->h.n_tokens);
    sparq_put_le64(hdr + 32, w->h.n_rows);
    sparq_put_le64(hdr + 40, w->h.tok_hash);
    sparq_put_le32(hdr + 48, w->h.compression);
    st = sparq_atomic_write(&w->f, hdr, sizeof hdr);
    for (int64_t i = 0; st == SPARQ_OK && i < n_tokens; i++) {
        uint8_t b[4];
        sparq_put_le32(b, (uint32_t)tokens[i]);
        st = sparq_atomic_write(&w->f, b, 4);
    }
    if (st != SPARQ_OK) {
        sq_reflp_abort(w);
        return st;
    }
    *out = w;
    return SPARQ_OK;
}

static sparq_status zpush(sq_reflp_writer *w, const void *src, size_t n, ZSTD_EndDirective mode)
{
    ZSTD_inBuffer in = {src, n, 0};
    for (;;) {
        ZSTD_outBuffer o = {w->zbuf, w->zcap, 0};
        size_t rem = ZSTD_compressStream2(w->cctx, &o, &in, mode);
        RETURN_IF(ZSTD_isError(rem), SPARQ_E_IO, "%s: zstd: %s", w->f.path, ZSTD_getErrorName(rem));
        if (o.pos) FORWARD_IF(sparq_atomic_write(&w->f, w->zbuf, o.pos));
        w->payload += o.pos;
        if (mode == ZSTD_e_end ? rem == 0 : in.pos == in.size) return SPARQ_OK;
    }
}

sparq_status sq_reflp_write_row(sq_reflp_writer *w, const float *lp)
{
    RETURN_IF(w->rows_done >= (int64_t)w->h.n_rows, SPARQ_E_STATE, "%s: more rows than the %llu declared", w->f.path,
              (unsigned long long)w->h.n_rows);
    size_t nb;
    if (w->h.dtype == 1) {
        uint8_t *o = w->row;
        for (uint32_t v = 0; v < w->h.vocab; v++) {
            float x = lp[v] < -65504.0f || isnan(lp[v]) ? -65504.0f : lp[v];
            uint16_t h = sparq_f32_to_f16(x);
            o[2 * v] = (uint8_t)h;
            o[2 * v + 1] = (uint8_t)(h >> 8);
        }
        nb = (size_t)w->h.vocab * 2;
    } else {
        uint8_t *o = w->row;
        for (uint32_t v = 0; v < w->h.vocab; v++) sparq_put_le32(o + 4 * v, sparq_f32_bits(lp[v]));
        nb = (size_t)w->h.vocab * 4;
    }
    XXH3_64bits_update(w->xx, w->row, nb);
    w->rows_done++;
    return zpush(w, w->row, nb, ZSTD_e_continue);
}

sparq_status sq_reflp_finish(sq_reflp_writer *w)
{
    sparq_status st = SPARQ_OK;
    if (w->rows_done != (int64_t)w->h.n_rows)
        st = sparq_err(SPARQ_E_STATE, "%s: %lld rows written, %llu declared", w->f.path, (long long)w->rows_done,
                       (unsigned long long)w->h.n_rows);
    if (st == SPARQ_OK) st = zpush(w, NULL, 0, ZSTD_e_end);
    if (st == SPARQ_OK) {
        uint8_t b[16];
        sparq_put_le64(b, w->payload);
        sparq_put_le64(b + 8, XXH3_64bits_digest(w->xx));
        st = sparq_atomic_write(&w->f, b, 16);
    }
    if (st == SPARQ_OK) {
        st = sparq_atomic_commit(&w->f);
        w->f.fp = NULL;
    }
    if (st != SPARQ_OK) sparq_atomic_abort(&w->f);
    ZSTD_freeCCtx(w->cctx);
    XXH3_freeState(w->xx);
    sparq_free(w->row);
    sparq_free(w->zbuf);
    sparq_free(w);
    return st;
}

struct sq_reflp_reader {
    char *path;
    FILE *fp;
    lp_header h;
    int32_t *tokens;
    int64_t rows_done;
    ZSTD_DCtx *dctx;
    XXH3_state_t *xx;
    uint8_t *ibuf, *row;
    size_t icap;
    ZSTD_inBuffer in;
    uint64_t payload_left; /* stored row bytes not yet read from the file */
    uint64_t rows_hash;    /* from the trailer */
};

void sq_reflp_close(sq_reflp_reader *r)
{
    if (!r) return;
    if (r->fp) fclose(r->fp);
    ZSTD_freeDCtx(r->dctx);
    XXH3_freeState(r->xx);
    sparq_free(r->ibuf);
    sparq_free(r->row);
    sparq_free(r->tokens);
    sparq_free(r->path);
    sparq_free(r);
}

sparq_status sq_reflp_open(sq_reflp_reader **out, const char *path)
{
    *out = NULL;
    sq_reflp_reader *r = sparq_calloc(1, sizeof *r);
    RETURN_IF(!r, SPARQ_E_NOMEM, "%s: out of memory", path);
    sparq_status st = SPARQ_OK;
    uint8_t hdr[LP_HEADER];
    r->path = sparq_strdup(path);
    r->fp = fopen(path, "rbe");
    if (!r->path || !r->fp) {
        st = r->path ? sparq_err(SPARQ_E_IO, "%s: cannot open", path) : sparq_err(SPARQ_E_NOMEM, "out of memory");
        goto fail;
    }
    if (fread(hdr, 1, sizeof hdr, r->fp) != sizeof hdr || memcmp(hdr, LP_MAGIC, 8) != 0) {
        st = sparq_err(SPARQ_E_FORMAT, "%s: not a sparq reference log-prob file (magic %s expected)", path, LP_MAGIC);
        goto fail;
    }
    r->h = (lp_header){sparq_get_le32(hdr + 8), sparq_get_le32(hdr + 12), sparq_get_le32(hdr + 16), sparq_get_le32(hdr + 20), sparq_get_le64(hdr + 24),
                       sparq_get_le64(hdr + 32), sparq_get_le64(hdr + 40), sparq_get_le32(hdr + 48)};
    if (r->h.version != 1 || r->h.vocab == 0 || r->h.vocab > (1u << 24) || r->h.ctx < 2 ||
        (r->h.dtype != 1 && r->h.dtype != 2) || r->h.compression > 1 || r->h.n_tokens > ((uint64_t)1 << 34) ||
        r->h.n_rows > r->h.n_tokens) {
        st = sparq_err(SPARQ_E_FORMAT, "%s: bad header (version %u, vocab %u, ctx %u, dtype %u, compression %u, "
                       "%llu tokens, %llu rows)", path, r->h.version, r->h.vocab, r->h.ctx, r->h.dtype,
                       r->h.compression, (unsigned long long)r->h.n_tokens, (unsigned long long)r->h.n_rows);
        goto fail;
    }
    {
        /* the token ids and the trailer must fit in the file before we allocate for them */
        struct stat sb;
        if (fstat(fileno(r->fp), &sb) != 0 || (uint64_t)sb.st_size < LP_HEADER + 16 ||
            r->h.n_tokens > ((uint64_t)sb.st_size - LP_HEADER - 16) / 4) {
            st = sparq_err(SPARQ_E_FORMAT, "%s: header declares %llu token ids, more than the file holds", path,
                           (unsigned long long)r->h.n_tokens);
            goto fail;
        }
    }
    r->tokens = sparq_malloc((size_t)(r->h.n_tokens ? r->h.n_tokens : 1) * sizeof(int32_t));
    r->row = sparq_malloc((size_t)r->h.vocab * 4);
    r->icap = ZSTD_DStreamInSize();
    r->ibuf = sparq_malloc(r->icap);
    r->dctx = ZSTD_createDCtx();
    r->xx = XXH3_createState();
    if (!r->tokens || !r->row || !r->ibuf || !r->dctx || !r->xx) {
        st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (uint64_t i = 0; i < r->h.n_tokens; i++) {
        uint8_t b[4];
        if (fread(b, 1, 4, r->fp) != 4) {
            st = sparq_err(SPARQ_E_FORMAT, "%s: truncated in the token ids", path);
            goto fail;
        }
        r->tokens[i] = (int32_t)sparq_get_le32(b);
    }
    if (XXH3_64bits(r->tokens, r->h.n_tokens * sizeof(int32_t)) != r->h.tok_hash) {
        st = sparq_err(SPARQ_E_CHECKSUM, "%s: token ids do not match their checksum", path);
        goto fail;
    }
    {
        /* trailer: u64 stored row bytes, u64 XXH3-64 of the rows; the file must end there */
        long data_at = ftell(r->fp);
        uint8_t t[16];
        if (data_at < 0 || fseek(r->fp, 0, SEEK_END) != 0) {
            st = sparq_err(SPARQ_E_IO, "%s: cannot seek", path);
            goto fail;
        }
        long size = ftell(r->fp);
        if (size < data_at + 16 || fseek(r->fp, size - 16, SEEK_SET) != 0 || fread(t, 1, 16, r->fp) != 16) {
            st = sparq_err(SPARQ_E_FORMAT, "%s: truncated (no checksum trailer)", path);
            goto fail;
        }
        r->payload_left = sparq_get_le64(t);
        r->rows_hash = sparq_get_le64(t + 8);
        if (r->payload_left != (uint64_t)(size - 16 - data_at) || fseek(r->fp, data_at, SEEK_SET) != 0) {
            st = sparq_err(SPARQ_E_FORMAT, "%s: trailer says %llu bytes of rows, the file holds %lld", path,
                           (unsigned long long)r->payload_left, (long long)(size - 16 - data_at));
            goto fail;
        }
    }
    XXH3_64bits_reset(r->xx);
    r->in = (ZSTD_inBuffer){r->ibuf, 0, 0};
    *out = r;
    return SPARQ_OK;
fail:
    sq_reflp_close(r);
    return st;
}

int sq_reflp_vocab(const sq_reflp_reader *r) { return (int)r->h.vocab; }
int sq_reflp_ctx(const sq_reflp_reader *r) { return (int)r->h.ctx; }
int64_t sq_reflp_rows(const sq_reflp_reader *r) { return (int64_t)r->h.n_rows; }
const int32_t *sq_reflp_tokens(const sq_reflp_reader *r, int64_t *n)
{
    *n = (int64_t)r->h.n_tokens;
    return r->tokens;
}

/* Fill `need` bytes of r->row from the (compressed) stream. */
static sparq_status read_bytes(sq_reflp_reader *r, size_t need)
{
    if (r->h.compression == 0) {
        RETURN_IF(need > r->payload_left || fread(r->row, 1, need, r->fp) != need, SPARQ_E_FORMAT,
                  "%s: truncated at row %lld", r->path, (long long)r->rows_done);
        r->payload_left -= need;
        return SPARQ_OK;
    }
    ZSTD_outBuffer o = {r->row, need, 0};
    while (o.pos < o.size) {
        if (r->in.pos == r->in.size) {
            size_t want = r->payload_left < r->icap ? (size_t)r->payload_left : r->icap;
            size_t got = want ? fread(r->ibuf, 1, want, r->fp) : 0;
            RETURN_IF(got == 0, SPARQ_E_FORMAT, "%s: truncated at row %lld", r->path, (long long)r->rows_done);
            r->payload_left -= got;
            r->in = (ZSTD_inBuffer){r->ibuf, got, 0};
        }
        size_t rc = ZSTD_decompressStream(r->dctx, &o, &r->in);
        RETURN_IF(ZSTD_isError(rc), SPARQ_E_FORMAT, "%s: row %lld: zstd: %s", r->path, (long long)r->rows_done,
                  ZSTD_getErrorName(rc));

    }
    return SPARQ_OK;
}

sparq_status sq_reflp_read_row(sq_reflp_reader *r, float *lp)
{
    RETURN_IF(r->rows_done >= (int64_t)r->h.n_rows, SPARQ_E_RANGE, "%s: all %llu rows already read", r->path,
              (unsigned long long)r->h.n_rows);
    const size_t nb = (size_t)r->h.vocab * (r->h.dtype == 1 ? 2 : 4);
    FORWARD_IF(read_bytes(r, nb));
    XXH3_64bits_update(r->xx, r->row, nb);
    for (uint32_t v = 0; v < r->h.vocab; v++)
        lp[v] = r->h.dtype == 1 ? sparq_f16_to_f32((uint16_t)(r->row[2 * v] | (r->row[2 * v + 1] << 8)))
                                : sparq_bits_f32(sparq_get_le32(r->row + 4 * v));
    r->rows_done++;
    if (r->rows_done == (int64_t)r->h.n_rows)
        RETURN_IF(r->rows_hash != XXH3_64bits_digest(r->xx), SPARQ_E_CHECKSUM,
                  "%s: log-prob rows do not match their checksum", r->path);
    return SPARQ_OK;
}

/* --- the evaluation ------------------------------------------------------------ */

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

static double quantile(const float *sorted, int64_t n, double q)
{
    if (n <= 0) return 0;
    double pos = q * (double)(n - 1);
    int64_t i = (int64_t)pos;
    double f = pos - (double)i;
    return i + 1 < n ? sorted[i] * (1 - f) + sorted[i + 1] * f : sorted[n - 1];
}

sparq_status sq_eval_run(sq_dist *model, sq_dist *ref, sq_reflp_reader *ref_in, sq_reflp_writer *save,
                         const int32_t *tokens, int64_t n, const sq_eval_opts *opts, sparq_progress *progress,
                         sq_eval_result *res)
{
    memset(res, 0, sizeof *res);
    const int ctx = opts->ctx, V = (int)sq_dist_cfg(model)->vocab_size;
    const int R = sq_dist_options(model)->max_rows;
    RETURN_IF(ctx < 2, SPARQ_E_ARG, "eval: ctx %d < 2", ctx);
    RETURN_IF(sq_dist_options(model)->ctx < ctx, SPARQ_E_ARG, "eval: model loaded with ctx %d < %d",
              sq_dist_options(model)->ctx, ctx);
    RETURN_IF(ref && sq_dist_cfg(ref)->vocab_size != V, SPARQ_E_ARG,
              "eval: reference vocabulary %lld differs from the model's %d",
              (long long)sq_dist_cfg(ref)->vocab_size, V);
    RETURN_IF(ref && (sq_dist_options(ref)->ctx < ctx || sq_dist_options(ref)->max_rows != R), SPARQ_E_ARG,
              "eval: reference model loaded with different ctx / max_rows");
    RETURN_IF(ref_in && sq_reflp_vocab(ref_in) != V, SPARQ_E_ARG,
              "eval: reference file vocabulary %d differs from the model's %d", sq_reflp_vocab(ref_in), V);
    const int64_t rows_total = sq_eval_n_rows(n, opts, NULL);
    RETURN_IF(ref_in && sq_reflp_rows(ref_in) != rows_total, SPARQ_E_ARG,
              "eval: reference file has %lld rows, this evaluation scores %lld", (long long)sq_reflp_rows(ref_in),
              (long long)rows_total);
    const bool has_ref = ref || ref_in;
    float *lg = sparq_malloc((size_t)R * V * sizeof(float));
    float *lgr = ref ? sparq_malloc((size_t)R * V * sizeof(float)) : NULL;
    float *lp = sparq_malloc((size_t)V * sizeof(float));
    float *lpr = sparq_malloc((size_t)V * sizeof(float));
    float *kls = has_ref ? sparq_malloc((size_t)(rows_total ? rows_total : 1) * sizeof(float)) : NULL;
    sparq_status st = SPARQ_OK;
    if (!lg || !lp || !lpr || (ref && !lgr) || (has_ref && !kls)) {
        st = sparq_err(SPARQ_E_NOMEM, "eval: out of memory for %d x %d logits", R, V);
        goto done;
    }
    int64_t nw = sq_eval_n_windows(n, ctx);
    if (opts->max_windows > 0 && nw > opts->max_windows) nw = opts->max_windows;
    int64_t top1 = 0, top5 = 0, top5_common = 0;
    for (int64_t w = 0; w < nw && st == SPARQ_OK; w++) {
        int64_t first;
        int len;
        sq_eval_window(n, ctx, w, &first, &len);
        st = sq_dist_seq_reset(model, 0);
        if (st == SPARQ_OK && ref) st = sq_dist_seq_reset(ref, 0);
        for (int c0 = 0; c0 < len && st == SPARQ_OK; c0 += R) {
            const int rows = len - c0 < R ? len - c0 : R;
            st = sq_dist_forward(model, 0, tokens + first + c0, rows, SQ_LOGITS_ALL, lg);
            if (st == SPARQ_OK && ref) st = sq_dist_forward(ref, 0, tokens + first + c0, rows, SQ_LOGITS_ALL, lgr);
            if (st != SPARQ_OK)
                st = sparq_err_context(st, "eval: window %lld (text tokens %lld..%lld, positions from 0)",
                                       (long long)w, (long long)first, (long long)(first + len - 1));
            for (int r = 0; r < rows && st == SPARQ_OK; r++) {
                const int p = c0 + r;
                if (p == len - 1) break; /* the window's last token predicts nothing scored */
                const int32_t target = tokens[first + p + 1];
                sq_eval_log_softmax(lg + (size_t)r * V, V, lp);
                res->nll_sum -= lp[target];
                if (has_ref) {
                    if (ref) sq_eval_log_softmax(lgr + (size_t)r * V, V, lpr);
                    else {
                        /* renormalise: fp16-rounded rows do not sum to exactly 1, and
                         * KL against them would be biased (even negative) */
                        st = sq_reflp_read_row(ref_in, lpr);
                        if (st != SPARQ_OK) break;
                        sq_eval_log_softmax(lpr, V, lpr);
                    }
                    res->ref_nll_sum -= lpr[target];
                    kls[res->n_scored] = (float)sq_eval_kl(lpr, lp, V);
                    int a[5], b[5];
                    sq_eval_topk(lpr, V, 5, a);
                    sq_eval_topk(lp, V, 5, b);
                    top1 += a[0] == b[0];
                    top5 += memcmp(a, b, sizeof a) == 0;
                    for (int i = 0; i < 5; i++)
                        for (int j = 0; j < 5; j++) top5_common += a[i] == b[j];
                }
                if (save) st = sq_reflp_write_row(save, has_ref ? lpr : lp);
                res->n_scored++;
                if (progress) sparq_progress_add(progress, 1);
            }
        }
        res->n_windows++;
        res->n_tokens += len;
    }
    if (st != SPARQ_OK) goto done;
    res->ppl = res->n_scored ? exp(res->nll_sum / (double)res->n_scored) : NAN;
    if (has_ref && res->n_scored) {
        res->has_ref = true;
        res->ref_ppl = exp(res->ref_nll_sum / (double)res->n_scored);
        res->dppl = res->ppl - res->ref_ppl;
        double s = 0;
        for (int64_t i = 0; i < res->n_scored; i++) s += kls[i];
        res->kl_mean = s / (double)res->n_scored;
        qsort(kls, (size_t)res->n_scored, sizeof(float), cmp_float);
        res->kl_median = quantile(kls, res->n_scored, 0.5);
        res->kl_p90 = quantile(kls, res->n_scored, 0.9);
        res->kl_p99 = quantile(kls, res->n_scored, 0.99);
        res->kl_max = kls[res->n_scored - 1];
        res->top1 = (double)top1 / (double)res->n_scored;
        res->top5 = (double)top5 / (double)res->n_scored;
        res->top5_overlap = (double)top5_common / (5.0 * (double)res->n_scored);
    }
done:
    sparq_free(lg);
    sparq_free(lgr);
    sparq_free(lp);
    sparq_free(lpr);
    sparq_free(kls);
    return st;
}
