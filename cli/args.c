/* cli/args.c — see args.h. */
#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

void cli_args_init(cli_args *a, int argc, char **argv, const cli_spec *spec)
{
    memset(a, 0, sizeof *a);
    a->argc = argc;
    a->argv = argv;
    a->i = 1; /* argv[0] is the command name */
    a->spec = spec;
}

void cli_print_help(const cli_spec *s)
{
    printf("usage: sparq %s %s\n\n%s\n", s->name, s->usage, s->description);
    if (s->opts && s->opts[0].name) printf("\noptions:\n");
    for (const cli_opt *o = s->opts; o && o->name; o++) {
        char left[64];
        if (o->short_name)
            snprintf(left, sizeof left, "-%c, --%s%s%s", o->short_name, o->name, o->arg ? " " : "",
                     o->arg ? o->arg : "");
        else
            snprintf(left, sizeof left, "    --%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        if (strlen(left) > 26)
            printf("  %s\n  %-26s  %s\n", left, "", o->help);
        else
            printf("  %-26s  %s\n", left, o->help);
    }
    printf("  %-26s  %s\n", "-h, --help", "show this help and exit");
    if (s->epilog) printf("\n%s\n", s->epilog);
}

int cli_usage_error(const cli_spec *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "sparq %s: ", s->name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'sparq %s --help')\n", s->name);
    va_end(ap);
    return 2;
}

int cli_fail(const cli_spec *s, int status)
{
    const char *msg = sparq_errmsg();
    fprintf(stderr, "sparq %s: %s%s%s\n", s->name, sparq_status_str((sparq_status)status),
            msg[0] ? ": " : "", msg);
    return 1;
}

int cli_next(cli_args *a, const char **val)
{
    *val = NULL;
    while (a->i < a->argc) {
        char *arg = a->argv[a->i++];
        if (a->only_pos || arg[0] != '-' || arg[1] == 0) {
            if (a->npos >= CLI_MAX_POS) {
                cli_usage_error(a->spec, "too many arguments");
                return CLI_ERR;
            }
            a->pos[a->npos++] = arg;
            continue;
        }
        if (!strcmp(arg, "--")) {
            a->only_pos = true;
            continue;
        }
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            cli_print_help(a->spec);
            return CLI_HELP;
        }
        const cli_opt *found = NULL;
        const char *inline_val = NULL;
        if (arg[1] == '-') {
            const char *name = arg + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            for (const cli_opt *o = a->spec->opts; o && o->name; o++)
                if (strlen(o->name) == len && !strncmp(o->name, name, len)) found = o;
            if (found && eq) inline_val = eq + 1;
        } else if (arg[2] == 0) {
            for (const cli_opt *o = a->spec->opts; o && o->name; o++)
                if (o->short_name == arg[1]) found = o;
        }
        if (!found) {
            cli_usage_error(a->spec, "unknown option '%s'", arg);
            return CLI_ERR;
        }
        if (found->arg) {
            if (inline_val)
                *val = inline_val;
            else if (a->i < a->argc)
                *val = a->argv[a->i++];
            else {
                cli_usage_error(a->spec, "option --%s needs a value (%s)", found->name, found->arg);
                return CLI_ERR;
            }
        } else if (inline_val) {
            cli_usage_error(a->spec, "option --%s takes no value", found->name);
            return CLI_ERR;
        }
        return (int)(found - a->spec->opts);
    }
    return CLI_END;
}

bool cli_parse_int(const cli_spec *s, const char *opt, const char *str, long long lo, long long hi,
                   long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(str, &end, 10);
    if (errno || end == str || *end || v < lo || v > hi) {
        cli_usage_error(s, "--%s: '%s' is not an integer in [%lld, %lld]", opt, str, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_double(const cli_spec *s, const char *opt, const char *str, double lo, double hi,
                      double *out)
{
    char *end;
    errno = 0;
    double v = strtod(str, &end);
    if (errno || end == str || *end || !isfinite(v) || v < lo || v > hi) {
        cli_usage_error(s, "--%s: '%s' is not a number in [%g, %g]", opt, str, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_size(const cli_spec *s, const char *opt, const char *str, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(str, &end);
    double mul = 1;
    if (errno || end == str || !(v >= 0)) goto bad;
    if (*end) {
        char u = (char)(*end | 0x20);
        const char *rest = end + 1;
        double base = 1024;
        if (!strcmp(rest, "B")) base = 1000; /* GB = decimal */
        else if (*rest && strcmp(rest, "iB") && strcmp(rest, "ib")) goto bad;
        switch (u) {
        case 'k': mul = base; break;
        case 'm': mul = base * base; break;
        case 'g': mul = base * base * base; break;
        case 't': mul = base * base * base * base; break;
        case 'b': if (*rest) goto bad; mul = 1; break;
        default: goto bad;
        }
    }
    if (v * mul > 1.8e19) goto bad;
    *out = (uint64_t)(v * mul + 0.5);
    return true;
bad:
    cli_usage_error(s, "--%s: '%s' is not a size (e.g. 128G, 1.75G, 512M, 4096)", opt, str);
    return false;
}
