/* cli/dist_cli.h — what run and eval share for multi-process runs: a
 * SIGTERM message (mpirun ends the other ranks with SIGTERM when one fails,
 * and a rank should say so rather than vanish), and the failure path that
 * prints the error and ends every rank. */
#ifndef SPARQ_CLI_DIST_CLI_H
#define SPARQ_CLI_DIST_CLI_H

#include "cli/args.h"
#include "runtime/transport.h"

/* Install the SIGTERM note for this rank (only when there are several). */
void cli_dist_setup(const sq_transport *t);

/* Print st (naming the rank when there are several) and, with several
 * ranks, end them all (MPI_Abort): does not return then. Returns 1. */
int cli_dist_fail(const cli_spec *spec, sq_transport *t, int st);

#endif
