/* tools/bench/pack_bench.c — verify throughput against a plain sequential
 * read of the same files, in the same run (issue 8: target >= 0.8x).
 *
 *   pack_bench [--mb N] [--threads T] [--boxes B] [--dir D] [--keep 1]
 *
 * Writes a synthetic Qwen3-MoE-shaped model of about N MB (random bf16) under
 * D (default $TMPDIR), packs it for B boxes (timed), then, for the page cache
 * warm and cold (posix_fadvise DONTNEED on every bundle file before the run):
 * sequential read of every file (one thread, 4 MiB reads, no hashing), then
 * `sparq verify` with T threads and with 1 thread; five rounds each. Prints
 * GB/s, the ratio verify / read of every round and the median ratios. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/progress.h"
#include "common/threadpool.h"
#include "pack/pack.h"

static void drop_cache(const char *bundle)
{
    sq_manifest m;
    if (sq_manifest_load(&m, bundle) != SPARQ_OK) return;
    for (size_t i = 0; i < m.n_files; i++) {
        char *p = sparq_path_join(bundle, m.files[i].path);
        int fd = p ? open(p, O_RDONLY) : -1;
        if (fd >= 0) {
            fdatasync(fd);
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
        sparq_free(p);
    }
    sq_manifest_free(&m);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int die(const char *what)
{
    fprintf(stderr, "pack_bench: %s: %s\n", what, sparq_errmsg());
    return 1;
}

int main(int argc, char **argv)
{
    long mb = 512, threads = 0, boxes = 2;
    const char *argv_threads = "all";
    int keep = 0;
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mb")) mb = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atol(argv_threads = argv[i + 1]);
        else if (!strcmp(argv[i], "--boxes")) boxes = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--keep")) keep = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: pack_bench [--mb N] [--threads T] [--boxes B] [--dir D] [--keep 1]\n");
            return 2;
        }
    }
    char root[512], model[600], bundle[600], path[700];
    snprintf(root, sizeof root, "%s/pack_bench.%d", dir, (int)getpid());
    snprintf(model, sizeof model, "%s/model", root);
    snprintf(bundle, sizeof bundle, "%s/bundle", root);
    if (sparq_mkdirs(model) != SPARQ_OK) return die("mkdir");

    /* model: 8 layers, hidden 1024, 32 experts of 3 x (512 x 1024) bf16 = 3 MiB each */
    const int L = 8, E = (int)(mb * 1024 * 1024 / (L * 3LL * 512 * 1024 * 2));
    snprintf(path, sizeof path, "%s/config.json", model);
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 512, \"hidden_size\": 1024, \"num_hidden_layers\": %d,"
             " \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 128,"
             " \"moe_intermediate_size\": 512, \"num_experts\": %d, \"num_experts_per_tok\": 4}\n",
             L, E < 1 ? 1 : E);
    if (sparq_file_write_atomic(path, cfg, strlen(cfg)) != SPARQ_OK) return die("config");
    /* pack loads the tokenizer: the smallest byte-level BPE it reads */
    static const char tok[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []},"
                              " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
                              " \"decoder\": {\"type\": \"ByteLevel\"}}\n";
    snprintf(path, sizeof path, "%s/tokenizer.json", model);
    if (sparq_file_write_atomic(path, tok, strlen(tok)) != SPARQ_OK) return die("tokenizer");
    snprintf(path, sizeof path, "%s/model.safetensors", model);
    sf_writer *w;
    if (sf_writer_create(&w, path) != SPARQ_OK) return die("writer");
    const uint64_t ex_n = 512 * 1024, buf_n = 1024 * 1024; /* an expert; the largest tensor (q_proj) */
    uint16_t *buf = sparq_malloc(buf_n * 2);
    uint64_t x = 88172645463325252ull;
    for (uint64_t i = 0; i < buf_n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (uint16_t)x;
    }
    uint64_t emb[2] = {512, 1024}, ex[2] = {512, 1024}, exd[2] = {1024, 512};
    char name[128];
    sf_writer_add_ref(w, "model.embed_tokens.weight", SF_BF16, 2, emb, buf, ex_n * 2);
    sf_writer_add_ref(w, "lm_head.weight", SF_BF16, 2, emb, buf, ex_n * 2);
    /* what the architecture reads besides the experts (the config check wants it all): norms of
     * 1024 and of head_dim 128, attention 1024 -> 1024 / 256, the router */
    const uint64_t hid[1] = {1024}, hd[1] = {128}, q[2] = {1024, 1024}, kv[2] = {256, 1024};
    const uint64_t rt[2] = {(uint64_t)(E < 1 ? 1 : E), 1024};
    sf_writer_add_ref(w, "model.norm.weight", SF_BF16, 1, hid, buf, 1024 * 2);
    static const char *const lin[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"};
    static const char *const norm[] = {"input_layernorm", "post_attention_layernorm", "self_attn.q_norm",
                                       "self_attn.k_norm"};
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < 4; i++) {
            const uint64_t *sh = i == 1 || i == 2 ? kv : q;
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, lin[i]);
            sf_writer_add_ref(w, name, SF_BF16, 2, sh, buf, sh[0] * sh[1] * 2);
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, norm[i]);
            sf_writer_add_ref(w, name, SF_BF16, 1, i < 2 ? hid : hd, buf, (i < 2 ? 1024 : 128) * 2);
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
        sf_writer_add_ref(w, name, SF_BF16, 2, rt, buf, rt[0] * rt[1] * 2);
    }
    for (int l = 0; l < L; l++)
        for (int e = 0; e < (E < 1 ? 1 : E); e++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
            sf_writer_add_ref(w, name, SF_BF16, 2, ex, buf, ex_n * 2);
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
            sf_writer_add_ref(w, name, SF_BF16, 2, ex, buf, ex_n * 2);
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            sf_writer_add_ref(w, name, SF_BF16, 2, exd, buf, ex_n * 2);
        }
    if (sf_writer_finish(w) != SPARQ_OK) return die("model write");

    sq_pack_options o;
    sq_pack_options_default(&o);
    o.boxes = (int)boxes;
    o.params.ctx = 4096;
    o.params.users = 1;
    double t0 = sparq_now();
    if (sq_pack_bundle(model, bundle, &o) != SPARQ_OK) return die("pack");
    double tp = sparq_now() - t0;
    uint64_t bytes;
    double secs;
    sq_verify_read_baseline(bundle, -1, &bytes, &secs);
    printf("bundle: %.3f GB in %ld node shards; pack (write + read back + hash) %.2f s = %.2f GB/s\n",
           (double)bytes / 1e9, boxes, tp, (double)bytes / tp / 1e9);
    /* context: what one thread hashes from memory, and the load of the machine */
    {
        uint8_t *big = sparq_malloc(64 << 20);
        memset(big, 7, 64 << 20);
        sq_digest d;
        double th = sparq_now();
        for (int i = 0; i < 8; i++) sq_digest_of(big, 64 << 20, &d);
        th = sparq_now() - th;
        double la[3] = {0, 0, 0};
        getloadavg(la, 3);
        printf("XXH3-128 from memory, one thread: %.2f GB/s; %d CPUs, load average %.2f\n", 8.0 * (64 << 20) / th / 1e9,
               sparq_cpu_count(), la[0]);
        sparq_free(big);
    }
    double ratios[2][2][16];
    const int reps = 5;
    for (int cold = 0; cold < 2; cold++) {
        for (int rep = 0; rep < reps; rep++) {
            if (cold) drop_cache(bundle);
            if (sq_verify_read_baseline(bundle, -1, &bytes, &secs) != SPARQ_OK) return die("read");
            double gr = (double)bytes / secs / 1e9;
            if (cold) drop_cache(bundle);
            sq_verify_options vo = {-1, false, (int)threads};
            sq_verify_report r;
            if (sq_verify_bundle(bundle, &vo, &r) != SPARQ_OK) return die("verify");
            double gv = (double)r.bytes / r.seconds / 1e9;
            sq_verify_report_free(&r);
            if (cold) drop_cache(bundle);
            vo.threads = 1;
            if (sq_verify_bundle(bundle, &vo, &r) != SPARQ_OK) return die("verify");
            double g1 = (double)r.bytes / r.seconds / 1e9;
            sq_verify_report_free(&r);
            ratios[cold][0][rep] = gv / gr;
            ratios[cold][1][rep] = g1 / gr;
            printf("%s cache, run %d: sequential read %.2f GB/s | verify %s threads %.2f GB/s (ratio %.2f), "
                   "1 thread %.2f GB/s (ratio %.2f)\n",
                   cold ? "cold" : "warm", rep + 1, gr, threads > 0 ? argv_threads : "all", gv, gv / gr, g1, g1 / gr);
        }
    }
    for (int cold = 0; cold < 2; cold++) {
        for (int k = 0; k < 2; k++) qsort(ratios[cold][k], (size_t)reps, sizeof(double), cmp_double);
        printf("median ratio verify/read, %s cache: all threads %.2f, 1 thread %.2f\n", cold ? "cold" : "warm",
               ratios[cold][0][reps / 2], ratios[cold][1][reps / 2]);
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (keep) printf("kept %s\n", root);
    else if (system(cmd) != 0) fprintf(stderr, "pack_bench: could not remove %s\n", root);
    sparq_free(buf);
    return 0;
}
