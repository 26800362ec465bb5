/* common/progress.h — a progress bar with rate and ETA for long jobs.
 *
 * Drawn on stderr only when stderr is a terminal (and SPARQ_NO_PROGRESS is
 * unset); otherwise every call is a cheap no-op, so pipes and logs stay
 * clean. Redraws are throttled to ~10 per second. Updates may come from any
 * thread (the last writer wins; drawing is serialised).
 *
 *   sparq_progress p;
 *   sparq_progress_begin(&p, "verify", total_bytes, SPARQ_PROGRESS_BYTES);
 *   ... sparq_progress_add(&p, n); ...
 *   sparq_progress_end(&p);
 */
#ifndef SPARQ_COMMON_PROGRESS_H
#define SPARQ_COMMON_PROGRESS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

typedef enum sparq_progress_unit {
    SPARQ_PROGRESS_ITEMS = 0, /* "123/456 items, 12.3 items/s" */
    SPARQ_PROGRESS_BYTES = 1, /* "1.2/3.4 GB, 1.1 GB/s" */
} sparq_progress_unit;

typedef struct sparq_progress {
    char label[48];
    char unit_name[16];
    uint64_t total;
    atomic_uint_fast64_t done;
    sparq_progress_unit unit;
    double t_start, t_last_draw;
    atomic_flag drawing;
    bool active;
} sparq_progress;

/* Is progress drawing enabled for this process (stderr is a tty)? */
bool sparq_progress_enabled(void);

void sparq_progress_begin(sparq_progress *p, const char *label, uint64_t total,
                          sparq_progress_unit unit);
/* Name the items ("tiles", "layers"); default "items". */
void sparq_progress_set_unit_name(sparq_progress *p, const char *name);
void sparq_progress_add(sparq_progress *p, uint64_t n);
void sparq_progress_set(sparq_progress *p, uint64_t done);
/* Final draw (100 %, total time) and newline. */
void sparq_progress_end(sparq_progress *p);

/* Format "1h02m", "3m05s", "12s" into buf. */
void sparq_format_duration(char *buf, int cap, double seconds);
/* Format a byte count with SI units ("1.23 GB"). */
void sparq_format_bytes(char *buf, int cap, double bytes);

/* Monotonic clock in seconds. */
double sparq_now(void);

/* The wall-clock (CLOCK_REALTIME) time `seconds` from now, the absolute
 * deadline pthread_cond_timedwait takes. */
struct timespec sparq_deadline_after(double seconds);

#endif
