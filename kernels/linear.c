/* kernels/linear.c — what every backend shares about an sq_linear's storage:
 * the bytes a pass reads and row views. Backend-independent (kernels/cpu and
 * kernels/cuda both see the same layouts, kernels/backend.h): a dense row is
 * in · element bytes, an FP8 row in bytes, an MXFP4 row in/2 bytes, and the
 * UE8M0 scales form a [ceil(out/block_rows), ceil(in/block_cols)] grid. */
#include "kernels/backend.h"

static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* Bytes of one stored weight row (0 for kinds without plain rows). */
static uint64_t row_bytes(const sq_linear *l)
{
    const uint64_t in = (uint64_t)l->in;
    switch (l->kind) {
    case SQ_LINEAR_F32: return in * 4;
    case SQ_LINEAR_BF16:
    case SQ_LINEAR_F16: return in * 2;
    case SQ_LINEAR_FP8: return in;
    case SQ_LINEAR_MXFP4: return in / 2;
    default: return 0;
    }
}

static bool block_scaled(const sq_linear *l) { return l->kind == SQ_LINEAR_FP8 || l->kind == SQ_LINEAR_MXFP4; }

uint64_t sq_linear_stored_bytes(const sq_linear *l)
{
    uint64_t b = row_bytes(l) * (uint64_t)l->out;
    if (block_scaled(l) && l->block_rows > 0 && l->block_cols > 0)
        b += ceil_div((uint64_t)l->out, (uint64_t)l->block_rows) * ceil_div((uint64_t)l->in, (uint64_t)l->block_cols);
    return b;
}

sparq_status sq_linear_rows_view(const sq_linear *l, int row0, int rows, sq_linear *view)
{
    const char *name = l->name ? l->name : "(unnamed)";
    RETURN_IF(l->forward || !row_bytes(l), SPARQ_E_UNSUPPORTED,
              "linear '%s': a row view of a %s linear is not supported (its rows are not stored one after another)",
              name, sq_linear_kind_name(l->kind));
    RETURN_IF(row0 < 0 || rows < 1 || row0 > l->out - rows, SPARQ_E_RANGE,
              "linear '%s': rows [%d, +%d) are not inside its %d output rows", name, row0, rows, l->out);
    if (block_scaled(l)) {
        const int br = l->block_rows;
        RETURN_IF(br < 1 || l->block_cols < 1 || !l->scale, SPARQ_E_STATE, "linear '%s': %s without its scale blocks",
                  name, sq_linear_kind_name(l->kind));
        RETURN_IF(row0 % br || (rows % br && row0 + rows != l->out), SPARQ_E_ARG,
                  "linear '%s': rows [%d, +%d) cut its %d-row scale blocks (a view must start on a block and end on "
                  "one or at the last row, %d)",
                  name, row0, rows, br, l->out);
    }
    *view = *l;
    view->out = rows;
    view->w = (const char *)l->w + (uint64_t)row0 * row_bytes(l);
    if (l->bias) view->bias = l->bias + row0;
    if (block_scaled(l))
        view->scale = l->scale + (uint64_t)(row0 / l->block_rows) * ceil_div((uint64_t)l->in, (uint64_t)l->block_cols);
    return SPARQ_OK;
}
