/* runtime/dist/dist.c — the pipeline over ranks (see runtime/dist/dist.h).
 *
 * Wire format (all ranks run the same binary on the same architecture, so
 * the structs go as bytes; the magic catches a stray or torn message):
 *   step     rank k -> k+1: msg_hdr, seqs[rows] i32, pos[rows] i32, hidden[rows*d] f32;
 *            with a device link the hidden states go over the link (link_send
 *            before the message, link_recv after it) and the message ends at pos
 *   control  rank k -> k+1: msg_hdr (reset / truncate / shutdown)
 *   result   last -> 0:     msg_hdr with n_out, then n_out rows of logits
 *                           [n_out, vocab] f32 in messages of ≤ LOGIT_CHUNK rows
 *   estep    0 -> every rank (the expert split): msg_hdr, seqs[rows], pos[rows],
 *            tokens[rows] i32; control messages likewise go to every rank
 * Buffers: two message buffers per rank, each one step (the plan's comm
 * term, runtime/memplan.h), used alternately so rank k can receive step i+1
 * while step i is still being sent; the last rank adds LOGIT_CHUNK rows of
 * logits. The expert split: one step message and the all-gather's
 * [size, max_rows, d] pieces. Nothing is allocated after open, but for a
 * device link's two buffers towards the next rank, made by its first send.
 *
 * The device link (GPU ranks, kernels/backend.h link_*): made at open when
 * every rank's exec has one and SPARQ_DIST_DEVICE_LINK is not 0; every rank
 * agrees on the outcome (a rank that cannot open its end turns it off
 * everywhere, and the run stages through host memory as before). Logits
 * from the last rank to rank 0 stay on the host path: they go to the host
 * sampler anyway. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/manifest.h"
#include "formats/safetensors.h"
#include "runtime/dist/dist.h"
#include "runtime/arch.h"

#define MSG_MAGIC 0x54535153u /* "SQST" */
#define LOGIT_CHUNK 32        /* rows of logits per result message */
#define QCAP 64               /* steps in flight at most */
#define SLOT_RESULT_HDR 2     /* send slots: 0, 1 = message buffers; 2, 3 = results */
#define SLOT_RESULT_ROWS 3
#define SLOT_STATS 4          /* a worker's figures to rank 0 */
#define SLOT_FANOUT 5         /* the expert split: rank 0's sends to rank r use slot 5 + (r - 1) % 11 */
#define N_FANOUT (SQ_TRANSPORT_SLOTS - SLOT_FANOUT)

enum { OP_STEP = SQ_DIST_OP_STEP, OP_RESET, OP_TRUNCATE, OP_SHUTDOWN, OP_STATS, OP_ESTEP };

typedef struct msg_hdr {
    uint32_t magic;
    int32_t op;
    uint32_t id;   /* step number, checked on the way back */
    int32_t rows;  /* OP_STEP */
    int32_t mode;  /* sq_logits_mode */
    int32_t seq;   /* OP_RESET / OP_TRUNCATE */
    int32_t n;     /* OP_TRUNCATE: tokens kept */
    int32_t n_out; /* result: rows of logits that follow */
} msg_hdr;

typedef struct pending_step {
    uint32_t id;
    int rows;
    sq_logits_mode mode;
    float *logits;
    int *seqs, *pos; /* [rows], for messages: d->qrows of its queue slot */
} pending_step;

struct sq_dist {
    sq_transport *t;
    sq_model *m;
    sq_dist_opts o;
    int rank, size, d, vocab, max_rows;
    char *buf[2];
    size_t buf_bytes;
    int cur;
    msg_hdr res_hdr;  /* last rank: the result header being sent */
    sq_model_engram_stats stats_out; /* a worker: its figures being sent (OP_STATS) */
    float *lbuf;      /* last rank: LOGIT_CHUNK rows of logits */
    int *pos, *seqs;  /* [max_rows] */
    int *qrows;       /* rank 0 of several: [QCAP][2][max_rows] sequences and positions of the steps in flight */
    pending_step q[QCAP];
    int q_head, q_n;
    int q_done;       /* entries from q_head whose result is already received */
    uint32_t next_id;
    uint64_t steps;
    bool esplit;      /* the expert split (every rank every layer; the MoE combined by all-gather) */
    float *gbuf;      /* the expert split: the all-gathered partial sums [size][max_rows * d] (host) */
    float *gdev;      /* ... the same in backend memory (GPU ranks: what sum_parts adds) */
    float *hpart;     /* GPU ranks of the expert split: one step's rows [max_rows * d] on the host */
    uint64_t hidden_hash;
    sq_link *link;    /* GPU ranks: the device link the hidden states take, or NULL (host memory) */
    const char *link_kind;
    char link_why[300]; /* why there is no link (several GPU ranks only) */
    uint64_t link_bytes, staged_bytes;
    bool borrowed_model;        /* sq_dist_wrap: the caller frees the model */
    sq_transport *own_transport; /* sq_dist_wrap: a local transport we made */
};

void sq_dist_opts_default(sq_dist_opts *o)
{
    o->timeout_s = 60.0;
    o->device_link = true;
}

static size_t hidden_bytes(const sq_dist *d, int rows) { return (size_t)rows * (size_t)d->d * sizeof(float); }

static size_t step_bytes(const sq_dist *d, int rows)
{
    if (d->esplit) return sizeof(msg_hdr) + (size_t)rows * 3 * sizeof(int32_t);
    return sizeof(msg_hdr) + (size_t)rows * 2 * sizeof(int32_t) + hidden_bytes(d, rows) * !d->link;
}

static int n_out_rows(sq_logits_mode mode, int rows)
{
    return mode == SQ_LOGITS_ALL ? rows : mode == SQ_LOGITS_LAST ? 1 : 0;
}

/* Load errors of every rank end up in rank 0's message. */
typedef struct load_report {
    int32_t code;
    char msg[500];
    sq_digest manifest; /* XXH3-128 of the rank's manifest.json (zero for a model directory) */
} load_report;

/* Digest of <path>/manifest.json, so ranks on different boxes can check that
 * they hold the same bundle (a box with an older copy would compute garbage). */
static void manifest_digest(const char *path, sq_digest *out)
{
    memset(out, 0, sizeof *out);
    char *mp = sparq_path_join(path, SQ_MANIFEST_NAME), *text = NULL;
    size_t len = 0;
    if (mp && sparq_path_exists(mp) && sparq_file_read_all(mp, SQ_MANIFEST_MAX_SIZE, &text, &len) == SPARQ_OK)
        sq_digest_of(text, len, out);
    sparq_free(text);
    sparq_free(mp);
    sparq_err_clear();
}

static sparq_status exchange_load_status(sq_dist *d, const char *path, sparq_status mine, bool *reported)
{
    sq_transport *t = d->t;
    load_report me = {.code = (int32_t)mine};
    if (mine != SPARQ_OK) snprintf(me.msg, sizeof me.msg, "%s", sparq_errmsg());
    if (t->size > 1) manifest_digest(path, &me.manifest);
    load_report *all = NULL;
    if (t->rank == 0) {
        all = sparq_calloc((size_t)t->size, sizeof *all);
        RETURN_IF(!all, SPARQ_E_NOMEM, "out of memory");
    }
    sparq_status st = t->vt->gather(t, &me, sizeof me, all);
    int32_t first_bad = -1;
    sparq_status bad_code = SPARQ_E_COMM;
    char text[2048] = "";
    if (st == SPARQ_OK && t->rank == 0) {
        /* one line per distinct message: "ranks 0, 1: <message>" */
        size_t len = 0;
        for (int r = 0; r < t->size; r++) all[r].msg[sizeof all[r].msg - 1] = 0;
        for (int r = 1; r < t->size; r++)
            if (all[r].code == SPARQ_OK && all[0].code == SPARQ_OK &&
                memcmp(&all[r].manifest, &all[0].manifest, sizeof(sq_digest)) != 0) {
                char a[33], b[33];
                sq_digest_hex(&all[0].manifest, a);
                sq_digest_hex(&all[r].manifest, b);
                all[r].code = SPARQ_E_CHECKSUM;
                snprintf(all[r].msg, sizeof all[r].msg,
                         "its manifest.json differs from rank 0's (XXH3-128 %s, rank 0 has %s): every box must hold "
                         "the same bundle (copy it again, then `sparq verify`)", b, a);
            }
        for (int r = 0; r < t->size; r++) {
            if (all[r].code == SPARQ_OK) continue;
            if (first_bad < 0) {
                first_bad = r;
                bad_code = (sparq_status)all[r].code;
            }
            bool seen = false;
            for (int q = 0; q < r && !seen; q++) seen = all[q].code != SPARQ_OK && !strcmp(all[q].msg, all[r].msg);
            if (seen) continue;
            char who[256];
            size_t wl = 0;
            int n_same = 0;
            for (int q = r; q < t->size; q++) {
                if (all[q].code == SPARQ_OK || strcmp(all[q].msg, all[r].msg)) continue;
                int w = snprintf(who + wl, sizeof who - wl, "%s%d", n_same ? ", " : "", q);
                if (w > 0 && (size_t)w < sizeof who - wl) wl += (size_t)w;
                n_same++;
            }
            int w = snprintf(text + len, sizeof text - len, "%srank%s %s: %s", len ? "; " : "", n_same > 1 ? "s" : "",
                             who, all[r].msg);
            if (w > 0) len += (size_t)w < sizeof text - len ? (size_t)w : sizeof text - len - 1;
        }
    }
    sparq_free(all);
    if (st != SPARQ_OK) return st;
    FORWARD_IF(t->vt->bcast(t, 0, &first_bad, sizeof first_bad));
    if (first_bad < 0) return SPARQ_OK;
    if (t->rank == 0) {
        sparq_status code = mine != SPARQ_OK ? mine : bad_code;
        if (t->size == 1) return code;
        return sparq_err(code, "%s", text);
    }
    *reported = true;
    return sparq_err(SPARQ_E_COMM, "rank %d: rank %d failed to load", t->rank, (int)first_bad);
}

/* Sizes from d->m, and the buffers this rank needs: row scratch always; the two
 * step buffers with several ranks; the logits chunk on the last of several. */
static sparq_status attach_model(sq_dist *d)
{
    d->d = (int)sq_arch_hidden_width(sq_model_cfg(d->m));
    d->vocab = (int)sq_model_cfg(d->m)->vocab_size;
    d->max_rows = sq_model_options(d->m)->max_rows;
    d->buf_bytes = step_bytes(d, d->max_rows);
    d->pos = sparq_malloc((size_t)d->max_rows * sizeof(int));
    d->seqs = sparq_malloc((size_t)d->max_rows * sizeof(int));
    if (d->esplit && d->size > 1) { /* one step message, the all-gather's pieces */
        const size_t piece = (size_t)d->max_rows * (size_t)d->d * sizeof(float);
        sq_exec *ex = sq_model_exec(d->m);
        d->buf[0] = sparq_aligned_alloc(64, d->buf_bytes);
        d->gbuf = sparq_aligned_alloc(64, (size_t)d->size * piece);
        bool dev_ok = true;
        if (ex->be->device) { /* the pieces are added on the device; the host copies serve the staging path */
            d->gdev = ex->be->alloc(ex, (size_t)d->size * piece);
            d->hpart = sparq_aligned_alloc(64, piece);
            dev_ok = d->gdev && d->hpart;
        }
        RETURN_IF(!d->pos || !d->seqs || !d->buf[0] || !d->gbuf || !dev_ok, SPARQ_E_NOMEM,
                  "rank %d: cannot allocate the expert split's buffers (%d x %d rows of %d floats)", d->rank, d->size,
                  d->max_rows, d->d);
        return SPARQ_OK;
    }
    const bool pipe = d->size > 1, last = pipe && d->rank == d->size - 1;
    if (pipe)
        for (int i = 0; i < 2; i++) d->buf[i] = sparq_aligned_alloc(64, d->buf_bytes);
    if (last) d->lbuf = sparq_aligned_alloc(64, (size_t)LOGIT_CHUNK * (size_t)d->vocab * sizeof(float));
    if (pipe && d->rank == 0) d->qrows = sparq_malloc((size_t)QCAP * 2 * (size_t)d->max_rows * sizeof(int));
    RETURN_IF(!d->pos || !d->seqs || (pipe && (!d->buf[0] || !d->buf[1])) || (last && !d->lbuf) ||
                  (pipe && d->rank == 0 && !d->qrows), SPARQ_E_NOMEM,
              "rank %d: cannot allocate the pipeline buffers (2 x %zu bytes)", d->rank, d->buf_bytes);
    return SPARQ_OK;
}

/* The expert split's combine (sq_model_set_moe_combine): every rank's partial
 * MoE sum (`part`, backend memory), gathered, then added in rank order
 * 0..N-1 by the backend's sum_parts (never in arrival order, never through
 * MPI_Allreduce or an NCCL reduction, whose order is the library's), so
 * every rank ends the layer with the same floats. The pieces travel over the
 * device link when GPU ranks have one (an NCCL all-gather, or the hub's
 * mailboxes), else through host memory and the transport's all-gather (a
 * GPU rank copying its piece out and the gathered ones back in). */
static sparq_status combine_moe(void *user, float *part, int rows, int width)
{
    sq_dist *d = user;
    sq_exec *ex = sq_model_exec(d->m);
    const sq_backend *be = ex->be;
    const size_t n = (size_t)rows * (size_t)width, bytes = n * sizeof(float);
    float *all = be->device ? d->gdev : d->gbuf;
    sparq_status st;
    if (d->link) {
        st = be->link_allgather(ex, d->link, part, all, bytes, d->o.timeout_s);
        d->link_bytes += bytes * (size_t)(d->size - 1);
    } else {
        const float *mine = part;
        st = be->device ? be->to_host(ex, d->hpart, part, bytes) : SPARQ_OK;
        if (be->device) mine = d->hpart;
        if (st == SPARQ_OK) st = d->t->vt->allgather(d->t, mine, bytes, d->gbuf, d->o.timeout_s);
        if (st == SPARQ_OK && be->device) st = be->to_device(ex, d->gdev, d->gbuf, (size_t)d->size * bytes);
        d->staged_bytes += bytes;
    }
    if (st != SPARQ_OK) return sparq_err_context(st, "the MoE combine of a %d-row step", rows);
    be->sum_parts(ex, all, d->size, n, part);
    return SPARQ_OK;
}

/* The expert split: fold a step's final hidden states into the rank's hash
 * (GPU ranks: copied out first, which waits for the step). */
static sparq_status hash_hidden(sq_dist *d, const float *hidden, int rows)
{
    sq_exec *ex = sq_model_exec(d->m);
    const size_t bytes = (size_t)rows * (size_t)d->d * sizeof(float);
    if (ex->be->device) {
        if (!d->hpart) return SPARQ_OK; /* one GPU rank: no other rank to compare it with */
        FORWARD_IF(ex->be->to_host(ex, d->hpart, hidden, bytes));
        hidden = d->hpart;
    }
    sq_digest g;
    sq_digest_of(hidden, bytes, &g);
    uint64_t x;
    memcpy(&x, g.b, sizeof x);
    d->hidden_hash = (d->hidden_hash << 7 | d->hidden_hash >> 57) ^ x;
    return SPARQ_OK;
}

/* Every rank's flag in, the smallest on every rank out (collective). */
static sparq_status agree_min(sq_dist *d, int32_t mine, int32_t *out)
{
    sq_transport *t = d->t;
    int32_t *all = NULL;
    if (t->rank == 0) {
        all = sparq_calloc((size_t)t->size, sizeof *all);
        RETURN_IF(!all, SPARQ_E_NOMEM, "out of memory");
    }
    const sparq_status st = t->vt->gather(t, &mine, sizeof mine, all);
    int32_t m = mine;
    for (int r = 0; st == SPARQ_OK && t->rank == 0 && r < t->size; r++) m = all[r] < m ? all[r] : m;
    sparq_free(all);
    FORWARD_IF(st);
    FORWARD_IF(t->vt->bcast(t, 0, &m, sizeof m));
    *out = m;
    return SPARQ_OK;
}

/* The device link of a pipeline of GPU ranks (collective: every rank calls
 * it once, after the load). Ranks that are threads of one process share the
 * CUDA backend's hub (rank 0 makes it; its address means the same to every
 * thread); processes make an NCCL communicator from rank 0's unique id.
 * If any rank cannot, none uses a link, and link_why says why. Only a
 * failure of the transport itself is an error. */
static sparq_status open_link(sq_dist *d)
{
    if (d->size == 1) return SPARQ_OK;
    sq_exec *ex = sq_model_exec(d->m);
    const sq_backend *be = ex->be;
    const char *env = getenv("SPARQ_DIST_DEVICE_LINK");
    const bool on = d->o.device_link && !(env && !strcmp(env, "0"));
    int32_t all = 0;
    FORWARD_IF(agree_min(d, on && be->device && be->link_open, &all));
    if (!all) {
        if (be->device)
            snprintf(d->link_why, sizeof d->link_why, "%s",
                     on ? "not every rank runs on a GPU" : "switched off (SPARQ_DIST_DEVICE_LINK=0)");
        return SPARQ_OK;
    }
    sq_link_spec spec = {.rank = d->rank, .size = d->size, .max_bytes = hidden_bytes(d, d->max_rows),
                         .timeout_s = d->o.timeout_s};
    uint8_t id[128];
    sparq_status st;
    if (d->t->one_process) {
        uint64_t hub = d->rank == 0 ? (uint64_t)(uintptr_t)be->link_hub_make(d->size) : 0;
        FORWARD_IF(d->t->vt->bcast(d->t, 0, &hub, sizeof hub));
        spec.hub = (void *)(uintptr_t)hub;
        st = hub ? be->link_open(ex, &spec, &d->link) : sparq_err(SPARQ_E_NOMEM, "no memory for the link's hub");
    } else {
        st = sq_transport_nccl_bootstrap(d->t, id);
        spec.nccl_id = id;
        if (st == SPARQ_OK) st = be->link_open(ex, &spec, &d->link);
    }
    if (st != SPARQ_OK) snprintf(d->link_why, sizeof d->link_why, "%s", sparq_errmsg());
    sparq_err_clear();
    FORWARD_IF(agree_min(d, st == SPARQ_OK, &all));
    if (all) {
        d->link_kind = d->t->one_process ? "device link (same process)" : "device link (NCCL)";
        return SPARQ_OK;
    }
    if (!d->link_why[0]) snprintf(d->link_why, sizeof d->link_why, "another rank could not open its end of the link");
    be->link_close(ex, d->link);
    d->link = NULL;
    return SPARQ_OK;
}

/* The model, and the expert split's device buffers with it (its exec's memory). */
static void free_model(sq_dist *d)
{
    if (d->gdev && d->m) sq_model_exec(d->m)->be->free(sq_model_exec(d->m), d->gdev);
    d->gdev = NULL;
    if (!d->borrowed_model) sq_model_free(d->m);
    d->m = NULL;
}

sparq_status sq_dist_open(sq_dist **out, const char *path, const sq_model_opts *mo, const sq_dist_opts *o,
                          sq_transport *t, bool *reported)
{
    *out = NULL;
    bool dummy;
    if (!reported) reported = &dummy;
    *reported = false;
    sq_dist *d = sparq_calloc(1, sizeof *d);
    RETURN_IF(!d, SPARQ_E_NOMEM, "out of memory");
    d->t = t;
    d->rank = t->rank;
    d->size = t->size;
    if (o) d->o = *o;
    else sq_dist_opts_default(&d->o);
    sq_model_opts opts;
    if (mo) opts = *mo;
    else sq_model_opts_default(&opts);
    opts.node = t->rank;
    opts.nodes = t->size;
    sparq_status st = sq_model_load(&d->m, path, &opts);
    if (st == SPARQ_OK) d->esplit = sq_model_expert_split(d->m) > 0;
    /* consistency of the split: rank 0 embeds, the last rank has the head (the
     * pipeline); every rank embeds, rank 0 alone has the head (the expert split) */
    const bool embed = d->esplit || d->rank == 0, head = d->esplit ? d->rank == 0 : d->rank == d->size - 1;
    if (st == SPARQ_OK && (embed != sq_model_has_embed(d->m) || head != sq_model_has_head(d->m)))
        st = sparq_err(SPARQ_E_FORMAT, "%s: node %d has embed=%d head=%d, which does not fit rank %d of %d", path,
                       d->rank, sq_model_has_embed(d->m), sq_model_has_head(d->m), d->rank, d->size);
    if (st == SPARQ_OK) st = attach_model(d);
    if (st == SPARQ_OK && d->esplit && d->size > 1) sq_model_set_moe_combine(d->m, combine_moe, d);
    st = exchange_load_status(d, path, st, reported);
    if (st != SPARQ_OK) {
        free_model(d);
        sq_dist_close(d);
        return st;
    }
    if ((st = open_link(d)) != SPARQ_OK) { /* the transport failed: no shutdown to send */
        if (d->link) sq_model_exec(d->m)->be->link_close(sq_model_exec(d->m), d->link);
        d->link = NULL;
        free_model(d);
        sq_dist_close(d);
        return st;
    }
    /* a worker waits for rank 0's next request without a deadline: rank 0's heartbeat bounds it */
    if (d->size > 1 && t->vt->keepalive) t->vt->keepalive(t, d->o.timeout_s);
    *out = d;
    return SPARQ_OK;
}

sparq_status sq_dist_wrap(sq_dist **out, sq_model *m)
{
    *out = NULL;
    sq_dist *d = sparq_calloc(1, sizeof *d);
    RETURN_IF(!d, SPARQ_E_NOMEM, "out of memory");
    sparq_status st = sq_transport_local(&d->own_transport);
    if (st != SPARQ_OK) {
        sparq_free(d);
        return st;
    }
    d->t = d->own_transport;
    d->size = 1;
    d->m = m;
    d->borrowed_model = true;
    sq_dist_opts_default(&d->o);
    if ((st = attach_model(d)) != SPARQ_OK) {
        sq_dist_close(d);
        return st;
    }
    *out = d;
    return SPARQ_OK;
}

bool sq_dist_is_leader(const sq_dist *d) { return d->rank == 0; }
int sq_dist_rank(const sq_dist *d) { return d->rank; }
int sq_dist_size(const sq_dist *d) { return d->size; }
sq_model *sq_dist_model(sq_dist *d) { return d->m; }
const sq_model_config *sq_dist_cfg(const sq_dist *d) { return sq_model_cfg(d->m); }
const sq_model_opts *sq_dist_options(const sq_dist *d) { return sq_model_options(d->m); }
int sq_dist_pending(const sq_dist *d) { return d->q_n; }
int sq_dist_seq_len(const sq_dist *d, int seq) { return sq_model_seq_len(d->m, seq); }

void sq_dist_get_stats(const sq_dist *d, sq_dist_stats *s)
{
    s->t_wait = d->t->t_wait;
    s->bytes_sent = d->t->bytes_sent;
    s->msgs_sent = d->t->msgs_sent;
    s->steps = d->steps;
    s->hidden_hash = d->hidden_hash;
    s->link_bytes = d->link_bytes;
    s->staged_bytes = d->staged_bytes;
}

const char *sq_dist_hidden_path(const sq_dist *d, const char **why)
{
    if (why) *why = d->link ? "" : d->link_why;
    return d->link ? d->link_kind : "host memory";
}

void sq_dist_abort(sq_dist *d, int code) { d->t->vt->abort(d->t, code); }

static sparq_status receive_next(sq_dist *d);

/* Rank 0: the logits of a finished step must be finite. NaN or Inf comes from
 * broken weights or overflowing activations, and sampling from it prints
 * garbage with exit status 0; say where instead. Row i of the n_out rows is
 * row rows - n_out + i of the step. */
static sparq_status check_logits(const sq_dist *d, const float *lg, int n_out, int rows, const int *seqs,
                                 const int *pos)
{
    for (int i = 0; i < n_out; i++) {
        const float *row = lg + (size_t)i * (size_t)d->vocab;
        float z = 0.0f; /* 0 * x is NaN exactly when x is NaN or Inf */
        for (int v = 0; v < d->vocab; v++) z += row[v] * 0.0f;
        if (z == 0.0f) continue;
        const sf_tensor view = {.name = "logits", .dtype = SF_F32, .ndim = 1, .shape = {(uint64_t)d->vocab},
                                .numel = (uint64_t)d->vocab, .data = row};
        uint64_t nan, inf;
        sf_count_nonfinite(&view, &nan, &inf);
        const int r = rows - n_out + i;
        return sparq_err(SPARQ_E_FORMAT,
                         "the logits of sequence %d at position %d are not finite (%llu NaN, %llu Inf of %d): the "
                         "model's weights hold NaN / Inf or its activations overflow (`sparq inspect --check MODEL` "
                         "scans the weights)",
                         seqs[r], pos[r], (unsigned long long)nan, (unsigned long long)inf, d->vocab);
    }
    return SPARQ_OK;
}

/* Would a link_send to the next rank go without waiting (true without a link)? */
static bool link_ready(sq_dist *d)
{
    if (!d->link) return true;
    sq_exec *ex = sq_model_exec(d->m);
    return ex->be->link_send_ready(ex, d->link, d->rank + 1);
}

/* The next message buffer, once its previous send has completed. On rank 0
 * with steps in flight, results are received while waiting: the last rank
 * may be blocked sending us logits, and until it is unblocked it cannot go
 * back to receive from its predecessor, which (through the chain) is what
 * our send waits for. */
static sparq_status take_buffer(sq_dist *d, char **buf)
{
    if (d->rank == 0) /* the device link's buffers likewise */
        while (d->q_done < d->q_n && (!d->t->vt->send_done(d->t, d->cur) || !link_ready(d)))
            FORWARD_IF(receive_next(d));
    FORWARD_IF(d->t->vt->wait_send(d->t, d->cur, d->o.timeout_s));
    *buf = d->buf[d->cur];
    return SPARQ_OK;
}

static sparq_status send_on(sq_dist *d, char *buf, size_t n)
{
    FORWARD_IF(d->t->vt->isend(d->t, d->rank + 1, SQ_TAG_STEP, buf, n, d->cur));
    d->cur ^= 1;
    return SPARQ_OK;
}

/* The expert split, rank 0: the message in d->buf[0] to every other rank.
 * The buffer is reused only once every send from it has completed. */
static sparq_status send_all(sq_dist *d, size_t n)
{
    for (int r = 1; r < d->size; r++)
        FORWARD_IF(d->t->vt->isend(d->t, r, SQ_TAG_STEP, d->buf[0], n, SLOT_FANOUT + (r - 1) % N_FANOUT));
    for (int r = 1; r < d->size; r++) FORWARD_IF(d->t->vt->wait_send(d->t, SLOT_FANOUT + (r - 1) % N_FANOUT,
                                                                     d->o.timeout_s));
    return SPARQ_OK;
}

static sparq_status send_control(sq_dist *d, int op, int seq, int n)
{
    if (d->esplit && d->size > 1) {
        if (d->rank != 0) return SPARQ_OK;
        const msg_hdr h = {.magic = MSG_MAGIC, .op = op, .seq = seq, .n = n};
        memcpy(d->buf[0], &h, sizeof h);
        return send_all(d, sizeof h);
    }
    if (d->size == 1 || d->rank == d->size - 1) return SPARQ_OK;
    char *buf;
    FORWARD_IF(take_buffer(d, &buf));
    msg_hdr h = {.magic = MSG_MAGIC, .op = op, .seq = seq, .n = n};
    memcpy(buf, &h, sizeof h);
    return send_on(d, buf, sizeof h);
}

/* Positions of a step's rows: each continues its sequence. */
static sparq_status row_positions(sq_dist *d, int rows, const int *seqs)
{
    const int n_seq = sq_model_options(d->m)->n_seq;
    for (int r = 0; r < rows; r++) {
        RETURN_IF(seqs[r] < 0 || seqs[r] >= n_seq, SPARQ_E_RANGE, "sequence %d outside [0, %d)", seqs[r], n_seq);
        int p = sq_model_seq_len(d->m, seqs[r]);
        for (int q = 0; q < r; q++) p += seqs[q] == seqs[r];
        d->pos[r] = p;
    }
    return SPARQ_OK;
}

/* Without a device link hidden states cross ranks in host memory (the
 * message buffer). On the CPU a stage works in that buffer directly; on a
 * device (a GPU rank with the link switched off, or one that could not be
 * made) it works in the model's own buffer and copies in and out. With the
 * link, a GPU stage works in the model's buffer and the link moves it to the
 * next rank's, device to device on the streams (kernels/backend.h). */
static float *stage_buffer(sq_dist *d, float *msg_hidden)
{
    return sq_model_exec(d->m)->be->device ? sq_model_hidden_buffer(d->m) : msg_hidden;
}

/* A step's hidden states in from rank - 1: the link, or the message. */
static sparq_status stage_in(sq_dist *d, float *work, const float *msg_hidden, int rows)
{
    sq_exec *ex = sq_model_exec(d->m);
    if (d->link) return ex->be->link_recv(ex, d->link, d->rank - 1, work, hidden_bytes(d, rows), d->o.timeout_s);
    if (work == msg_hidden) return SPARQ_OK;
    return ex->be->to_device(ex, work, msg_hidden, hidden_bytes(d, rows));
}

/* A step's hidden states out to rank + 1, before its message: the link, or the message. */
static sparq_status stage_out(sq_dist *d, float *msg_hidden, const float *work, int rows)
{
    sq_exec *ex = sq_model_exec(d->m);
    if (d->link) {
        FORWARD_IF(ex->be->link_send(ex, d->link, d->rank + 1, work, hidden_bytes(d, rows), d->o.timeout_s));
        d->link_bytes += hidden_bytes(d, rows);
        return SPARQ_OK;
    }
    d->staged_bytes += hidden_bytes(d, rows);
    if (work == msg_hidden) return SPARQ_OK;
    return ex->be->to_host(ex, msg_hidden, work, hidden_bytes(d, rows));
}

sparq_status sq_dist_submit(sq_dist *d, int rows, const int *seqs, const int32_t *tokens, sq_logits_mode mode,
                            float *logits)
{
    RETURN_IF(d->rank != 0, SPARQ_E_STATE, "rank %d: only rank 0 submits steps", d->rank);
    RETURN_IF(rows < 1 || rows > d->max_rows, SPARQ_E_RANGE, "a step of %d rows (1..%d)", rows, d->max_rows);
    RETURN_IF(mode != SQ_LOGITS_NONE && !logits, SPARQ_E_ARG, "step with logits but no buffer");
    if (d->q_n == QCAP) FORWARD_IF(sq_dist_wait(d));
    FORWARD_IF(row_positions(d, rows, seqs));
    d->steps++;
    if (d->size == 1 || d->esplit) {
        /* everything here, synchronously; the expert split first tells every rank what to run */
        if (d->esplit && d->size > 1) {
            const msg_hdr h = {.magic = MSG_MAGIC, .op = OP_ESTEP, .id = d->next_id++, .rows = rows};
            memcpy(d->buf[0], &h, sizeof h);
            int32_t *ids = (int32_t *)(void *)(d->buf[0] + sizeof h);
            for (int r = 0; r < rows; r++) {
                ids[r] = seqs[r];
                ids[rows + r] = d->pos[r];
                ids[2 * rows + r] = tokens[r];
            }
            FORWARD_IF(send_all(d, step_bytes(d, rows)));
        }
        float *hidden = sq_model_hidden_buffer(d->m);
        FORWARD_IF(sq_model_embed(d->m, tokens, rows, hidden));
        FORWARD_IF(sq_model_forward_rows(d->m, hidden, rows, seqs, d->pos));
        if (d->esplit) FORWARD_IF(hash_hidden(d, hidden, rows));
        const int n_out = n_out_rows(mode, rows);
        const float *first = hidden + (size_t)(rows - n_out) * d->d;
        /* in LOGIT_CHUNK rows, exactly as the last rank of a pipeline does: the
         * head's kernels may round differently for other row counts */
        for (int r0 = 0; r0 < n_out; r0 += LOGIT_CHUNK) {
            const int n = n_out - r0 < LOGIT_CHUNK ? n_out - r0 : LOGIT_CHUNK;
            FORWARD_IF(sq_model_head(d->m, first + (size_t)r0 * d->d, n, logits + (size_t)r0 * d->vocab));
        }
        return check_logits(d, logits, n_out, rows, seqs, d->pos);
    }
    char *buf;
    FORWARD_IF(take_buffer(d, &buf));
    msg_hdr h = {.magic = MSG_MAGIC, .op = OP_STEP, .id = d->next_id++, .rows = rows, .mode = (int32_t)mode};
    memcpy(buf, &h, sizeof h);
    int32_t *ids = (int32_t *)(void *)(buf + sizeof h);
    for (int r = 0; r < rows; r++) {
        ids[r] = seqs[r];
        ids[rows + r] = d->pos[r];
    }
    float *hidden = (float *)(void *)(buf + sizeof h + (size_t)rows * 2 * sizeof(int32_t));
    /* on a device the stage runs in the model's buffer; the result goes over the link or through the host */
    float *work = stage_buffer(d, hidden);
    FORWARD_IF(sq_model_embed(d->m, tokens, rows, work));
    FORWARD_IF(sq_model_forward_rows(d->m, work, rows, seqs, d->pos));
    FORWARD_IF(stage_out(d, hidden, work, rows));
    FORWARD_IF(send_on(d, buf, step_bytes(d, rows)));
    const int slot = (d->q_head + d->q_n) % QCAP;
    pending_step *p = &d->q[slot];
    *p = (pending_step){.id = h.id, .rows = rows, .mode = mode, .logits = logits,
                        .seqs = d->qrows + (size_t)slot * 2 * (size_t)d->max_rows};
    p->pos = p->seqs + d->max_rows;
    memcpy(p->seqs, seqs, (size_t)rows * sizeof(int));
    memcpy(p->pos, d->pos, (size_t)rows * sizeof(int));
    d->q_n++;
    return SPARQ_OK;
}

sparq_status sq_dist_step_sample(sq_dist *d, int rows, const int *seqs, const int32_t *tokens, sq_sampler *const *smp,
                                 float *logits, int32_t *ids)
{
    RETURN_IF(d->rank != 0 || d->size != 1, SPARQ_E_STATE,
              "rank %d of %d: a sampled step runs in one process only (sq_dist_submit otherwise)", d->rank, d->size);
    RETURN_IF(rows < 1 || rows > d->max_rows, SPARQ_E_RANGE, "a step of %d rows (1..%d)", rows, d->max_rows);
    while (d->q_n > 0) FORWARD_IF(sq_dist_wait(d));
    d->steps++;
    int bad = -1;
    FORWARD_IF(sq_model_decode_sample(d->m, rows, seqs, tokens, smp, logits, ids, &bad));
    if (bad < 0) return SPARQ_OK;
    return sparq_err(SPARQ_E_FORMAT,
                     "the logits of sequence %d at position %d are not finite (NaN or Inf): the model's weights hold "
                     "NaN / Inf or its activations overflow (`sparq inspect --check MODEL` scans the weights)",
                     seqs[bad], sq_model_seq_len(d->m, seqs[bad]) - 1);
}

/* The leader's deadline passed: find out who is silent, say so. */
static sparq_status stalled(sq_dist *d, const pending_step *p)
{
    char why[512];
    snprintf(why, sizeof why, "%s", sparq_errmsg());
    const int silent = d->t->vt->find_silent(d->t, d->o.timeout_s < 2 ? d->o.timeout_s : 2.0);
    if (silent > 0)
        return sparq_err(SPARQ_E_TIMEOUT,
                         "rank 0: step %u (%d row%s) got no reply within %.1f s, and rank %d does not answer "
                         "(stopped, hung or dead); stopping every rank (%s)",
                         (unsigned)p->id, p->rows, p->rows == 1 ? "" : "s", d->o.timeout_s, silent, why);
    return sparq_err(SPARQ_E_TIMEOUT,
                     "rank 0: step %u (%d row%s) got no reply within %.1f s although every rank answers a ping "
                     "(a stage is slower than --timeout?); stopping every rank (%s)",
                     (unsigned)p->id, p->rows, p->rows == 1 ? "" : "s", d->o.timeout_s, why);
}

/* Receive the result of the oldest step not yet received. */
static sparq_status receive_next(sq_dist *d)
{
    pending_step *p = &d->q[(d->q_head + d->q_done) % QCAP];
    sq_transport *t = d->t;
    const int last = d->size - 1;
    msg_hdr h;
    size_t got = 0;
    sparq_status st = t->vt->recv(t, last, SQ_TAG_RESULT, &h, sizeof h, &got, d->o.timeout_s);
    if (st == SPARQ_E_TIMEOUT) return stalled(d, p);
    FORWARD_IF(st);
    const int n_out = n_out_rows(p->mode, p->rows);
    RETURN_IF(got != sizeof h || h.magic != MSG_MAGIC || h.id != p->id || h.n_out != n_out, SPARQ_E_COMM,
              "rank 0: malformed result from rank %d (%zu bytes, step %u, %d rows; expected step %u, %d rows)", last,
              got, (unsigned)h.id, (int)h.n_out, (unsigned)p->id, n_out);
    for (int r0 = 0; r0 < n_out; r0 += LOGIT_CHUNK) {
        const int n = n_out - r0 < LOGIT_CHUNK ? n_out - r0 : LOGIT_CHUNK;
        const size_t want = (size_t)n * (size_t)d->vocab * sizeof(float);
        st = t->vt->recv(t, last, SQ_TAG_RESULT, p->logits + (size_t)r0 * d->vocab, want, &got, d->o.timeout_s);
        if (st == SPARQ_E_TIMEOUT) return stalled(d, p);
        FORWARD_IF(st);
        RETURN_IF(got != want, SPARQ_E_COMM, "rank 0: logits message from rank %d has %zu bytes, expected %zu", last,
                  got, want);
    }
    FORWARD_IF(check_logits(d, p->logits, n_out, p->rows, p->seqs, p->pos));
    d->q_done++;
    return SPARQ_OK;
}

sparq_status sq_dist_wait(sq_dist *d)
{
    if (d->q_n == 0) return SPARQ_OK;
    if (d->q_done == 0) FORWARD_IF(receive_next(d));
    d->q_head = (d->q_head + 1) % QCAP;
    d->q_n--;
    d->q_done--;
    return SPARQ_OK;
}

sparq_status sq_dist_forward(sq_dist *d, int seq, const int32_t *tokens, int n, sq_logits_mode mode, float *logits)
{
    const int ctx = sq_model_options(d->m)->ctx;
    const int len = sq_model_seq_len(d->m, seq);
    RETURN_IF(n < 0 || len + n > ctx, SPARQ_E_RANGE, "sequence %d: %d + %d tokens exceed the context of %d", seq, len,
              n, ctx);
    for (int c0 = 0; c0 < n; c0 += d->max_rows) {
        const int rows = n - c0 < d->max_rows ? n - c0 : d->max_rows;
        for (int r = 0; r < rows; r++) d->seqs[r] = seq;
        sq_logits_mode cm = SQ_LOGITS_NONE;
        float *dst = NULL;
        if (mode == SQ_LOGITS_ALL) {
            cm = SQ_LOGITS_ALL;
            dst = logits + (size_t)c0 * d->vocab;
        } else if (mode == SQ_LOGITS_LAST && c0 + rows == n) {
            cm = SQ_LOGITS_LAST;
            dst = logits;
        }
        FORWARD_IF(sq_dist_submit(d, rows, d->seqs, tokens + c0, cm, dst));
    }
    while (d->q_n > 0) FORWARD_IF(sq_dist_wait(d));
    return SPARQ_OK;
}

sparq_status sq_dist_seq_reset(sq_dist *d, int seq)
{
    sq_model_seq_reset(d->m, seq);
    return send_control(d, OP_RESET, seq, 0);
}

sparq_status sq_dist_seq_truncate(sq_dist *d, int seq, int n)
{
    sq_model_seq_truncate(d->m, seq, n);
    return send_control(d, OP_TRUNCATE, seq, n);
}

sparq_status sq_dist_engram_stats(sq_dist *d, sq_model_engram_stats *all)
{
    RETURN_IF(d->rank != 0, SPARQ_E_STATE, "rank %d: only rank 0 gathers the figures", d->rank);
    while (d->q_n > 0) FORWARD_IF(sq_dist_wait(d));
    sq_model_engram_report(d->m, &all[0]);
    if (d->size == 1) return SPARQ_OK;
    FORWARD_IF(send_control(d, OP_STATS, 0, 0));
    for (int r = 1; r < d->size; r++) {
        size_t got = 0;
        FORWARD_IF(d->t->vt->recv(d->t, r, SQ_TAG_STATS, &all[r], sizeof all[r], &got, d->o.timeout_s));
        RETURN_IF(got != sizeof all[r], SPARQ_E_COMM, "rank %d sent %zu bytes of figures, expected %zu", r, got,
                  sizeof all[r]);
    }
    return SPARQ_OK;
}

/* --- ranks > 0 --------------------------------------------------------------- */

sparq_status sq_dist_msg_parse(const void *buf, size_t n, int max_rows, int hidden, int n_seq, int src,
                               sq_dist_msg *out)
{
    msg_hdr h;
    RETURN_IF(n < sizeof h, SPARQ_E_COMM, "short message (%zu bytes) from rank %d", n, src);
    memcpy(&h, buf, sizeof h);
    RETURN_IF(h.magic != MSG_MAGIC, SPARQ_E_COMM, "message from rank %d has a bad magic 0x%08x", src,
              (unsigned)h.magic);
    memset(out, 0, sizeof *out);
    out->op = h.op;
    out->id = h.id;
    out->seq = h.seq;
    out->n = h.n;
    switch (h.op) {
    case OP_STEP: {
        RETURN_IF(h.rows < 1 || h.rows > max_rows, SPARQ_E_COMM, "step %u from rank %d has %d rows (1..%d)",
                  (unsigned)h.id, src, (int)h.rows, max_rows);
        const size_t want = sizeof h + (size_t)h.rows * 2 * sizeof(int32_t) + (size_t)h.rows * (size_t)hidden * 4;
        RETURN_IF(n != want, SPARQ_E_COMM, "step %u from rank %d: %zu bytes, expected %zu for %d rows",
                  (unsigned)h.id, src, n, want, (int)h.rows);
        RETURN_IF(h.mode != SQ_LOGITS_NONE && h.mode != SQ_LOGITS_LAST && h.mode != SQ_LOGITS_ALL, SPARQ_E_COMM,
                  "step %u from rank %d: unknown logits mode %d", (unsigned)h.id, src, (int)h.mode);
        const int32_t *ids = (const int32_t *)(const void *)((const char *)buf + sizeof h);
        for (int r = 0; r < h.rows; r++) {
            int32_t sq, ps;
            memcpy(&sq, ids + r, 4);
            memcpy(&ps, ids + h.rows + r, 4);
            RETURN_IF(sq < 0 || sq >= n_seq || ps < 0, SPARQ_E_COMM,
                      "step %u from rank %d: row %d has sequence %d, position %d", (unsigned)h.id, src, r, (int)sq,
                      (int)ps);
        }
        out->rows = h.rows;
        out->mode = (sq_logits_mode)h.mode;
        out->ids = ids;
        out->hidden = (const char *)buf + sizeof h + (size_t)h.rows * 2 * sizeof(int32_t);
        return SPARQ_OK;
    }
    case OP_ESTEP: {
        RETURN_IF(h.rows < 1 || h.rows > max_rows, SPARQ_E_COMM, "step %u from rank %d has %d rows (1..%d)",
                  (unsigned)h.id, src, (int)h.rows, max_rows);
        const size_t want = sizeof h + (size_t)h.rows * 3 * sizeof(int32_t);
        RETURN_IF(n != want, SPARQ_E_COMM, "step %u from rank %d: %zu bytes, expected %zu for %d rows of tokens",
                  (unsigned)h.id, src, n, want, (int)h.rows);
        const int32_t *ids = (const int32_t *)(const void *)((const char *)buf + sizeof h);
        for (int r = 0; r < h.rows; r++) {
            int32_t sq, ps, tk;
            memcpy(&sq, ids + r, 4);
            memcpy(&ps, ids + h.rows + r, 4);
            memcpy(&tk, ids + 2 * h.rows + r, 4);
            RETURN_IF(sq < 0 || sq >= n_seq || ps < 0 || tk < 0, SPARQ_E_COMM,
                      "step %u from rank %d: row %d has sequence %d, position %d, token %d", (unsigned)h.id, src, r,
                      (int)sq, (int)ps, (int)tk);
        }
        out->rows = h.rows;
        out->ids = ids;
        return SPARQ_OK;
    }
    case OP_RESET:
    case OP_TRUNCATE:
    case OP_SHUTDOWN:
    case OP_STATS:
        RETURN_IF(n != sizeof h, SPARQ_E_COMM, "control message from rank %d: %zu bytes, expected %zu", src, n,
                  sizeof h);
        RETURN_IF((h.op == OP_RESET || h.op == OP_TRUNCATE) && (h.seq < 0 || h.seq >= n_seq || h.n < 0), SPARQ_E_COMM,
                  "control message from rank %d names sequence %d (count %d)", src, (int)h.seq, (int)h.n);
        return SPARQ_OK;
    default:
        return sparq_err(SPARQ_E_COMM, "unknown operation %d from rank %d", (int)h.op, src);
    }
}

/* Last rank: the result of a step (header, then logits in chunks). */
static sparq_status send_result(sq_dist *d, const sq_dist_msg *in, float *hidden)
{
    sq_transport *t = d->t;
    const int rows = in->rows, n_out = n_out_rows(in->mode, rows);
    FORWARD_IF(t->vt->wait_send(t, SLOT_RESULT_HDR, d->o.timeout_s));
    d->res_hdr = (msg_hdr){.magic = MSG_MAGIC, .op = OP_STEP, .id = in->id, .rows = rows, .mode = (int32_t)in->mode,
                           .n_out = n_out};
    FORWARD_IF(t->vt->isend(t, 0, SQ_TAG_RESULT, &d->res_hdr, sizeof d->res_hdr, SLOT_RESULT_HDR));
    const float *first = hidden + (size_t)(rows - n_out) * d->d;
    for (int r0 = 0; r0 < n_out; r0 += LOGIT_CHUNK) {
        const int n = n_out - r0 < LOGIT_CHUNK ? n_out - r0 : LOGIT_CHUNK;
        FORWARD_IF(t->vt->wait_send(t, SLOT_RESULT_ROWS, d->o.timeout_s));
        FORWARD_IF(sq_model_head(d->m, first + (size_t)r0 * d->d, n, d->lbuf));
        FORWARD_IF(t->vt->isend(t, 0, SQ_TAG_RESULT, d->lbuf, (size_t)n * (size_t)d->vocab * sizeof(float),
                                SLOT_RESULT_ROWS));
    }
    return SPARQ_OK;
}

/* Test knob: SPARQ_DIST_DELAY_MS makes every step of a rank > 0 that much
 * slower (a slow box or link), so the mpi suite can stop a rank in the
 * middle of a generation of the tiny fixture. */
static void test_delay(void)
{
    const char *env = getenv("SPARQ_DIST_DELAY_MS");
    const long ms = env ? strtol(env, NULL, 10) : 0;
    if (ms <= 0 || ms >= 100000) return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A rank > 0 of the expert split: every message comes from rank 0; a step is
 * embed + every layer (the MoE layers' all-gathers meet rank 0's and the
 * others'), and nothing goes back but figures. */
static sparq_status serve_experts(sq_dist *d)
{
    sq_transport *t = d->t;
    float *hidden = sq_model_hidden_buffer(d->m);
    int32_t *tok = sparq_malloc((size_t)d->max_rows * sizeof *tok);
    RETURN_IF(!tok, SPARQ_E_NOMEM, "rank %d: out of memory", d->rank);
    sparq_status st = SPARQ_OK;
    while (st == SPARQ_OK) {
        size_t got = 0;
        /* idle between requests: no deadline (rank 0 may wait for a user; its heartbeat bounds this) */
        st = t->vt->recv(t, 0, SQ_TAG_STEP, d->buf[0], d->buf_bytes, &got, -1.0);
        sq_dist_msg msg;
        if (st == SPARQ_OK)
            st = sq_dist_msg_parse(d->buf[0], got, d->max_rows, d->d, sq_model_options(d->m)->n_seq, 0, &msg);
        if (st != SPARQ_OK) break;
        if (msg.op == OP_ESTEP) {
            for (int r = 0; r < msg.rows; r++) {
                memcpy(&d->seqs[r], msg.ids + r, 4);
                memcpy(&d->pos[r], msg.ids + msg.rows + r, 4);
                memcpy(&tok[r], msg.ids + 2 * msg.rows + r, 4);
            }
            st = sq_model_embed(d->m, tok, msg.rows, hidden);
            if (st == SPARQ_OK) st = sq_model_forward_rows(d->m, hidden, msg.rows, d->seqs, d->pos);
            if (st != SPARQ_OK) {
                st = sparq_err_context(st, "rank %d: step %u", d->rank, (unsigned)msg.id);
                break;
            }
            if ((st = hash_hidden(d, hidden, msg.rows)) != SPARQ_OK) break;
            d->steps++;
            test_delay();
        } else if (msg.op == OP_STATS) {
            st = t->vt->wait_send(t, SLOT_STATS, d->o.timeout_s); /* the previous request's, if any */
            sq_model_engram_report(d->m, &d->stats_out);
            if (st == SPARQ_OK) st = t->vt->isend(t, 0, SQ_TAG_STATS, &d->stats_out, sizeof d->stats_out, SLOT_STATS);
        } else if (msg.op == OP_RESET) {
            sq_model_seq_reset(d->m, msg.seq);
        } else if (msg.op == OP_TRUNCATE) {
            sq_model_seq_truncate(d->m, msg.seq, msg.n);
        } else if (msg.op == OP_SHUTDOWN) {
            for (int s = 0; s < SQ_TRANSPORT_SLOTS && st == SPARQ_OK; s++) st = t->vt->wait_send(t, s, d->o.timeout_s);
            break;
        } else {
            st = sparq_err(SPARQ_E_COMM, "rank %d: operation %d from rank 0 in an expert-split run", d->rank, msg.op);
        }
    }
    sparq_free(tok);
    if (st != SPARQ_OK && !strstr(sparq_errmsg(), "rank ")) return sparq_err_context(st, "rank %d", d->rank);
    return st;
}

sparq_status sq_dist_serve(sq_dist *d)
{
    RETURN_IF(d->rank == 0, SPARQ_E_STATE, "rank 0 does not serve");
    if (d->esplit) return serve_experts(d);
    sq_transport *t = d->t;
    const bool last = d->rank == d->size - 1;
    const int prev = d->rank - 1;
    for (;;) {
        char *buf;
        FORWARD_IF(take_buffer(d, &buf));
        size_t got = 0;
        /* idle between requests: no deadline (rank 0 may wait for a user) */
        FORWARD_IF(t->vt->recv(t, prev, SQ_TAG_STEP, buf, d->buf_bytes, &got, -1.0));
        sq_dist_msg msg;
        sparq_status st = sq_dist_msg_parse(buf, got, d->max_rows, d->link ? 0 : d->d, sq_model_options(d->m)->n_seq,
                                            prev, &msg);
        if (st != SPARQ_OK) return sparq_err_context(st, "rank %d", d->rank);
        switch (msg.op) {
        case OP_STEP: {
            for (int r = 0; r < msg.rows; r++) {
                d->seqs[r] = msg.ids[r];
                d->pos[r] = msg.ids[msg.rows + r];
            }
            float *hidden = (float *)(void *)(buf + (msg.hidden - buf));
            float *work = stage_buffer(d, hidden);
            st = stage_in(d, work, hidden, msg.rows);
            if (st == SPARQ_OK) st = sq_model_forward_rows(d->m, work, msg.rows, d->seqs, d->pos);
            if (st == SPARQ_OK && !last) st = stage_out(d, hidden, work, msg.rows);
            if (st != SPARQ_OK) return sparq_err_context(st, "rank %d: step %u", d->rank, (unsigned)msg.id);
            d->steps++;
            test_delay();
            if (last) FORWARD_IF(send_result(d, &msg, work));
            else FORWARD_IF(send_on(d, buf, got));
            break;
        }
        case OP_STATS:
            if (!last) FORWARD_IF(send_on(d, buf, got));
            FORWARD_IF(t->vt->wait_send(t, SLOT_STATS, d->o.timeout_s)); /* the previous request's, if any */
            sq_model_engram_report(d->m, &d->stats_out);
            FORWARD_IF(t->vt->isend(t, 0, SQ_TAG_STATS, &d->stats_out, sizeof d->stats_out, SLOT_STATS));
            break;
        case OP_RESET:
        case OP_TRUNCATE:
        case OP_SHUTDOWN:
            if (msg.op == OP_RESET) sq_model_seq_reset(d->m, msg.seq);
            else if (msg.op == OP_TRUNCATE) sq_model_seq_truncate(d->m, msg.seq, msg.n);
            if (!last) FORWARD_IF(send_on(d, buf, got));
            if (msg.op == OP_SHUTDOWN) {
                for (int s = 0; s < SQ_TRANSPORT_SLOTS; s++) FORWARD_IF(t->vt->wait_send(t, s, d->o.timeout_s));
                return SPARQ_OK;
            }
            break;
        default:
            return sparq_err(SPARQ_E_STATE, "rank %d: operation %d", d->rank, msg.op);
        }
    }
}

void sq_dist_close(sq_dist *d)
{
    if (!d) return;
    if (d->m && d->rank == 0 && d->size > 1) {
        /* best effort: complete what is in flight, then stop the workers */
        while (d->q_n > 0 && sq_dist_wait(d) == SPARQ_OK) {}
        if (d->q_n == 0 && send_control(d, OP_SHUTDOWN, 0, 0) == SPARQ_OK)
            for (int s = 0; s < SQ_TRANSPORT_SLOTS; s++) d->t->vt->wait_send(d->t, s, d->o.timeout_s);
    }
    if (d->link) sq_model_exec(d->m)->be->link_close(sq_model_exec(d->m), d->link);
    free_model(d);
    sq_transport_close(d->own_transport);
    sparq_aligned_free(d->buf[0]);
    sparq_aligned_free(d->buf[1]);
    sparq_aligned_free(d->lbuf);
    sparq_aligned_free(d->gbuf);
    sparq_aligned_free(d->hpart);
    sparq_free(d->pos);
    sparq_free(d->seqs);
    sparq_free(d->qrows);
    sparq_free(d);
}
