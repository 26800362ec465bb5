/* cli/dist_cli.h — what run and eval share for multi-process runs: a
 * SIGTERM message (mpirun ends the other ranks with SIGTERM when one fails,
 * and a rank should say so rather than vanish), and the failure path that
 * prints the error and ends every rank. */
#ifndef SPARQ_CLI_DIST_CLI_H
#define SPARQ_CLI_DIST_CLI_H

#include "cli/args.h"
#include "formats/tokenizer.h"
#include "runtime/dist/dist.h"
#include "runtime/dist/transport.h"

/* Install the SIGTERM note for this rank (only when there are several). */
void cli_dist_setup(const sq_transport *t);

/* Print st (naming the rank when there are several) and, with several
 * ranks, end them all (MPI_Abort): does not return then. Returns 1. */
int cli_dist_fail(const cli_spec *spec, sq_transport *t, int st);

/* Open MODEL as `run` and `serve` do: the transport (with the SIGTERM note),
 * the tokenizer on rank 0, the model through sq_dist_open (up to 256 rows per
 * step; a bundle's files checked on every rank, each its own node). A
 * failure on any rank is printed by rank 0 with its full message. Returns −1 on rank
 * 0 with *tr, *model and *tok open. Otherwise returns the command's exit
 * code with everything closed: on ranks > 0 after serving their pipeline
 * stage until rank 0 shuts it down, or after printing the error. */
typedef struct cli_model_args {
    int ctx, threads, n_seq; /* sq_model_opts: ctx, n_threads (0 = all CPUs), n_seq */
    sq_device device;
    double timeout_s;        /* sq_dist_opts */
    bool no_verify;          /* sq_model_opts: skip the bundle's block checksums */
} cli_model_args;
int cli_dist_start(const cli_spec *spec, const char *dir, const cli_model_args *ma, sq_transport **tr,
                   sq_dist **model, sq_tokenizer **tok);

#endif
