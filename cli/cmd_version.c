/* cli/cmd_version.c — `sparq version`: version and what this build has. */
#include <stdio.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "sparq_version.h"

static const cli_opt opts[] = {{0}};
static const cli_spec spec = {"version", "", "Print the sparq version and the optional parts of this build.",
                              opts, NULL};

int cmd_version(int argc, char **argv)
{
    cli_args a;
    const char *v;
    int id;
    cli_args_init(&a, argc, argv, &spec);
    while ((id = cli_next(&a, &v)) >= 0) {
    }
    if (id != CLI_END) return id == CLI_HELP ? 0 : 2;
    if (a.npos) return cli_usage_error(&spec, "takes no arguments");
    printf("sparq %s\n", SPARQ_VERSION);
    printf("cuda backend: %s\n", SPARQ_HAVE_CUDA ? "yes" : "no (nvcc not found at build time)");
    printf("nccl: %s\n", SPARQ_HAVE_NCCL ? "yes" : "no");
    printf("mpi: %s\n", SPARQ_HAVE_MPI ? "yes" : "no");
    return 0;
}
