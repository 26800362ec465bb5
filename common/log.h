/* common/log.h — leveled logging to stderr.
 *
 * The level comes from sparq_log_set_level() or, at first use, from the
 * SPARQ_LOG environment variable (error|warn|info|debug). Default: info.
 * Library code logs sparingly (warnings about odd but usable input, debug
 * detail); results and errors are the caller's to print. */
#ifndef SPARQ_COMMON_LOG_H
#define SPARQ_COMMON_LOG_H

typedef enum sparq_log_level {
    SPARQ_LOG_ERROR = 0,
    SPARQ_LOG_WARN = 1,
    SPARQ_LOG_INFO = 2,
    SPARQ_LOG_DEBUG = 3,
} sparq_log_level;

void sparq_log_set_level(sparq_log_level lvl);
sparq_log_level sparq_log_get_level(void);
void sparq_log(sparq_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_ERROR(...) sparq_log(SPARQ_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...) sparq_log(SPARQ_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(...) sparq_log(SPARQ_LOG_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) sparq_log(SPARQ_LOG_DEBUG, __VA_ARGS__)

#endif
