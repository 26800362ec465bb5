/* common/alloc.c — see alloc.h. Each allocation asks common/fault.h's hook
 * first: one branch while fault injection is not armed. */
#include "common/alloc.h"

#include <stdlib.h>
#include <string.h>

void *sparq_malloc(size_t n)
{
    if (sparq_fault_alloc()) return NULL;
    return malloc(n ? n : 1);
}

void *sparq_calloc(size_t count, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) return NULL;
    if (sparq_fault_alloc()) return NULL;
    return calloc(total ? total : 1, 1);
}

void *sparq_realloc(void *p, size_t n)
{
    if (sparq_fault_alloc()) return NULL;
    return realloc(p, n ? n : 1);
}

void sparq_free(void *p) { free(p); }

void *sparq_aligned_alloc(size_t align, size_t size)
{
    if (align < sizeof(void *) || (align & (align - 1))) return NULL;
    size_t rounded = (size + align - 1) & ~(align - 1);
    if (rounded < size) return NULL;
    if (sparq_fault_alloc()) return NULL;
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
