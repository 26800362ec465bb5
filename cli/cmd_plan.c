/* cli/cmd_plan.c — `sparq plan MODEL --boxes N ...`: the memory plan per
 * node (layers, experts, every memory term, headroom) and a verdict; when it
 * does not fit, the smallest box count and the largest context that would,
 * and the term to blame. Also the option handling `sparq pack` shares. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_plan.h"
#include "cli/commands.h"
#include "runtime/quantplan.h"

bool plan_opt_handle(const cli_spec *s, int id, const char *v, sq_pack_options *o)
{
    long long n;
    double d;
    const char *name = s->opts[id].name;
    switch (id) {
    case 0:
        if (!cli_parse_int(s, name, v, 1, 4096, &n)) return false;
        o->boxes = (int)n;
        return true;
    case 1: return cli_parse_size(s, name, v, &o->budget.mem_per_box);
    case 2: return cli_parse_size(s, name, v, &o->budget.reserve_os);
    case 3: return cli_parse_size(s, name, v, &o->budget.display_reserve);
    case 4: return cli_parse_size(s, name, v, &o->budget.unlock_display);
    case 5:
        if (!cli_parse_double(s, name, v, 1e-6, 1.0, &d)) return false;
        o->budget.gpu_util = d;
        return true;
    case 6: return cli_parse_size(s, name, v, &o->budget.margin);
    case 7: return cli_parse_size(s, name, v, &o->budget.engram_cache);
    case 8:
    case 9:
    case 10:
    case 11: {
        int64_t *dst[] = {&o->params.ctx, &o->params.users, &o->params.chunk, &o->params.logits_rows};
        const long long hi[] = {(long long)1 << 40, 1 << 20, 1 << 24, 1 << 24};
        if (!cli_parse_int(s, name, v, 1, hi[id - 8], &n)) return false;
        *dst[id - 8] = n;
        return true;
    }
    case 13:
        if (!cli_parse_int(s, name, v, 1, 4096, &n)) return false;
        o->params.threads = n;
        return true;
    case 12:
        if (!sq_kv_dtype_parse(v, &o->params.kv_dtype)) {
            cli_usage_error(s, "--kv-dtype: '%s' is not f32 or f16", v);
            return false;
        }
        return true;
    case 14:
        if (!sq_memplan_split_parse(v, &o->params.split)) {
            cli_usage_error(s, "--split: '%s' is not pipeline or experts", v);
            return false;
        }
        return true;
    }
    return false;
}

enum { O_JSON = PLAN_OPT_COUNT, O_BITS, O_BITS_FOR, O_ATTN_BITS, O_SHARED_BITS, O_HEAD_BITS, O_SHIP };
#define MAX_BITS_RULES 32
static const cli_opt opts[] = {
    PLAN_OPTS,
    [O_JSON] = {"json", 0, NULL, "print the plan as JSON"},
    [O_BITS] = {"bits", 0, "K", "plan a quantized target instead of MODEL as stored: routed experts at K bits "
                                "(1..8, fractional as `sparq quantize` spreads it: 2.9 = 3 bits on 90% of the "
                                "layers), the other linears at the role defaults below, other tensors as stored"},
    [O_BITS_FOR] = {"bits-for", 0, "PATTERN=K", "with --bits: K bits for the linears whose key matches the fnmatch "
                                                "PATTERN (e.g. 'layers.2[0-2].ffn.experts.*=2'; repeatable, the last "
                                                "match wins; engram.wkv has '*.engram.wkv=4' first)"},
    [O_ATTN_BITS] = {"attn-bits", 0, "K", "with --bits: attention projections (default 5)"},
    [O_SHARED_BITS] = {"shared-bits", 0, "K", "with --bits: shared experts and dense MLPs (default 4)"},
    [O_HEAD_BITS] = {"head-bits", 0, "K", "with --bits: the output head (default 6)"},
    [O_SHIP] = {"ship-pools", 0, NULL, "what-if (no runtime runs it yet): let a pipeline node start at any layer, "
                                       "holding copies of the earlier source layers' pools it reads (DeepSeek "
                                       "V4.1); pack does not accept such a split"},
    {0}};
static const cli_spec spec = {
    "plan", "MODEL [--boxes N] [budget and run options] [--json]",
    "Plan how MODEL (an HF-layout folder, any dtype incl. EXL3) splits over N boxes: contiguous layers per\n"
    "node balanced by bytes and per-token work (--split pipeline), or every layer on every node with the\n"
    "routed experts divided (--split experts), and per node the weights, KV cache (ctx x users),\n"
    "workspace, Engram row cache, communication buffers and safety margin against the usable memory\n"
    "  usable = (mem-per-box - reserve-os - display-reserve + unlock-display) * gpu-util\n"
    "It also prints the bytes and collectives one decoded token costs between the boxes, both splits.\n"
    "With --bits, the plan is of the EXL3 pack `sparq quantize` would make from MODEL (any stored form,\n"
    "a header-only copy too): each linear's bytes at its bits, everything else as stored.\n"
    "Exit status 0 when it fits, 1 when it does not (or on error), 2 on a usage error.",
    opts,
    "example: sparq plan models/qwen3-exl3 --boxes 2 --ctx 32768 --users 6\n"
    "         sparq plan models/qwen3-exl3 --boxes 3 --split experts\n"
    "         sparq plan DeepSeek-V4.1-Flash --bits 2.9 --boxes 2 --ctx 131072 --users 4\n"
    "docs: docs/cli-plan.md"};

/* Binary units: memory is counted in GiB. */
static const char *fmt_size(char *buf, size_t cap, uint64_t b)
{
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double x = (double)b;
    int i = 0;
    while (x >= 1024.0 && i < 5) {
        x /= 1024.0;
        i++;
    }
    if (i == 0) snprintf(buf, cap, "%llu B", (unsigned long long)b);
    else snprintf(buf, cap, "%.2f %s", x, u[i]);
    return buf;
}

static void print_target(const sq_bits_policy *pol, const sq_quantplan_summary *q)
{
    char a[32], b[32], c[32], d[32], e[32], f[32];
    printf("target: EXL3, experts %g bits (%.3f bpw over the experts), attention %d, shared %d, head %d", pol->bits,
           q->expert_bpw, pol->attn_bits, pol->shared_bits, pol->head_bits);
    for (int r = 0; r < pol->n_rules; r++) printf(", %s=%d", pol->rules[r].pattern, pol->rules[r].K);
    printf("\n        experts %s, attention %s, shared %s, head %s, native %s: %s in memory; linears at K =",
           fmt_size(a, 32, q->experts), fmt_size(b, 32, q->attn), fmt_size(c, 32, q->shared),
           fmt_size(d, 32, q->head), fmt_size(e, 32, q->native), fmt_size(f, 32, q->total));
    for (int k = 1; k <= 8; k++)
        if (q->linears_at[k]) printf(" %d:%llu", k, (unsigned long long)q->linears_at[k]);
    printf("\n");
}

static json_t *traffic_json(const sq_memplan_traffic *t)
{
    json_t *o = json_object();
    json_object_set_new(o, "bytes", json_integer((json_int_t)t->bytes));
    json_object_set_new(o, "bytes_max_node", json_integer((json_int_t)t->bytes_max_node));
    json_object_set_new(o, "messages", json_integer((json_int_t)t->messages));
    json_object_set_new(o, "collectives", json_integer((json_int_t)t->collectives));
    return o;
}

static void print_traffic(const sq_model_config *cfg, int boxes, sq_memplan_split chosen)
{
    printf("\ncommunication per decoded token on %d box%s (payload; one row):\n", boxes, boxes == 1 ? "" : "es");
    for (int s = SQ_SPLIT_PIPELINE; s <= SQ_SPLIT_EXPERTS; s++) {
        sq_memplan_traffic t;
        sq_memplan_traffic_per_token(cfg, boxes, (sq_memplan_split)s, &t);
        char a[32], b[32];
        printf("  %-8s %11s in %llu messages, %lld collectives; busiest box sends %s%s\n",
               sq_memplan_split_name((sq_memplan_split)s), fmt_size(a, 32, t.bytes), (unsigned long long)t.messages,
               (long long)t.collectives, fmt_size(b, 32, t.bytes_max_node), s == (int)chosen ? "  (this plan)" : "");
    }
}

static void print_table(const char *model, const sq_memplan *p)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], k[40];
    printf("model: %s (%lld layers%s)\n", model, (long long)p->n_layers, p->tied_head ? ", tied embeddings" : "");
    printf("run: ctx %lld x %lld users, chunk %lld, kv %s, %lld threads\n", (long long)p->params.ctx,
           (long long)p->params.users, (long long)p->params.chunk, sq_kv_dtype_name(p->params.kv_dtype),
           (long long)p->params.threads);
    if (p->params.split == SQ_SPLIT_EXPERTS)
        printf("split: experts (every node runs all %lld layers; routed expert e of every MoE layer on node e mod "
               "%d; the head on node 0)\n", (long long)p->n_layers, p->boxes);
    else
        printf("split: pipeline (contiguous layers per node)\n");
    printf("budget per box: (%s - %s os - %s display + %s unlocked) x %.2f = %s usable\n",
           fmt_size(a, 32, p->budget.mem_per_box), fmt_size(b, 32, p->budget.reserve_os),
           fmt_size(c, 32, p->budget.display_reserve), fmt_size(d, 32, p->budget.unlock_display),
           p->budget.gpu_util, fmt_size(e, 32, p->usable));
    if (p->has_engram) {
        printf("engram tables on SSD: %s (", fmt_size(a, 32, p->engram_table_bytes));
        for (int i = 0; i < p->boxes; i++)
            printf("%snode %d %s", i ? ", " : "", i, fmt_size(a, 32, p->nodes[i].engram_ssd));
        printf(")\n");
    }
    printf("\n%-4s %-9s %-7s %11s %11s %11s %11s %11s %11s %11s %12s\n", "node", "layers", "experts", "weights", "kv",
           "workspace", "engram", "comm", "margin", "total", "headroom");
    for (int i = 0; i < p->boxes; i++) {
        const sq_memplan_node *n = &p->nodes[i];
        char layers[32];
        snprintf(layers, sizeof layers, "%lld-%lld%s%s", (long long)n->first_layer,
                 (long long)(n->first_layer + n->n_layers - 1), n->has_embed ? "E" : "", n->has_head ? "H" : "");
        uint64_t hr = (uint64_t)(n->headroom < 0 ? -n->headroom : n->headroom);
        snprintf(k, sizeof k, "%s%s", n->headroom < 0 ? "-" : "", fmt_size(h, 32, hr));
        printf("%-4d %-9s %-7lld %11s %11s %11s %11s %11s %11s %11s %12s\n", i, layers, (long long)n->experts,
               fmt_size(a, 32, n->weights), fmt_size(b, 32, n->kv), fmt_size(c, 32, n->workspace),
               fmt_size(d, 32, n->engram_cache), fmt_size(e, 32, n->comm), fmt_size(f, 32, n->margin),
               fmt_size(g, 32, n->total), k);
    }
    printf("(E = embeddings, H = final norm + lm_head)\n");
}

int cmd_plan(int argc, char **argv)
{
    sq_pack_options o;
    sq_pack_options_default(&o);
    bool json = false;
    double bits = 0;
    sq_bits_policy pol;
    sq_bits_policy_default(&pol, 3);
    pol.attn_bits = 5;
    pol.shared_bits = 4;
    /* the Engram fusion projection is counted as attention by the layer description; it gets 4 */
    sq_bits_rule rules[MAX_BITS_RULES + 1] = {{"*.engram.wkv", 4}};
    char pats[MAX_BITS_RULES][256];
    int n_rules = 1;
    cli_args a;
    const char *v;
    int id;
    cli_args_init(&a, argc, argv, &spec);
    while ((id = cli_next(&a, &v)) >= 0) {
        long long ll;
        if (id < PLAN_OPT_COUNT) {
            if (!plan_opt_handle(&spec, id, v, &o)) return 2;
        } else if (id == O_JSON) {
            json = true;
        } else if (id == O_SHIP) {
            o.params.ship_sources = true;
        } else if (id == O_BITS) {
            if (!cli_parse_double(&spec, "bits", v, 1.0, 8.0, &bits)) return 2;
        } else if (id == O_BITS_FOR) {
            const char *eq = strrchr(v, '=');
            if (!eq || eq == v || (size_t)(eq - v) >= sizeof pats[0] || n_rules > MAX_BITS_RULES)
                return cli_usage_error(&spec, "--bits-for: expected PATTERN=K (at most %d rules)", MAX_BITS_RULES);
            if (!cli_parse_int(&spec, "bits-for", eq + 1, 1, 8, &ll)) return 2;
            char *pat = pats[n_rules - 1];
            snprintf(pat, sizeof pats[0], "%.*s", (int)(eq - v), v);
            rules[n_rules] = (sq_bits_rule){pat, (int)ll};
            n_rules++;
        } else {
            if (!cli_parse_int(&spec, opts[id].name, v, 1, 8, &ll)) return 2;
            *(id == O_ATTN_BITS ? &pol.attn_bits : id == O_SHARED_BITS ? &pol.shared_bits : &pol.head_bits) = (int)ll;
        }
    }
    if (id != CLI_END) return id == CLI_HELP ? 0 : 2;
    if (a.npos != 1) return cli_usage_error(&spec, "expected one MODEL folder");
    const char *model = a.pos[0];

    sq_pack_model m;
    sparq_status st = sq_pack_model_open(&m, model);
    if (st != SPARQ_OK) return cli_fail(&spec, st);
    /* the tensors planned: MODEL's, or those of its quantized target */
    const sq_memplan_tensor *tensors = m.tensors;
    size_t n_tensors = m.n_tensors;
    sq_quantplan qp = {0};
    sq_quantplan_summary qs;
    if (bits > 0) {
        pol.bits = bits;
        pol.rules = rules;
        pol.n_rules = n_rules;
        st = sq_quantplan_tensors(&m.cfg, m.sf, &pol, &qp, &qs);
        if (st != SPARQ_OK) {
            sq_pack_model_close(&m);
            return cli_fail(&spec, st);
        }
        tensors = qp.tensors;
        n_tensors = qp.n_tensors;
    } else if (n_rules > 1) {
        sq_pack_model_close(&m);
        return cli_usage_error(&spec, "--bits-for needs --bits");
    }
    sq_memplan p;
    st = sq_memplan_build(&p, &m.cfg, tensors, n_tensors, o.boxes, &o.params, &o.budget);
    if (st != SPARQ_OK) {
        sq_quantplan_free(&qp);
        sq_pack_model_close(&m);
        return cli_fail(&spec, st);
    }
    int min_boxes = 0;
    int64_t max_ctx = 0;
    if (!p.fits) st = sq_memplan_suggest(&p, &m.cfg, tensors, n_tensors, &min_boxes, &max_ctx);
    char why[256];
    sq_pack_plan_reason(&p, why, sizeof why);
    int rc = p.fits ? 0 : 1;
    if (st != SPARQ_OK) {
        rc = cli_fail(&spec, st);
    } else if (json) {
        json_t *root = json_object(), *sug = json_object();
        json_object_set_new(root, "model", json_string(model));
        json_object_set_new(root, "fits", json_boolean(p.fits));
        json_object_set_new(root, "reason", json_string(why));
        json_object_set_new(sug, "min_boxes", min_boxes ? json_integer(min_boxes) : json_null());
        json_object_set_new(sug, "max_ctx", max_ctx ? json_integer(max_ctx) : json_null());
        json_object_set_new(root, "suggest", p.fits ? json_null() : sug);
        if (p.fits) json_decref(sug);
        json_t *pj = sq_pack_plan_json(&p), *ssd = json_array();
        json_object_set_new(root, "plan", pj ? pj : json_null());
        for (int i = 0; i < p.boxes; i++) json_array_append_new(ssd, json_integer((json_int_t)p.nodes[i].engram_ssd));
        json_object_set_new(root, "engram_ssd", ssd);
        json_object_set_new(root, "ship_pools", json_boolean(o.params.ship_sources));
        json_object_set_new(root, "split", json_string(sq_memplan_split_name(o.params.split)));
        json_t *tr = json_object();
        for (int s = SQ_SPLIT_PIPELINE; s <= SQ_SPLIT_EXPERTS; s++) {
            sq_memplan_traffic t;
            sq_memplan_traffic_per_token(&m.cfg, o.boxes, (sq_memplan_split)s, &t);
            json_object_set_new(tr, sq_memplan_split_name((sq_memplan_split)s), traffic_json(&t));
        }
        json_object_set_new(root, "traffic_per_token", tr);
        if (bits > 0) {
            json_t *t = json_object();
            json_object_set_new(t, "bits", json_real(bits));
            json_object_set_new(t, "expert_bpw", json_real(qs.expert_bpw));
            json_object_set_new(t, "attn_bits", json_integer(pol.attn_bits));
            json_object_set_new(t, "shared_bits", json_integer(pol.shared_bits));
            json_object_set_new(t, "head_bits", json_integer(pol.head_bits));
            const uint64_t v[] = {qs.experts, qs.attn, qs.shared, qs.head, qs.native, qs.total, qs.engram_tables};
            static const char *const k[] = {"experts", "attn", "shared", "head", "native", "total", "engram_tables"};
            for (int i = 0; i < 7; i++) json_object_set_new(t, k[i], json_integer((json_int_t)v[i]));
            json_object_set_new(root, "target", t);
        }
        char *s = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
        if (s) printf("%s\n", s);
        free(s);
        json_decref(root);
    } else {
        if (bits > 0) print_target(&pol, &qs);
        print_table(model, &p);
        if (m.cfg.max_position_embeddings > 0 && p.params.ctx > m.cfg.max_position_embeddings)
            printf("note: ctx %lld exceeds the model's max_position_embeddings (%lld)\n", (long long)p.params.ctx,
                   (long long)m.cfg.max_position_embeddings);
        if (o.params.ship_sources)
            printf("what-if --ship-pools: nodes keep copies of earlier source layers' pools (in kv); no runtime runs "
                   "this split yet, and the entries shipped per step are not in comm\n");
        print_traffic(&m.cfg, o.boxes, o.params.split);
        printf("\nverdict: %s: %s\n", p.fits ? "fits" : "does not fit", why);
        if (!p.fits) {
            if (min_boxes) printf("smallest box count that fits: %d\n", min_boxes);
            else if (o.params.split == SQ_SPLIT_EXPERTS)
                printf("no box count up to %lld (one expert per box) fits\n", (long long)m.cfg.num_experts);
            else printf("no box count up to %lld (one layer per box) fits\n", (long long)p.n_layers);
            const char *bx = p.boxes == 1 ? "box" : "boxes";
            if (max_ctx) printf("largest ctx that fits on %d %s: %lld\n", p.boxes, bx, (long long)max_ctx);
            else printf("no ctx fits on %d %s: what does not grow with ctx is already too large\n", p.boxes, bx);
        }
    }
    sq_memplan_free(&p);
    sq_quantplan_free(&qp);
    sq_pack_model_close(&m);
    return rc;
}
