/* runtime/eval.h — perplexity and divergence from a reference, the scoring
 * `sparq eval` and the golden tests use, and the reference log-prob file.
 *
 * Scoring (exactly what tests/data/<fixture>/golden/golden.json's ppl_ctx512
 * was made with): the token ids of the whole text are cut into windows
 * ids[i*ctx : (i+1)*ctx]; a last partial window is kept if it has ≥ 2 tokens;
 * each window runs alone from position 0 (fresh KV cache); every token but the
 * first of its window is scored by the log-probability the model gave it at the
 * previous position; ppl = exp(Σ NLL / number scored).
 *
 * With a reference (a second model, or a saved log-prob file): per scored
 * position KL(ref ‖ model) = Σ_v p_ref(v) (log p_ref(v) − log p_model(v)),
 * reported as mean, median, p90, p99 and max; top-1 agreement (same argmax);
 * top-5 agreement (the two top-5 lists equal, in order); the reference's own
 * perplexity and ΔPPL = ppl − ppl_ref.
 *
 * Reference log-prob file (".lp", little endian; see docs/cli-eval.md):
 *   0  char[8]  magic "SQREFLP1"
 *   8  u32      version (1)
 *  12  u32      vocab
 *  16  u32      ctx (window length used)
 *  20  u32      dtype of the rows: 1 = fp16, 2 = fp32
 *  24  u64      n_tokens (token ids stored)
 *  32  u64      n_rows (scored positions = rows of log-probs)
 *  40  u64      XXH3-64 of the token ids (int32 LE bytes)
 *  48  u32      compression: 0 = none, 1 = zstd (one stream)
 *  52  u8[12]   zero
 *  64  i32[n_tokens] token ids
 *   …  the rows, window by window, position by position: vocab log-probs each
 *      (fp16 rounds to nearest; −inf and < −65504 are stored as −65504),
 *      zstd-compressed as one stream when compression = 1
 *   …  u64      bytes of rows as stored (after compression)
 *   …  u64      XXH3-64 of the uncompressed rows (the file ends here)
 */
#ifndef SPARQ_RUNTIME_EVAL_H
#define SPARQ_RUNTIME_EVAL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/progress.h"
#include "common/status.h"
#include "runtime/dist/dist.h"
#include "runtime/model.h"

/* Windows of n tokens at ctx: count, and window i's [first, first + len). */
int64_t sq_eval_n_windows(int64_t n_tokens, int ctx);
void sq_eval_window(int64_t n_tokens, int ctx, int64_t i, int64_t *first, int *len);

/* out[v] = log softmax(logits)[v], computed in double. Returns the argmax. */
int sq_eval_log_softmax(const float *logits, int vocab, float *out);

/* KL(p‖q) = Σ exp(lp)(lp − lq) from two log-prob rows. */
double sq_eval_kl(const float *lp, const float *lq, int vocab);

/* The k best ids of a row, descending (ties to the lower id); k ≤ 16. */
void sq_eval_topk(const float *row, int vocab, int k, int *ids);

/* --- reference log-prob files ----------------------------------------------- */

typedef struct sq_reflp_writer sq_reflp_writer;
typedef struct sq_reflp_reader sq_reflp_reader;

/* Create `path` (atomically: under a temporary name until finish). tokens are
 * the ids the rows will follow; fp16: rows stored as fp16 (else fp32). */
sparq_status sq_reflp_create(sq_reflp_writer **out, const char *path, int vocab, int ctx, const int32_t *tokens,
                             int64_t n_tokens, int64_t n_rows, bool fp16);
sparq_status sq_reflp_write_row(sq_reflp_writer *w, const float *lp);
/* Check the row count, write the checksum, rename into place; frees w. */
sparq_status sq_reflp_finish(sq_reflp_writer *w);
/* Discard (no file is left). NULL-safe. */
void sq_reflp_abort(sq_reflp_writer *w);

/* Open and validate the header; tokens are read (sq_reflp_tokens). */
sparq_status sq_reflp_open(sq_reflp_reader **out, const char *path);
int sq_reflp_vocab(const sq_reflp_reader *r);
int sq_reflp_ctx(const sq_reflp_reader *r);
int64_t sq_reflp_rows(const sq_reflp_reader *r);
const int32_t *sq_reflp_tokens(const sq_reflp_reader *r, int64_t *n);
/* Next row (vocab floats). After the last row the checksum is verified
 * (SPARQ_E_CHECKSUM if the rows do not hash to the trailer). */
sparq_status sq_reflp_read_row(sq_reflp_reader *r, float *lp);
void sq_reflp_close(sq_reflp_reader *r);

/* --- the evaluation ----------------------------------------------------------- */

typedef struct sq_eval_opts {
    int ctx;             /* window length (default 512); the models' ctx must be ≥ it */
    int64_t max_windows; /* 0 = all */
} sq_eval_opts;

typedef struct sq_eval_result {
    int64_t n_tokens, n_windows, n_scored;
    double nll_sum, ppl;
    bool has_ref;
    double ref_nll_sum, ref_ppl, dppl;
    double kl_mean, kl_median, kl_p90, kl_p99, kl_max;
    double top1, top5;   /* fractions in [0, 1]; top5: the same five ids in the same order */
    double top5_overlap; /* mean |top5(ref) ∩ top5(model)| / 5, in [0, 1] */
} sq_eval_result;

/* Evaluate `model` on tokens[0..n) (rank 0 of a multi-process run, or one
 * process: sq_dist_wrap). Reference: `ref` (a second model, same
 * vocabulary) or `ref_in` (a log-prob file made on the same tokens and ctx),
 * or neither. `save` (may be NULL) receives the reference's rows — or, with no
 * reference, the model's own, which makes it a reference for later runs.
 * progress (may be NULL, begun by the caller) advances by scored tokens. */
sparq_status sq_eval_run(sq_dist *model, sq_dist *ref, sq_reflp_reader *ref_in, sq_reflp_writer *save,
                         const int32_t *tokens, int64_t n, const sq_eval_opts *opts, sparq_progress *progress,
                         sq_eval_result *res);

/* Rows sq_eval_run will score for these settings (the writer needs it). */
int64_t sq_eval_n_rows(int64_t n_tokens, const sq_eval_opts *opts, int64_t *n_tokens_used);

#endif
