/* common/alloc.h — allocation with alignment, overflow-checked sizes, and
 * SQLite-style fault injection.
 *
 * All library allocations go through sparq_malloc/sparq_calloc/sparq_realloc/
 * sparq_aligned_alloc so that tests can make the Nth allocation fail
 * (sparq_alloc_fail_at, common/fault.h) and prove every error path is clean. */
#ifndef SPARQ_COMMON_ALLOC_H
#define SPARQ_COMMON_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/fault.h"

void *sparq_malloc(size_t n);
void *sparq_calloc(size_t count, size_t size);   /* NULL on overflow too */
void *sparq_realloc(void *p, size_t n);
void sparq_free(void *p);

/* Memory aligned to `align` (a power of two ≥ sizeof(void*)); size is rounded
 * up to a multiple of align. Free with sparq_aligned_free. */
void *sparq_aligned_alloc(size_t align, size_t size);
void sparq_aligned_free(void *p);

/* Duplicate a string (NULL on failure). */
char *sparq_strdup(const char *s);

/* Overflow-checked arithmetic: return false on overflow. */
static inline bool sparq_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool sparq_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* Saturating variants: UINT64_MAX on overflow (for size estimates that must
 * never wrap to something small). */
static inline uint64_t sparq_sat_mul_u64(uint64_t a, uint64_t b)
{
    uint64_t r;
    return sparq_mul_u64(a, b, &r) ? r : UINT64_MAX;
}
static inline uint64_t sparq_sat_add_u64(uint64_t a, uint64_t b)
{
    uint64_t r;
    return sparq_add_u64(a, b, &r) ? r : UINT64_MAX;
}

#endif
