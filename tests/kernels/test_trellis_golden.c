/* tests/kernels/test_trellis_golden.c — the trellis codec against tensors made
 * by exllamav3 itself (tests/data/exl3, see its README):
 *  - our three codebook tables equal codebooks.safetensors for all 65536 states;
 *  - decoding every golden `trellis` reproduces exllamav3's `inner_fp16` bit for
 *    bit (element by element where the tensor is kept, by FNV-1a-64 digest of
 *    the fp16 bytes for every case), on every code path this CPU has;
 *  - the full reconstruction diag(suh)·H·Q·H·diag(svh) matches `weight_fp16`
 *    to fp16 rounding, for the cases that keep it (one K=3 case per shape and
 *    codebook: the Hadamard/scale path does not depend on K);
 *  - the GEMV on those linears equals x · weight_fp16 to the same tolerance. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cpu/trellis.h"
#include "t.h"
#include "kernels/st_mini.h"

static st_mini cases_st, cb_st;

static uint64_t fnv1a64(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void test_codebooks(void)
{
    for (int cb = 0; cb < TRELLIS_CB_COUNT_; cb++) {
        char name[64];
        snprintf(name, sizeof name, "codebook.%s", trellis_cb_name((trellis_codebook)cb));
        size_t nb = 0;
        const uint16_t *ref = st_mini_get(&cb_st, name, &nb);
        CHECK_MSG(ref && nb == 65536 * 2, "%s missing", name);
        if (!ref) continue;
        int bad = 0, first = -1;
        for (uint32_t s = 0; s < 65536; s++) {
            uint16_t r;
            memcpy(&r, ref + s, 2);
            if (trellis_cb_value_f16((trellis_codebook)cb, s) != r) {
                bad++;
                if (first < 0) first = (int)s;
            }
        }
        CHECK_MSG(bad == 0, "%s: %d of 65536 states differ (first: state %d)", name, bad, first);
    }
}

typedef struct gcase {
    char name[64];
    int k, n, K;
    trellis_codebook cb;
    trellis_linear lin;
    const uint16_t *weight_fp16;
} gcase;

static int load_case(const char *name, gcase *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    char cbname[16];
    if (sscanf(name, "%dx%d.K%d.%15s", &c->k, &c->n, &c->K, cbname) != 4) return -1;
    if (!trellis_cb_parse(cbname, &c->cb)) return -1;
    char key[128];
    size_t nb_t = 0, nb_s = 0, nb_v = 0, nb_w = 0;
    snprintf(key, sizeof key, "%s.trellis", name);
    const void *tr = st_mini_get(&cases_st, key, &nb_t);
    snprintf(key, sizeof key, "%s.suh", name);
    const void *suh = st_mini_get(&cases_st, key, &nb_s);
    snprintf(key, sizeof key, "%s.svh", name);
    const void *svh = st_mini_get(&cases_st, key, &nb_v);
    snprintf(key, sizeof key, "%s.weight_fp16", name);
    c->weight_fp16 = st_mini_get(&cases_st, key, &nb_w);
    if (!tr || !suh || !svh) return -1;
    if (nb_t != (size_t)c->k * c->n / 256 * 16 * c->K * 2 || nb_s != (size_t)c->k * 2 ||
        nb_v != (size_t)c->n * 2 || (c->weight_fp16 && nb_w != (size_t)c->k * c->n * 2))
        return -1;
    c->lin = (trellis_linear){c->k, c->n, c->K, c->cb, tr, suh, svh};
    return 0;
}

static void check_inner(const gcase *c, trellis_path path)
{
    const size_t kn = (size_t)c->k * c->n;
    float *q = malloc(kn * sizeof(float));
    uint16_t *qh = malloc(kn * 2);
    /* decode tile by tile through the chosen path */
    const int nt_count = c->n / 16;
    for (int kt = 0; kt < c->k / 16; kt++)
        for (int nt = 0; nt < nt_count; nt++) {
            float tile[256];
            trellis_tile_decode_path(c->lin.trellis + ((size_t)kt * nt_count + nt) * 16 * c->K, c->K, c->cb,
                                     tile, path);
            for (int r = 0; r < 16; r++)
                for (int j = 0; j < 16; j++) q[(size_t)(16 * kt + r) * c->n + 16 * nt + j] = tile[16 * r + j];
        }
    for (size_t i = 0; i < kn; i++) qh[i] = sparq_f32_to_f16(q[i]);

    char key[128], want[32], got[32];
    snprintf(key, sizeof key, "%s.inner_fp16.fnv1a64", c->name);
    CHECK_MSG(st_mini_meta(&cases_st, key, want, sizeof want) == 0, "%s: digest missing", key);
    snprintf(got, sizeof got, "%016llx", (unsigned long long)fnv1a64((const uint8_t *)qh, kn * 2));
    CHECK_MSG(strcmp(want, got) == 0, "%s [%s]: inner_fp16 digest %s, exllamav3 %s", c->name,
              trellis_path_name(path), got, want);

    snprintf(key, sizeof key, "%s.inner_fp16", c->name);
    size_t nb = 0;
    const uint16_t *ref = st_mini_get(&cases_st, key, &nb);
    if (ref) {
        size_t bad = 0, first = (size_t)-1;
        for (size_t i = 0; i < kn; i++) {
            uint16_t r;
            memcpy(&r, ref + i, 2);
            if (r != qh[i]) {
                bad++;
                if (first == (size_t)-1) first = i;
            }
        }
        CHECK_MSG(bad == 0, "%s [%s]: %zu of %zu inner values differ (first at row %zu col %zu)", c->name,
                  trellis_path_name(path), bad, kn, first / c->n, first % c->n);
    }
    /* the library's whole-linear decode agrees with the tile path */
    float *q2 = malloc(kn * sizeof(float));
    CHECK(trellis_linear_decode_inner(&c->lin, q2, NULL) == SPARQ_OK);
    CHECK(memcmp(q, q2, kn * sizeof(float)) == 0);
    free(q2);
    free(q);
    free(qh);
}

/* |ours − golden| ≤ 2^-7·(|golden| + rms): torch rounds the intermediate
 * Hadamard products to fp16 (2^-11 relative each, of values that can exceed
 * the final one); a wrong decode is off by O(rms). The RMS of the difference
 * must also stay below 2^-10 of the weight's RMS. */
static double weight_tol(double g, double rms) { return (fabs(g) + rms) / 128.0; }

static void check_weight(const gcase *c, sparq_pool *pool)
{
    const size_t kn = (size_t)c->k * c->n;
    float *w = malloc(kn * sizeof(float));
    CHECK(trellis_linear_decode(&c->lin, w, pool) == SPARQ_OK);
    double rms = 0;
    for (size_t i = 0; i < kn; i++) {
        uint16_t g;
        memcpy(&g, c->weight_fp16 + i, 2);
        const double gv = sparq_f16_to_f32(g);
        rms += gv * gv;
    }
    rms = sqrt(rms / (double)kn);
    size_t bad = 0;
    double worst = 0, err2 = 0;
    for (size_t i = 0; i < kn; i++) {
        uint16_t g;
        memcpy(&g, c->weight_fp16 + i, 2);
        const double gv = sparq_f16_to_f32(g), d = fabs(w[i] - gv);
        if (d / (fabs(gv) + rms) > worst) worst = d / (fabs(gv) + rms);
        if (d > weight_tol(gv, rms)) bad++;
        err2 += d * d;
    }
    const double rel_rms = sqrt(err2 / (double)kn) / rms;
    CHECK_MSG(rel_rms < 1.0 / 1024, "%s: RMS error %.3g of the weight RMS", c->name, rel_rms);
    fprintf(stderr, "  %-18s weight rel RMS err %.2e, worst %.2e\n", c->name, rel_rms, worst);
    CHECK_MSG(bad == 0, "%s: %zu of %zu weights off by more than fp16 rounding (worst rel %.3g)", c->name,
              bad, kn, worst);

    /* GEMV: y = x·W through the trellis kernel vs. x·weight_fp16 in double */
    float *x = malloc((size_t)c->k * 2 * sizeof(float)), *y = malloc((size_t)c->n * 2 * sizeof(float));
    uint32_t seed = 12345;
    for (int i = 0; i < 2 * c->k; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = ((float)(seed >> 8) / 16777216.0f) * 2.0f - 1.0f;
    }
    CHECK(trellis_linear_gemm(&c->lin, x, 2, y, pool) == SPARQ_OK);
    size_t bad_y = 0;
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < c->n; j++) {
            double ref = 0, mag = 0;
            for (int i = 0; i < c->k; i++) {
                uint16_t g;
                memcpy(&g, c->weight_fp16 + (size_t)i * c->n + j, 2);
                ref += (double)x[r * c->k + i] * sparq_f16_to_f32(g);
                mag += fabs((double)x[r * c->k + i]) * (fabs(sparq_f16_to_f32(g)) + rms);
            }
            if (fabs(y[r * c->n + j] - ref) > mag / 512.0) bad_y++;
        }
    CHECK_MSG(bad_y == 0, "%s: GEMV differs from x·weight_fp16 in %zu of %d outputs", c->name, bad_y, 2 * c->n);
    free(x);
    free(y);
    free(w);
}

static void test_cases(void)
{
    char list[2048];
    CHECK(st_mini_meta(&cases_st, "cases", list, sizeof list) == 0);
    sparq_pool *pool = NULL;
    CHECK(sparq_pool_create(&pool, 2) == SPARQ_OK);
    int n_cases = 0, n_weight = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        gcase c;
        const int rc = load_case(tok, &c);
        CHECK_MSG(rc == 0, "case %s: cannot load", tok);
        if (rc) continue;
        n_cases++;
        for (int p = 0; p < TRELLIS_PATH_COUNT_; p++)
            if (trellis_path_available((trellis_path)p)) check_inner(&c, (trellis_path)p);
        if (c.weight_fp16) {
            check_weight(&c, pool);
            n_weight++;
        }
    }
    CHECK_EQ_INT(n_cases, 16);
    CHECK_EQ_INT(n_weight, 5);
    sparq_pool_free(pool);
}

int main(void)
{
    if (st_mini_open(&cases_st, t_data_path("exl3/cases.safetensors")) ||
        st_mini_open(&cb_st, t_data_path("exl3/codebooks.safetensors"))) {
        fprintf(stderr, "cannot read tests/data/exl3 (SPARQ_TEST_DATA=%s)\n", getenv("SPARQ_TEST_DATA"));
        return 1;
    }
    fprintf(stderr, "code path: %s\n", trellis_path_name(trellis_path_best()));
    RUN(test_codebooks);
    RUN(test_cases);
    st_mini_close(&cases_st);
    st_mini_close(&cb_st);
    return t_summary();
}
