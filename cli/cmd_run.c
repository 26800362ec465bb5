/* cli/cmd_run.c — `sparq run MODEL -p PROMPT`: generate text on the CPU.
 *
 * Loads the model (runtime/model.h) and its tokenizer, prefills the prompt
 * (optionally through the chat template), then samples token by token
 * (runtime/sampler.h), streaming whole UTF-8 characters to stdout as they are
 * decoded. Speeds go to stderr at the end; --stats adds peak RSS and the bytes
 * the model holds (weights mapped, KV cache, workspace), one `key=value` per
 * line so scripts can check them. With --chat and no prompt it is an
 * interactive chat on stdin; the KV cache keeps the conversation's shared
 * prefix between turns.
 *
 * Under mpirun (a bundle packed for N boxes, `mpirun -np N sparq run BUNDLE
 * ...`) rank 0 does all of the above and the other ranks only serve their
 * pipeline stage, or their share of the experts of an expert-split bundle
 * (runtime/dist/dist.h); one rank or N, the command is the same.
 * --parallel N generates N continuations of the prompt at once (seeds
 * seed, seed+1, ...), split into micro-batches that keep every rank busy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/dist_cli.h"
#include "common/alloc.h"
#include "common/progress.h"
#include "formats/tokenizer.h"
#include "runtime/dist/dist.h"
#include "runtime/generate.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/serve/session.h"

enum {
    O_PROMPT, O_N, O_CHAT, O_SYSTEM, O_TEMP, O_TOPK, O_TOPP, O_MINP, O_REP, O_REPN, O_SEED, O_CTX, O_THREADS,
    O_STATS, O_IGNORE_EOS, O_PARALLEL, O_TIMEOUT, O_DEVICE, O_NO_VERIFY
};
static const cli_opt opts[] = {
    [O_PROMPT] = {"prompt", 'p', "TEXT", "prompt text (with --chat: the user's message)"},
    [O_N] = {"n-predict", 'n', "N", "tokens to generate (default 128)"},
    [O_CHAT] = {"chat", 0, NULL, "use the model's chat template; interactive when no --prompt"},
    [O_SYSTEM] = {"system", 0, "TEXT", "system message for --chat"},
    [O_TEMP] = {"temp", 0, "T", "temperature (default 0.8; 0 = greedy)"},
    [O_TOPK] = {"top-k", 0, "K", "keep the K most likely tokens (default 40; 0 = off)"},
    [O_TOPP] = {"top-p", 0, "P", "nucleus sampling mass (default 0.95; 1 = off)"},
    [O_MINP] = {"min-p", 0, "P", "drop tokens below P x the top probability (default 0.05; 0 = off)"},
    [O_REP] = {"repeat-penalty", 0, "R", "penalty for recent tokens (default 1.0 = off)"},
    [O_REPN] = {"repeat-last-n", 0, "N", "tokens the penalty looks back over (default 64)"},
    [O_SEED] = {"seed", 0, "S", "random seed (default 0; same seed, same text)"},
    [O_CTX] = {"ctx", 'c', "N", "context length to allocate the KV cache for (default 4096, or a bundle's planned "
                                "ctx, capped at the model's max_position_embeddings; a larger N is refused)"},
    [O_THREADS] = {"threads", 't', "N", "worker threads (default: all CPUs)"},
    [O_STATS] = {"stats", 0, NULL, "print peak RSS, weights/KV/workspace bytes, (--device cuda) the device bytes planned and used, and (Engram models) the Engram rows read, distinct rows, rows/s and the fraction of their read time hidden behind compute (summed over the ranks of an mpirun, then one line per rank), and a bundle's Engram row cache (bytes, hits, misses, hit rate), to stderr"},
    [O_IGNORE_EOS] = {"ignore-eos", 0, NULL, "keep generating after an end-of-sequence token"},
    [O_PARALLEL] = {"parallel", 0, "N", "generate N continuations of the prompt at once, seeds S..S+N-1 (default 1); "
                                        "printed one after another when all are done"},
    [O_TIMEOUT] = {"timeout", 0, "SECONDS", "multi-process runs: longest wait for another rank before every rank "
                                            "stops with an error naming it (default 60)"},
    [O_DEVICE] = {"device", 0, "cpu|cuda", "where the forward pass runs (default cpu; cuda: GPU 0, needs a CUDA build)"},
    [O_NO_VERIFY] = {"no-verify", 0, NULL, "a bundle: skip the XXH3 check of every block at load (for a copy already "
                                           "checked with `sparq verify`; sizes are still checked)"},
    {0}};
static const cli_spec spec = {
    "run", "MODEL [-p PROMPT] [options]",
    "Generate text with MODEL (a Hugging Face model directory, an EXL3 model, or a bundle from `sparq pack`) on "
    "the CPU, streaming it to stdout. Prompt and decode speeds are printed to stderr at the end. A bundle packed "
    "for N boxes runs as N processes, one per box: `mpirun -np N sparq run BUNDLE ...` (rank 0 prints), as a "
    "pipeline of layers or, packed with --split experts, every rank running every layer with its share of the "
    "routed experts (CPU backend). A bundle's "
    "files are checked at load, every block's XXH3-128 included; a damaged one is refused, naming the file and block.",
    opts,
    "examples:\n  sparq run build/tests/data/tiny-qwen3moe -p 'The file system' -n 64 --temp 0\n"
    "  sparq run build/tests/data/tiny-qwen3moe --chat\n"
    "  mpirun -np 2 sparq run bundle-2box -p 'The file system' -n 64 --temp 0\n"};

typedef struct run_state {
    sq_session sess;
    sq_tokenizer *tok;
    sq_dist *model;
    uint64_t seed;
} run_state;

static bool emit_stdout(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

/* Prefill ids (reusing the cached prefix), then generate up to n tokens,
 * streaming the text to stdout. */
static sparq_status generate(run_state *s, const int32_t *ids, int n_ids, int n_new)
{
    sq_session_out o;
    const sparq_status st = sq_session_generate(&s->sess, ids, n_ids, n_new, s->seed, emit_stdout, NULL, &o);
    fflush(stdout);
    return st;
}

/* --parallel N: N continuations of the prompt (runtime/generate.h), printed
 * one after another when all are done. */
static sparq_status generate_parallel(run_state *s, const sq_sampler_params *sp, const int32_t *ids, int n_ids,
                                      int n_new, int N)
{
    sq_gen_opts o = {.n_seqs = N, .n_new = n_new, .sampler = *sp, .n_vocab = s->sess.n_vocab, .stop = s->sess.stop,
                     .n_stop = s->sess.n_stop, .ignore_stop = s->sess.ignore_eos};
    sq_gen_result r;
    FORWARD_IF(sq_generate(s->model, ids, n_ids, &o, &r));
    s->sess.t_prompt += r.t_prompt;
    s->sess.t_decode += r.t_decode;
    s->sess.n_prompt += r.n_prompt;
    s->sess.n_decode += r.n_decode;
    sparq_status st = SPARQ_OK;
    for (int i = 0; st == SPARQ_OK && i < N; i++) {
        char *text = NULL;
        size_t len = 0;
        st = sq_tokenizer_decode(s->tok, r.out[i], (size_t)r.n_out[i], true, &text, &len);
        if (st != SPARQ_OK) break;
        printf("%s--- continuation %d (seed %llu) ---\n", i ? "\n" : "", i, (unsigned long long)(sp->seed + (uint64_t)i));
        fwrite(text, 1, len, stdout);
        sparq_free(text);
    }
    sq_gen_result_free(&r);
    return st;
}

/* Render the conversation so far and generate the assistant's turn. */
static sparq_status chat_turn(run_state *s, sq_chat_msg *msgs, int n_msgs, int n_new)
{
    char *text = NULL;
    FORWARD_IF(sq_chat_apply(s->tok, msgs, n_msgs, true, &text));
    int32_t *ids = NULL;
    int n = 0;
    sparq_status st = sq_prompt_encode(s->tok, text, false, &ids, &n);
    sparq_free(text);
    if (st == SPARQ_OK) st = generate(s, ids, n, n_new);
    sparq_free(ids);
    return st;
}

static char *read_line(FILE *f)
{
    size_t cap = 256, n = 0;
    char *b = sparq_malloc(cap);
    if (!b) return NULL;
    int c;
    while ((c = fgetc(f)) != EOF && c != '\n') {
        if (n + 1 >= cap) {
            char *nb = sparq_realloc(b, cap *= 2);
            if (!nb) {
                sparq_free(b);
                return NULL;
            }
            b = nb;
        }
        b[n++] = (char)c;
    }
    if (c == EOF && n == 0) {
        sparq_free(b);
        return NULL;
    }
    b[n] = 0;
    return b;
}

static sparq_status interactive(run_state *s, const char *system, int n_new)
{
    enum { MAX_MSGS = 256 };
    sq_chat_msg msgs[MAX_MSGS];
    char *owned[MAX_MSGS] = {0};
    int n = 0;
    sparq_status st = SPARQ_OK;
    if (system) msgs[n++] = (sq_chat_msg){SQ_ROLE_SYSTEM, system};
    fprintf(stderr, "chat: type a message and press Enter; an empty line or EOF ends.\n");
    while (n + 2 <= MAX_MSGS) {
        fprintf(stderr, "> ");
        fflush(stderr);
        char *line = read_line(stdin);
        if (!line || !line[0]) {
            sparq_free(line);
            break;
        }
        owned[n] = line;
        msgs[n++] = (sq_chat_msg){SQ_ROLE_USER, line};
        st = chat_turn(s, msgs, n, n_new);
        fputc('\n', stdout);
        if (st != SPARQ_OK) break;
        /* the reply (the ids generated after the prompt) becomes the assistant turn */
        char *reply = NULL;
        size_t rl = 0;
        const int n_prompt_ids = s->sess.last_prompt_len;
        st = sq_tokenizer_decode(s->tok, s->sess.cached + n_prompt_ids, (size_t)(s->sess.n_cached - n_prompt_ids),
                                 true, &reply, &rl);
        if (st != SPARQ_OK) break;
        owned[n] = reply;
        msgs[n++] = (sq_chat_msg){SQ_ROLE_ASSISTANT, reply};
    }
    for (int i = 0; i < n; i++) sparq_free(owned[i]);
    return st;
}

/* --stats' Engram lines: every rank's reads (sq_dist_engram_stats), summed, and with several ranks one
 * line per rank (each reads the tables of its own layers). Rows per second: distinct rows over the
 * seconds their reads took, summed over ranks; hidden: the part of those seconds the forward did not
 * wait for. */
static void print_engram_stats(sq_dist *d)
{
    const int n = sq_dist_size(d);
    sq_model_engram_stats *all = sparq_calloc((size_t)n, sizeof *all);
    if (!all || sq_dist_engram_stats(d, all) != SPARQ_OK) {
        fprintf(stderr, "stats: engram: %s\n", all ? sparq_errmsg() : "out of memory");
        sparq_err_clear();
        sparq_free(all);
        return;
    }
    sq_model_engram_stats sum = {0};
    double hidden_wait = 0;
    for (int r = 0; r < n; r++) {
        sum.rows += all[r].rows, sum.unique += all[r].unique, sum.fetch_s += all[r].fetch_s;
        sum.cache_hits += all[r].cache_hits, sum.cache_misses += all[r].cache_misses;
        sum.cache_bytes += all[r].cache_bytes;
        hidden_wait += all[r].wait_s < all[r].fetch_s ? all[r].wait_s : all[r].fetch_s;
    }
    if (sum.rows)
        fprintf(stderr,
                "stats: engram_rows=%llu\nstats: engram_unique_rows=%llu\nstats: engram_rows_per_s=%.0f\n"
                "stats: engram_fetch_s=%.6f\nstats: engram_hidden_fraction=%.3f\n",
                (unsigned long long)sum.rows, (unsigned long long)sum.unique,
                sum.fetch_s > 0 ? (double)sum.unique / sum.fetch_s : 0.0, sum.fetch_s,
                sum.fetch_s > 0 ? 1.0 - hidden_wait / sum.fetch_s : 1.0);
    if (sum.cache_bytes) /* a bundle's planned row cache (--engram-cache of plan / pack) */
        fprintf(stderr,
                "stats: engram_cache_bytes=%llu\nstats: engram_cache_hits=%llu\nstats: engram_cache_misses=%llu\n"
                "stats: engram_cache_hit_rate=%.3f\n",
                (unsigned long long)sum.cache_bytes, (unsigned long long)sum.cache_hits,
                (unsigned long long)sum.cache_misses,
                sum.cache_hits + sum.cache_misses ? (double)sum.cache_hits / (double)(sum.cache_hits + sum.cache_misses)
                                                  : 0.0);
    for (int r = 0; sum.rows && n > 1 && r < n; r++) {
        const sq_model_engram_stats *e = &all[r];
        fprintf(stderr,
                "stats: rank %d engram_rows=%llu engram_unique_rows=%llu engram_fetch_s=%.6f "
                "engram_hidden_fraction=%.3f engram_cache_hits=%llu engram_cache_misses=%llu\n",
                r, (unsigned long long)e->rows, (unsigned long long)e->unique, e->fetch_s,
                e->fetch_s > 0 ? 1.0 - (e->wait_s < e->fetch_s ? e->wait_s : e->fetch_s) / e->fetch_s : 1.0,
                (unsigned long long)e->cache_hits, (unsigned long long)e->cache_misses);
    }
    sparq_free(all);
}

int cmd_run(int argc, char **argv)
{
    cli_args a;
    const char *v;
    int id;
    const char *prompt = NULL, *system = NULL;
    long long n_new = 128, ctx = 0, threads = 0, repn = 64, seed = 0;
    double temp = 0.8, top_p = 0.95, min_p = 0.05, rep = 1.0;
    long long top_k = 40;
    bool chat = false, stats = false, ignore_eos = false, no_verify = false;
    sq_device device = SQ_DEVICE_CPU;
    long long parallel = 1;
    double timeout = 60;
    cli_args_init(&a, argc, argv, &spec);
    while ((id = cli_next(&a, &v)) >= 0) {
        bool ok = true;
        switch (id) {
        case O_PROMPT: prompt = v; break;
        case O_N: ok = cli_parse_int(&spec, "n-predict", v, 0, 1 << 24, &n_new); break;
        case O_CHAT: chat = true; break;
        case O_SYSTEM: system = v; break;
        case O_TEMP: ok = cli_parse_double(&spec, "temp", v, 0, 100, &temp); break;
        case O_TOPK: ok = cli_parse_int(&spec, "top-k", v, 0, 1 << 24, &top_k); break;
        case O_TOPP: ok = cli_parse_double(&spec, "top-p", v, 1e-9, 1, &top_p); break;
        case O_MINP: ok = cli_parse_double(&spec, "min-p", v, 0, 1, &min_p); break;
        case O_REP: ok = cli_parse_double(&spec, "repeat-penalty", v, 1e-3, 100, &rep); break;
        case O_REPN: ok = cli_parse_int(&spec, "repeat-last-n", v, 0, 1 << 20, &repn); break;
        case O_SEED: ok = cli_parse_int(&spec, "seed", v, 0, INT64_MAX, &seed); break;
        case O_CTX: ok = cli_parse_int(&spec, "ctx", v, 2, 1 << 24, &ctx); break;
        case O_THREADS: ok = cli_parse_int(&spec, "threads", v, 1, 4096, &threads); break;
        case O_STATS: stats = true; break;
        case O_IGNORE_EOS: ignore_eos = true; break;
        case O_NO_VERIFY: no_verify = true; break;
        case O_DEVICE: ok = sq_device_parse(v, &device) == SPARQ_OK || cli_usage_error(&spec, "--device: expected cpu or cuda") != 2; break;
        case O_PARALLEL: ok = cli_parse_int(&spec, "parallel", v, 1, 4096, &parallel); break;
        case O_TIMEOUT: ok = cli_parse_double(&spec, "timeout", v, 0.1, 1e6, &timeout); break;
        }
        if (!ok) return 2;
    }
    if (id != CLI_END) return id == CLI_HELP ? 0 : 2;
    if (a.npos != 1) return cli_usage_error(&spec, "expected one MODEL directory");
    if (!prompt && !chat) return cli_usage_error(&spec, "give a prompt with -p (or --chat for an interactive chat)");
    if (parallel > 1 && chat) return cli_usage_error(&spec, "--parallel works with a plain prompt, not --chat");
    const char *dir = a.pos[0];

    run_state s = {0};
    s.seed = (uint64_t)seed;
    const cli_model_args ma = {(int)ctx, (int)threads, (int)parallel, device, timeout, no_verify};
    sq_transport *tr = NULL;
    const int started = cli_dist_start(&spec, dir, &ma, &tr, &s.model, &s.tok);
    if (started >= 0) return started;
    sparq_status st = SPARQ_OK;
    if (parallel > sq_dist_options(s.model)->n_seq) {
        st = sparq_err(SPARQ_E_ARG, "%s: --parallel %lld, but the bundle was planned for %d users (sparq pack --users)",
                       dir, parallel, sq_dist_options(s.model)->n_seq);
        int rc = cli_dist_fail(&spec, tr, st);
        sq_dist_close(s.model);
        sq_tokenizer_free(s.tok);
        sq_transport_close(tr);
        return rc;
    }
    sq_sampler_params sp;
    sq_sampler_params_default(&sp);
    sp.temp = (float)temp;
    sp.top_k = (int)top_k;
    sp.top_p = (float)top_p;
    sp.min_p = (float)min_p;
    sp.repeat_penalty = (float)rep;
    sp.repeat_last_n = (int)repn;
    sp.seed = (uint64_t)seed;
    st = sq_session_init(&s.sess, s.model, s.tok, &sp, chat);
    s.sess.ignore_eos = ignore_eos;

    if (st == SPARQ_OK) {
        if (chat && !prompt) {
            st = interactive(&s, system, (int)n_new);
        } else if (chat) {
            sq_chat_msg msgs[2];
            int nm = 0;
            if (system) msgs[nm++] = (sq_chat_msg){SQ_ROLE_SYSTEM, system};
            msgs[nm++] = (sq_chat_msg){SQ_ROLE_USER, prompt};
            st = chat_turn(&s, msgs, nm, (int)n_new);
            fputc('\n', stdout);
        } else {
            int32_t *ids = NULL;
            int n = 0;
            st = sq_prompt_encode(s.tok, prompt, sq_tokenizer_add_bos(s.tok), &ids, &n);
            if (st == SPARQ_OK && n == 0) st = sparq_err(SPARQ_E_ARG, "the prompt is empty");
            if (st == SPARQ_OK && parallel > 1) {
                st = generate_parallel(&s, &sp, ids, n, (int)n_new, (int)parallel);
                fputc('\n', stdout);
            } else if (st == SPARQ_OK) {
                fputs(prompt, stdout);
                st = generate(&s, ids, n, (int)n_new);
                fputc('\n', stdout);
            }
            sparq_free(ids);
        }
    }
    int rc = 0;
    fflush(stdout);
    if (st != SPARQ_OK) {
        rc = cli_dist_fail(&spec, tr, st);
    } else {
        fprintf(stderr, "prompt: %ld tokens in %.3f s (%.1f tok/s); decode: %ld tokens in %.3f s (%.1f tok/s)\n",
                s.sess.n_prompt, s.sess.t_prompt, s.sess.t_prompt > 0 ? s.sess.n_prompt / s.sess.t_prompt : 0.0,
                s.sess.n_decode, s.sess.t_decode, s.sess.t_decode > 0 ? s.sess.n_decode / s.sess.t_decode : 0.0);
        if (stats) {
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            sq_model_mem mm;
            sq_model_mem_report(sq_dist_model(s.model), &mm);
            fprintf(stderr,
                    "stats: peak_rss_bytes=%llu\nstats: weights_bytes=%llu\nstats: kv_bytes=%llu\n"
                    "stats: workspace_bytes=%llu\nstats: plan_kv_bytes=%llu\nstats: plan_workspace_bytes=%llu\n"
                    "stats: threads=%d\nstats: device_plan_bytes=%llu\nstats: device_used_bytes=%llu\n",
                    (unsigned long long)ru.ru_maxrss * 1024ull, (unsigned long long)mm.weights,
                    (unsigned long long)mm.kv, (unsigned long long)mm.workspace, (unsigned long long)mm.plan_kv,
                    (unsigned long long)mm.plan_workspace, sq_model_exec(sq_dist_model(s.model))->n_threads,
                    (unsigned long long)mm.device_plan, (unsigned long long)mm.device_used);
            uint64_t g_cap, g_rep;
            sq_model_graph_counts(sq_dist_model(s.model), &g_cap, &g_rep);
            fprintf(stderr, "stats: graph_steps_captured=%llu\nstats: graph_steps_replayed=%llu\n",
                    (unsigned long long)g_cap, (unsigned long long)g_rep);
            print_engram_stats(s.model);
            sq_dist_stats ds;
            sq_dist_get_stats(s.model, &ds);
            fprintf(stderr, "stats: ranks=%d\nstats: steps=%llu\nstats: comm_wait_s=%.6f\nstats: comm_bytes_sent=%llu\n",
                    sq_dist_size(s.model), (unsigned long long)ds.steps, ds.t_wait,
                    (unsigned long long)ds.bytes_sent);
            fprintf(stderr, "stats: hidden_link_bytes=%llu\nstats: hidden_staged_bytes=%llu\n",
                    (unsigned long long)ds.link_bytes, (unsigned long long)ds.staged_bytes);
        }
    }
    sq_session_free(&s.sess);
    sq_dist_close(s.model);
    sq_tokenizer_free(s.tok);
    sq_transport_close(tr);
    return rc;
}
