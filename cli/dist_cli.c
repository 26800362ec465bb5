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

int cli_dist_start(const cli_spec *spec, const char *dir, const cli_model_args *ma, sq_transport **trp,
                   sq_dist **model, sq_tokenizer **tok)
{
    sq_model_opts mo;
    sq_model_opts_default(&mo);
    mo.ctx = ma->ctx;
    mo.n_threads = ma->threads;
    mo.device = ma->device;
    mo.max_rows = 256;
    mo.n_seq = ma->n_seq;
    mo.no_verify = ma->no_verify;
    sq_dist_opts dop;
    sq_dist_opts_default(&dop);
    dop.timeout_s = ma->timeout_s;
    *trp = NULL, *model = NULL, *tok = NULL;
    sq_transport *tr = NULL;
    sparq_status st = sq_transport_auto(&tr);
    if (st != SPARQ_OK) return cli_fail(spec, st);
    cli_dist_setup(tr);
    /* a tokenizer failure on rank 0 must still let the other ranks finish loading and hear about it;
     * its message is kept, as loading sets (or clears) the thread's message */
    char tok_msg[512] = "";
    if (tr->rank == 0 && (st = sq_tokenizer_load(tok, dir)) != SPARQ_OK)
        snprintf(tok_msg, sizeof tok_msg, "%s", sparq_errmsg());
    bool reported = false;
    const sparq_status st_open = sq_dist_open(model, dir, &mo, &dop, tr, &reported);
    if (st_open != SPARQ_OK) st = st_open; /* the load's message: a damaged tokenizer.json is named there too */
    else if (st != SPARQ_OK) sparq_err(st, "%s", tok_msg);
    if (st == SPARQ_OK && tr->rank != 0) {
        st = sq_dist_serve(*model);
        if (st != SPARQ_OK) cli_dist_fail(spec, tr, st); /* does not return under MPI */
        sq_dist_close(*model);
        sq_transport_close(tr);
        *model = NULL;
        return 0;
    }
    if (st != SPARQ_OK) {
        if (st_open == SPARQ_OK && tr->size > 1) cli_dist_fail(spec, tr, st); /* the others are serving */
        /* print before closing: closing waits for every rank, and once the others exit
         * with an error mpirun stops this one, possibly before it has said why */
        const int rc = reported ? 1 : cli_fail(spec, st);
        sq_dist_close(*model);
        sq_tokenizer_free(*tok);
        sq_transport_close(tr);
        *model = NULL, *tok = NULL;
        return rc;
    }
    *trp = tr;
    return -1;
}
