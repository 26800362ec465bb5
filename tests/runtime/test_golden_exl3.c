/* tests/runtime/test_golden_exl3.c — interop: sparq runs an EXL3 model made
 * by exllamav3 (tests/data/exl3-model/exl3-3.0bpw) and reproduces exllamav3's
 * own outputs on the same 512 token ids:
 *  - full logits of the first 128 positions (exl3_logits128.npy) to
 *    fp16-level differences (exllamav3 computes in fp16, sparq in fp32):
 *    relative error ≤ 5e-3, KL(exl3 ‖ sparq) ≪ 0.01, top-1 equal;
 *  - exllamav3's top-20 log-probs at all 512 positions;
 *  - top-1 agreement with the original bf16 model through transformers
 *    (ref_top20_id.npy) as exllamav3's (README: 0.809).
 * The data is exllamav3's and transformers', nobody here wrote it. */
#include <math.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "npy.h"
#include "runtime/eval.h"
#include "runtime/model.h"
#include "t.h"

static sq_model *m;
static float *lg; /* [512, V] */
static int V;

static void test_logits128(void)
{
    npy_array ref;
    if (npy_load(t_data_path("exl3-model/exl3_logits128.npy"), &ref) != 0) {
        CHECK(0);
        return;
    }
    CHECK(ref.ndim == 2 && ref.shape[0] == 128 && ref.shape[1] == (uint64_t)V);
    const float *r = ref.data;
    double maxabs = 0, maxref = 0, kl = 0;
    int agree = 0;
    float *lp = malloc((size_t)V * 4), *lq = malloc((size_t)V * 4);
    for (int p = 0; p < 128; p++) {
        for (int v = 0; v < V; v++) {
            maxabs = fmax(maxabs, fabs((double)lg[(size_t)p * V + v] - r[(size_t)p * V + v]));
            maxref = fmax(maxref, fabs(r[(size_t)p * V + v]));
        }
        int a = sq_eval_log_softmax(r + (size_t)p * V, V, lp);
        int b = sq_eval_log_softmax(lg + (size_t)p * V, V, lq);
        agree += a == b;
        kl += sq_eval_kl(lp, lq, V);
    }
    kl /= 128;
    fprintf(stderr, "exl3 logits[128]: max abs err %.4g, max |ref| %.4g, rel %.4g, top-1 %d/128, KL(exl3||sparq) %.3g\n",
            maxabs, maxref, maxabs / maxref, agree, kl);
    CHECK_MSG(maxabs / maxref <= 5e-3, "relative error %.4g", maxabs / maxref);
    CHECK_MSG(agree >= 127, "top-1 agreement %d/128", agree);
    CHECK_MSG(kl < 1e-3, "KL %.4g", kl);
    free(lp), free(lq);
    npy_free(&ref);
}

static void test_top20_512(void)
{
    npy_array id, lpv, rid;
    if (npy_load(t_data_path("exl3-model/exl3_top20_id.npy"), &id) ||
        npy_load(t_data_path("exl3-model/exl3_top20_lp.npy"), &lpv) ||
        npy_load(t_data_path("exl3-model/ref_top20_id.npy"), &rid)) {
        CHECK(0);
        return;
    }
    const int32_t *ids = id.data, *rids = rid.data;
    const float *lps = lpv.data;
    float *lp = malloc((size_t)V * 4);
    double maxd = 0, sumd = 0;
    int agree = 0, agree_ref = 0, off = 0, off_pos = 0;
    for (int p = 0; p < 512; p++) {
        int b = sq_eval_log_softmax(lg + (size_t)p * V, V, lp);
        int off0 = off;
        for (int j = 0; j < 20; j++) {
            double d = fabs(lp[ids[p * 20 + j]] - lps[p * 20 + j]);
            maxd = fmax(maxd, d);
            off += d > 0.05;
            sumd += d;
        }
        off_pos += off > off0;
        agree += b == ids[p * 20];
        agree_ref += b == rids[p * 20];
    }
    fprintf(stderr, "exl3 top-20 x 512: mean |dlogprob| %.4g, max %.4g, %d of 10240 entries (at %d positions) "
            "off by > 0.05; top-1 vs exllamav3 %d/512; top-1 vs transformers(original) %.4f (exllamav3: 0.809)\n",
            sumd / (512 * 20), maxd, off, off_pos, agree, agree_ref / 512.0);
    CHECK_MSG(sumd / (512 * 20) < 0.01, "mean log-prob difference %.4g", sumd / (512 * 20));
    /* exllamav3's fp16 forward drifts at a few positions (449-450 here: the
     * whole top-20 tail of a token it is >99.9 % sure of); sparq's bf16 path
     * matches transformers at all 512 positions (test_golden on the fixtures) */
    CHECK_MSG(off <= 100 && off_pos <= 8, "%d entries at %d positions differ by > 0.05", off, off_pos);
    CHECK_MSG(agree >= 500, "top-1 agreement with exllamav3 %d/512", agree);
    CHECK_MSG(fabs(agree_ref / 512.0 - 0.809) < 0.03, "top-1 agreement with the original %.4f", agree_ref / 512.0);
    free(lp);
    npy_free(&id), npy_free(&lpv), npy_free(&rid);
}

int main(void)
{
    npy_array ids;
    if (npy_load(t_data_path("exl3-model/ids.npy"), &ids) != 0) T_SKIP("tests/data/exl3-model/ids.npy missing");
    sq_model_opts o;
    sq_model_opts_default(&o);
    o.ctx = 512;
    o.max_rows = 512;
    sparq_status st = sq_model_load(&m, t_data_path("exl3-model/exl3-3.0bpw"), &o);
    if (st != SPARQ_OK) {
        fprintf(stderr, "load: %s\n", sparq_errmsg());
        return 1;
    }
    V = (int)sq_model_cfg(m)->vocab_size;
    lg = malloc((size_t)512 * V * 4);
    CHECK(ids.count == 512);
    st = sq_model_forward(m, 0, ids.data, 512, SQ_LOGITS_ALL, lg);
    CHECK_MSG(st == SPARQ_OK, "forward: %s", sparq_errmsg());
    if (st == SPARQ_OK) {
        RUN(test_logits128);
        RUN(test_top20_512);
    }
    free(lg);
    npy_free(&ids);
    sq_model_free(m);
    return t_summary();
}
