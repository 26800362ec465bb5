/* common/fault.h — SQLite-style fault injection: fail the Nth allocation or
 * the Nth file operation, so tests can prove that every error path is clean.
 *
 * Two counters: allocations (every sparq_malloc / calloc / realloc /
 * aligned_alloc / strdup of common/alloc.h) and file operations (the calls
 * common/file.h wraps: open, read, pread, write, fsync, rename, mkdir, mmap).
 * They count only while armed, by the calls below (tests) or by the
 * environment when the process starts, so a whole `sparq` run can be swept
 * from a script:
 *   SPARQ_FAULT_ALLOC=N      fail the Nth allocation ("N+": it and every later one)
 *   SPARQ_FAULT_IO=N         fail the Nth file operation ("N+" likewise; ":EIO" or
 *                            ":ENOSPC" after it picks the errno, else reads get EIO
 *                            and writes ENOSPC)
 *   SPARQ_FAULT_COUNT=1      only count
 * With any of them set the process prints one line on stderr at exit:
 *   "sparq fault: A allocations, F file operations[, failed allocation N]"
 * (the only output library code ever makes, and only on request).
 *
 * Unarmed, a wrapper pays one predictable branch on a global. The counters
 * are atomic, so with worker threads the Nth operation is the Nth to reach
 * the counter: the same one each run when the threads' work is. */
#ifndef SPARQ_COMMON_FAULT_H
#define SPARQ_COMMON_FAULT_H

#include <stdbool.h>
#include <stdint.h>

/* Fail the nth allocation from now (1-based), and every one after it while
 * `sticky`. 0 disarms allocation faults. */
void sparq_alloc_fail_at(uint64_t nth, bool sticky);
/* Fail the nth file operation from now the same way, with errno `err`
 * (0: EIO for open/read/pread/mmap, ENOSPC for write/fsync/rename/mkdir). */
void sparq_io_fail_at(uint64_t nth, bool sticky, int err);
/* Count without failing (on), or stop counting (off: the counters keep
 * their values). Arming a failure counts too. */
void sparq_fault_counting(bool on);
/* Operations counted so far while armed; take differences around a call. */
uint64_t sparq_alloc_count(void);
uint64_t sparq_io_count(void);
/* How many injected failures have fired since the process started (a sweep
 * checks its fault was reached). */
uint64_t sparq_fault_fired(void);
/* Called each time an injected fault fires, and does nothing: in a debugger,
 * `break sparq_fault_breakpoint` stops at the call that is made to fail. */
void sparq_fault_breakpoint(void);

/* --- the hooks, for common/'s wrappers only --------------------------------------- */

extern int sparq_fault_armed_;
bool sparq_fault_alloc_slow_(void);
int sparq_fault_io_slow_(int natural_errno);

/* True when this allocation must fail. */
static inline bool sparq_fault_alloc(void)
{
    return __builtin_expect(__atomic_load_n(&sparq_fault_armed_, __ATOMIC_RELAXED), 0) && sparq_fault_alloc_slow_();
}

/* 0, or the errno this file operation must fail with. */
static inline int sparq_fault_io(int natural_errno)
{
    return __builtin_expect(__atomic_load_n(&sparq_fault_armed_, __ATOMIC_RELAXED), 0)
               ? sparq_fault_io_slow_(natural_errno)
               : 0;
}

#endif
