/* tests/common/test_half.c — fp16/bf16 conversions against the compiler's own
 * IEEE _Float16 (round to nearest even): every fp16 value, and a stride over
 * all 2^32 float bit patterns. */
#include "common/half.h"
#include "t.h"

static void test_f16_exhaustive(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = sparq_f16_to_f32((uint16_t)h);
        _Float16 g;
        uint16_t hb = (uint16_t)h;
        memcpy(&g, &hb, 2);
        if (isnan(f)) continue;
        bad += f != (float)g;
        bad += sparq_f32_to_f16(f) != h;
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_f32_to_f16_stride(void)
{
    int bad = 0;
    for (uint64_t u = 0; u < 0x100000000ull; u += 4099) {
        float f = sparq_bits_f32((uint32_t)u);
        uint16_t mine = sparq_f32_to_f16(f);
        if (isnan(f)) {
            bad += (mine & 0x7C00) != 0x7C00 || !(mine & 0x3FF);
            continue;
        }
        _Float16 g = (_Float16)f;
        uint16_t gb;
        memcpy(&gb, &g, 2);
        bad += mine != gb;
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_bf16(void)
{
    CHECK(sparq_f32_to_bf16(1.0f) == 0x3F80);
    CHECK(sparq_bf16_to_f32(0x3F80) == 1.0f);
    /* ties to even: 1 + 2^-8 is halfway between 1 and 1+2^-7 -> 1 */
    CHECK(sparq_f32_to_bf16(1.0f + 1.0f / 256) == 0x3F80);
    CHECK(sparq_f32_to_bf16(1.0f + 3.0f / 256) == 0x3F82);
    CHECK(isnan(sparq_bf16_to_f32(sparq_f32_to_bf16(NAN))));
    int bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = sparq_bf16_to_f32((uint16_t)b);
        if (!isnan(f)) bad += sparq_f32_to_bf16(f) != b;
    }
    CHECK_EQ_INT(bad, 0);
}

int main(void)
{
    RUN(test_f16_exhaustive);
    RUN(test_f32_to_f16_stride);
    RUN(test_bf16);
    return t_summary();
}
