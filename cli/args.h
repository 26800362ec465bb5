/* cli/args.h — the one option parser every `sparq <cmd>` uses.
 *
 * A command declares its options in a table; `--help` output is generated
 * from the same table, so every flag is documented by construction.
 *
 *   static const cli_opt opts[] = {
 *       {"json", 0, NULL, "print JSON instead of a table"},
 *       {"ctx", 'c', "N", "context length (default 512)"},
 *       {0}};
 *   static const cli_spec spec = {"eval", "MODEL --text FILE [options]",
 *                                 "Perplexity of MODEL on a text.", opts, NULL};
 *   cli_args a; cli_args_init(&a, argc, argv, &spec);
 *   const char *v; int id;
 *   while ((id = cli_next(&a, &v)) >= 0) switch (id) { ... }
 *   if (id != CLI_END) return id == CLI_HELP ? 0 : 2;
 *   // a.pos[0..a.npos) are the positional arguments
 *
 * Long options take values as `--ctx 512` or `--ctx=512`; short ones as
 * `-c 512`. "--" ends options. */
#ifndef SPARQ_CLI_ARGS_H
#define SPARQ_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct cli_opt {
    const char *name;  /* long name without "--" */
    char short_name;   /* 0 if none */
    const char *arg;   /* metavar if the option takes a value, NULL for a flag */
    const char *help;
} cli_opt;

typedef struct cli_spec {
    const char *name;        /* "eval" */
    const char *usage;       /* "MODEL --text FILE [options]" */
    const char *description; /* a paragraph */
    const cli_opt *opts;     /* terminated by {0} */
    const char *epilog;      /* examples etc., may be NULL */
} cli_spec;

#define CLI_MAX_POS 64

typedef struct cli_args {
    int argc;
    char **argv;
    int i;
    bool only_pos;
    const cli_spec *spec;
    const char *pos[CLI_MAX_POS];
    int npos;
} cli_args;

enum { CLI_END = -1, CLI_ERR = -2, CLI_HELP = -3 };

void cli_args_init(cli_args *a, int argc, char **argv, const cli_spec *spec);
/* Next option: its index in spec->opts, or CLI_END / CLI_ERR (message
 * printed) / CLI_HELP (help printed to stdout). */
int cli_next(cli_args *a, const char **val);
void cli_print_help(const cli_spec *spec);

/* Value parsers: print "sparq <cmd>: --opt: ..." and return false on error. */
bool cli_parse_int(const cli_spec *spec, const char *opt, const char *s, long long lo, long long hi,
                   long long *out);
bool cli_parse_double(const cli_spec *spec, const char *opt, const char *s, double lo, double hi,
                      double *out);
/* Sizes like 128G, 1.75G, 6GiB, 512M, 4096 (bytes). G = GiB (2^30), as
 * memory is counted; GB = 10^9 explicitly. */
bool cli_parse_size(const cli_spec *spec, const char *opt, const char *s, uint64_t *out);

/* Print "sparq <cmd>: <status>: <message>" for the last library error and
 * return the exit code (1). */
int cli_fail(const cli_spec *spec, int status);
/* Print "sparq <cmd>: <message>" and return 2 (usage error). */
int cli_usage_error(const cli_spec *spec, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
