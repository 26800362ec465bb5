/* common/log.c — leveled logging; see log.h. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int level_ = -1;

static int env_level(void)
{
    const char *e = getenv("SPARQ_LOG");
    if (!e) return SPARQ_LOG_INFO;
    if (!strcmp(e, "error")) return SPARQ_LOG_ERROR;
    if (!strcmp(e, "warn")) return SPARQ_LOG_WARN;
    if (!strcmp(e, "debug")) return SPARQ_LOG_DEBUG;
    return SPARQ_LOG_INFO;
}

void sparq_log_set_level(sparq_log_level lvl) { level_ = (int)lvl; }

sparq_log_level sparq_log_get_level(void)
{
    if (level_ < 0) level_ = env_level();
    return (sparq_log_level)level_;
}

void sparq_log(sparq_log_level lvl, const char *fmt, ...)
{
    static const char *const tag[] = {"error", "warning", "info", "debug"};
    if ((int)lvl > (int)sparq_log_get_level()) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "sparq: %s: %s\n", tag[lvl], buf);
}
