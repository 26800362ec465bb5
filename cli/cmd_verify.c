/* cli/cmd_verify.c — `sparq verify BUNDLE [--node K] [--quick]`: check every
 * file size and block checksum of a bundle, in parallel; name the file and
 * block of each mismatch; exit 1 if anything is wrong. */
#include <stdio.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "pack/pack.h"

static const cli_opt opts[] = {
    {"node", 'n', "K", "check only what node K loads (its shard and the shared files)"},
    {"quick", 'q', NULL, "sizes only (what the runtime checks at load), no hashing"},
    {"threads", 't', "N", "hashing threads (default: all CPUs)"},
    {0}};
static const cli_spec spec = {
    "verify", "BUNDLE [--node K] [--quick] [--threads N]",
    "Check a bundle made by `sparq pack` against its manifest: every file present with its size, and\n"
    "the XXH3-128 of every block. Prints each damaged file and block, then a summary with GB/s.\n"
    "Exit status 0 when everything matches, 1 otherwise.",
    opts, "example: sparq verify bundles/qwen3-2box --node 1\ndocs: docs/cli-pack.md"};

int cmd_verify(int argc, char **argv)
{
    sq_verify_options o = {.node = -1, .quick = false, .threads = 0};
    cli_args a;
    const char *v;
    int id;
    long long n;
    cli_args_init(&a, argc, argv, &spec);
    while ((id = cli_next(&a, &v)) >= 0) {
        switch (id) {
        case 0:
            if (!cli_parse_int(&spec, "node", v, 0, 4095, &n)) return 2;
            o.node = (int)n;
            break;
        case 1: o.quick = true; break;
        case 2:
            if (!cli_parse_int(&spec, "threads", v, 1, 1024, &n)) return 2;
            o.threads = (int)n;
            break;
        }
    }
    if (id != CLI_END) return id == CLI_HELP ? 0 : 2;
    if (a.npos != 1) return cli_usage_error(&spec, "expected one BUNDLE folder");
    sq_verify_report r;
    sparq_status st = sq_verify_bundle(a.pos[0], &o, &r);
    for (size_t i = 0; i < r.n_problems; i++) printf("BAD %s\n", r.problems[i]);
    if (r.n_bad > r.n_problems) printf("... and %llu more\n", (unsigned long long)(r.n_bad - r.n_problems));
    if (st == SPARQ_OK || r.n_bad) {
        double gbs = r.seconds > 0 ? (double)r.bytes / r.seconds / 1e9 : 0;
        if (o.quick)
            printf("%s: %llu files, sizes %s (quick: no checksums)\n", a.pos[0], (unsigned long long)r.files,
                   r.n_bad ? "WRONG" : "ok");
        else
            printf("%s: %llu files, %llu blocks, %.3f GB in %.3f s (%.2f GB/s): %s\n", a.pos[0],
                   (unsigned long long)r.files, (unsigned long long)r.blocks, (double)r.bytes / 1e9, r.seconds, gbs,
                   r.n_bad ? "DAMAGED" : "ok");
    }
    sq_verify_report_free(&r);
    if (st != SPARQ_OK) return cli_fail(&spec, st);
    return 0;
}
