/* tests/runtime/test_sampler.c — the sampler: greedy is the argmax, a seed
 * fixes the sequence, each filter (top-k, top-p, min-p, repetition penalty)
 * keeps exactly the tokens it should, the empirical distribution matches
 * softmax(logits / T), and the ids past the tokenizer's are never chosen. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "runtime/sampler.h"
#include "sample_check.h"
#include "t.h"

static sq_sampler *make(float temp, int top_k, float top_p, float min_p, float rep, uint64_t seed, int V)
{
    sq_sampler_params p;
    sq_sampler_params_default(&p);
    p.temp = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repeat_penalty = rep;
    p.seed = seed;
    sq_sampler *s = NULL;
    CHECK(sq_sampler_create(&s, &p, V) == SPARQ_OK);
    return s;
}

static const float L[6] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};

static void test_greedy(void)
{
    sq_sampler *s = make(0, 40, 0.95f, 0.05f, 1.0f, 1, 6);
    CHECK_EQ_INT(sq_sampler_sample(s, L), 1); /* tie 1/3: lower id */
    sq_sampler_free(s);
}

static void test_seed_determinism(void)
{
    int a[200], b[200], c[200];
    sq_sampler *s1 = make(1.0f, 0, 1, 0, 1, 42, 6), *s2 = make(1.0f, 0, 1, 0, 1, 42, 6),
               *s3 = make(1.0f, 0, 1, 0, 1, 43, 6);
    for (int i = 0; i < 200; i++) {
        a[i] = sq_sampler_sample(s1, L);
        b[i] = sq_sampler_sample(s2, L);
        c[i] = sq_sampler_sample(s3, L);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    sq_sampler_reset(s1, 42);
    for (int i = 0; i < 200; i++) b[i] = sq_sampler_sample(s1, L);
    CHECK(memcmp(a, b, sizeof a) == 0);
    sq_sampler_free(s1), sq_sampler_free(s2), sq_sampler_free(s3);
}

static void test_distribution(void)
{
    const int N = 200000;
    for (int ti = 0; ti < 2; ti++) {
        float T = ti ? 0.5f : 1.0f;
        sq_sampler *s = make(T, 0, 1, 0, 1, 7, 6);
        int cnt[6] = {0};
        for (int i = 0; i < N; i++) cnt[sq_sampler_sample(s, L)]++;
        double z = 0;
        for (int v = 0; v < 6; v++) z += exp(L[v] / T);
        for (int v = 0; v < 6; v++) {
            double p = exp(L[v] / T) / z, f = (double)cnt[v] / N;
            CHECK_MSG(fabs(f - p) < 4 * sqrt(p * (1 - p) / N) + 1e-4, "T %.1f token %d: freq %.5f, p %.5f", T, v, f, p);
        }
        sq_sampler_free(s);
    }
}

static void test_filters(void)
{
    /* top-k 2: only ids 1 and 3 */
    sq_sampler *s = make(1.0f, 2, 1, 0, 1, 3, 6);
    int seen[6] = {0};
    for (int i = 0; i < 2000; i++) seen[sq_sampler_sample(s, L)]++;
    CHECK(seen[1] > 0 && seen[3] > 0);
    CHECK_EQ_INT(seen[0] + seen[2] + seen[4] + seen[5], 0);
    sq_sampler_free(s);
    /* top-p: p(1)=p(3)≈0.38 each, p(2)≈0.14: mass 0.8 needs 1, 3 and 2 */
    s = make(1.0f, 0, 0.8f, 0, 1, 3, 6);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 4000; i++) seen[sq_sampler_sample(s, L)]++;
    CHECK(seen[1] > 0 && seen[3] > 0 && seen[2] > 0);
    CHECK_EQ_INT(seen[0] + seen[4] + seen[5], 0);
    sq_sampler_free(s);
    /* min-p 0.3: p(2)/p(1) = e^-1 ≈ 0.37 stays, p(0)/p(1) = e^-2 goes */
    s = make(1.0f, 0, 1, 0.3f, 1, 3, 6);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 4000; i++) seen[sq_sampler_sample(s, L)]++;
    CHECK(seen[2] > 0);
    CHECK_EQ_INT(seen[0] + seen[4] + seen[5], 0);
    sq_sampler_free(s);
}

static void test_repeat_penalty(void)
{
    sq_sampler *s = make(0, 0, 1, 0, 4.0f, 1, 6);
    sq_sampler_accept(s, 1);
    sq_sampler_accept(s, 1); /* counted once */
    /* logit 3 / 4 = 0.75 < 3 (id 3) */
    CHECK_EQ_INT(sq_sampler_sample(s, L), 3);
    sq_sampler_accept(s, 3);
    /* 1 and 3 now 0.75: best is id 2 (2.0) */
    CHECK_EQ_INT(sq_sampler_sample(s, L), 2);
    /* a negative logit is multiplied */
    float l2[3] = {-1.0f, -2.5f, -3.0f};
    sq_sampler *s2 = make(0, 0, 1, 0, 3.0f, 1, 3);
    sq_sampler_accept(s2, 0);
    CHECK_EQ_INT(sq_sampler_sample(s2, l2), 1);
    sq_sampler_free(s), sq_sampler_free(s2);
}

/* A head padded past the tokenizer: ids at or past n_vocab are never chosen, however high their
 * logits (tests/runtime/test_padded_vocab.c runs the same through run's and serve's paths). */
static void test_padded_row(void)
{
    CHECK_EQ_INT(sq_sampler_vocab(151936, 151669), 151669); /* Qwen3 */
    CHECK_EQ_INT(sq_sampler_vocab(4096, 4096), 4096);
    CHECK_EQ_INT(sq_sampler_vocab(4000, 4096), 4000); /* a tokenizer past the head: the head's rows */
    CHECK_EQ_INT(sq_sampler_vocab(4096, 0), 4096);    /* unknown */
    const float row[9] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f, 50.0f, INFINITY, NAN}; /* 3 padding rows */
    sq_sampler *g = make(0, 0, 1, 0, 1, 1, 6), *t = make(5.0f, 0, 1, 0, 1, 1, 6);
    CHECK_EQ_INT(sq_sampler_sample(g, row), 1);
    int past = 0;
    for (int i = 0; i < 2000; i++) past += sq_sampler_sample(t, row) >= 6;
    CHECK_EQ_INT(past, 0);
    sq_sampler_free(g), sq_sampler_free(t);
}

static void test_bad_params(void)
{
    sq_sampler_params p;
    sq_sampler_params_default(&p);
    p.top_p = 1.5f;
    sq_sampler *s = NULL;
    CHECK(sq_sampler_create(&s, &p, 10) == SPARQ_E_ARG);
    CHECK(s == NULL);
}

/* The split path (the backend's sample_select, then sq_sampler_finish) on the CPU backend against the
 * whole-row sampler: the device path's host half and wiring, run without a GPU (tests/gpu/test_sample_cuda.c
 * runs the same on the CUDA backend). */
static void test_split_path(void)
{
    sq_exec *ex = NULL;
    CHECK(sq_exec_create(&ex, 1) == SPARQ_OK);
    sample_check_all(ex, 1000, 1000, 1000);          /* no top-k fits the op here: every id a candidate */
    sample_check_all(ex, 4093, 4099, 1000);          /* padded rows */
    sample_check_all(ex, 151669, 151936, 160);       /* Qwen3's head, tokenizer ids */
    sample_check_all(ex, 129280, 129280, 120);       /* DeepSeek V4.1's */
    /* unset, the CPU exec samples whole rows (no op) */
    unsetenv("SPARQ_DEVICE_SAMPLING");
    CHECK_EQ_INT(sq_device_sampling_mode(), -1);
    sq_sampler_params p;
    sq_sampler_params_default(&p);
    CHECK_EQ_INT(sample_check(ex, 2000, 2000, &p, 40, false, "defaults, SPARQ_DEVICE_SAMPLING unset"), 0);
    setenv("SPARQ_DEVICE_SAMPLING", "0", 1);
    CHECK_EQ_INT(sample_check(ex, 2000, 2000, &p, 40, false, "defaults, SPARQ_DEVICE_SAMPLING=0"), 0);
    setenv("SPARQ_DEVICE_SAMPLING", "1", 1);
    sq_exec_free(ex);
}

int main(void)
{
    setenv("SPARQ_DEVICE_SAMPLING", "1", 1);
    RUN(test_greedy);
    RUN(test_seed_determinism);
    RUN(test_distribution);
    RUN(test_filters);
    RUN(test_repeat_penalty);
    RUN(test_padded_row);
    RUN(test_bad_params);
    RUN(test_split_path);
    return t_summary();
}
