/* cli/cmd_plan.h — the options `sparq plan` and `sparq pack` share (box
 * count, budget, context, users, ...), kept in one table so both commands
 * accept and document them identically. A command's option table starts with
 * PLAN_OPTS; option ids below PLAN_OPT_COUNT go to plan_opt_handle(). */
#ifndef SPARQ_CLI_CMD_PLAN_H
#define SPARQ_CLI_CMD_PLAN_H

#include <stdbool.h>

#include "cli/args.h"
#include "pack/pack.h"

#define PLAN_OPTS                                                                                       \
    {"boxes", 'b', "N", "number of boxes (nodes) to split the model over (default 1)"},               \
    {"mem-per-box", 0, "SIZE", "physical memory of one box (default 128G; G = GiB, GB = 10^9)"},       \
    {"reserve-os", 0, "SIZE", "kept for the OS and services (default 6G)"},                             \
    {"display-reserve", 0, "SIZE", "firmware display carve-out (default 2G)"},                          \
    {"unlock-display", 0, "SIZE", "part of the display reserve usable on a headless box (default 1.75G)"}, \
    {"gpu-util", 0, "F", "fraction of the remaining memory the runtime may use (default 0.92)"},       \
    {"margin", 0, "SIZE", "safety margin per node (default 512M)"},                                     \
    {"engram-cache", 0, "SIZE", "Engram row cache per node with Engram layers (default 2G)"},           \
    {"ctx", 'c', "N", "context length per sequence (default 32768)"},                                   \
    {"users", 'u', "N", "sequences served at once (default 6)"},                                        \
    {"chunk", 0, "N", "prefill rows per forward step (default 512)"},                                   \
    {"logits-rows", 0, "N", "rows of logits held at once (default: users)"},                            \
    {"kv-dtype", 0, "T", "KV cache element type: f32 (CPU runtime, default) or f16"},                  \
    {"threads", 0, "N", "runtime threads per node, for per-thread scratch (default 32)"},              \
    {"split", 0, "HOW", "pipeline (default: contiguous layers per node) or experts (every node runs "  \
                        "every layer and holds routed experts e with e mod N == its node; the rest on "  \
                        "every node, the head on node 0 only)"}

enum { PLAN_OPT_COUNT = 15 };

/* Apply option `id` (< PLAN_OPT_COUNT) with value `val` to *o. Prints a usage
 * error and returns false on a bad value. */
bool plan_opt_handle(const cli_spec *spec, int id, const char *val, sq_pack_options *o);

#endif
