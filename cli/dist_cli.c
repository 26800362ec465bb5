/* cli/dist_cli.c — see dist_cli.h. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/dist_cli.h"

static char term_note[160];
static size_t term_len;

static void on_term(int sig)
{
    (void)sig;
    if (write(STDERR_FILENO, term_note, term_len) < 0) {}
    _exit(143);
}

void cli_dist_setup(const sq_transport *t)
{
    if (t->size <= 1) return;
    int n = snprintf(term_note, sizeof term_note,
                     "sparq: rank %d of %d: stopped by SIGTERM (mpirun ends every rank when one fails; its message "
                     "names the rank)\n", t->rank, t->size);
    term_len = n > 0 && (size_t)n < sizeof term_note ? (size_t)n : 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
}

int cli_dist_fail(const cli_spec *spec, sq_transport *t, int st)
{
    if (t && t->size > 1) {
        const char *msg = sparq_errmsg();
        fprintf(stderr, "sparq %s: rank %d of %d: %s%s%s\nsparq %s: rank %d: stopping every rank\n", spec->name,
                t->rank, t->size, sparq_status_str((sparq_status)st), msg[0] ? ": " : "", msg, spec->name, t->rank);
        t->vt->abort(t, 1);
    }
    return cli_fail(spec, st);
}
