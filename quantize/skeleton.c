/* quantize/skeleton.c — sources the runtime cannot load as they are (FP8
 * with block scales, MXFP4): qz_build_skeleton writes work/skeleton, what
 * the runtime must read in another form than the source's: an all-zero 1-bit
 * EXL3 placeholder for each linear the driver quantizes (the layer loop binds
 * the dequantised fp32 weight over it while its layer runs) and a dequantised
 * embedding. The runtime reads it over the source (sf_open_overlay), and the
 * output writer takes the unquantized tensors from that same view. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "quantize/job.h"

/* The linears the driver quantizes (and binds itself when they are FP8/MXFP4):
 * those the architecture's layer descriptions mark, and the head. */
static bool is_quant_linear(const sq_model_config *cfg, const char *key)
{
    const sq_arch_info *a = sq_arch_of(cfg);
    return a && (sq_arch_is_quant_linear(cfg, key, NULL) || strcmp(key, a->head_key) == 0);
}

static bool is_embedding(const sq_model_config *cfg, const char *key)
{
    const sq_arch_info *a = sq_arch_of(cfg);
    return a && strcmp(key, a->embed_key) == 0;
}

/* Forms the runtime binds in place (docs/runtime.md "Linear layers"): E4M3 with UE8M0 block
 * scales, MXFP4 with `.scale` UE8M0 (not DeepSeek V3's float weight_scale_inv, not gpt-oss naming). */
static bool runs_in_place(const sf_weight *w)
{
    if (!w->scale || w->scale->dtype != SF_F8_E8M0) return false;
    if (w->kind == SF_WEIGHT_FP8) return w->w->dtype == SF_F8_E4M3;
    return w->kind == SF_WEIGHT_MXFP4 && w->w->dtype == SF_I8;
}

static bool ends_with(const char *s, const char *sfx, size_t *stem)
{
    size_t n = strlen(s), m = strlen(sfx);
    if (n <= m || strcmp(s + n - m, sfx) != 0) return false;
    if (stem) *stem = n - m;
    return true;
}

/* If the source stores any tensor in a form the runtime does not read (FP8,
 * MXFP4), write work/skeleton: config.json, the tokenizer files and only the
 * tensors that differ from the source. Each FP8/MXFP4 linear the driver
 * quantizes is a 1-bit EXL3 placeholder (k·n/8 bytes, left a hole: the file
 * costs ~no disk; the driver binds the dequantised fp32 weight over it while
 * its layer runs), and an FP8/MXFP4 embedding is stored dequantised as F32.
 * Everything else (norms, a router or V4.1's indexer kept FP8 with its scales,
 * the Engram tables: ~200 GB on the real V4.1) is not copied: the runtime
 * loads the skeleton over the source (sq_model_opts.base_dir, the rule of
 * sf_open_overlay) and the output writer streams those tensors from the
 * source. *dir_out is NULL when the source needs no skeleton. */
sparq_status qz_build_skeleton(qjob *j, char **dir_out)
{
    *dir_out = NULL;
    const sf_model *src = j->src;
    size_t n = sf_count(src);
    bool need = false;
    for (size_t i = 0; i < n && !need; i++) {
        const sf_tensor *x = sf_at(src, i);
        need = ends_with(x->name, "_blocks", NULL) ||
               (ends_with(x->name, ".weight", NULL) && x->dtype != SF_BF16 && x->dtype != SF_F16 &&
                x->dtype != SF_F32);
    }
    if (!need) return SPARQ_OK;
    sq_model_config cfg;
    FORWARD_IF(sq_config_load(&cfg, j->o->model_dir));
    char *dir = sparq_path_join(j->work, "skeleton");
    sparq_status st = dir ? sparq_mkdirs(dir) : sparq_err(SPARQ_E_NOMEM, "out of memory");
    /* every placeholder / dequantised tensor needs an sf_tensor of its own */
    sf_tensor *own = sparq_calloc(3 * n + 1, sizeof *own);
    out_entry *ent = sparq_calloc(3 * n + 1, sizeof *ent);
    void **heap = sparq_calloc(3 * n + 2, sizeof *heap);
    size_t ne = 0, no = 0, nheap = 0;
    if (st == SPARQ_OK && (!own || !ent || !heap)) st = sparq_err(SPARQ_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n && st == SPARQ_OK; i++) {
        const sf_tensor *x = sf_at(src, i);
        size_t stem;
        bool dense = x->dtype == SF_BF16 || x->dtype == SF_F16 || x->dtype == SF_F32;
        bool blocks = ends_with(x->name, "_blocks", &stem);
        bool weight = !blocks && ends_with(x->name, ".weight", &stem) && !dense;
        if (!blocks && !weight) continue; /* read from the source as it is */
        if (sq_arch_skipped(&cfg, x->name)) continue; /* not read by sparq (V4.1's mtp.*, vision.*) */
        char key[512];
        snprintf(key, sizeof key, "%.*s", (int)stem, x->name);
        sf_weight w;
        st = sf_weight_find_block(src, key, cfg.quant.weight_block_size[0], cfg.quant.weight_block_size[1], &w);
        if (st != SPARQ_OK && !is_quant_linear(&cfg, key) && !is_embedding(&cfg, key)) {
            /* not a linear of the config's scale blocks (V4.1's Engram tables: one scale per 32 values
             * of a row): kept as it is, read from the source */
            sparq_err_clear();
            st = SPARQ_OK;
            continue;
        }
        if (st != SPARQ_OK) break;
        if (!is_quant_linear(&cfg, key) && !is_embedding(&cfg, key) && runs_in_place(&w)) {
            /* an FP8/MXFP4 tensor kept as it is (a router, V4.1's indexer): the runtime runs it in place
             * from the source, and the output copies it byte-exact with its scales */
            continue;
        }
        if (is_quant_linear(&cfg, key)) {
            uint64_t k = w.in, nn = w.out;
            if (k % 128 || nn % 128) {
                st = sparq_err(SPARQ_E_SHAPE, "%s: linear '%s' is %llu -> %llu; quantizable sizes are multiples of 128",
                               sf_file_path(src, x->file), key, (unsigned long long)k, (unsigned long long)nn);
                break;
            }
            static const char *const part[3] = {".trellis", ".suh", ".svh"};
            for (int p3 = 0; p3 < 3; p3++) {
                sf_tensor *t = &own[no++];
                char nm[600];
                snprintf(nm, sizeof nm, "%s%s", key, part[p3]);
                t->name = sparq_strdup(nm);
                if (!t->name) {
                    st = sparq_err(SPARQ_E_NOMEM, "out of memory");
                    break;
                }
                heap[nheap++] = (void *)t->name;
                if (p3 == 0) {
                    t->dtype = SF_I16, t->ndim = 3;
                    t->shape[0] = k / 16, t->shape[1] = nn / 16, t->shape[2] = 16;
                    t->nbytes = k * nn / 8;
                } else {
                    t->dtype = SF_F16, t->ndim = 1;
                    t->shape[0] = p3 == 1 ? k : nn;
                    t->nbytes = 2 * t->shape[0];
                }
                t->numel = t->nbytes / 2;
                ent[ne].t = t;
                ent[ne].hole = true; /* all zero: never read (the driver binds the fp32 weight over it) */
                ent[ne++].owned = true;
            }
        } else {
            /* an FP8/MXFP4 embedding (the runtime reads dense rows), or a tensor of a form the runtime does not
             * run in place: store it as F32 */
            float *f = sparq_malloc((size_t)(w.out * w.in) * sizeof(float));
            sf_tensor *t = &own[no++];
            char nm[600];
            snprintf(nm, sizeof nm, "%s.weight", key);
            t->name = sparq_strdup(nm);
            if (!f || !t->name) {
                sparq_free(f);
                sparq_free((void *)t->name);
                st = sparq_err(SPARQ_E_NOMEM, "out of memory dequantising '%s'", key);
                break;
            }
            heap[nheap++] = f;
            heap[nheap++] = (void *)t->name;
            st = sf_weight_to_f32(&w, f);
            qz_release_weight(j, &w);
            t->dtype = SF_F32, t->ndim = 2, t->shape[0] = w.out, t->shape[1] = w.in;
            t->numel = w.out * w.in, t->nbytes = 4 * t->numel, t->data = f;
            ent[ne].t = t;
            ent[ne++].owned = true;
        }
    }
    if (st == SPARQ_OK) {
        qz_clear_dir_files(dir); /* a stale skeleton of an interrupted run */
        qsort(ent, ne, sizeof *ent, qz_cmp_entry);
        st = qz_write_shards(j, dir, ent, ne, qz_shard_cap(j));
    }
    /* the runtime reads config.json, and V4.1's Engram hash the tokenizer (its compressed token map) */
    static const char *const side[] = {"config.json", "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof side / sizeof *side && st == SPARQ_OK; i++)
        st = qz_copy_file(j->o->model_dir, dir, side[i]);
    for (size_t i = 0; heap && i < nheap; i++) sparq_free(heap[i]);
    sparq_free(heap);
    sparq_free(own);
    sparq_free(ent);
    sq_config_free(&cfg);
    if (st != SPARQ_OK) {
        sparq_free(dir);
        return st;
    }
    *dir_out = dir;
    return SPARQ_OK;
}
