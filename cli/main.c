/* cli/main.c — `sparq`: dispatch to subcommands. Nothing else lives here. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "sparq_version.h"

static const cli_command commands[] = {
    /* @commands-table: one line per command, in the order `sparq help` lists them */
    {"quantize", "calibrated EXL3 quantization of a model, streaming, resumable, with a report", cmd_quantize},
    {"tokenize", "text -> token ids and back with a model's tokenizer", cmd_tokenize},
    {"run", "generate text with a model on the CPU (streaming; --chat)", cmd_run},
    {"serve", "OpenAI-compatible HTTP server for a model (/v1/completions, /v1/chat/completions)", cmd_serve},
    {"eval", "perplexity of a model on a text; KL divergence against a reference", cmd_eval},
    {"plan", "memory plan of a model on N boxes: per-node table and a verdict", cmd_plan},
    {"pack", "write a checksummed bundle for N boxes (refuses what does not fit)", cmd_pack},
    {"verify", "check a bundle's sizes and block checksums", cmd_verify},
    {"inspect", "describe a model: architecture, parameters, bytes by dtype, tensors", cmd_inspect},
    {"version", "print the version and build configuration", cmd_version},
};
static const int n_commands = (int)(sizeof commands / sizeof commands[0]);

static void usage(FILE *f)
{
    fprintf(f,
            "sparq %s — quantize, pack and run giant mixture-of-experts models on a few boxes\n\n"
            "usage: sparq <command> [options]\n\ncommands:\n",
            SPARQ_VERSION);
    for (int i = 0; i < n_commands; i++) fprintf(f, "  %-10s  %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "  %-10s  %s\n", "help", "this list; `sparq help <command>` = `sparq <command> --help`");
    fprintf(f, "\nRun 'sparq <command> --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "help") || !strcmp(name, "--help") || !strcmp(name, "-h")) {
        if (argc >= 3 && strcmp(name, "help") == 0) {
            for (int i = 0; i < n_commands; i++)
                if (!strcmp(commands[i].name, argv[2])) {
                    char *av[] = {argv[2], "--help", NULL};
                    return commands[i].fn(2, av);
                }
            fprintf(stderr, "sparq: unknown command '%s'\n", argv[2]);
            return 2;
        }
        usage(stdout);
        return 0;
    }
    if (!strcmp(name, "--version")) name = "version";
    for (int i = 0; i < n_commands; i++)
        if (!strcmp(commands[i].name, name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "sparq: unknown command '%s'\n\n", name);
    usage(stderr);
    return 2;
}
