/* quantize/driver.c — `sparq quantize`'s engine, the job itself: the options'
 * defaults and qz_run, which sets the job up (work dir, source, skeleton,
 * model, calibration tokens, the memory check), resumes from the checkpoint,
 * runs the layers and lm_head and assembles the output, then frees it all.
 * See driver.h for the algorithm and quantize/job.h for the file of each
 * stage; the per-matrix math is quantize/ldlq.c. */
#include "quantize/driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/progress.h"
#include "kernels/cuda/ldlq_cuda.h"
#include "quantize/job.h"

const char *qz_method_name(qz_method m)
{
    switch (m) {
    case QZ_METHOD_TRELLIS: return "trellis";
    case QZ_METHOD_TRELLIS_NOCALIB: return "trellis-nocalib";
    case QZ_METHOD_RTN: return "rtn";
    }
    return "?";
}

bool qz_method_parse(const char *s, qz_method *out)
{
    for (int m = 0; m <= QZ_METHOD_RTN; m++)
        if (strcmp(s, qz_method_name((qz_method)m)) == 0) {
            *out = (qz_method)m;
            return true;
        }
    return false;
}

void qz_opts_default(qz_opts *o)
{
    memset(o, 0, sizeof *o);
    o->bits = 3.0;
    o->head_bits = 6;
    o->calib_rows = 16;
    o->calib_len = 256;
    o->random_rows_frac = 0.15;
    o->cb = TRELLIS_CB_MUL1;
    o->method = QZ_METHOD_TRELLIS;
    o->rtn_group = 128;
    o->shard_bytes = 4ull << 30;
    o->stop_after_layer = -1;
    o->scale_search = QZ_SCALE_FULL;
}

sparq_status qz_devices_parse(const char *list, int *devices, int *n_devices)
{
    *n_devices = 0;
    RETURN_IF(!list || !*list, SPARQ_E_ARG, "--devices: empty list (give CUDA device ordinals, e.g. 0,1)");
    int n = 0;
    for (const char *p = list;;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        RETURN_IF(len == 0, SPARQ_E_ARG, "--devices %s: entry %d is empty", list, n + 1);
        int v = 0;
        for (size_t i = 0; i < len; i++) {
            RETURN_IF(p[i] < '0' || p[i] > '9' || i >= 3, SPARQ_E_ARG,
                      "--devices %s: '%.*s' is not a CUDA device ordinal (0..999)", list, (int)len, p);
            v = v * 10 + (p[i] - '0');
        }
        RETURN_IF(n == QZ_MAX_DEVICES, SPARQ_E_ARG, "--devices %s: more than %d devices", list, QZ_MAX_DEVICES);
        devices[n++] = v;
        if (!end) break;
        p = end + 1;
    }
    *n_devices = n;
    return SPARQ_OK;
}

/* One ldlq_cuda context per --devices entry (device 0 alone without the list), made
 * before any work: an unknown or unusable ordinal is refused here, named. */
static sparq_status open_devices(qjob *j)
{
    const qz_opts *o = j->o;
    static const int dev0[1] = {0};
    const int n = o->n_devices > 0 ? o->n_devices : 1;
    const int *dv = o->n_devices > 0 ? o->devices : dev0;
    RETURN_IF(n > QZ_MAX_DEVICES, SPARQ_E_ARG, "--devices: %d devices, at most %d", n, QZ_MAX_DEVICES);
    j->gops = sq_cuda_ldlq_ops();
    if (!j->gops) return sparq_err_context(SPARQ_E_UNSUPPORTED, "--device cuda: no usable GPU");
    for (int i = 0; i < n; i++) {
        const sparq_status st = j->gops->create(dv[i], 0, &j->gdev[i]);
        if (st != SPARQ_OK && o->n_devices > 0)
            return sparq_err_context(st, "--device cuda (--devices entry %d)", i + 1);
        if (st != SPARQ_OK) return sparq_err_context(st, "--device cuda");
        j->n_gdev = i + 1;
        j->rep->devices[i] = dv[i];
    }
    j->rep->n_devices = n;
    j->gctx = j->gdev[0];
    return SPARQ_OK;
}

/* --- the job ---------------------------------------------------------------------- */

static void job_free(qjob *j)
{
    for (int K = 0; K <= TRELLIS_K_MAX; K++) viterbi_free(j->enc[K]);
    for (int i = 0; i < j->n_gdev; i++) j->gops->free(j->gdev[i]);
    sq_model_free(j->m);
    sf_close(j->src);
    sf_close(j->skel);
    sparq_free(j->spans);
    sparq_pool_free(j->pool);
    sparq_free(j->tokens);
    sparq_aligned_free(j->hq);
    sparq_aligned_free(j->href);
    sparq_aligned_free(j->tmp);
    sparq_free(j->pos);
    sparq_free(j->work);
    qz_recipe_free(&j->recipe);
}

sparq_status qz_run(const qz_opts *o, qz_report *rep)
{
    double t_start = sparq_now();
    qjob j = {.o = o, .rep = rep};
    sparq_status st = SPARQ_OK;
    RETURN_IF(!o->model_dir || !o->out_dir, SPARQ_E_ARG, "model and output directories are required");
    RETURN_IF(o->bits < 1.0 || o->bits > 8.0, SPARQ_E_ARG, "--bits %.3g is outside 1..8", o->bits);
    RETURN_IF(o->head_bits < 1 || o->head_bits > 8, SPARQ_E_ARG, "--head-bits %d is outside 1..8", o->head_bits);
    RETURN_IF(o->calib_len < 1 || o->calib_rows < 1, SPARQ_E_ARG, "--calib-rows and --calib-len must be >= 1");
    RETURN_IF(sparq_path_exists(o->out_dir), SPARQ_E_ARG, "%s already exists (refusing to overwrite)", o->out_dir);
    /* the inputs, before anything is created */
    RETURN_IF(!sparq_path_is_dir(o->model_dir), SPARQ_E_NOTFOUND,
              "%s: no such model directory (MODEL is a folder with config.json and *.safetensors)", o->model_dir);
    FORWARD_IF(qz_check_calib_files(o));
    if (o->recipe) FORWARD_IF(qz_recipe_load(o->recipe, &j.recipe));
    if (o->work_dir) j.work = sparq_strdup(o->work_dir);
    else {
        size_t n = strlen(o->out_dir) + 8;
        j.work = sparq_malloc(n);
        if (j.work) snprintf(j.work, n, "%s.work", o->out_dir);
    }
    if (!j.work) {
        qz_recipe_free(&j.recipe);
        return sparq_err(SPARQ_E_NOMEM, "out of memory");
    }
    bool new_work = !sparq_path_exists(j.work);
    st = sparq_mkdirs(j.work);
    if (st == SPARQ_OK) st = qz_check_job(&j, o->resume);
    if (st == SPARQ_OK) st = sparq_pool_create(&j.pool, o->threads);
    if (st == SPARQ_OK && o->device == QZ_DEVICE_CUDA && o->method != QZ_METHOD_RTN) {
        /* the GPU recursion (layer_cuda.c) and the MoE all-experts capture (calib_gpu.c); the rest of the
         * calibration forward stays on the CPU */
        st = open_devices(&j);
    }
    if (st == SPARQ_OK) st = sf_open(&j.src, o->model_dir);
    j.page = (size_t)sysconf(_SC_PAGESIZE);
    if (j.page == 0 || (j.page & (j.page - 1))) j.page = 4096;
    if (st == SPARQ_OK) st = qz_check_source(&j);
    char *skel_dir = NULL;
    if (st == SPARQ_OK) st = qz_build_skeleton(&j, &skel_dir);
    j.skeleton = rep->skeleton = skel_dir != NULL;
    if (st == SPARQ_OK && skel_dir) st = sf_open_overlay(&j.skel, skel_dir, o->model_dir);

    /* Model: rows per forward step = whole calibration sequences (an architecture whose layers read
     * each other's caches: one sequence per step, each calibration row with a cache slot per path). */
    if (st == SPARQ_OK) {
        sq_model_opts mo;
        sq_model_opts_default(&mo);
        j.T = o->calib_len;
        j.batch_seqs = 2048 / j.T > 0 ? 2048 / j.T : 1;
        if (j.batch_seqs > o->calib_rows) j.batch_seqs = o->calib_rows;
        mo.ctx = j.T;
        mo.n_threads = o->threads;
        sq_model_config pc;
        st = sq_config_load(&pc, o->model_dir);
        if (st == SPARQ_OK) {
            const sq_arch_info *a = sq_arch_of(&pc);
            j.per_seq = a && a->calib_per_seq;
            sq_config_free(&pc);
        }
        if (j.per_seq) {
            j.batch_seqs = 1;
            mo.n_seq = 2 * o->calib_rows;
        }
        mo.max_rows = j.batch_seqs * j.T;
        mo.base_dir = skel_dir ? o->model_dir : NULL; /* the skeleton holds only what differs from the source */
        if (st == SPARQ_OK) st = sq_model_load(&j.m, skel_dir ? skel_dir : o->model_dir, &mo);
    }
    if (st == SPARQ_OK) {
        j.cfg = sq_model_cfg(j.m);
        j.arch = sq_arch_of(j.cfg);
        j.d = (int)j.cfg->hidden_size;
        j.w = (int)sq_arch_hidden_width(j.cfg);
        j.cmp = j.w / j.d * j.d; /* the streams; what an architecture appends after them is not compared */
        j.n_layers = (int)j.cfg->num_hidden_layers;
        st = qz_build_calib_tokens(o, (int)j.cfg->vocab_size, &j.tokens, &j.rows, &rep->random_rows);
    }
    size_t nh = 0;
    if (st == SPARQ_OK) {
        rep->calib_rows = j.rows;
        rep->calib_len = j.T;
        nh = (size_t)j.rows * j.T * j.w;
        qz_memdbg("estimate", -1);
        uint64_t now = qz_cur_rss_bytes(), hwm = qz_peak_rss_bytes();
        qz_mem_estimate(&j, hwm > now ? hwm : now);
        if (o->max_mem && rep->mem_estimate > o->max_mem) st = qz_mem_refuse(&j);
    }
    if (st == SPARQ_OK) {
        j.hq = sparq_aligned_alloc(64, nh * sizeof(float));
        j.href = sparq_aligned_alloc(64, nh * sizeof(float));
        j.tmp = sparq_aligned_alloc(64, nh * sizeof(float));
        j.pos = sparq_malloc((size_t)j.batch_seqs * j.T * sizeof(int));
        rep->layers = sparq_calloc((size_t)j.n_layers, sizeof *rep->layers);
        if (!j.hq || !j.href || !j.tmp || !j.pos || !rep->layers)
            st = sparq_err(SPARQ_E_NOMEM, "out of memory for %d calibration rows", j.rows);
        else {
            rep->n_layers = j.n_layers;
            for (int r = 0; r < j.batch_seqs * j.T; r++) j.pos[r] = r % j.T;
        }
    }
    if (st != SPARQ_OK && new_work) { /* failed before any work (the model, the calibration text, --max-mem):
                                         leave nothing behind */
        if (skel_dir) {
            qz_clear_dir_files(skel_dir);
            rmdir(skel_dir);
        }
        qz_clear_dir_files(j.work);
        rmdir(j.work);
    }
    int done = -1;
    if (st == SPARQ_OK && o->resume) st = qz_load_hidden(&j, &done);
    if (st == SPARQ_OK && done >= j.n_layers) done = j.n_layers - 1;
    for (int L = 0; L <= done && st == SPARQ_OK; L++) st = qz_restore_layer_stats(&j, L);
    if (st == SPARQ_OK && done >= 0 && j.per_seq) {
        /* the caches of the finished layers: run them again from the embedding; the hidden states
         * must come out as the checkpoint has them */
        memcpy(j.tmp, j.hq, nh * sizeof(float));
        st = sq_model_embed(j.m, j.tokens, j.rows * j.T, j.hq);
        if (st == SPARQ_OK) memcpy(j.href, j.hq, nh * sizeof(float));
        for (int L = 0; L <= done && st == SPARQ_OK; L++) st = qz_replay_layer(&j, L);
        if (st == SPARQ_OK && memcmp(j.tmp, j.hq, nh * sizeof(float)) != 0)
            st = sparq_err(SPARQ_E_STATE, "%s: replaying layers 0..%d does not give the checkpoint's hidden states "
                           "(different options or build?); start again without --resume", j.work, done);
    }
    if (st == SPARQ_OK && done < 0) {
        st = sq_model_embed(j.m, j.tokens, j.rows * j.T, j.hq);
        if (st == SPARQ_OK) memcpy(j.href, j.hq, nh * sizeof(float));
    }
    double t_layers = sparq_now();
    for (int L = done + 1; L < j.n_layers && st == SPARQ_OK; L++) {
        st = qz_do_layer(&j, L, j.n_layers);
        rep->total_seconds = sparq_now() - t_layers;
        if (st == SPARQ_OK && L == o->stop_after_layer)
            st = sparq_err(SPARQ_E_INTERRUPTED, "stopped after layer %d as asked (--stop-after-layer)", L);
    }
    if (st == SPARQ_OK) {
        char *hp = qz_work_file(&j, -1);
        bool have = hp && o->resume && done == j.n_layers - 1 && sparq_path_exists(hp);
        if (!hp) {
            st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        } else if (have) {
            sf_model *sf = NULL;
            st = sf_open(&sf, hp);
            if (st == SPARQ_OK) {
                const char *v = sf_metadata(sf, "proxy.lm_head"), *kv = sf_metadata(sf, "K.lm_head");
                st = qz_report_add_tensor(rep, "lm_head", kv ? atoi(kv) : 0, j.d, (int)j.cfg->vocab_size,
                                       v ? atof(v) : 0.0);
                double *qv[] = {&rep->quality_kld, &rep->quality_top1, &rep->quality_ppl_source,
                                &rep->quality_ppl_output};
                static const char *const qk[] = {"quality.kld", "quality.top1", "quality.ppl_source",
                                                 "quality.ppl_output", "quality.tokens"};
                for (int i = 0; i < 5; i++) {
                    const char *m = sf_metadata(sf, qk[i]);
                    if (m && i < 4) *qv[i] = atof(m);
                    else if (m) rep->quality_tokens = atol(m);
                }
                sf_close(sf);
            }
        } else {
            st = qz_do_head(&j);
        }
        sparq_free(hp);
    }
    qz_memdbg("before assembly", -1);
    if (st == SPARQ_OK) st = qz_assemble_output(&j);
    qz_memdbg("after assembly", -1);
    rep->quant_seconds = j.t_quant;
    rep->gpu_seconds = j.t_gpu;
    for (int i = 0; i < j.n_gdev; i++) rep->gpu_seconds_dev[i] = j.t_gpu_dev[i];
    rep->total_seconds = sparq_now() - t_start;
    rep->peak_rss = qz_peak_rss_bytes();
    job_free(&j);
    sparq_free(skel_dir);
    return st;
}
