/* common/bytes.h — little-endian stores and loads for on-disk headers.
 *
 * Every binary format sparq writes (Engram tables, cached reference
 * log-probs, ...) is little-endian regardless of the host; these helpers
 * keep that explicit and alignment-safe. Header-only. */
#ifndef SPARQ_COMMON_BYTES_H
#define SPARQ_COMMON_BYTES_H

#include <stdint.h>

static inline void sparq_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline void sparq_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t sparq_get_le32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static inline uint64_t sparq_get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif
