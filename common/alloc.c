/* common/alloc.c — see alloc.h. The fault-injection counter is global and
 * atomic; it costs one relaxed increment per allocation. */
#include "common/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_uint_fast64_t alloc_n_;
static atomic_uint_fast64_t fail_at_;   /* absolute allocation number, 0 = off */
static atomic_bool fail_sticky_;

static bool should_fail(void)
{
    uint64_t n = atomic_fetch_add_explicit(&alloc_n_, 1, memory_order_relaxed) + 1;
    uint64_t f = atomic_load_explicit(&fail_at_, memory_order_relaxed);
    if (!f) return false;
    return atomic_load_explicit(&fail_sticky_, memory_order_relaxed) ? n >= f : n == f;
}

void sparq_alloc_fail_at(uint64_t nth, bool sticky)
{
    atomic_store(&fail_sticky_, sticky);
    atomic_store(&fail_at_, nth ? atomic_load(&alloc_n_) + nth : 0);
}

uint64_t sparq_alloc_count(void) { return atomic_load(&alloc_n_); }

void *sparq_malloc(size_t n)
{
    if (should_fail()) return NULL;
    return malloc(n ? n : 1);
}

void *sparq_calloc(size_t count, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) return NULL;
    if (should_fail()) return NULL;
    return calloc(total ? total : 1, 1);
}

void *sparq_realloc(void *p, size_t n)
{
    if (should_fail()) return NULL;
    return realloc(p, n ? n : 1);
}

void sparq_free(void *p) { free(p); }

void *sparq_aligned_alloc(size_t align, size_t size)
{
    if (align < sizeof(void *) || (align & (align - 1))) return NULL;
    size_t rounded = (size + align - 1) & ~(align - 1);
    if (rounded < size) return NULL;
    if (should_fail()) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, align, rounded ? rounded : align)) return NULL;
    return p;
}

void sparq_aligned_free(void *p) { free(p); }

char *sparq_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = sparq_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}
