/* common/progress.c — see progress.h. */
#include "common/progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double sparq_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct timespec sparq_deadline_after(double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const double end = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + seconds;
    ts.tv_sec = (time_t)end;
    ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
    return ts;
}

bool sparq_progress_enabled(void)
{
    static int enabled = -1;
    if (enabled < 0) enabled = isatty(2) && !getenv("SPARQ_NO_PROGRESS");
    return enabled == 1;
}

void sparq_format_duration(char *buf, int cap, double s)
{
    if (!(s >= 0) || s > 1e8) {
        snprintf(buf, (size_t)cap, "--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, (size_t)cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, (size_t)cap, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, (size_t)cap, "%lds", t);
}

void sparq_format_bytes(char *buf, int cap, double b)
{
    static const char *const u[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    int i = 0;
    while (b >= 1000.0 && i < 5) {
        b /= 1000.0;
        i++;
    }
    snprintf(buf, (size_t)cap, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

void sparq_progress_begin(sparq_progress *p, const char *label, uint64_t total,
                          sparq_progress_unit unit)
{
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label);
    snprintf(p->unit_name, sizeof p->unit_name, "items");
    p->total = total;
    p->unit = unit;
    atomic_init(&p->done, 0);
    atomic_flag_clear(&p->drawing);
    p->active = sparq_progress_enabled();
    p->t_start = sparq_now();
    p->t_last_draw = 0;
}

void sparq_progress_set_unit_name(sparq_progress *p, const char *name)
{
    snprintf(p->unit_name, sizeof p->unit_name, "%s", name);
}

static void draw(sparq_progress *p, bool final)
{
    double now = sparq_now();
    uint64_t done = atomic_load(&p->done);
    if (final && done < p->total) done = p->total;
    double el = now - p->t_start;
    double rate = el > 0 ? (double)done / el : 0;
    double frac = p->total ? (double)done / (double)p->total : 1.0;
    if (frac > 1) frac = 1;
    char bar[26];
    int fill = (int)(frac * 24 + 0.5);
    for (int i = 0; i < 24; i++) bar[i] = i < fill ? '#' : '.';
    bar[24] = 0;
    char amt[64], rt[48], eta[24];
    if (p->unit == SPARQ_PROGRESS_BYTES) {
        char a[24], b[24];
        sparq_format_bytes(a, sizeof a, (double)done);
        sparq_format_bytes(b, sizeof b, (double)p->total);
        snprintf(amt, sizeof amt, "%s/%s", a, b);
        sparq_format_bytes(a, sizeof a, rate);
        snprintf(rt, sizeof rt, "%s/s", a);
    } else {
        snprintf(amt, sizeof amt, "%llu/%llu %s", (unsigned long long)done,
                 (unsigned long long)p->total, p->unit_name);
        snprintf(rt, sizeof rt, "%.3g %s/s", rate, p->unit_name);
    }
    if (final)
        sparq_format_duration(eta, sizeof eta, el);
    else
        sparq_format_duration(eta, sizeof eta,
                              rate > 0 ? (double)(p->total - (done < p->total ? done : p->total)) / rate : -1);
    fprintf(stderr, "\r\033[K%s [%s] %5.1f%% %s  %s  %s %s%s", p->label, bar, 100 * frac, amt, rt,
            final ? "in" : "ETA", eta, final ? "\n" : "");
    fflush(stderr);
    p->t_last_draw = now;
}

void sparq_progress_set(sparq_progress *p, uint64_t done)
{
    atomic_store(&p->done, done);
    if (!p->active) return;
    if (atomic_flag_test_and_set(&p->drawing)) return;
    if (sparq_now() - p->t_last_draw >= 0.1) draw(p, false);
    atomic_flag_clear(&p->drawing);
}

void sparq_progress_add(sparq_progress *p, uint64_t n)
{
    uint64_t d = atomic_fetch_add(&p->done, n) + n;
    if (!p->active) return;
    if (atomic_flag_test_and_set(&p->drawing)) return;
    if (sparq_now() - p->t_last_draw >= 0.1) {
        (void)d;
        draw(p, false);
    }
    atomic_flag_clear(&p->drawing);
}

void sparq_progress_end(sparq_progress *p)
{
    if (!p->active) return;
    while (atomic_flag_test_and_set(&p->drawing)) {
    }
    draw(p, true);
    atomic_flag_clear(&p->drawing);
    p->active = false;
}
