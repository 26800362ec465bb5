/* quantize/checkpoint.c — the work dir, which is the checkpoint `--resume`
 * restarts from: the options that must match (job.txt), each finished
 * layer's quantized tensors with its metrics as metadata, and the hidden
 * states after the last finished layer. Layer files are complete before
 * hidden.bin names their layer, so an interrupted run loses at most the layer
 * it was in. Work dir files (all written atomically):
 *   job.txt                  the options that must match on --resume
 *   layer-NNNN.safetensors   layer N's stored tensors + metadata (metrics)
 *   head.safetensors         lm_head
 *   hidden.bin               hidden states (quantized path, reference path)
 *                            after the last finished layer: the checkpoint
 *   skeleton/                FP8/MXFP4 sources only: what the runtime model is
 *                            loaded from (skeleton.c; rebuilt on every start) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "quantize/job.h"

/* Add q's stored tensors to writer w (data referenced: q must outlive the finish). */
sparq_status qz_add_qlin_tensors(sf_writer *w, const qlin *q, trellis_codebook cb)
{
    char name[512];
    static const int32_t mul1 = (int32_t)MUL1_MULT, mcg = (int32_t)MCG_MULT;
    if (q->bf16) {
        snprintf(name, sizeof name, "%s.weight", q->key);
        uint64_t shape[2] = {(uint64_t)q->n, (uint64_t)q->k};
        return sf_writer_add_ref(w, name, SF_BF16, 2, shape, q->bf16, (uint64_t)q->k * q->n * 2);
    }
    uint64_t ts[3] = {(uint64_t)q->k / 16, (uint64_t)q->n / 16, (uint64_t)16 * q->K};
    snprintf(name, sizeof name, "%s.trellis", q->key);
    FORWARD_IF(sf_writer_add_ref(w, name, SF_I16, 3, ts, q->trellis, ts[0] * ts[1] * ts[2] * 2));
    uint64_t ks = (uint64_t)q->k, ns = (uint64_t)q->n;
    snprintf(name, sizeof name, "%s.suh", q->key);
    FORWARD_IF(sf_writer_add_ref(w, name, SF_F16, 1, &ks, q->suh, ks * 2));
    snprintf(name, sizeof name, "%s.svh", q->key);
    FORWARD_IF(sf_writer_add_ref(w, name, SF_F16, 1, &ns, q->svh, ns * 2));
    if (cb == TRELLIS_CB_MUL1) {
        snprintf(name, sizeof name, "%s.mul1", q->key);
        FORWARD_IF(sf_writer_add_ref(w, name, SF_I32, 0, NULL, &mul1, 4));
    } else if (cb == TRELLIS_CB_MCG) {
        snprintf(name, sizeof name, "%s.mcg", q->key);
        FORWARD_IF(sf_writer_add_ref(w, name, SF_I32, 0, NULL, &mcg, 4));
    }
    return SPARQ_OK;
}

sparq_status qz_meta_num(sf_writer *w, const char *prefix, const char *key, double v)
{
    char k[512], val[64];
    snprintf(k, sizeof k, "%s%s", prefix, key);
    snprintf(val, sizeof val, "%.17g", v);
    return sf_writer_set_metadata(w, k, val);
}

/* --- hidden-state checkpoint ------------------------------------------------------ */

#define HID_MAGIC "SQHIDv1\n"

sparq_status qz_save_hidden(qjob *j, int layer)
{
    size_t n = (size_t)j->rows * j->T * j->w;
    char *path = sparq_path_join(j->work, "hidden.bin");
    RETURN_IF(!path, SPARQ_E_NOMEM, "out of memory");
    sparq_atomic_file f = {0};
    sparq_status st = sparq_atomic_open(&f, path);
    int32_t hdr[4] = {layer, j->rows, j->T, j->w};
    if (st == SPARQ_OK) st = sparq_atomic_write(&f, HID_MAGIC, 8);
    if (st == SPARQ_OK) st = sparq_atomic_write(&f, hdr, sizeof hdr);
    if (st == SPARQ_OK) st = sparq_atomic_write(&f, j->hq, n * sizeof(float));
    if (st == SPARQ_OK) st = sparq_atomic_write(&f, j->href, n * sizeof(float));
    if (st == SPARQ_OK) st = sparq_atomic_commit(&f);
    else sparq_atomic_abort(&f);
    sparq_free(path);
    return st;
}

/* Returns the last finished layer in *layer (-1: nothing usable). Read
 * straight into hq/href (no second copy: the hidden states are the largest
 * buffers of a run with many calibration rows). */
sparq_status qz_load_hidden(qjob *j, int *layer)
{
    *layer = -1;
    size_t n = (size_t)j->rows * j->T * j->w;
    char *path = sparq_path_join(j->work, "hidden.bin");
    RETURN_IF(!path, SPARQ_E_NOMEM, "out of memory");
    sparq_status st = SPARQ_OK;
    int fd = -1;
    uint64_t size = 0;
    if (sparq_path_exists(path)) st = sparq_open_regular(path, &fd, &size);
    if (fd >= 0) {
        char magic[8];
        int32_t hdr[4];
        const uint64_t at = 8 + sizeof hdr, fl = (uint64_t)n * sizeof(float);
        if (size != at + 2 * fl)
            st = sparq_err(SPARQ_E_FORMAT, "%s: not a checkpoint of this job (size differs)", path);
        if (st == SPARQ_OK) st = sparq_pread_full(fd, magic, 8, 0, path);
        if (st == SPARQ_OK) st = sparq_pread_full(fd, hdr, sizeof hdr, 8, path);
        if (st == SPARQ_OK && memcmp(magic, HID_MAGIC, 8) != 0)
            st = sparq_err(SPARQ_E_FORMAT, "%s: not a checkpoint of this job (magic differs)", path);
        if (st == SPARQ_OK && (hdr[1] != j->rows || hdr[2] != j->T || hdr[3] != j->w))
            st = sparq_err(SPARQ_E_FORMAT, "%s: checkpoint shape differs from this job", path);
        if (st == SPARQ_OK) st = sparq_pread_full(fd, j->hq, fl, at, path);
        if (st == SPARQ_OK) st = sparq_pread_full(fd, j->href, fl, at + fl, path);
        if (st == SPARQ_OK) *layer = hdr[0];
        close(fd);
    }
    sparq_free(path);
    return st;
}

char *qz_work_file(const qjob *j, int layer)
{
    char name[64];
    if (layer < 0) snprintf(name, sizeof name, "head.safetensors");
    else snprintf(name, sizeof name, "layer-%04d.safetensors", layer);
    return sparq_path_join(j->work, name);
}

/* Read a finished layer's stats back from its work file (on --resume). */
sparq_status qz_restore_layer_stats(qjob *j, int layer)
{
    char *path = qz_work_file(j, layer);
    RETURN_IF(!path, SPARQ_E_NOMEM, "out of memory");
    sf_model *sf = NULL;
    sparq_status st = sf_open(&sf, path);
    sparq_free(path);
    FORWARD_IF(st);
    qz_layer_stat *ls = &j->rep->layers[layer];
    const char *v;
    ls->layer = layer;
    ls->resumed = true;
    if ((v = sf_metadata(sf, "layer.rel_err"))) ls->rel_err = atof(v);
    if ((v = sf_metadata(sf, "layer.cosine"))) ls->cosine = atof(v);
    if ((v = sf_metadata(sf, "layer.sqnr_db"))) ls->sqnr_db = atof(v);
    if ((v = sf_metadata(sf, "layer.mean_proxy"))) ls->mean_proxy = atof(v);
    if ((v = sf_metadata(sf, "layer.max_proxy"))) ls->max_proxy = atof(v);
    for (size_t i = 0; i < sf_count(sf) && st == SPARQ_OK; i++) {
        const sf_tensor *t = sf_at(sf, i);
        size_t nl = strlen(t->name);
        bool tr = nl > 8 && strcmp(t->name + nl - 8, ".trellis") == 0;
        bool wt = nl > 7 && strcmp(t->name + nl - 7, ".weight") == 0;
        if (!tr && !wt) continue;
        char key[512], mk[600];
        snprintf(key, sizeof key, "%.*s", (int)(nl - (tr ? 8 : 7)), t->name);
        snprintf(mk, sizeof mk, "proxy.%s", key);
        double p = (v = sf_metadata(sf, mk)) ? atof(v) : 0.0;
        snprintf(mk, sizeof mk, "K.%s", key);
        int K = (v = sf_metadata(sf, mk)) ? atoi(v) : 0;
        int k = tr ? (int)t->shape[0] * 16 : (int)t->shape[1];
        int n = tr ? (int)t->shape[1] * 16 : (int)t->shape[0];
        st = qz_report_add_tensor(j->rep, key, K, k, n, p);
    }
    sf_close(sf);
    j->rep->resumed_layers++;
    return st;
}

/* --- job signature ----------------------------------------------------------------- */

sparq_status qz_check_job(qjob *j, bool resume)
{
    const qz_opts *o = j->o;
    char sig[32768]; /* a recipe of a few hundred rules fits */
    int n = snprintf(sig, sizeof sig,
                     "model=%s\nmethod=%s\nbits=%.6f\nhead_bits=%d\ncodebook=%s\nrows=%d\nlen=%d\nrandom=%.6f\n"
                     "seed=%llu\nrtn_group=%d\nscale_search=%d\n",
                     o->model_dir, qz_method_name(o->method), o->bits, o->head_bits, trellis_cb_name(o->cb),
                     o->calib_rows, o->calib_len, o->random_rows_frac, (unsigned long long)o->seed, o->rtn_group,
                     (int)o->scale_search);
    for (int i = 0; i < o->n_calib && n < (int)sizeof sig; i++)
        n += snprintf(sig + n, sizeof sig - (size_t)n, "calib=%s\n", o->calib[i]);
    for (int i = 0; i < j->recipe.n && n < (int)sizeof sig; i++)
        n += snprintf(sig + n, sizeof sig - (size_t)n, "recipe=%s=%d\n", j->recipe.rules[i].pattern,
                      j->recipe.rules[i].K);
    for (int i = 0; i < o->n_rules && n < (int)sizeof sig; i++)
        n += snprintf(sig + n, sizeof sig - (size_t)n, "rule=%s=%d\n", o->rules[i].pattern, o->rules[i].K);
    char *path = sparq_path_join(j->work, "job.txt");
    RETURN_IF(!path, SPARQ_E_NOMEM, "out of memory");
    sparq_status st = SPARQ_OK;
    if (resume && sparq_path_exists(path)) {
        char *old = NULL;
        size_t len = 0;
        st = sparq_file_read_all(path, 1 << 20, &old, &len);
        if (st == SPARQ_OK && (len != strlen(sig) || memcmp(old, sig, len) != 0))
            st = sparq_err(SPARQ_E_ARG, "%s: --resume with different options than the interrupted run", path);
        sparq_free(old);
    } else {
        st = sparq_file_write_atomic(path, sig, strlen(sig));
    }
    sparq_free(path);
    return st;
}
