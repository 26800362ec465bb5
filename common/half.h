/* common/half.h — IEEE fp16 and bfloat16 <-> fp32 conversion, bit exact.
 *
 * f32 -> f16 and f32 -> bf16 round to nearest, ties to even, as the GPU's
 * __float2half_rn / __float2bfloat16_rn do; NaN stays NaN (quiet), overflow
 * goes to ±inf, subnormals are handled. Header-only so hot loops inline it. */
#ifndef SPARQ_COMMON_HALF_H
#define SPARQ_COMMON_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t sparq_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float sparq_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float sparq_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    if (exp == 0x1F) return sparq_bits_f32(sign | 0x7F800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return sparq_bits_f32(sign);
        /* subnormal: man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return sparq_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t sparq_f32_to_f16(float f)
{
    uint32_t x = sparq_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) /* inf or NaN */
        return (uint16_t)(sign | 0x7C00 | (ax > 0x7F800000u ? 0x200 | ((ax >> 13) & 0x3FF) : 0));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00); /* rounds to >= 65520 -> inf */
    if (ax < 0x38800000u) {
        /* result is subnormal or zero: value = ax_float; half subnormal unit 2^-24 */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to 0 */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7FFFFF) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 for e in 102..112 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax + 0xC8000FFFu + ((ax >> 13) & 1); /* rebias (-112<<23) and round to even */
    return (uint16_t)(sign | (r >> 13));
}

static inline float sparq_bf16_to_f32(uint16_t b) { return sparq_bits_f32((uint32_t)b << 16); }

static inline uint16_t sparq_f32_to_bf16(float f)
{
    uint32_t x = sparq_f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7FFF + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* fp32 rounded through fp16 and back (what storing to half does). */
static inline float sparq_round_f16(float f) { return sparq_f16_to_f32(sparq_f32_to_f16(f)); }

#endif
