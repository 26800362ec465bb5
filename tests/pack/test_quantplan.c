/* tests/pack/test_quantplan.c — the what-if of a quantized target
 * (runtime/quantplan.h): the bit rule is the quantizer's own (qz_bits_for,
 * compared over layers, roles, fractional bits and rules), the EXL3 byte
 * formula, and the target tensor list of the tiny V4.1 fixture (every
 * quantized linear replaced by its four parts, nothing else touched). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quantize/job.h"
#include "runtime/quantplan.h"
#include "t.h"

static void test_bits_agree_with_quantize(void)
{
    static const double bits[] = {1, 2, 2.5, 2.9, 3, 3.25, 4.75, 7.5, 8};
    static const sq_lin_role roles[] = {SQ_ROLE_ATTN, SQ_ROLE_EXPERT, SQ_ROLE_SHARED, SQ_ROLE_MLP};
    static const char *const keys[] = {"layers.{L}.attn.wq_a", "layers.{L}.ffn.experts.7.w2",
                                       "layers.{L}.ffn.shared_experts.w1", "model.layers.{L}.mlp.down_proj"};
    for (int with_rules = 0; with_rules < 2; with_rules++)
        for (size_t b = 0; b < sizeof bits / sizeof bits[0]; b++) {
            qz_opts o;
            memset(&o, 0, sizeof o);
            o.bits = bits[b];
            o.head_bits = 6;
            sq_bits_rule rules[2] = {{"layers.1[89].ffn.experts.*", 2}, {"*.wq_a", 7}};
            if (with_rules) {
                o.rules[0] = (qz_bits_rule){rules[0].pattern, rules[0].K};
                o.rules[1] = (qz_bits_rule){rules[1].pattern, rules[1].K};
                o.n_rules = 2;
            }
            qjob j;
            memset(&j, 0, sizeof j);
            j.o = &o;
            sq_bits_policy p;
            sq_bits_policy_default(&p, bits[b]);
            p.rules = rules;
            p.n_rules = with_rules ? 2 : 0;
            for (int L = -1; L < 40; L++)
                for (int r = 0; r < 4; r++) {
                    char key[128];
                    const char *pat = L < 0 ? "head" : keys[r];
                    const char *at = strstr(pat, "{L}");
                    if (at) snprintf(key, sizeof key, "%.*s%d%s", (int)(at - pat), pat, L, at + 3);
                    else snprintf(key, sizeof key, "%s", pat);
                    const int q = qz_bits_for(&j, key, L, roles[r]), s = sq_bits_for(&p, key, L, roles[r]);
                    CHECK_MSG(q == s, "bits %g, %s (layer %d, role %d): quantize %d, plan %d", bits[b], key, L,
                              (int)roles[r], q, s);
                }
        }
}

/* 2.9: 36 of 40 layers at 3 bits, the 4 others at 2, spread out (not the last four). */
static void test_fraction_spread(void)
{
    sq_bits_policy p;
    sq_bits_policy_default(&p, 2.9);
    int at3 = 0, last = -1, min_gap = 100;
    for (int L = 0; L < 40; L++) {
        const int K = sq_bits_for(&p, "x", L, SQ_ROLE_EXPERT);
        CHECK(K == 2 || K == 3);
        if (K == 3) at3++;
        else {
            if (last >= 0 && L - last < min_gap) min_gap = L - last;
            last = L;
        }
    }
    CHECK_EQ_INT(at3, 36);
    CHECK(min_gap >= 9);
    /* fixed roles and clamping */
    p.attn_bits = 5;
    p.shared_bits = 4;
    CHECK_EQ_INT(sq_bits_for(&p, "a", 3, SQ_ROLE_ATTN), 5);
    CHECK_EQ_INT(sq_bits_for(&p, "s", 3, SQ_ROLE_SHARED), 4);
    const sq_bits_rule big = {"*", 12};
    p.rules = &big;
    p.n_rules = 1;
    CHECK_EQ_INT(sq_bits_for(&p, "a", 3, SQ_ROLE_ATTN), 8);
}

static void test_exl3_bytes(void)
{
    /* a V4.1 expert w1 (5120 -> 2304) at 3 bits: trellis 5120·2304·3/8, suh 2·5120, svh 2·2304, mul1 4 */
    CHECK(sq_exl3_linear_bytes(5120, 2304, 3) == 4423680ull + 10240 + 4608 + 4);
    /* the I16 tensor quantize writes: (k/16)·(n/16)·16K elements of 2 bytes */
    CHECK(sq_exl3_linear_bytes(256, 128, 5) == (256 / 16) * (128 / 16) * 16 * 5 * 2 + 512 + 256 + 4);
}

static void test_tiny_dsv41_target(void)
{
    char dir[1024];
    const char *d = getenv("SPARQ_TEST_DATA");
    snprintf(dir, sizeof dir, "%s/tiny-dsv41", d ? d : "build/tests/data");
    sq_model_config cfg;
    if (sq_config_load(&cfg, dir) != SPARQ_OK) {
        CHECK_MSG(0, "cannot read %s: %s", dir, sparq_errmsg());
        return;
    }
    sf_model *sf;
    CHECK_EQ_INT(sf_open(&sf, dir), SPARQ_OK);
    sq_bits_policy p;
    sq_bits_policy_default(&p, 3);
    sq_quantplan q;
    sq_quantplan_summary s;
    CHECK_EQ_INT(sq_quantplan_tensors(&cfg, sf, &p, &q, &s), SPARQ_OK);
    /* the linears: per layer 5 attention + 8 experts x 3 + 3 shared, + engram.wkv on 2 layers, + the head */
    const uint64_t n_lin = 16 * (5 + 24 + 3) + 2 + 1;
    uint64_t removed = 0, sum = 0, trellis = 0;
    for (size_t i = 0; i < sf_count(sf); i++) {
        const char *nm = sf_at(sf, i)->name;
        bool kept = false;
        for (size_t k = 0; k < q.n_tensors && !kept; k++) kept = q.tensors[k].name == nm;
        if (!kept) removed++;
    }
    CHECK_EQ_INT(removed, 2 * n_lin - 1); /* .weight and .scale of each (the head is BF16: .weight only) */
    CHECK_EQ_INT(q.n_tensors, sf_count(sf) - removed + 4 * n_lin);
    for (size_t k = 0; k < q.n_tensors; k++) {
        sum += q.tensors[k].nbytes;
        if (strstr(q.tensors[k].name, ".trellis")) trellis++;
        CHECK_MSG(strncmp(q.tensors[k].name, "layers.", 7) || !strstr(q.tensors[k].name, "experts.0.w1.scale"),
                  "%s left", q.tensors[k].name);
    }
    CHECK_EQ_INT(trellis, n_lin);
    CHECK(sum == s.total + s.engram_tables);
    /* experts: 16 layers x 8 x (2 x 64->64 + 64->64) at 3 bits */
    CHECK(s.experts == 16ull * 8 * 3 * sq_exl3_linear_bytes(64, 64, 3));
    CHECK(s.head == sq_exl3_linear_bytes(64, 129280, 6));
    CHECK_EQ_INT(s.linears_at[3], 16 * 8 * 3);
    CHECK_EQ_INT(s.linears_at[5], 16 * 5);    /* attention */
    CHECK_EQ_INT(s.linears_at[4], 16 * 3 + 2); /* shared experts, and engram.wkv (its own role) */
    CHECK_NEAR(s.expert_bpw, 3.0, 1e-12);
    sq_quantplan_free(&q);
    sf_close(sf);
    sq_config_free(&cfg);
}

int main(void)
{
    RUN(test_bits_agree_with_quantize);
    RUN(test_fraction_spread);
    RUN(test_exl3_bytes);
    RUN(test_tiny_dsv41_target);
    return t_summary();
}
