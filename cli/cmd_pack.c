/* cli/cmd_pack.c — `sparq pack MODEL OUT --boxes N ...`: write a checksummed
 * bundle for N boxes, or refuse (exit 1, nothing written) a layout the
 * memory plan says will not fit. The budget/run options are `sparq plan`'s. */
#include <stdio.h>

#include "cli/cmd_plan.h"
#include "cli/commands.h"

static const cli_opt opts[] = {
    PLAN_OPTS,
    {"resume", 0, NULL, "continue an interrupted pack from OUT.partial (same options; same bytes as one run)"},
    {"block-size", 0, "SIZE", "checksum block size, a power of two >= 4096 (default 4M)"},
    {0}};
static const cli_spec spec = {
    "pack", "MODEL OUT [--boxes N] [budget and run options] [--resume]",
    "Lay MODEL out as a bundle for N boxes: OUT/manifest.json (model config, quantization, memory plan,\n"
    "node -> layers, size + XXH3-128 of every file and of every block), OUT/node-K/model.safetensors\n"
    "(4096-aligned, only node K's tensors), OUT/engram/engram-node-K.bin (the Engram tables of node\n"
    "K's layers, when the model has them) and the config/tokenizer files. With --split experts every\n"
    "node's shard holds every layer but only its routed experts (e mod N == K), and node 0 the head.\n"
    "Refuses, before writing anything, what `sparq plan` with the same options says will not fit.\n"
    "Writes OUT.partial/ and renames it to OUT when complete.",
    opts,
    "example: sparq pack models/qwen3-exl3 bundles/qwen3-2box --boxes 2 --ctx 32768 --users 6\n"
    "         sparq pack models/qwen3-exl3 bundles/qwen3-3box-experts --boxes 3 --split experts\n"
    "docs: docs/cli-pack.md, docs/bundle-format.md"};

int cmd_pack(int argc, char **argv)
{
    sq_pack_options o;
    sq_pack_options_default(&o);
    cli_args a;
    const char *v;
    int id;
    cli_args_init(&a, argc, argv, &spec);
    while ((id = cli_next(&a, &v)) >= 0) {
        if (id < PLAN_OPT_COUNT) {
            if (!plan_opt_handle(&spec, id, v, &o)) return 2;
        } else if (id == PLAN_OPT_COUNT) {
            o.resume = true;
        } else {
            if (!cli_parse_size(&spec, "block-size", v, &o.block_size)) return 2;
            if (o.block_size < 4096 || (o.block_size & (o.block_size - 1)))
                return cli_usage_error(&spec, "--block-size: %s is not a power of two >= 4096", v);
        }
    }
    if (id != CLI_END) return id == CLI_HELP ? 0 : 2;
    if (a.npos != 2) return cli_usage_error(&spec, "expected MODEL and OUT");
    sparq_status st = sq_pack_bundle(a.pos[0], a.pos[1], &o);
    if (st != SPARQ_OK) return cli_fail(&spec, st);
    fprintf(stderr, "sparq pack: wrote %s (%d node%s); check it with `sparq verify %s`\n", a.pos[1], o.boxes,
            o.boxes == 1 ? "" : "s", a.pos[1]);
    return 0;
}
