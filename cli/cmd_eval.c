/* cli/cmd_eval.c — `sparq eval MODEL --text FILE`: perplexity, and with a
 * reference (--ref MODEL or --ref-logits FILE) KL divergence, top-k agreement
 * and ΔPPL. The scoring and the log-prob file live in runtime/eval.h; this
 * file parses options, tokenizes, loads the models and prints a table or
 * JSON. Under mpirun (a bundle packed for N boxes) rank 0 does all of that
 * and the other ranks serve their pipeline stage (runtime/dist/dist.h); the
 * reference (--ref) is loaded by rank 0 alone. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/dist_cli.h"
#include "common/alloc.h"
#include "common/file.h"
#include "common/progress.h"
#include "formats/tokenizer.h"
#include "runtime/eval.h"
#include "runtime/model.h"

enum { O_TEXT, O_CTX, O_REF, O_SAVE_REF, O_REF_LOGITS, O_REF_F32, O_JSON, O_MAXW, O_THREADS, O_DEVICE, O_NO_VERIFY };
static const cli_opt opts[] = {
    [O_TEXT] = {"text", 'f', "FILE", "text to score (UTF-8); optional with --ref-logits"},
    [O_CTX] = {"ctx", 'c', "N", "window length in tokens (default 512, or the --ref-logits file's)"},
    [O_REF] = {"ref", 0, "REF_MODEL", "reference model: also report KL(ref||model), top-1/top-5 agreement, dPPL"},
    [O_SAVE_REF] = {"save-ref", 0, "F", "write the reference's log-probs to F (the model's own without --ref)"},
    [O_REF_LOGITS] = {"ref-logits", 0, "F", "read reference log-probs from F (made by --save-ref) instead of --ref"},
    [O_REF_F32] = {"save-ref-f32", 0, NULL, "store --save-ref rows as fp32 instead of fp16 (twice the size)"},
    [O_JSON] = {"json", 0, NULL, "print one JSON object instead of a table"},
    [O_MAXW] = {"max-windows", 0, "N", "score at most the first N windows"},
    [O_THREADS] = {"threads", 't', "N", "worker threads (default: all CPUs)"},
    [O_DEVICE] = {"device", 0, "cpu|cuda", "where the forward pass runs (default cpu; cuda: GPU 0; also runs --ref there)"},
    [O_NO_VERIFY] = {"no-verify", 0, NULL, "a bundle (MODEL or REF): skip the XXH3 check of every block at load"},
    {0}};
static const cli_spec spec = {
    "eval", "MODEL --text FILE [options]",
    "Perplexity of MODEL on a text: the text's token ids are cut into windows of --ctx tokens (a last partial "
    "window of >= 2 tokens is kept), each window runs alone from position 0, and every token but the first of "
    "its window is scored; ppl = exp(mean NLL). With a reference, also KL(ref||model) per position (mean, "
    "median, p90, p99), top-1 and top-5 agreement and dPPL, on the same tokens.",
    opts,
    "examples:\n  sparq eval build/tests/data/tiny-qwen3moe --text tests/data/text/eval.txt\n"
    "  sparq eval ORIGINAL --text eval.txt --save-ref ref.lp\n"
    "  sparq eval QUANT --ref-logits ref.lp --json\n"};

/* A JSON string literal (paths may hold quotes, backslashes, control bytes). */
static void put_json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void print_result(const sq_eval_result *r, const char *model, const char *ref, int ctx, bool json)
{
    if (json) {
        printf("{\"model\": ");
        put_json_str(model);
        printf(", \"ctx\": %d, \"windows\": %lld, \"tokens\": %lld, \"scored\": %lld, \"nll_sum\": %.9g, "
               "\"ppl\": %.9g",
               ctx, (long long)r->n_windows, (long long)r->n_tokens, (long long)r->n_scored, r->nll_sum, r->ppl);
        if (r->has_ref) {
            printf(", \"ref\": ");
            put_json_str(ref);
            printf(", \"ref_ppl\": %.9g, \"dppl\": %.9g, \"kl_mean\": %.9g, \"kl_median\": %.9g, "
                   "\"kl_p90\": %.9g, \"kl_p99\": %.9g, \"kl_max\": %.9g, \"top1\": %.9g, \"top5\": %.9g, "
                   "\"top5_overlap\": %.9g",
                   r->ref_ppl, r->dppl, r->kl_mean, r->kl_median, r->kl_p90, r->kl_p99, r->kl_max, r->top1,
                   r->top5, r->top5_overlap);
        }
        printf("}\n");
        return;
    }
    printf("model            %s\n", model);
    printf("windows          %lld x ctx %d (%lld tokens, %lld scored)\n", (long long)r->n_windows, ctx,
           (long long)r->n_tokens, (long long)r->n_scored);
    printf("perplexity       %.4f\n", r->ppl);
    if (!r->has_ref) return;
    printf("reference        %s\n", ref);
    printf("ref perplexity   %.4f\n", r->ref_ppl);
    printf("dPPL             %+.4f (%+.3f %%)\n", r->dppl, 100.0 * r->dppl / r->ref_ppl);
    printf("KL(ref||model)   mean %.6f  median %.6f  p90 %.6f  p99 %.6f  max %.6f\n", r->kl_mean, r->kl_median,
           r->kl_p90, r->kl_p99, r->kl_max);
    printf("top-1 agreement  %.4f\n", r->top1);
    printf("top-5 agreement  %.4f (same five tokens in the same order)\n", r->top5);
    printf("top-5 overlap    %.4f (mean share of the reference's top 5 in the model's top 5)\n", r->top5_overlap);
}

int cmd_eval(int argc, char **argv)
{
    cli_args a;
    const char *v;
    int id;
    const char *text_path = NULL, *ref_dir = NULL, *save_path = NULL, *ref_logits = NULL;
    long long ctx = 0, maxw = 0, threads = 0;
    sq_device device = SQ_DEVICE_CPU;
    bool json = false, f32 = false, no_verify = false;
    cli_args_init(&a, argc, argv, &spec);
    while ((id = cli_next(&a, &v)) >= 0) {
        bool ok = true;
        switch (id) {
        case O_TEXT: text_path = v; break;
        case O_CTX: ok = cli_parse_int(&spec, "ctx", v, 2, 1 << 20, &ctx); break;
        case O_REF: ref_dir = v; break;
        case O_SAVE_REF: save_path = v; break;
        case O_REF_LOGITS: ref_logits = v; break;
        case O_REF_F32: f32 = true; break;
        case O_JSON: json = true; break;
        case O_MAXW: ok = cli_parse_int(&spec, "max-windows", v, 1, INT64_MAX, &maxw); break;
        case O_THREADS: ok = cli_parse_int(&spec, "threads", v, 1, 4096, &threads); break;
        case O_DEVICE: ok = sq_device_parse(v, &device) == SPARQ_OK || cli_usage_error(&spec, "--device: expected cpu or cuda") != 2; break;
        case O_NO_VERIFY: no_verify = true; break;
        }
        if (!ok) return 2;
    }
    if (id != CLI_END) return id == CLI_HELP ? 0 : 2;
    if (a.npos != 1) return cli_usage_error(&spec, "expected one MODEL directory");
    if (!text_path && !ref_logits) return cli_usage_error(&spec, "--text FILE is required (or --ref-logits F)");
    if (ref_dir && ref_logits) return cli_usage_error(&spec, "--ref and --ref-logits are exclusive");
    if (save_path && ref_logits) return cli_usage_error(&spec, "--save-ref with --ref-logits would copy the file");
    const char *dir = a.pos[0];

    sq_transport *tr = NULL, *tr_ref = NULL;
    sparq_status st = sq_transport_auto(&tr);
    if (st != SPARQ_OK) return cli_fail(&spec, st);
    cli_dist_setup(tr);
    if (tr->rank != 0) {
        /* a pipeline stage: the bundle fixes ctx and rows */
        sq_model_opts mo;
        sq_model_opts_default(&mo);
        mo.n_threads = (int)threads;
        mo.device = device;
        mo.no_verify = no_verify;
        sq_dist *d = NULL;
        bool reported = false;
        st = sq_dist_open(&d, dir, &mo, NULL, tr, &reported);
        if (st == SPARQ_OK) st = sq_dist_serve(d);
        if (st != SPARQ_OK && !reported) cli_dist_fail(&spec, tr, st);
        sq_dist_close(d);
        sq_transport_close(tr);
        return st == SPARQ_OK ? 0 : 1;
    }
    sq_tokenizer *tok = NULL;
    sq_reflp_reader *rin = NULL;
    sq_reflp_writer *save = NULL;
    sq_dist *model = NULL, *ref = NULL;
    bool reported = false, opened = false, open_tried = false;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const int32_t *toks = NULL;
    int64_t n_toks = 0;
    char *text = NULL;
    size_t text_len = 0;
    sq_eval_result res;
    int rc = 0;

    if (ref_logits) {
        st = sq_reflp_open(&rin, ref_logits);
        if (st != SPARQ_OK) goto fail;
        if (ctx && ctx != sq_reflp_ctx(rin)) {
            rc = cli_usage_error(&spec, "--ctx %lld differs from the %d the reference file was made with", ctx,
                                 sq_reflp_ctx(rin));
            goto out;
        }
        ctx = sq_reflp_ctx(rin);
        toks = sq_reflp_tokens(rin, &n_toks);
    }
    if (!ctx) ctx = 512;
    if (text_path) {
        st = sq_tokenizer_load(&tok, dir);
        if (st == SPARQ_OK) st = sparq_file_read_all(text_path, (size_t)1 << 31, &text, &text_len);
        if (st == SPARQ_OK) st = sq_tokenizer_encode(tok, text, text_len, true, &ids, &n_ids);
        if (st != SPARQ_OK) goto fail;
        if (rin) {
            /* the file holds the ids of the windows it scored: they must be this text's */
            if ((int64_t)n_ids < n_toks || memcmp(ids, toks, (size_t)n_toks * sizeof(int32_t)) != 0) {
                st = sparq_err(SPARQ_E_ARG, "%s: its tokens are not those of %s with this model's tokenizer",
                               ref_logits, text_path);
                goto fail;
            }
        } else {
            toks = ids;
            n_toks = (int64_t)n_ids;
        }
    }
    sq_model_opts mo;
    sq_model_opts_default(&mo);
    mo.ctx = (int)ctx;
    mo.max_rows = ctx < 512 ? (int)ctx : 512;
    mo.n_threads = (int)threads;
    mo.device = device;
    mo.no_verify = no_verify;
    st = sq_dist_open(&model, dir, &mo, NULL, tr, &reported);
    open_tried = true;
    opened = st == SPARQ_OK;
    if (st == SPARQ_OK && ref_dir) st = sq_transport_local(&tr_ref);
    if (st == SPARQ_OK && ref_dir) {
        /* the reference runs the same chunks as the model (a bundle fixes its own) */
        mo.max_rows = sq_dist_options(model)->max_rows;
        mo.ctx = sq_dist_options(model)->ctx;
        st = sq_dist_open(&ref, ref_dir, &mo, NULL, tr_ref, NULL);
    }
    if (st != SPARQ_OK) goto fail;

    sq_eval_opts eo = {(int)ctx, rin ? 0 : maxw};
    if (sq_eval_n_windows(n_toks, eo.ctx) == 0) {
        st = sparq_err(SPARQ_E_ARG, "the text has %lld tokens: nothing to score", (long long)n_toks);
        goto fail;
    }
    int64_t used = 0, rows = sq_eval_n_rows(n_toks, &eo, &used);
    if (save_path) {
        st = sq_reflp_create(&save, save_path, (int)sq_dist_cfg(model)->vocab_size, eo.ctx, toks, used, rows, !f32);
        if (st != SPARQ_OK) goto fail;
    }
    sparq_progress prog;
    sparq_progress_begin(&prog, "eval", (uint64_t)rows, SPARQ_PROGRESS_ITEMS);
    sparq_progress_set_unit_name(&prog, "tokens");
    st = sq_eval_run(model, ref, rin, save, toks, n_toks, &eo, &prog, &res);
    sparq_progress_end(&prog);
    if (st == SPARQ_OK && save) {
        st = sq_reflp_finish(save);
        save = NULL;
    }
    if (st != SPARQ_OK) goto fail;
    print_result(&res, dir, ref_dir ? ref_dir : ref_logits ? ref_logits : "", eo.ctx, json);
    goto out;
fail:
    /* the other ranks wait in sq_dist_open or in their stage: end them with the error,
     * unless the open itself failed (then every rank already knows) */
    rc = open_tried && !opened ? cli_fail(&spec, st) : cli_dist_fail(&spec, tr, st);
out:
    sq_reflp_abort(save);
    sq_reflp_close(rin);
    sq_dist_close(model);
    sq_dist_close(ref);
    sq_transport_close(tr_ref);
    sq_transport_close(tr);
    sq_tokenizer_free(tok);
    sparq_free(ids);
    sparq_free(text);
    return rc;
}
