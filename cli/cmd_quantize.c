/* cli/cmd_quantize.c — `sparq quantize MODEL OUT`: option parsing, the
 * human report table and the report files around quantize/driver.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "common/file.h"
#include "common/progress.h"
#include "quantize/driver.h"
#include "sparq_version.h"

enum {
    O_BITS, O_BITS_FOR, O_RECIPE, O_HEAD_BITS, O_CALIB, O_CALIB_ROWS, O_CALIB_LEN, O_RANDOM, O_CODEBOOK, O_METHOD,
    O_RTN_GROUP, O_SCALE, O_WORK, O_RESUME, O_REPORT, O_PLOT, O_MAX_MEM, O_SHARD, O_SEED, O_THREADS, O_DEVICE, O_DEVICES, O_STOP,
    O_QUIET
};

static const cli_opt opts[] = {
    [O_BITS] = {"bits", 'b', "K", "routed-expert bits per weight, 1..8; fractional (3.25) upgrades a share of "
                                  "the layers by one bit (default 3)"},
    [O_BITS_FOR] = {"bits-for", 0, "PATTERN=K", "bits for tensors whose key matches the fnmatch PATTERN "
                                                "(repeatable, last match wins; applied after --recipe), e.g. "
                                                "'*.down_proj=4'"},
    [O_RECIPE] = {"recipe", 0, "FILE", "bits per tensor from FILE: lines GLOB=K (fnmatch over tensor keys, K 1..8, "
                                       "'#' comments), last match wins, e.g. 'layers.1[89].ffn.experts.*=2'; "
                                       "a bad line is refused with FILE:LINE"},
    [O_HEAD_BITS] = {"head-bits", 0, "K", "lm_head bits (default 6)"},
    [O_CALIB] = {"calib", 0, "FILE", "calibration text (repeatable; *.jsonl: the \"text\" field of each line); "
                                     "default " SPARQ_DEFAULT_CALIB " (sparq's source tree, fixed at build "
                                     "time; required when that file is not there)"},
    [O_CALIB_ROWS] = {"calib-rows", 0, "N", "calibration rows (default 16)"},
    [O_CALIB_LEN] = {"calib-len", 0, "N", "tokens per calibration row (default 256)"},
    [O_RANDOM] = {"random-rows-frac", 0, "F", "share of rows of uniform random tokens (default 0.15)"},
    [O_CODEBOOK] = {"codebook", 0, "NAME", "trellis codebook: mul1 (default), mcg, 3inst"},
    [O_METHOD] = {"method", 'm', "M", "trellis (calibrated, default), trellis-nocalib (identity Hessian), rtn "
                                      "(round-to-nearest baseline, written dequantised to bf16)"},
    [O_RTN_GROUP] = {"rtn-group", 0, "N", "RTN group size along the input dim (default 128)"},
    [O_SCALE] = {"scale-search", 0, "MODE", "global-scale search: full (default: every tensor, as exllamav3), "
                                           "shared (expert 0's scale reused by the layer's other experts; "
                                           "faster), fixed (no search; fastest, for tests)"},
    [O_WORK] = {"work-dir", 0, "DIR", "per-layer results and the checkpoint (default OUT.work)"},
    [O_RESUME] = {"resume", 0, NULL, "continue an interrupted run from the work dir (same options)"},
    [O_REPORT] = {"report", 0, "FILE.json", "write the report as JSON (and an SVG plot beside it, FILE.svg)"},
    [O_PLOT] = {"plot", 0, "FILE.svg", "write the error-by-layer plot here instead"},
    [O_MAX_MEM] = {"max-mem", 0, "SIZE", "bound on the peak resident memory (e.g. 8G): the run streams one layer at "
                                         "a time and is refused up front, naming what does not fit, when its "
                                         "estimated peak exceeds SIZE; output shards are capped at SIZE/4"},
    [O_SHARD] = {"shard-size", 0, "SIZE", "maximum bytes per output shard (default 4G)"},
    [O_SEED] = {"seed", 0, "N", "seed of the random signs and random rows (default 0)"},
    [O_THREADS] = {"threads", 't', "N", "worker threads (default: all CPUs)"},
    [O_DEVICE] = {"device", 0, "DEV", "cpu (default) or cuda: with cuda the trellis search, the LDLQ error "
                                      "feedback and the proxy errors run on GPU 0 (or the --devices), many experts "
                                      "at a time; the calibration forward and the Hessians stay on the CPU. Same "
                                      "format, same results up to the order of fp32 sums (docs/cli-quantize.md)"},
    [O_DEVICES] = {"devices", 0, "LIST", "CUDA device ordinals sharing each layer's GPU work, e.g. 0,1 (implies "
                                         "--device cuda; default 0; at most 16, one listed twice gets two "
                                         "contexts): the output is byte-identical to one GPU's; the MoE "
                                         "calibration capture and lm_head run on the first"},
    [O_STOP] = {"stop-after-layer", 0, "L", "testing: stop (exit 1) after layer L's checkpoint"},
    [O_QUIET] = {"quiet", 'q', NULL, "no report table on stdout"},
    {0}};

static const cli_spec spec = {
    "quantize", "MODEL OUT [options]",
    "Quantize the HF model in MODEL to EXL3 (exllamav3's trellis format) in OUT, one layer at a time: "
    "Hessians from calibration text, block-LDLQ + Viterbi trellis per linear, hidden states advanced "
    "through the quantized layer. Experts get --bits, attention +2, dense MLP and shared experts +1, "
    "lm_head --head-bits; DeepSeek V4.1 (deepseek_v41): attention 5, shared experts 4, engram.wkv 4, as "
    "the community's two-box pack. Kept as they are (byte-exact, FP8 with their scales, where the runtime runs "
    "that form in place; an FP8 embedding is widened to F32): embeddings, "
    "norms, routers, V4.1's hc_*, attn_sink, compressor and indexer linears, engram.q/k_weight and the "
    "Engram tables. V4.1's mtp.* and vision.* tensors are dropped (sparq does not run them). "
    "OUT is written atomically (OUT.partial, then renamed); the work dir keeps a checkpoint per layer.",
    opts,
    "examples:\n  sparq quantize model/ model-3bpw/ --bits 3 --calib corpus.txt --report q.json\n"
    "  sparq quantize model/ model-rtn4/ --method rtn --bits 4\n"};

static void print_table(const qz_report *r, const qz_opts *o)
{
    printf("%-6s %10s %9s %9s %12s %12s %8s %10s\n", "layer", "rel_err", "cosine", "sqnr_dB", "mean_proxy",
           "max_proxy", "time", "weights/s");
    for (int i = 0; i < r->n_layers; i++) {
        const qz_layer_stat *l = &r->layers[i];
        char t[32];
        if (l->resumed) snprintf(t, sizeof t, "resumed");
        else sparq_format_duration(t, sizeof t, l->seconds);
        char wps[32] = "-";
        if (!l->resumed && l->quant_seconds > 0) snprintf(wps, sizeof wps, "%.0f", (double)l->n_weights / l->quant_seconds);
        printf("%-6d %10.5f %9.6f %9.2f %12.6f %12.6f %8s %10s\n", l->layer, l->rel_err, l->cosine, l->sqnr_db,
               l->mean_proxy, l->max_proxy, t, wps);
    }
    double wps = r->quant_seconds > 0 ? (double)r->n_weights / r->quant_seconds : 0.0;
    char rss[32], est[32], tot[32], bound[40] = "none";
    sparq_format_bytes(rss, sizeof rss, (double)r->peak_rss);
    sparq_format_bytes(est, sizeof est, (double)r->mem_estimate);
    if (o->max_mem) sparq_format_bytes(bound, sizeof bound, (double)o->max_mem);
    sparq_format_duration(tot, sizeof tot, r->total_seconds);
    printf("method %s, bits %.3g, head %d, codebook %s; calibration %d rows x %d tokens (%d random)\n",
           qz_method_name(o->method), o->bits, o->head_bits, trellis_cb_name(o->cb), r->calib_rows, r->calib_len,
           r->random_rows);
    printf("%d tensors; %llu weights quantized in %.1f s = %.0f weights/s; total %s\n", r->n_tensors,
           (unsigned long long)r->n_weights, r->quant_seconds, wps, tot);
    if (r->n_devices > 0) {
        printf("GPU busy %.1f s:", r->gpu_seconds);
        for (int i = 0; i < r->n_devices; i++)
            printf("%s device %d %.1f s", i ? "," : "", r->devices[i], r->gpu_seconds_dev[i]);
        printf("\n");
    }
    printf("memory: peak RSS %s measured (VmHWM), estimate %s, --max-mem bound %s%s\n", rss, est, bound,
           r->skeleton ? "; FP8/MXFP4 source (dequantised per layer)" : "");
    if (r->quality_tokens > 0)
        printf("quality vs the source on %ld calibration text tokens: KLD %.5f, top-1 agreement %.2f %%, "
               "ppl %.3f -> %.3f (sparq eval OUT --ref SRC on held-out text for the real figure)\n",
               r->quality_tokens, r->quality_kld, 100.0 * r->quality_top1, r->quality_ppl_source,
               r->quality_ppl_output);
}

int cmd_quantize(int argc, char **argv)
{
    qz_opts o;
    qz_opts_default(&o);
    const char *report = NULL, *plot = NULL;
    bool quiet = false, device_given = false, devices_given = false;
    cli_args a;
    const char *v;
    int id;
    long long ll;
    double dv;
    cli_args_init(&a, argc, argv, &spec);
    while ((id = cli_next(&a, &v)) >= 0) {
        switch (id) {
        case O_BITS:
            if (!cli_parse_double(&spec, "bits", v, 1.0, 8.0, &o.bits)) return 2;
            break;
        case O_BITS_FOR: {
            const char *eq = strrchr(v, '=');
            if (!eq || eq == v || o.n_rules >= QZ_MAX_RULES)
                return cli_usage_error(&spec, "--bits-for: expected PATTERN=K (at most %d rules)", QZ_MAX_RULES);
            if (!cli_parse_int(&spec, "bits-for", eq + 1, 1, 8, &ll)) return 2;
            static char pats[QZ_MAX_RULES][256];
            snprintf(pats[o.n_rules], sizeof pats[0], "%.*s", (int)(eq - v), v);
            o.rules[o.n_rules].pattern = pats[o.n_rules];
            o.rules[o.n_rules++].K = (int)ll;
            break;
        }
        case O_RECIPE:
            o.recipe = v;
            break;
        case O_HEAD_BITS:
            if (!cli_parse_int(&spec, "head-bits", v, 1, 8, &ll)) return 2;
            o.head_bits = (int)ll;
            break;
        case O_CALIB:
            if (o.n_calib >= QZ_MAX_CALIB) return cli_usage_error(&spec, "--calib: at most %d files", QZ_MAX_CALIB);
            o.calib[o.n_calib++] = v;
            break;
        case O_CALIB_ROWS:
            if (!cli_parse_int(&spec, "calib-rows", v, 1, 1 << 20, &ll)) return 2;
            o.calib_rows = (int)ll;
            break;
        case O_CALIB_LEN:
            if (!cli_parse_int(&spec, "calib-len", v, 1, 1 << 20, &ll)) return 2;
            o.calib_len = (int)ll;
            break;
        case O_RANDOM:
            if (!cli_parse_double(&spec, "random-rows-frac", v, 0.0, 0.9, &dv)) return 2;
            o.random_rows_frac = dv;
            break;
        case O_CODEBOOK:
            if (!trellis_cb_parse(v, &o.cb)) return cli_usage_error(&spec, "--codebook: unknown '%s'", v);
            break;
        case O_METHOD:
            if (!qz_method_parse(v, &o.method)) return cli_usage_error(&spec, "--method: unknown '%s'", v);
            break;
        case O_RTN_GROUP:
            if (!cli_parse_int(&spec, "rtn-group", v, 1, 1 << 20, &ll)) return 2;
            o.rtn_group = (int)ll;
            break;
        case O_SCALE:
            if (strcmp(v, "full") == 0) o.scale_search = QZ_SCALE_FULL;
            else if (strcmp(v, "shared") == 0) o.scale_search = QZ_SCALE_SHARED;
            else if (strcmp(v, "fixed") == 0) o.scale_search = QZ_SCALE_FIXED;
            else return cli_usage_error(&spec, "--scale-search: expected full, shared or fixed, not '%s'", v);
            break;
        case O_WORK: o.work_dir = v; break;
        case O_RESUME: o.resume = true; break;
        case O_REPORT: report = v; break;
        case O_PLOT: plot = v; break;
        case O_MAX_MEM:
            if (!cli_parse_size(&spec, "max-mem", v, &o.max_mem)) return 2;
            break;
        case O_SHARD:
            if (!cli_parse_size(&spec, "shard-size", v, &o.shard_bytes)) return 2;
            break;
        case O_SEED:
            if (!cli_parse_int(&spec, "seed", v, 0, (long long)1 << 62, &ll)) return 2;
            o.seed = (uint64_t)ll;
            break;
        case O_THREADS:
            if (!cli_parse_int(&spec, "threads", v, 1, 4096, &ll)) return 2;
            o.threads = (int)ll;
            break;
        case O_DEVICE:
            device_given = true;
            if (strcmp(v, "cpu") == 0) o.device = QZ_DEVICE_CPU;
            else if (strcmp(v, "cuda") == 0) o.device = QZ_DEVICE_CUDA;
            else return cli_usage_error(&spec, "--device: expected cpu or cuda, not '%s'", v);
            break;
        case O_DEVICES:
            if (qz_devices_parse(v, o.devices, &o.n_devices) != SPARQ_OK)
                return cli_usage_error(&spec, "%s", sparq_errmsg());
            devices_given = true;
            break;
        case O_STOP:
            if (!cli_parse_int(&spec, "stop-after-layer", v, 0, 1 << 20, &ll)) return 2;
            o.stop_after_layer = (int)ll;
            break;
        case O_QUIET: quiet = true; break;
        }
    }
    if (id != CLI_END) return id == CLI_HELP ? 0 : 2;
    if (devices_given && device_given && o.device == QZ_DEVICE_CPU)
        return cli_usage_error(&spec, "--devices needs --device cuda (or no --device)");
    if (devices_given) o.device = QZ_DEVICE_CUDA;
    if (a.npos != 2) return cli_usage_error(&spec, "expected MODEL and OUT");
    o.model_dir = a.pos[0];
    o.out_dir = a.pos[1];
    /* every method reads calibration text: trellis for its Hessians, the others for the report's reference rows */
    if (o.n_calib == 0) {
        if (!sparq_path_exists(SPARQ_DEFAULT_CALIB))
            return cli_usage_error(&spec, "give --calib FILE (the default, %s, is not there: sparq was moved or "
                                          "installed without its source tree)", SPARQ_DEFAULT_CALIB);
        o.calib[o.n_calib++] = SPARQ_DEFAULT_CALIB;
    }

    qz_report rep = {0};
    sparq_status st = qz_run(&o, &rep);
    if (st != SPARQ_OK) {
        int rc = cli_fail(&spec, st);
        qz_report_free(&rep);
        return rc;
    }
    if (!quiet) print_table(&rep, &o);
    char svg[4096];
    if (report) {
        st = qz_report_write_json(&rep, &o, report);
        if (!plot) {
            size_t n = strlen(report);
            if (n > 5 && strcmp(report + n - 5, ".json") == 0) n -= 5;
            snprintf(svg, sizeof svg, "%.*s.svg", (int)n, report);
            plot = svg;
        }
    }
    if (st == SPARQ_OK && plot) st = qz_report_write_svg(&rep, plot);
    qz_report_free(&rep);
    if (st != SPARQ_OK) return cli_fail(&spec, st);
    return 0;
}
