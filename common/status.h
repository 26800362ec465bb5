/* common/status.h — numbered status codes and the per-thread error message.
 *
 * Every library function that can fail returns a sparq_status. On failure it
 * also leaves a human message in a thread-local buffer (sparq_errmsg()) that
 * says which file / tensor / field and what was expected, e.g.
 *   "model.safetensors: tensor 'w': data_offsets [0, 10) but F32 [3] needs 12 bytes".
 * Library code never prints and never exits; the CLI prints the message.
 *
 * The numeric values are pinned: they are part of the CLI's exit codes and of
 * tests. Append new codes at the end only. */
#ifndef SPARQ_COMMON_STATUS_H
#define SPARQ_COMMON_STATUS_H

#include <stdarg.h>

typedef enum sparq_status {
    SPARQ_OK = 0,
    SPARQ_E_IO = 1,          /* open/read/write/mmap/rename failed */
    SPARQ_E_FORMAT = 2,      /* malformed input: bad JSON, bad header, bad offsets */
    SPARQ_E_CHECKSUM = 3,    /* checksum mismatch */
    SPARQ_E_NOMEM = 4,       /* allocation failed */
    SPARQ_E_UNSUPPORTED = 5, /* valid input we do not handle (architecture, dtype use) */
    SPARQ_E_ARG = 6,         /* bad argument from the caller / command line */
    SPARQ_E_RANGE = 7,       /* size or offset overflow, index out of range */
    SPARQ_E_NOTFOUND = 8,    /* missing tensor, key or file */
    SPARQ_E_SHAPE = 9,       /* tensor shape or dtype not what was expected */
    SPARQ_E_FIT = 10,        /* does not fit the memory budget */
    SPARQ_E_COMM = 11,       /* distributed transport failure */
    SPARQ_E_TIMEOUT = 12,    /* an operation ran past its deadline */
    SPARQ_E_STATE = 13,      /* "impossible" internal state detected */
    SPARQ_E_INTERRUPTED = 14,/* stopped by a signal or by the user */
    SPARQ_E_UTF8 = 15,       /* invalid UTF-8 text */
    SPARQ_STATUS_COUNT_
} sparq_status;

/* Short fixed name of a status ("format error", ...). Never NULL. */
const char *sparq_status_str(sparq_status st);

/* The message left by the last failing call on this thread ("" if none). */
const char *sparq_errmsg(void);

/* Set the thread's message (printf-style) and return st, so call sites can
 * write `return sparq_err(SPARQ_E_FORMAT, "%s: ...", path);`. */
sparq_status sparq_err(sparq_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
sparq_status sparq_verr(sparq_status st, const char *fmt, va_list ap);

/* Prepend context to the current message: "ctx: old message". Returns st.
 * Used when a low-level parser does not know the file name its caller has. */
sparq_status sparq_err_context(sparq_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Clear the thread's message. */
void sparq_err_clear(void);

/* Internal call-site helpers (zstd style). */
#define RETURN_IF(cond, st, ...)                                   \
    do {                                                           \
        if (cond) return sparq_err((st), __VA_ARGS__);             \
    } while (0)
#define FORWARD_IF(expr)                                           \
    do {                                                           \
        sparq_status fwd_st_ = (expr);                             \
        if (fwd_st_ != SPARQ_OK) return fwd_st_;                   \
    } while (0)

#endif
