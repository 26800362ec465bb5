/* tests/fuzz/fuzz_dist_msg.c — libFuzzer target for the pipeline wire
 * (sq_dist_msg_parse, runtime/dist/dist.h): what a rank accepts from its
 * predecessor (or, the expert split, from rank 0). An accepted step must have
 * exactly the size its rows imply, ids in range, and the hidden states (an
 * expert-split step: the tokens) inside the buffer. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "runtime/dist/dist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    enum { MAX_ROWS = 8, HIDDEN = 4, N_SEQ = 3 };
    sq_dist_msg m;
    if (sq_dist_msg_parse(data, size, MAX_ROWS, HIDDEN, N_SEQ, 1, &m) != SPARQ_OK) return 0;
    if (m.op == SQ_DIST_OP_STEP) {
        if (m.rows < 1 || m.rows > MAX_ROWS) __builtin_trap();
        if (size != 32 + (size_t)m.rows * 8 + (size_t)m.rows * HIDDEN * 4) __builtin_trap();
        for (int r = 0; r < m.rows; r++) {
            int32_t s, p;
            memcpy(&s, m.ids + r, 4);
            memcpy(&p, m.ids + m.rows + r, 4);
            if (s < 0 || s >= N_SEQ || p < 0) __builtin_trap();
        }
        volatile float sink = 0;
        for (int i = 0; i < m.rows * HIDDEN; i++) {
            float f;
            memcpy(&f, m.hidden + 4 * i, 4);
            sink += f;
        }
        (void)sink;
    } else if (m.op == SQ_DIST_OP_ESTEP) {
        if (m.rows < 1 || m.rows > MAX_ROWS || m.hidden) __builtin_trap();
        if (size != 32 + (size_t)m.rows * 12) __builtin_trap();
        for (int r = 0; r < m.rows; r++) {
            int32_t s, p, k;
            memcpy(&s, m.ids + r, 4);
            memcpy(&p, m.ids + m.rows + r, 4);
            memcpy(&k, m.ids + 2 * m.rows + r, 4);
            if (s < 0 || s >= N_SEQ || p < 0 || k < 0) __builtin_trap();
        }
    } else if (size != 32) {
        __builtin_trap();
    }
    return 0;
}
