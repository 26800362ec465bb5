/* tests/formats/bench_formats.c — throughput of the safetensors reader and
 * converters, each against memcpy of the same bytes in this process (the
 * baseline). Not a test: run it by hand, numbers go to
 * docs/benchmarks-formats.md.
 *
 *   build/tests/formats/bench_formats [MODEL_DIR]   (default build/tests/data/exl3-model/exl3-3.0bpw) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "formats/safetensors.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best of `reps` timings of fn, in seconds. */
#define BEST(reps, stmt)                                   \
    ({                                                     \
        double best_ = 1e30;                               \
        for (int r_ = 0; r_ < (reps); r_++) {              \
            double t0_ = now();                            \
            stmt;                                          \
            double dt_ = now() - t0_;                      \
            if (dt_ < best_) best_ = dt_;                  \
        }                                                  \
        best_;                                             \
    })

static sf_tensor mk(const char *name, sf_dtype dt, uint64_t rows, uint64_t cols, const void *data)
{
    sf_tensor t;
    memset(&t, 0, sizeof t);
    t.name = name, t.dtype = dt, t.ndim = 2, t.shape[0] = rows, t.shape[1] = cols;
    t.numel = rows * cols;
    t.nbytes = t.numel * sf_dtype_bits(dt) / 8;
    t.data = data;
    return t;
}

int main(int argc, char **argv)
{
    const char *model = argc > 1 ? argv[1] : "build/tests/data/exl3-model/exl3-3.0bpw";
    sf_model *m;
    if (sf_open(&m, model) != SPARQ_OK) {
        fprintf(stderr, "bench_formats: %s\n", sparq_errmsg());
        return 1;
    }
    const size_t nt = sf_count(m);
    sf_close(m);
    double t_open = BEST(20, { sf_open(&m, model); sf_close(m); });
    printf("sf_open+close %-40s %zu tensors: %.3f ms (%.2f us/tensor)\n", model, nt, t_open * 1e3,
           t_open * 1e6 / (double)nt);

    enum { O = 4096, I = 4096 };
    const size_t n = (size_t)O * I;
    uint8_t *src = malloc(n * 2), *dst = malloc(n * 4);
    float *out = malloc(n * 4);
    for (size_t i = 0; i < n * 2; i++) src[i] = (uint8_t)(i * 131 + 7) & 0x77; /* no E4M3 NaN codes */
    double t_copy = BEST(5, memcpy(dst, src, n * 2));
    double t_copy4 = BEST(5, memcpy(dst, out, n * 4));
    printf("baseline memcpy 32 MiB: %.2f GB/s; 64 MiB: %.2f GB/s\n", n * 2 / t_copy / 1e9, n * 4 / t_copy4 / 1e9);

    sf_tensor bf = mk("bf16", SF_BF16, O, I, src);
    double t_bf = BEST(5, sf_to_f32(&bf, out));
    printf("sf_to_f32 BF16 [4096,4096]: %.2f Gelem/s (%.2fx the 64 MiB memcpy time)\n", n / t_bf / 1e9,
           t_bf / t_copy4);
    sf_tensor h = mk("f16", SF_F16, O, I, src);
    double t_h = BEST(5, sf_to_f32(&h, out));
    printf("sf_to_f32 F16  [4096,4096]: %.2f Gelem/s (%.2fx)\n", n / t_h / 1e9, t_h / t_copy4);

    static float sc[32 * 32];
    for (int i = 0; i < 32 * 32; i++) sc[i] = 1.0f + (float)i / 1024;
    sf_tensor w8 = mk("w", SF_F8_E4M3, O, I, src), s128 = mk("w.weight_scale_inv", SF_F32, 32, 32, sc);
    double t_fp8 = BEST(5, sf_dequant_fp8(&w8, &s128, 128, 128, out));
    printf("sf_dequant_fp8 E4M3 128x128 F32 scales: %.2f Gelem/s (%.2fx)\n", n / t_fp8 / 1e9, t_fp8 / t_copy4);
    uint8_t *e8 = malloc((size_t)O * (I / 32));
    for (size_t i = 0; i < (size_t)O * (I / 32); i++) e8[i] = (uint8_t)(120 + i % 15);
    sf_tensor s32 = mk("w.scale", SF_F8_E8M0, O / 32, I / 32, e8);
    double t_fp8b = BEST(5, sf_dequant_fp8(&w8, &s32, 32, 32, out));
    printf("sf_dequant_fp8 E4M3 32x32 E8M0 scales: %.2f Gelem/s (%.2fx)\n", n / t_fp8b / 1e9, t_fp8b / t_copy4);
    sf_tensor w4 = mk("e", SF_I8, O, I / 2, src), s4 = mk("e.scale", SF_F8_E8M0, O, I / 32, e8);
    double t_fp4 = BEST(5, sf_dequant_mxfp4(&w4, &s4, out));
    printf("sf_dequant_mxfp4 [4096,4096]: %.2f Gelem/s (%.2fx)\n", n / t_fp4 / 1e9, t_fp4 / t_copy4);
    free(src), free(dst), free(out), free(e8);
    return 0;
}
