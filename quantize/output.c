/* quantize/output.c — the output directory: the source's unquantized tensors
 * and the work dir's quantized ones as sharded safetensors (+ index),
 * config.json with quantization_config, quantization_config.json with every
 * module's stored tensors (exllamav3's layout), the tokenizer files; written
 * to OUT.partial and renamed to OUT, so OUT exists only when complete. The
 * shard writer and the small file helpers here serve skeleton.c and the
 * report as well. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/json.h"
#include "quantize/job.h"
#include "sparq_version.h"

int qz_cmp_entry(const void *a, const void *b)
{
    return strcmp(((const out_entry *)a)->t->name, ((const out_entry *)b)->t->name);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static const char *torch_dtype(sf_dtype dt)
{
    switch (dt) {
    case SF_BF16: return "torch.bfloat16";
    case SF_F16: return "torch.float16";
    case SF_F32: return "torch.float32";
    case SF_I16: return "torch.int16";
    case SF_I32: return "torch.int32";
    case SF_U8: return "torch.uint8";
    case SF_I8: return "torch.int8";
    default: return sf_dtype_name(dt);
    }
}

static json_t *quant_config_json(const qjob *j, const qz_opts *o)
{
    json_t *q = json_object();
    if (o->method == QZ_METHOD_RTN) {
        json_object_set_new(q, "quant_method", json_string("rtn"));
        json_object_set_new(q, "version", json_string("sparq " SPARQ_VERSION));
        json_object_set_new(q, "bits", json_real(o->bits));
        json_object_set_new(q, "head_bits", json_integer(o->head_bits));
        json_object_set_new(q, "group_size", json_integer(o->rtn_group));
        json_object_set_new(q, "storage", json_string("dequantised bf16 (HF layout)"));
        return q;
    }
    json_object_set_new(q, "quant_method", json_string("exl3"));
    json_object_set_new(q, "version", json_string("sparq " SPARQ_VERSION));
    json_object_set_new(q, "bits", json_real(o->bits));
    json_object_set_new(q, "head_bits", json_integer(o->head_bits));
    json_t *cal = json_object();
    bool calibrated = o->method == QZ_METHOD_TRELLIS;
    json_object_set_new(cal, "rows", json_integer(calibrated ? j->rows : 0));
    json_object_set_new(cal, "cols", json_integer(calibrated ? j->T : 0));
    json_object_set_new(q, "calibration", cal);
    json_object_set_new(q, "out_scales", json_string("always"));
    json_object_set_new(q, "codebook", json_string(trellis_cb_name(o->cb)));
    if (!calibrated) json_object_set_new(q, "method", json_string(qz_method_name(o->method)));
    return q;
}

sparq_status qz_write_json(const char *path, json_t *v)
{
    char *s = json_dumps(v, JSON_INDENT(4) | JSON_PRESERVE_ORDER);
    RETURN_IF(!s, SPARQ_E_NOMEM, "%s: out of memory formatting JSON", path);
    sparq_atomic_file f;
    sparq_status st = sparq_atomic_open(&f, path);
    if (st == SPARQ_OK) st = sparq_atomic_write(&f, s, strlen(s));
    if (st == SPARQ_OK) st = sparq_atomic_write(&f, "\n", 1);
    if (st == SPARQ_OK) st = sparq_atomic_commit(&f);
    else sparq_atomic_abort(&f); /* safe after a failed open too */
    free(s); /* jansson's own malloc (formats/json.c says why) */
    return st;
}

sparq_status qz_copy_file(const char *src_dir, const char *dst_dir, const char *name)
{
    char *src = sparq_path_join(src_dir, name), *dst = sparq_path_join(dst_dir, name);
    sparq_status st = SPARQ_OK;
    if (!src || !dst) st = sparq_err(SPARQ_E_NOMEM, "out of memory");
    else if (sparq_path_exists(src)) {
        char *data = NULL;
        size_t n = 0;
        st = sparq_file_read_all(src, 0, &data, &n);
        if (st == SPARQ_OK) st = sparq_file_write_atomic(dst, data, n);
        sparq_free(data);
    }
    sparq_free(src);
    sparq_free(dst);
    return st;
}

/* Remove the files (not subdirectories) of a directory this job owns. */
void qz_clear_dir_files(const char *dir)
{
    DIR *dd = opendir(dir);
    struct dirent *de;
    while (dd && (de = readdir(dd))) {
        if (de->d_name[0] == '.') continue;
        char *p = sparq_path_join(dir, de->d_name);
        if (p) unlink(p);
        sparq_free(p);
    }
    if (dd) closedir(dd);
}

/* With --max-mem, a shard is at most a quarter of the bound: writing a shard
 * maps (touches) all its source tensors, which are released after it. */
uint64_t qz_shard_cap(const qjob *j)
{
    uint64_t cap = j->o->shard_bytes ? j->o->shard_bytes : (4ull << 30);
    if (j->o->max_mem) {
        uint64_t q = j->o->max_mem / 4 > (1u << 20) ? j->o->max_mem / 4 : (1u << 20);
        if (cap > q) cap = q;
    }
    return cap;
}

/* The writer's hook (sf_writer_on_written): a piece of a mapped tensor is
 * written, its pages go. */
static void release_written(void *user, const void *p, uint64_t n) { qz_release_mapped(user, p, n); }

#define QZ_WRITE_PIECE (64ull << 20) /* a mapped tensor is copied 64 MiB at a time */

/* Write ent[0..ne) (sorted by name) to dir as model.safetensors, or as
 * model-0000i-of-0000n.safetensors + model.safetensors.index.json when they
 * exceed `cap` bytes. A tensor mapped from a file (the source's Engram
 * tables, ~100 GB each on the real V4.1) is streamed: its pages are released
 * as each 64 MiB piece is written, so no tensor is ever resident whole; the
 * shard's tensors are released again once it is written (fault-around). */
sparq_status qz_write_shards(const qjob *j, const char *dir, out_entry *ent, size_t ne, uint64_t cap)
{
    size_t n_shards = 1;
    uint64_t acc = 0, total = 0;
    for (size_t i = 0; i < ne; i++) {
        if (acc > 0 && acc + ent[i].t->nbytes > cap) n_shards++, acc = 0;
        ent[i].shard = n_shards - 1;
        acc += ent[i].t->nbytes;
        total += ent[i].t->nbytes;
    }
    sparq_status st = SPARQ_OK;
    json_t *wmap = json_object();
    for (size_t s = 0; s < n_shards && st == SPARQ_OK; s++) {
        char fname[64];
        if (n_shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", s + 1, n_shards);
        char *p = sparq_path_join(dir, fname);
        sf_writer *w = NULL;
        st = p ? sf_writer_create(&w, p) : sparq_err(SPARQ_E_NOMEM, "out of memory");
        if (st == SPARQ_OK) st = sf_writer_set_metadata(w, "format", "pt");
        if (st == SPARQ_OK) sf_writer_on_written(w, QZ_WRITE_PIECE, release_written, (void *)j);
        for (size_t i = 0; i < ne && st == SPARQ_OK; i++) {
            if (ent[i].shard != s) continue;
            const sf_tensor *x = ent[i].t;
            if (ent[i].hole) st = sf_writer_add_hole(w, x->name, x->dtype, x->ndim, x->shape);
            else if (ent[i].owned) /* heap memory: written whole, never madvised */
                st = sf_writer_add_ref(w, x->name, x->dtype, x->ndim, x->shape, x->data, x->nbytes);
            else st = sf_writer_add_streamed(w, x->name, x->dtype, x->ndim, x->shape, x->data, x->nbytes);
            json_object_set_new(wmap, x->name, json_string(fname));
        }
        if (st == SPARQ_OK) st = sf_writer_finish(w);
        else if (w) sf_writer_free(w);
        sparq_free(p);
        for (size_t i = 0; i < ne; i++)
            if (ent[i].shard == s && !ent[i].owned) qz_release_mapped(j, ent[i].t->data, ent[i].t->nbytes);
    }
    if (st == SPARQ_OK && n_shards > 1) {
        json_t *idx = json_object(), *md = json_object();
        json_object_set_new(md, "total_size", json_integer((json_int_t)total));
        json_object_set_new(idx, "metadata", md);
        json_object_set(idx, "weight_map", wmap);
        char *p = sparq_path_join(dir, "model.safetensors.index.json");
        st = p ? qz_write_json(p, idx) : sparq_err(SPARQ_E_NOMEM, "out of memory");
        sparq_free(p);
        json_decref(idx);
    }
    json_decref(wmap);
    return st;
}

sparq_status qz_assemble_output(qjob *j)
{
    const qz_opts *o = j->o;
    sparq_status st = SPARQ_OK;
    int n_work = j->n_layers + 1;
    sf_model **wf = sparq_calloc((size_t)n_work, sizeof *wf);
    RETURN_IF(!wf, SPARQ_E_NOMEM, "out of memory");
    for (int i = 0; i < n_work && st == SPARQ_OK; i++) {
        char *p = qz_work_file(j, i < j->n_layers ? i : -1);
        st = p ? sf_open(&wf[i], p) : sparq_err(SPARQ_E_NOMEM, "out of memory");
        sparq_free(p);
    }
    /* Keys replaced by quantized tensors (`<key>.trellis` of EXL3, `<key>.weight` of RTN):
     * every stored part of such a key in the source (weight, FP8/MXFP4 scales, skeleton
     * placeholders) is left out. Unquantized tensors come from the skeleton over the source
     * when there is a skeleton (its dequantised embedding; everything else is the source's,
     * streamed from it: nothing kept as it is was copied into the work dir). */
    const sf_model *base = j->skel ? j->skel : j->src;
    size_t n_entries = sf_count(base), n_q = 0;
    for (int i = 0; i < n_work && st == SPARQ_OK; i++) n_entries += sf_count(wf[i]);
    out_entry *ent = sparq_calloc(n_entries ? n_entries : 1, sizeof *ent);
    char **qkeys = sparq_calloc(n_entries ? n_entries : 1, sizeof *qkeys);
    if (st == SPARQ_OK && (!ent || !qkeys)) st = sparq_err(SPARQ_E_NOMEM, "out of memory");
    size_t ne = 0;
    for (int i = 0; i < n_work && st == SPARQ_OK; i++)
        for (size_t t = 0; t < sf_count(wf[i]); t++) {
            const sf_tensor *x = sf_at(wf[i], t);
            ent[ne++].t = x;
            size_t nl = strlen(x->name), sl = 0;
            if (nl > 8 && strcmp(x->name + nl - 8, ".trellis") == 0) sl = 8;
            else if (nl > 7 && strcmp(x->name + nl - 7, ".weight") == 0) sl = 7;
            if (sl) {
                char *k = sparq_malloc(nl + 1);
                if (!k) {
                    st = sparq_err(SPARQ_E_NOMEM, "out of memory");
                    break;
                }
                snprintf(k, nl + 1, "%.*s", (int)(nl - sl), x->name);
                qkeys[n_q++] = k;
            }
        }
    if (st == SPARQ_OK) {
        qsort(qkeys, n_q, sizeof *qkeys, cmp_str);
        for (size_t t = 0; t < sf_count(base); t++) {
            const sf_tensor *x = sf_at(base, t);
            const char *nm = x->name;
            char key[512];
            const char *dot = strrchr(nm, '.');
            size_t nl = strlen(nm);
            const char *kp = key;
            snprintf(key, sizeof key, "%.*s", dot ? (int)(dot - nm) : (int)nl, nm);
            if (bsearch(&kp, qkeys, n_q, sizeof *qkeys, cmp_str)) continue;
            if (nl > 7 && (strcmp(nm + nl - 7, "_blocks") == 0 || strcmp(nm + nl - 7, "_scales") == 0)) {
                snprintf(key, sizeof key, "%.*s", (int)(nl - 7), nm);
                if (bsearch(&kp, qkeys, n_q, sizeof *qkeys, cmp_str)) continue;
            }
            if (sq_arch_skipped(j->cfg, nm)) continue; /* not read by sparq: dropped (cmd_quantize.c's --help) */
            bool dup = false;
            for (int i = 0; i < n_work && !dup; i++) dup = sf_find(wf[i], nm) != NULL;
            if (dup) continue;
            ent[ne++].t = x;
        }
        qsort(ent, ne, sizeof *ent, qz_cmp_entry);
    }
    char *partial = NULL;
    if (st == SPARQ_OK) {
        size_t pl = strlen(o->out_dir) + 16;
        partial = sparq_malloc(pl);
        if (!partial) st = sparq_err(SPARQ_E_NOMEM, "out of memory");
        else snprintf(partial, pl, "%s.partial", o->out_dir);
    }
    if (st == SPARQ_OK) st = sparq_mkdirs(partial);
    if (st == SPARQ_OK) {
        qz_clear_dir_files(partial); /* leftovers of an interrupted assembly */
    }
    if (st == SPARQ_OK) st = qz_write_shards(j, partial, ent, ne, qz_shard_cap(j));
    /* config.json + quantization_config.json */
    if (st == SPARQ_OK) {
        char *sp = sparq_path_join(o->model_dir, "config.json");
        json_t *cfg = NULL; /* jansson keeps the keys' order */
        st = sp ? sq_json_load_file(&cfg, sp, 1 << 24) : sparq_err(SPARQ_E_NOMEM, "out of memory");
        if (st == SPARQ_OK) {
            /* RTN writes plain bf16: a source's own quantization_config (FP8) no longer describes it */
            if (o->method != QZ_METHOD_RTN) json_object_set_new(cfg, "quantization_config", quant_config_json(j, o));
            else json_object_del(cfg, "quantization_config");
            char *p = sparq_path_join(partial, "config.json");
            st = p ? qz_write_json(p, cfg) : sparq_err(SPARQ_E_NOMEM, "out of memory");
            sparq_free(p);
        }
        json_decref(cfg);
        sparq_free(sp);
    }
    if (st == SPARQ_OK) {
        json_t *qc = quant_config_json(j, o), *storage = json_object();
        for (size_t i = 0; i < ne; i++) {
            const sf_tensor *x = ent[i].t;
            const char *dot = strrchr(x->name, '.');
            char module[512];
            snprintf(module, sizeof module, "%.*s", dot ? (int)(dot - x->name) : (int)strlen(x->name), x->name);
            json_t *mod = json_object_get(storage, module);
            if (!mod) {
                mod = json_object();
                json_object_set_new(mod, "stored_tensors", json_object());
                json_object_set_new(storage, module, mod);
            }
            json_t *td = json_object(), *shape = json_array();
            for (int d = 0; d < x->ndim; d++) json_array_append_new(shape, json_integer((json_int_t)x->shape[d]));
            json_object_set_new(td, "shape", shape);
            json_object_set_new(td, "n_bytes", json_integer((json_int_t)x->nbytes));
            json_object_set_new(td, "dtype", json_string(torch_dtype(x->dtype)));
            json_object_set_new(json_object_get(mod, "stored_tensors"), x->name, td);
            if (dot && strcmp(dot, ".trellis") == 0) {
                json_object_set_new(mod, "quant_format", json_string("exl3"));
                json_object_set_new(mod, "bits_per_weight", json_integer((json_int_t)(x->shape[2] / 16)));
                if (o->cb == TRELLIS_CB_MUL1) json_object_set_new(mod, "mul1_multiplier", json_integer(MUL1_MULT));
                if (o->cb == TRELLIS_CB_MCG) json_object_set_new(mod, "mcg_multiplier", json_integer(MCG_MULT));
            }
        }
        json_object_set_new(qc, "tensor_storage", storage);
        char *p = sparq_path_join(partial, "quantization_config.json");
        st = p ? qz_write_json(p, qc) : sparq_err(SPARQ_E_NOMEM, "out of memory");
        sparq_free(p);
        json_decref(qc);
    }
    static const char *const extra[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                        "chat_template.jinja", "special_tokens_map.json", "vocab.json",
                                        "merges.txt", "tokenizer.model"};
    for (size_t i = 0; i < sizeof extra / sizeof *extra && st == SPARQ_OK; i++)
        st = qz_copy_file(o->model_dir, partial, extra[i]);
    if (st == SPARQ_OK && sparq_io_rename(partial, o->out_dir) != 0)
        st = sparq_err(SPARQ_E_IO, "%s: cannot rename to %s", partial, o->out_dir);
    sparq_free(partial);
    for (size_t i = 0; i < n_q; i++) sparq_free(qkeys[i]);
    sparq_free(qkeys);
    sparq_free(ent);
    for (int i = 0; i < n_work; i++) sf_close(wf[i]);
    sparq_free(wf);
    return st;
}
