/* cli/cmd_inspect.c — `sparq inspect PATH [--tensors] [--json] [--check]`:
 * what a model directory or safetensors file holds; with --check, whether it
 * is sound (config.json against the tensors through runtime/arch.h, and every
 * tensor read for NaN / Inf).
 *
 * Reads config.json (when present) for the architecture and the MoE shape,
 * and the safetensors tensors for counts. Parameters are counted the way
 * transformers' num_parameters() counts them: every stored tensor's elements,
 * an EXL3 linear (<key>.trellis + .suh + .svh + .mul1/.mcg, reference.md §1.4)
 * as the k×n weight it stands for, and lm_head.weight skipped when the config
 * ties it to the embeddings. Active parameters per token replace each MoE
 * layer's experts by num_experts_per_tok of them (embeddings included).
 * Bytes by dtype are the stored bytes. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "common/alloc.h"
#include "common/file.h"
#include "formats/hfconfig.h"
#include "common/progress.h"
#include "formats/safetensors.h"
#include "runtime/arch.h"
#include "runtime/memplan.h"

static const cli_opt opts[] = {
    {"tensors", 't', NULL, "also list every tensor: name, dtype, shape, bytes (EXL3 linears as one line with bits per weight)"},
    {"json", 0, NULL, "print JSON instead of a table"},
    {"check", 0, NULL, "also read every tensor and report each one holding NaN or Inf (with counts), and check "
                       "config.json against the tensors (each one the architecture reads present with its shape, "
                       "none left unused); exit status 1 on any problem"},
    {0}};
static const cli_spec spec = {
    "inspect", "PATH [--tensors] [--json] [--check]",
    "Describe a model: PATH is a Hugging Face model directory (config.json plus model.safetensors or "
    "sharded model-*.safetensors with model.safetensors.index.json) or one .safetensors file. Prints the "
    "architecture, layers, experts, total parameters and active parameters per token (counted like "
    "transformers' num_parameters(): tied embeddings once, an EXL3 linear as its k x n weight), and "
    "stored bytes by dtype.",
    opts,
    "examples:\n  sparq inspect build/tests/data/exl3-model/exl3-3.0bpw\n"
    "  sparq inspect model-dir --tensors --json\n"
    "  sparq inspect model-dir --check\n"
    "docs: docs/cli-inspect.md"};

/* One line of the tensor listing: a stored tensor, or an EXL3 linear folding
 * its .trellis/.suh/.svh/.mul1/.mcg parts. */
typedef struct inspect_row {
    char *name;            /* owned */
    const sf_tensor *t;    /* the stored tensor (the .trellis one for EXL3) */
    bool exl3;
    int K;                 /* EXL3 bits per trellis weight */
    uint64_t in, out;      /* EXL3 logical weight: k (in) × n (out) */
    uint64_t bytes;        /* stored bytes (all parts for EXL3) */
    uint64_t params;       /* logical parameters (0 for parts folded elsewhere) */
    const char *codebook;  /* "mul1", "mcg", "3inst" */
} inspect_row;

typedef struct inspect_info {
    sq_model_config cfg;
    bool have_cfg;
    char cfg_note[512];     /* why config.json was not used, if not */
    inspect_row *rows;
    size_t nrows;
    uint64_t total, active, expert_params, stored_bytes;
    uint64_t engram_params;               /* Engram tables: in the total, not active (a token reads 24 rows) */
    uint64_t skipped_count, skipped_bytes; /* tensors the architecture ships but does not read (MTP, vision) */
    char skipped_what[128];
    uint64_t dtype_bytes[SF_DTYPE_COUNT];
    uint64_t dtype_count[SF_DTYPE_COUNT];
    uint64_t exl3_linears, exl3_bits_num, exl3_weights; /* weighted mean bpw */
    /* stored bits and weights by group (bits per weight by group; scales count as bits, not weights) */
    uint64_t grp_bits[6], grp_weights[6];
} inspect_info;

enum { GRP_ATTN, GRP_EXPERTS, GRP_SHARED, GRP_HEAD, GRP_ENGRAM, GRP_NATIVE, GRP_COUNT_ };
static const char *const grp_name[GRP_COUNT_] = {"attention", "experts", "shared", "head", "engram", "native"};

/* The group of a stored row: an EXL3 linear by its slot's role (runtime/arch.h), anything else native. */
static int row_group(const inspect_info *in, const inspect_row *r)
{
    if (!r->exl3) return GRP_NATIVE;
    const sq_arch_info *a = in->have_cfg ? sq_arch_of(&in->cfg) : NULL;
    if (a && !strcmp(r->name, a->head_key)) return GRP_HEAD;
    sq_lin_role role;
    if (!in->have_cfg || !sq_arch_quant_linear_role(&in->cfg, r->name, NULL, &role)) return GRP_ATTN;
    switch (role) {
    case SQ_ROLE_EXPERT: return GRP_EXPERTS;
    case SQ_ROLE_SHARED:
    case SQ_ROLE_MLP: return GRP_SHARED;
    case SQ_ROLE_ENGRAM: return GRP_ENGRAM;
    default: return GRP_ATTN;
    }
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Find "<key><suffix>" in m. */
static const sf_tensor *find_part(const sf_model *m, const char *key, size_t keylen, const char *suffix)
{
    char buf[1024];
    if (keylen + strlen(suffix) + 1 > sizeof buf) return NULL;
    memcpy(buf, key, keylen);
    strcpy(buf + keylen, suffix);
    return sf_find(m, buf);
}

/* Is t an EXL3 trellis: "<key>.trellis", I16, (k/16, n/16, 16·K), K in 1..8? */
static bool is_trellis(const sf_tensor *t)
{
    return ends_with(t->name, ".trellis") && t->dtype == SF_I16 && t->ndim == 3 && t->shape[2] % 16 == 0 &&
           t->shape[2] >= 16 && t->shape[2] <= 128;
}

/* Is t a part folded into an EXL3 linear (.suh/.svh/.mul1/.mcg next to a .trellis)? */
static bool is_exl3_part(const sf_model *m, const sf_tensor *t)
{
    static const char *const parts[] = {".suh", ".svh", ".mul1", ".mcg"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (ends_with(t->name, parts[i])) {
            const sf_tensor *tr = find_part(m, t->name, strlen(t->name) - strlen(parts[i]), ".trellis");
            return tr && is_trellis(tr);
        }
    return false;
}

/* Is the tensor a routed expert's weight? The memory plan's classification,
 * which knows every architecture's layer naming (runtime/memplan.h). */
static bool is_expert_tensor(const char *name)
{
    bool ex = false;
    return sq_memplan_classify(name, NULL, &ex) == SQ_TENSOR_LAYER && ex;
}

static int collect(inspect_info *in, const sf_model *m)
{
    const size_t n = sf_count(m);
    in->rows = sparq_calloc(n ? n : 1, sizeof *in->rows);
    if (!in->rows) return sparq_err(SPARQ_E_NOMEM, "out of memory");
    const bool tied = in->have_cfg && in->cfg.tie_word_embeddings;
    for (size_t i = 0; i < n; i++) {
        const sf_tensor *t = sf_at(m, i);
        in->dtype_bytes[t->dtype] += t->nbytes;
        in->dtype_count[t->dtype]++;
        in->stored_bytes += t->nbytes;
        if (is_exl3_part(m, t)) continue;
        const char *skip = in->have_cfg ? sq_arch_skipped(&in->cfg, t->name) : NULL;
        if (skip) {
            in->skipped_count++;
            in->skipped_bytes += t->nbytes;
            if (!strstr(in->skipped_what, skip) && strlen(in->skipped_what) + strlen(skip) + 4 < sizeof in->skipped_what)
                snprintf(in->skipped_what + strlen(in->skipped_what), sizeof in->skipped_what - strlen(in->skipped_what),
                         "%s%s*", in->skipped_what[0] ? ", " : "", skip);
            continue;
        }
        inspect_row *r = &in->rows[in->nrows];
        r->t = t;
        r->bytes = t->nbytes;
        r->params = t->numel;
        size_t namelen = strlen(t->name);
        if (is_trellis(t)) {
            const size_t kl = namelen - strlen(".trellis");
            const sf_tensor *suh = find_part(m, t->name, kl, ".suh"), *svh = find_part(m, t->name, kl, ".svh");
            const sf_tensor *mul1 = find_part(m, t->name, kl, ".mul1"), *mcg = find_part(m, t->name, kl, ".mcg");
            r->exl3 = true;
            r->K = (int)(t->shape[2] / 16);
            r->in = t->shape[0] * 16;
            r->out = t->shape[1] * 16;
            r->params = r->in * r->out;
            r->codebook = mul1 ? "mul1" : mcg ? "mcg" : "3inst";
            r->bytes += (suh ? suh->nbytes : 0) + (svh ? svh->nbytes : 0) + (mul1 ? mul1->nbytes : 0) +
                        (mcg ? mcg->nbytes : 0);
            namelen = kl;
            in->exl3_linears++;
            /* bits per weight: K plus the suh/svh overhead (16 bits per channel) */
            in->exl3_bits_num += (uint64_t)r->K * r->params + 16 * (r->in + r->out);
            in->exl3_weights += r->params;
        }
        /* block scales are not parameters; packed FP4 (I8/U8 "<key>.weight" with an E8M0 "<key>.scale") holds two */
        if (t->dtype == SF_F8_E8M0 && ends_with(t->name, ".scale")) r->params = 0;
        if ((t->dtype == SF_I8 || t->dtype == SF_U8) && ends_with(t->name, ".weight")) {
            const sf_tensor *sc = find_part(m, t->name, namelen - strlen(".weight"), ".scale");
            if (sc && sc->dtype == SF_F8_E8M0) r->params = 2 * t->numel;
        }
        r->name = sparq_malloc(namelen + 1);
        if (!r->name) return sparq_err(SPARQ_E_NOMEM, "out of memory");
        memcpy(r->name, t->name, namelen);
        r->name[namelen] = 0;
        in->nrows++;
        const int grp = row_group(in, r);
        in->grp_bits[grp] += 8 * r->bytes;
        in->grp_weights[grp] += r->params;
        /* A tied lm_head is the embedding matrix: transformers counts it once. */
        if (tied && !r->exl3 && !strcmp(r->name, "lm_head.weight") && sf_find(m, "model.embed_tokens.weight"))
            continue;
        in->total += r->params;
        if (is_expert_tensor(r->name)) in->expert_params += r->params;
        if (sq_memplan_classify(r->name, NULL, NULL) == SQ_TENSOR_ENGRAM_TABLE) in->engram_params += r->params;
    }
    in->active = in->total;
    if (in->have_cfg && in->cfg.num_experts > 0 && in->expert_params) {
        const uint64_t E = (uint64_t)in->cfg.num_experts, k = (uint64_t)in->cfg.num_experts_per_tok;
        const uint64_t used = in->expert_params / E * k + in->expert_params % E * k / E;
        in->active = in->total - in->expert_params + used;
    }
    in->active -= in->engram_params < in->active ? in->engram_params : 0;
    return SPARQ_OK;
}

static void info_free(inspect_info *in)
{
    for (size_t i = 0; i < in->nrows; i++) sparq_free(in->rows[i].name);
    sparq_free(in->rows);
    sq_config_free(&in->cfg);
}

/* --check: the config against the tensors, and every tensor's NaN / Inf. */
typedef struct bad_tensor {
    const sf_tensor *t;
    uint64_t nan, inf;
} bad_tensor;

typedef struct inspect_check {
    bool config_checked;
    char config_note[600];      /* why the config was not checked, or a problem that is not a list */
    sq_arch_problems probs;
    bad_tensor *bad;
    size_t n_bad;
    size_t scanned;
} inspect_check;

static sparq_status run_check(const inspect_info *in, const sf_model *m, const char *path, inspect_check *c)
{
    memset(c, 0, sizeof *c);
    if (!in->have_cfg) {
        snprintf(c->config_note, sizeof c->config_note, "not checked (%s)", in->cfg_note);
    } else {
        c->config_checked = true;
        sparq_status st = sq_arch_check_tensors(&in->cfg, m, NULL, path, &c->probs);
        if (st == SPARQ_E_NOMEM) return st;
        if (st != SPARQ_OK && c->probs.n == 0) snprintf(c->config_note, sizeof c->config_note, "%s", sparq_errmsg());
        sparq_err_clear();
    }
    const size_t n = sf_count(m);
    c->bad = sparq_calloc(n ? n : 1, sizeof *c->bad);
    RETURN_IF(!c->bad, SPARQ_E_NOMEM, "out of memory");
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += sf_at(m, i)->nbytes;
    sparq_progress pb;
    sparq_progress_begin(&pb, "check", total, SPARQ_PROGRESS_BYTES);
    for (size_t i = 0; i < n; i++) {
        const sf_tensor *t = sf_at(m, i);
        uint64_t nan, inf;
        sf_count_nonfinite(t, &nan, &inf);
        if (nan || inf) c->bad[c->n_bad++] = (bad_tensor){t, nan, inf};
        c->scanned++;
        sparq_progress_add(&pb, t->nbytes);
    }
    sparq_progress_end(&pb);
    return SPARQ_OK;
}

static bool check_failed(const inspect_check *c)
{
    return c->probs.n > 0 || (c->config_checked && c->config_note[0]) || c->n_bad > 0;
}

static void print_check(const inspect_check *c)
{
    printf("\n");
    if (!c->config_checked || c->config_note[0]) {
        printf("%-14s config.json against the tensors: %s\n", "check", c->config_note);
    } else if (c->probs.n == 0) {
        printf("%-14s config.json against the tensors: ok\n", "check");
    } else {
        printf("%-14s config.json against the tensors: %zu problem%s\n", "check", c->probs.n,
               c->probs.n == 1 ? "" : "s");
        for (size_t i = 0; i < c->probs.n_lines; i++) printf("  %s\n", c->probs.line[i]);
        if (c->probs.n > c->probs.n_lines) printf("  ... and %zu more\n", c->probs.n - c->probs.n_lines);
    }
    if (c->n_bad == 0) {
        printf("%-14s NaN / Inf: none in %zu tensors\n", "check", c->scanned);
    } else {
        printf("%-14s NaN / Inf: %zu of %zu tensors\n", "check", c->n_bad, c->scanned);
        for (size_t i = 0; i < c->n_bad; i++)
            printf("  %s: %llu NaN, %llu Inf (of %llu values)\n", c->bad[i].t->name, (unsigned long long)c->bad[i].nan,
                   (unsigned long long)c->bad[i].inf, (unsigned long long)c->bad[i].t->numel);
    }
    printf("%-14s %s\n", "verdict", check_failed(c) ? "FAILED" : "ok");
}

static json_t *check_json(const inspect_check *c)
{
    json_t *o = json_object(), *probs = json_array(), *bad = json_array();
    for (size_t i = 0; i < c->probs.n_lines; i++) json_array_append_new(probs, json_string(c->probs.line[i]));
    if (c->config_note[0] && c->config_checked) json_array_append_new(probs, json_string(c->config_note));
    json_object_set_new(o, "config_checked", json_boolean(c->config_checked));
    if (!c->config_checked) json_object_set_new(o, "config_note", json_string(c->config_note));
    json_object_set_new(o, "config_problem_count", json_integer((json_int_t)(c->probs.n + (c->probs.n == 0 &&
                                                                    c->config_checked && c->config_note[0]))));
    json_object_set_new(o, "config_problems", probs);
    for (size_t i = 0; i < c->n_bad; i++) {
        json_t *t = json_object();
        json_object_set_new(t, "tensor", json_string(c->bad[i].t->name));
        json_object_set_new(t, "nan", json_integer((json_int_t)c->bad[i].nan));
        json_object_set_new(t, "inf", json_integer((json_int_t)c->bad[i].inf));
        json_object_set_new(t, "values", json_integer((json_int_t)c->bad[i].t->numel));
        json_array_append_new(bad, t);
    }
    json_object_set_new(o, "tensors_scanned", json_integer((json_int_t)c->scanned));
    json_object_set_new(o, "nonfinite", bad);
    json_object_set_new(o, "ok", json_boolean(!check_failed(c)));
    return o;
}

static void human(char *buf, size_t cap, double v, const char *unit)
{
    const char *suf[] = {"", "K", "M", "G", "T", "P"};
    int i = 0;
    while (v >= 1000 && i < 5) v /= 1000, i++;
    snprintf(buf, cap, i ? "%.2f %s%s" : "%.0f %s%s", v, suf[i], unit);
}

static void shape_str(char *buf, size_t cap, int ndim, const uint64_t *shape)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, d ? ", %llu" : "%llu", (unsigned long long)shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static int count_moe_layers(const sq_model_config *c)
{
    int n = 0;
    for (int64_t L = 0; L < c->num_hidden_layers; L++) n += sq_config_is_moe_layer(c, L);
    return n;
}

static double mean_bpw(const inspect_info *in)
{
    return in->exl3_weights ? (double)in->exl3_bits_num / (double)in->exl3_weights : 0;
}

/* K plus the suh/svh overhead: 16 bits per input and per output channel. */
static double row_bpw(const inspect_row *r)
{
    return r->K + 16.0 * (double)(r->in + r->out) / (double)r->params;
}

static void print_table(const inspect_info *in, const sf_model *m, const char *path, bool tensors)
{
    char a[64], b[64];
    printf("%-14s %s\n", "model", path);
    if (in->have_cfg) {
        const sq_model_config *c = &in->cfg;
        const int moe = count_moe_layers(c);
        printf("%-14s %s\n", "architecture", sq_arch_name(c->arch));
        printf("%-14s %lld (%d MoE, %lld dense)\n", "layers", (long long)c->num_hidden_layers, moe,
               (long long)(c->num_hidden_layers - moe));
        printf("%-14s hidden %lld, %lld query heads / %lld kv heads x %lld, vocab %lld\n", "shape",
               (long long)c->hidden_size, (long long)c->num_attention_heads, (long long)c->num_key_value_heads,
               (long long)c->head_dim, (long long)c->vocab_size);
        printf("%-14s %lld per MoE layer, %lld active per token, expert width %lld\n", "experts",
               (long long)c->num_experts, (long long)c->num_experts_per_tok, (long long)c->moe_intermediate_size);
        const sq_quant_config *q = &c->quant;
        if (q->present && !strcmp(q->quant_method, "fp8")) {
            char blk[48] = "blocks from each scale's shape";
            if (q->weight_block_size[0])
                snprintf(blk, sizeof blk, "%dx%d blocks", q->weight_block_size[0], q->weight_block_size[1]);
            printf("%-14s fp8 %s, %s%s%s, experts %s\n", "quantization", q->fmt[0] ? q->fmt : "e4m3", blk,
                   q->scale_fmt[0] ? " " : "", q->scale_fmt, q->expert_dtype[0] ? q->expert_dtype : "fp8");
        } else if (q->present)
            printf("%-14s %s %g bpw (head %g), codebook %s\n", "quantization", q->quant_method, q->bits,
                   q->head_bits, q->codebook[0] ? q->codebook : "mul1");
    } else {
        printf("%-14s unknown (%s)\n", "architecture", in->cfg_note);
    }
    printf("%-14s %d file%s, %zu tensors stored\n", "files", sf_file_count(m), sf_file_count(m) == 1 ? "" : "s",
           sf_count(m));
    human(a, sizeof a, (double)in->total, "");
    printf("%-14s %llu (%s)\n", "parameters", (unsigned long long)in->total, a);
    if (in->have_cfg) {
        human(b, sizeof b, (double)in->active, "");
        printf("%-14s %llu (%s)\n", "active/token", (unsigned long long)in->active, b);
    }
    if (in->skipped_count) {
        human(a, sizeof a, (double)in->skipped_bytes, "B");
        printf("%-14s %llu tensors (%s) of %s: shipped, not read by sparq (MTP stages are loaded by no command "
               "yet)\n", "skipped", (unsigned long long)in->skipped_count, a, in->skipped_what);
    }
    if (in->engram_params) {
        human(a, sizeof a, (double)in->engram_params, "");
        printf("%-14s %llu (%s) in Engram tables (in the parameters, not active: a token reads 24 rows per "
               "table)\n", "engram", (unsigned long long)in->engram_params, a);
    }
    if (in->exl3_linears)
        printf("%-14s %llu linears, %.3f bits per weight on average (K plus suh/svh)\n", "EXL3",
               (unsigned long long)in->exl3_linears, mean_bpw(in));
    if (in->exl3_linears) { /* stored bits / weights: EXL3 with suh/svh, native tensors with their scales */
        printf("%-14s", "bpw by group");
        const char *sep = " ";
        for (int g = 0; g < GRP_COUNT_; g++)
            if (in->grp_weights[g]) {
                printf("%s%s %.3f (%llu weights)", sep, grp_name[g], (double)in->grp_bits[g] / (double)in->grp_weights[g],
                       (unsigned long long)in->grp_weights[g]);
                sep = ", ";
            }
        printf("\n");
    }
    human(a, sizeof a, (double)in->stored_bytes, "B");
    printf("%-14s %llu (%s)\n", "bytes", (unsigned long long)in->stored_bytes, a);
    for (int d = 0; d < SF_DTYPE_COUNT; d++) {
        if (!in->dtype_count[d]) continue;
        human(a, sizeof a, (double)in->dtype_bytes[d], "B");
        printf("  %-12s %12llu  (%s, %llu tensors)\n", sf_dtype_name((sf_dtype)d),
               (unsigned long long)in->dtype_bytes[d], a, (unsigned long long)in->dtype_count[d]);
    }
    if (!tensors) return;
    printf("\n%-60s %-10s %-20s %12s  %s\n", "tensor", "dtype", "shape", "bytes", "bpw");
    for (size_t i = 0; i < in->nrows; i++) {
        const inspect_row *r = &in->rows[i];
        char sh[128], dt[16];
        if (r->exl3) {
            const uint64_t s[2] = {r->out, r->in}; /* the HF weight's [out, in] */
            shape_str(sh, sizeof sh, 2, s);
            snprintf(dt, sizeof dt, "EXL3 K=%d", r->K);
            printf("%-60s %-10s %-20s %12llu  %.3f (%s)\n", r->name, dt, sh, (unsigned long long)r->bytes,
                   row_bpw(r), r->codebook);
        } else {
            shape_str(sh, sizeof sh, r->t->ndim, r->t->shape);
            printf("%-60s %-10s %-20s %12llu\n", r->name, sf_dtype_name(r->t->dtype), sh,
                   (unsigned long long)r->bytes);
        }
    }
}

static json_t *shape_json(int ndim, const uint64_t *shape)
{
    json_t *a = json_array();
    for (int d = 0; d < ndim; d++) json_array_append_new(a, json_integer((json_int_t)shape[d]));
    return a;
}

static int print_json(const inspect_info *in, const sf_model *m, const char *path, bool tensors,
                      const inspect_check *check)
{
    json_t *o = json_object();
    json_object_set_new(o, "path", json_string(path));
    if (in->have_cfg) {
        const sq_model_config *c = &in->cfg;
        json_object_set_new(o, "architecture", json_string(sq_arch_name(c->arch)));
        json_object_set_new(o, "layers", json_integer(c->num_hidden_layers));
        json_object_set_new(o, "moe_layers", json_integer(count_moe_layers(c)));
        json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
        json_object_set_new(o, "num_attention_heads", json_integer(c->num_attention_heads));
        json_object_set_new(o, "num_key_value_heads", json_integer(c->num_key_value_heads));
        json_object_set_new(o, "head_dim", json_integer(c->head_dim));
        json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
        json_object_set_new(o, "num_experts", json_integer(c->num_experts));
        json_object_set_new(o, "num_experts_per_tok", json_integer(c->num_experts_per_tok));
        json_object_set_new(o, "active_parameters", json_integer((json_int_t)in->active));
        if (c->quant.present && !strcmp(c->quant.quant_method, "fp8")) {
            json_t *q = json_object();
            json_object_set_new(q, "quant_method", json_string("fp8"));
            json_object_set_new(q, "fmt", json_string(c->quant.fmt[0] ? c->quant.fmt : "e4m3"));
            json_object_set_new(q, "weight_block_size",
                                c->quant.weight_block_size[0]
                                    ? json_pack("[ii]", c->quant.weight_block_size[0], c->quant.weight_block_size[1])
                                    : json_null());
            json_object_set_new(q, "scale_fmt", c->quant.scale_fmt[0] ? json_string(c->quant.scale_fmt) : json_null());
            json_object_set_new(q, "expert_dtype", json_string(c->quant.expert_dtype[0] ? c->quant.expert_dtype : "fp8"));
            json_object_set_new(o, "quantization", q);
        } else if (c->quant.present) {
            json_t *q = json_object();
            json_object_set_new(q, "quant_method", json_string(c->quant.quant_method));
            json_object_set_new(q, "bits", json_real(c->quant.bits));
            json_object_set_new(q, "head_bits", json_real(c->quant.head_bits));
            json_object_set_new(q, "codebook", json_string(c->quant.codebook[0] ? c->quant.codebook : "mul1"));
            json_object_set_new(o, "quantization", q);
        }
    } else {
        json_object_set_new(o, "architecture", json_null());
        json_object_set_new(o, "config_note", json_string(in->cfg_note));
    }
    json_object_set_new(o, "files", json_integer(sf_file_count(m)));
    json_object_set_new(o, "tensors_stored", json_integer((json_int_t)sf_count(m)));
    json_object_set_new(o, "parameters", json_integer((json_int_t)in->total));
    json_object_set_new(o, "engram_parameters", json_integer((json_int_t)in->engram_params));
    json_object_set_new(o, "skipped_tensors", json_integer((json_int_t)in->skipped_count));
    json_object_set_new(o, "skipped_bytes", json_integer((json_int_t)in->skipped_bytes));
    json_object_set_new(o, "bytes", json_integer((json_int_t)in->stored_bytes));
    if (in->exl3_linears) {
        json_t *bg = json_object();
        for (int g = 0; g < GRP_COUNT_; g++)
            if (in->grp_weights[g])
                json_object_set_new(bg, grp_name[g], json_real((double)in->grp_bits[g] / (double)in->grp_weights[g]));
        json_object_set_new(o, "bpw_by_group", bg);
        json_object_set_new(o, "exl3_linears", json_integer((json_int_t)in->exl3_linears));
        json_object_set_new(o, "exl3_mean_bits_per_weight", json_real(mean_bpw(in)));
    }
    json_t *bd = json_object();
    for (int d = 0; d < SF_DTYPE_COUNT; d++)
        if (in->dtype_count[d])
            json_object_set_new(bd, sf_dtype_name((sf_dtype)d), json_integer((json_int_t)in->dtype_bytes[d]));
    json_object_set_new(o, "bytes_by_dtype", bd);
    if (tensors) {
        json_t *arr = json_array();
        for (size_t i = 0; i < in->nrows; i++) {
            const inspect_row *r = &in->rows[i];
            json_t *t = json_object();
            json_object_set_new(t, "name", json_string(r->name));
            if (r->exl3) {
                const uint64_t s[2] = {r->out, r->in};
                json_object_set_new(t, "dtype", json_string("EXL3"));
                json_object_set_new(t, "shape", shape_json(2, s));
                json_object_set_new(t, "K", json_integer(r->K));
                json_object_set_new(t, "codebook", json_string(r->codebook));
                json_object_set_new(t, "bits_per_weight", json_real(row_bpw(r)));
            } else {
                json_object_set_new(t, "dtype", json_string(sf_dtype_name(r->t->dtype)));
                json_object_set_new(t, "shape", shape_json(r->t->ndim, r->t->shape));
            }
            json_object_set_new(t, "bytes", json_integer((json_int_t)r->bytes));
            json_array_append_new(arr, t);
        }
        json_object_set_new(o, "tensors", arr);
    }
    if (check) json_object_set_new(o, "check", check_json(check));
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(o);
    if (!s) return sparq_err(SPARQ_E_NOMEM, "out of memory formatting JSON");
    printf("%s\n", s);
    free(s);
    return SPARQ_OK;
}

int cmd_inspect(int argc, char **argv)
{
    cli_args a;
    const char *v;
    int id;
    bool tensors = false, as_json = false, check = false;
    cli_args_init(&a, argc, argv, &spec);
    while ((id = cli_next(&a, &v)) >= 0) {
        if (id == 0) tensors = true;
        else if (id == 1) as_json = true;
        else if (id == 2) check = true;
    }
    if (id != CLI_END) return id == CLI_HELP ? 0 : 2;
    if (a.npos != 1) return cli_usage_error(&spec, "expects exactly one PATH (see --help)");
    const char *path = a.pos[0];

    inspect_info in;
    memset(&in, 0, sizeof in);
    sf_model *m = NULL;
    int st = sf_open(&m, path);
    if (st != SPARQ_OK) return cli_fail(&spec, st);

    /* config.json next to the weights, when there is one. */
    char *cfg_path = NULL;
    if (sparq_path_is_dir(path)) cfg_path = sparq_path_join(path, "config.json");
    if (cfg_path && sparq_path_exists(cfg_path)) {
        st = sq_config_load(&in.cfg, cfg_path);
        if (st == SPARQ_OK) in.have_cfg = true;
        else if (st == SPARQ_E_UNSUPPORTED) snprintf(in.cfg_note, sizeof in.cfg_note, "%s", sparq_errmsg());
        else {
            sparq_free(cfg_path);
            sf_close(m);
            return cli_fail(&spec, st);
        }
    } else {
        snprintf(in.cfg_note, sizeof in.cfg_note, "no config.json");
    }
    sparq_free(cfg_path);

    st = collect(&in, m);
    inspect_check chk;
    memset(&chk, 0, sizeof chk);
    if (st == SPARQ_OK && check) st = run_check(&in, m, path, &chk);
    if (st == SPARQ_OK) {
        if (as_json) st = print_json(&in, m, path, tensors, check ? &chk : NULL);
        else print_table(&in, m, path, tensors);
        if (!as_json && check) print_check(&chk);
    }
    const bool failed = st == SPARQ_OK && check && check_failed(&chk);
    sq_arch_problems_free(&chk.probs);
    sparq_free(chk.bad);
    info_free(&in);
    sf_close(m);
    if (failed) {
        fflush(stdout);
        fprintf(stderr, "sparq inspect: %s: the check found problems (listed in its output)\n", path);
        return 1;
    }
    return st == SPARQ_OK ? 0 : cli_fail(&spec, st);
}
