/* common/fault.c — see fault.h. Two counters (allocations, file operations),
 * each with an absolute failure point; armed_ is set while anything counts,
 * so the wrappers' fast path is one load and one branch. The environment is
 * read once, before main, by a constructor. */
#include "common/fault.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_ALLOC, K_IO, K_COUNT_ };

int sparq_fault_armed_;
static atomic_uint_fast64_t count_[K_COUNT_];
static atomic_uint_fast64_t fail_at_[K_COUNT_]; /* absolute operation number, 0 = off */
static atomic_bool sticky_[K_COUNT_];
static atomic_bool counting_;
static atomic_int io_errno_;                     /* 0: the operation's natural errno */
static atomic_uint_fast64_t fired_;
static atomic_uint_fast64_t first_fired_[K_COUNT_]; /* for the exit line */

static void rearm(void)
{
    int on = atomic_load(&counting_) || atomic_load(&fail_at_[K_ALLOC]) || atomic_load(&fail_at_[K_IO]);
    __atomic_store_n(&sparq_fault_armed_, on, __ATOMIC_SEQ_CST);
}

/* Called when an injected fault fires: `break sparq_fault_breakpoint` in gdb
 * stops at the failing call (docs/testing.md). */
__attribute__((noinline)) void sparq_fault_breakpoint(void) { __asm__ volatile(""); }

static bool hit(int k)
{
    const uint64_t n = atomic_fetch_add_explicit(&count_[k], 1, memory_order_relaxed) + 1;
    const uint64_t f = atomic_load_explicit(&fail_at_[k], memory_order_relaxed);
    if (!f || (atomic_load_explicit(&sticky_[k], memory_order_relaxed) ? n < f : n != f)) return false;
    atomic_fetch_add(&fired_, 1);
    sparq_fault_breakpoint();
    uint64_t zero = 0;
    atomic_compare_exchange_strong(&first_fired_[k], &zero, n);
    return true;
}

bool sparq_fault_alloc_slow_(void) { return hit(K_ALLOC); }

int sparq_fault_io_slow_(int natural_errno)
{
    if (!hit(K_IO)) return 0;
    const int e = atomic_load_explicit(&io_errno_, memory_order_relaxed);
    return e ? e : natural_errno;
}

static void fail_at(int k, uint64_t nth, bool sticky)
{
    atomic_store(&sticky_[k], sticky);
    atomic_store(&fail_at_[k], nth ? atomic_load(&count_[k]) + nth : 0);
    rearm();
}

void sparq_alloc_fail_at(uint64_t nth, bool sticky) { fail_at(K_ALLOC, nth, sticky); }

void sparq_io_fail_at(uint64_t nth, bool sticky, int err)
{
    atomic_store(&io_errno_, err);
    fail_at(K_IO, nth, sticky);
}

void sparq_fault_counting(bool on)
{
    atomic_store(&counting_, on);
    rearm();
}

uint64_t sparq_alloc_count(void) { return atomic_load(&count_[K_ALLOC]); }
uint64_t sparq_io_count(void) { return atomic_load(&count_[K_IO]); }
uint64_t sparq_fault_fired(void) { return atomic_load(&fired_); }

/* --- the environment --------------------------------------------------------------- */

static void report_at_exit(void)
{
    char failed[96] = "";
    const uint64_t a = atomic_load(&first_fired_[K_ALLOC]), f = atomic_load(&first_fired_[K_IO]);
    if (a) snprintf(failed, sizeof failed, ", failed allocation %llu", (unsigned long long)a);
    if (f)
        snprintf(failed + strlen(failed), sizeof failed - strlen(failed), ", failed file operation %llu",
                 (unsigned long long)f);
    fprintf(stderr, "sparq fault: %llu allocations, %llu file operations%s\n",
            (unsigned long long)sparq_alloc_count(), (unsigned long long)sparq_io_count(), failed);
}

/* "N", "N+", "N:EIO", "N+:ENOSPC". False (and nothing set) when not understood. */
static bool parse_spec(const char *s, uint64_t *nth, bool *sticky, int *err)
{
    char *end;
    errno = 0;
    unsigned long long n = strtoull(s, &end, 10);
    if (errno || end == s || n == 0) return false;
    *sticky = *end == '+';
    if (*sticky) end++;
    *err = 0;
    if (*end == ':') {
        if (!strcmp(end + 1, "EIO")) *err = EIO;
        else if (!strcmp(end + 1, "ENOSPC")) *err = ENOSPC;
        else return false;
    } else if (*end) {
        return false;
    }
    *nth = n;
    return true;
}

__attribute__((constructor)) static void fault_from_env(void)
{
    const char *a = getenv("SPARQ_FAULT_ALLOC"), *f = getenv("SPARQ_FAULT_IO"), *c = getenv("SPARQ_FAULT_COUNT");
    if (!a && !f && !c) return;
    uint64_t nth;
    bool sticky;
    int err;
    if (a && parse_spec(a, &nth, &sticky, &err) && !err) sparq_alloc_fail_at(nth, sticky);
    else if (a) fprintf(stderr, "sparq fault: SPARQ_FAULT_ALLOC=%s not understood (N or N+); ignored\n", a);
    if (f && parse_spec(f, &nth, &sticky, &err)) sparq_io_fail_at(nth, sticky, err);
    else if (f) fprintf(stderr, "sparq fault: SPARQ_FAULT_IO=%s not understood (N, N+, N:EIO, N:ENOSPC); ignored\n", f);
    sparq_fault_counting(true);
    atexit(report_at_exit);
}
