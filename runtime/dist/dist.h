/* runtime/dist/dist.h — one model over several processes: a pipeline over
 * layers, or the routed experts split between them.
 *
 * `mpirun -np N sparq run BUNDLE` starts N ranks; rank K loads node-K/ of a
 * bundle packed for N boxes (its contiguous layers; node 0 also the
 * embeddings, the last node the final norm and lm_head). Rank 0 is the
 * leader: it holds the tokenizer and the sampler, and is the only rank a
 * command talks to. A step (a prefill chunk of one sequence, or one decode
 * token of several) is embedded and run through rank 0's layers, its hidden
 * states [rows, d] go to rank 1, ..., the last rank applies the head and
 * sends the logits back to rank 0. Other ranks sit in sq_dist_serve().
 *
 * Where hidden states travel: CPU ranks put them in the step's message (host
 * memory). When every rank runs on a GPU (--device cuda), they go from one
 * rank's device buffer to the next rank's over a device link, queued on the
 * execs' streams with no host copy (kernels/backend.h, link_*): NCCL
 * (ncclSend / ncclRecv) between mpirun processes, a mailbox of device
 * buffers between ranks that are threads of one process (tests, benchmarks:
 * NCCL refuses two ranks on one GPU). The step's message then carries only
 * its rows' sequences and positions. SPARQ_DIST_DEVICE_LINK=0 (or
 * opts.device_link false) keeps GPU ranks on the host path: copied out of
 * the device into the message, and into the next rank's device, as before.
 * If a link cannot be made (no NCCL in the build, a rank fails to set it up)
 * every rank takes the host path, and sq_dist_hidden_path says why. Logits
 * go from the last rank to rank 0 through host memory in either case (the
 * sampler is on the host). A link's waits have the same deadline and name
 * the same peer as the host transport's: a receive that gets nothing within
 * opts.timeout_s fails naming the sender (an NCCL link is aborted), a send
 * whose two buffers the next rank has not read fails naming it.
 *
 * Micro-batching: sq_dist_submit() returns as soon as rank 0 has done its
 * own stage and handed the hidden states on, so the leader can start the
 * next micro-batch (another group of sequences, or the next prefill chunk)
 * while later ranks work on the first: with S groups in flight all stages
 * are busy. sq_dist_wait() completes the oldest step (FIFO). A sequence may
 * have at most one step in flight unless its steps are submitted in order
 * (prefill chunks are): every rank sees steps in submission order.
 *
 * Control operations (reset, truncate, shutdown, a stats request) travel
 * down the same pipeline, so they apply in order with the steps on every rank.
 *
 * With one rank (a model directory, a one-box bundle, no mpirun) the same
 * calls run everything locally and synchronously: `sparq run` has one code
 * path. The arithmetic per layer is that of sq_model_forward, so logits are
 * bit-identical for any number of ranks (given the same thread count).
 *
 * The expert split (a bundle packed with --split experts): every rank holds
 * every layer and the routed experts e with e mod N == rank (rank 0 alone
 * the head). A step is rank 0 sending the rows' tokens, sequences and
 * positions to every other rank (SQ_DIST_OP_ESTEP), then every rank running
 * embed and every layer on the same rows. At each MoE layer a rank routes
 * every row (the same router on the same input: the same choice on every
 * rank), computes only the (row, expert) pairs of its experts, and the
 * partial sums are combined by ONE all-gather (sq_transport allgather) and
 * added in rank order 0..N-1 on every rank, so all ranks hold the same
 * floats after every layer, whatever the timing. Rank 0 applies the head;
 * the others skip it (they do not hold it: cheaper than computing logits to
 * throw away). Steps are synchronous (no micro-batching: every rank is busy
 * in every step anyway). With one rank nothing is combined, and the
 * arithmetic is sq_model_forward's to the bit; with N ranks the experts' sum
 * is grouped by rank, so logits differ from one rank's by float rounding
 * (tests/runtime/test_dist_experts.c derives the bound). On GPU ranks each
 * rank's MoE skips the other ranks' pairs on the device, the partial sums
 * are all-gathered over the device link (link_allgather: an NCCL all-gather
 * between processes, the hub's mailboxes between thread ranks) or, without
 * one, through host memory, and the backend's sum_parts adds them in rank
 * order, so every rank keeps the same floats (docs/runtime.md).
 *
 * Failures: every wait has a deadline (opts.timeout_s). When the leader's
 * deadline passes it pings the other ranks and names the first that does not
 * answer; the caller prints the message and calls sq_dist_abort(), which
 * ends every rank (MPI_Abort). A worker's wait for the next request has no
 * deadline (rank 0 may wait for a user), but rank 0 sends heartbeats
 * (transport keepalive): a worker that hears nothing from rank 0 for
 * timeout_s stops naming rank 0. A rank that dies is reported by mpirun,
 * which ends the others. Logits that are not finite (NaN / Inf weights,
 * overflowing activations) fail the step on rank 0, naming the sequence and
 * position, rather than being sampled. */
#ifndef SPARQ_RUNTIME_DIST_H
#define SPARQ_RUNTIME_DIST_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/model.h"
#include "runtime/dist/transport.h"

typedef struct sq_dist sq_dist;

typedef struct sq_dist_opts {
    double timeout_s; /* deadline of one transfer / one step's reply (default 60 s) */
    bool device_link; /* GPU ranks: hidden states over a device link (default true; SPARQ_DIST_DEVICE_LINK=0: false) */
} sq_dist_opts;

void sq_dist_opts_default(sq_dist_opts *o);

/* Every rank calls this with the same path. mo->node/nodes are set from the
 * transport (rank, size). Load errors of every rank are collected on rank 0:
 * its status names the failing rank(s) and why; the other ranks return
 * SPARQ_E_COMM with *reported = true (rank 0 prints the reason; they should
 * print nothing more). t is borrowed (closed by the caller after
 * sq_dist_close). */
sparq_status sq_dist_open(sq_dist **out, const char *path, const sq_model_opts *mo, const sq_dist_opts *o,
                          sq_transport *t, bool *reported);

/* One process, around a model the caller loaded (and frees after
 * sq_dist_close): for code that holds an sq_model and calls an sq_dist API
 * (sq_eval_run, tests). */
sparq_status sq_dist_wrap(sq_dist **out, sq_model *m);

/* Rank 0: sends shutdown to the other ranks (after completing what is in
 * flight). Every rank: frees the model. Safe with NULL. */
void sq_dist_close(sq_dist *d);

/* End every rank now (after printing why). Does not return with MPI. */
void sq_dist_abort(sq_dist *d, int code);

bool sq_dist_is_leader(const sq_dist *d);
int sq_dist_rank(const sq_dist *d);
int sq_dist_size(const sq_dist *d);
sq_model *sq_dist_model(sq_dist *d); /* this rank's part */
const sq_model_config *sq_dist_cfg(const sq_dist *d);
const sq_model_opts *sq_dist_options(const sq_dist *d);

/* Ranks > 0: run stages until rank 0 shuts the pipeline down. Returns an
 * error (already complete with the rank) if a transfer failed. */
sparq_status sq_dist_serve(sq_dist *d);

/* --- rank 0 ---------------------------------------------------------------- */

/* Submit one step: row r is the next token of sequence seqs[r] (rows of one
 * sequence must be consecutive tokens; rows ≤ max_rows). mode picks the
 * logits written to `logits` when the step completes: none, the last row's,
 * or every row's [rows, vocab]. The buffer must stay valid until then. */
sparq_status sq_dist_submit(sq_dist *d, int rows, const int *seqs, const int32_t *tokens, sq_logits_mode mode,
                            float *logits);

/* One process only (sq_dist_size 1): one decode step, row r the next token
 * of sequence seqs[r] (distinct), that returns a token a row drawn by smp[r]
 * (not accepted) instead of logits: sq_model_decode_sample, so on a device
 * the logits stay there (issue 21). logits: host scratch [rows, vocab].
 * Synchronous. Logits that are not finite fail the step, as above. */
typedef struct sq_sampler sq_sampler;
sparq_status sq_dist_step_sample(sq_dist *d, int rows, const int *seqs, const int32_t *tokens, sq_sampler *const *smp,
                                 float *logits, int32_t *ids);

/* Complete the oldest step in flight (its logits are then in its buffer). */
sparq_status sq_dist_wait(sq_dist *d);

/* Steps in flight. */
int sq_dist_pending(const sq_dist *d);

/* Whole-sequence forward, like sq_model_forward: tokens[0..n) of seq in
 * chunks of max_rows, all chunks in flight at once, then waits. */
sparq_status sq_dist_forward(sq_dist *d, int seq, const int32_t *tokens, int n, sq_logits_mode mode, float *logits);

/* KV-cache bookkeeping on every rank (in order with the steps). */
sparq_status sq_dist_seq_reset(sq_dist *d, int seq);
sparq_status sq_dist_seq_truncate(sq_dist *d, int seq, int n);
int sq_dist_seq_len(const sq_dist *d, int seq);

/* Communication figures of this rank since open: seconds spent waiting in
 * transfers, bytes and messages sent through the transport (host memory),
 * and of the hidden states this rank handed to the next: link_bytes over
 * the device link, staged_bytes in messages (also counted in bytes_sent).
 * With a link staged_bytes stays 0: no hidden state crossed host memory. */
typedef struct sq_dist_stats {
    double t_wait;
    uint64_t bytes_sent, msgs_sent, steps;
    uint64_t link_bytes, staged_bytes;
    /* the expert split: a running hash of every step's final hidden states on
     * this rank (equal on every rank when they agree to the bit); 0 otherwise */
    uint64_t hidden_hash;
} sq_dist_stats;
void sq_dist_get_stats(const sq_dist *d, sq_dist_stats *s);

/* How this run's hidden states cross ranks: "device link (NCCL)", "device
 * link (same process)" or "host memory"; *why (if why is not NULL) is why GPU
 * ranks have no link ("" otherwise: a link, CPU ranks, one rank). */
const char *sq_dist_hidden_path(const sq_dist *d, const char **why);

/* Rank 0: every rank's Engram reads (sq_model_engram_report of its part) in
 * all[0..size): rank 0 completes what is in flight, sends a stats request
 * down the pipeline (in order with the steps) and receives each other rank's
 * figures (tag SQ_TAG_STATS, with the deadline of a step). `sparq run
 * --stats` prints their sum and, with several ranks, one line per rank. */
sparq_status sq_dist_engram_stats(sq_dist *d, sq_model_engram_stats *all);

/* --- the wire (exposed for the fuzz target) ------------------------------------ */

enum {
    SQ_DIST_OP_STEP = 1,
    SQ_DIST_OP_RESET,
    SQ_DIST_OP_TRUNCATE,
    SQ_DIST_OP_SHUTDOWN,
    SQ_DIST_OP_STATS,
    SQ_DIST_OP_ESTEP, /* the expert split: rank 0 -> every rank, a step's rows as tokens */
};

typedef struct sq_dist_msg {
    int op;                  /* SQ_DIST_OP_* */
    uint32_t id;             /* step number */
    int rows;                /* step: rows; ids = seqs[rows] then pos[rows]; hidden = rows × d fp32 (or none:
                                the device link);
                                estep: ids = seqs[rows], pos[rows], then tokens[rows]; hidden NULL */
    sq_logits_mode mode;
    const int32_t *ids;      /* point into the buffer (may be unaligned for int32: read with memcpy) */
    const char *hidden;
    int seq, n;              /* reset / truncate */
} sq_dist_msg;

/* Check a message a stage received from rank src: magic, known operation,
 * exact size for its kind (a step's hidden states: rows × `hidden` floats;
 * hidden 0 when they travel over the device link), rows in 1..max_rows,
 * every row's sequence in [0, n_seq), position ≥ 0 and (estep) token ≥ 0.
 * The message names src and what is wrong. */
sparq_status sq_dist_msg_parse(const void *buf, size_t n, int max_rows, int hidden, int n_seq, int src,
                               sq_dist_msg *out);

#endif
