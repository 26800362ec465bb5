/* common/status.c — status names and the thread-local error message buffer. */
#include "common/status.h"

#include <stdio.h>
#include <string.h>

#define SPARQ_ERRMSG_CAP 1024

static _Thread_local char errmsg_[SPARQ_ERRMSG_CAP];

static const char *const status_names_[SPARQ_STATUS_COUNT_] = {
    [SPARQ_OK] = "ok",
    [SPARQ_E_IO] = "I/O error",
    [SPARQ_E_FORMAT] = "format error",
    [SPARQ_E_CHECKSUM] = "checksum mismatch",
    [SPARQ_E_NOMEM] = "out of memory",
    [SPARQ_E_UNSUPPORTED] = "unsupported",
    [SPARQ_E_ARG] = "bad argument",
    [SPARQ_E_RANGE] = "out of range",
    [SPARQ_E_NOTFOUND] = "not found",
    [SPARQ_E_SHAPE] = "shape mismatch",
    [SPARQ_E_FIT] = "does not fit",
    [SPARQ_E_COMM] = "communication error",
    [SPARQ_E_TIMEOUT] = "timeout",
    [SPARQ_E_STATE] = "internal state error",
    [SPARQ_E_INTERRUPTED] = "interrupted",
    [SPARQ_E_UTF8] = "invalid UTF-8",
};

const char *sparq_status_str(sparq_status st)
{
    if ((unsigned)st >= SPARQ_STATUS_COUNT_) return "unknown status";
    return status_names_[st];
}

const char *sparq_errmsg(void) { return errmsg_; }

void sparq_err_clear(void) { errmsg_[0] = 0; }

sparq_status sparq_verr(sparq_status st, const char *fmt, va_list ap)
{
    vsnprintf(errmsg_, sizeof errmsg_, fmt, ap);
    return st;
}

sparq_status sparq_err(sparq_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sparq_verr(st, fmt, ap);
    va_end(ap);
    return st;
}

sparq_status sparq_err_context(sparq_status st, const char *fmt, ...)
{
    char ctx[SPARQ_ERRMSG_CAP], old[SPARQ_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    memcpy(old, errmsg_, sizeof old);
    if (old[0])
        snprintf(errmsg_, sizeof errmsg_, "%s: %s", ctx, old);
    else
        snprintf(errmsg_, sizeof errmsg_, "%s: %s", ctx, sparq_status_str(st));
    return st;
}
