/* tests/mpi/test_transport.c — the MPI transport (runtime/dist/transport.h),
 * run as `mpirun -np 3 test_mpi_transport` (tests/mpi/meson.build):
 *  - rank 0's 128-byte id (the NCCL seam, with a test id maker) reaches every
 *    rank intact, and a maker that fails on rank 0 fails every rank;
 *  - messages of one tag between two ranks arrive in order, sizes reported;
 *  - a receive nobody answers times out with a message naming the peer, and
 *    does not hang;
 *  - find_silent() finds nobody silent while every rank waits in recv;
 *  - gather and bcast move the right bytes;
 *  - allgather gives every rank every rank's piece in rank order, many times
 *    in a row (pieces of successive calls never mix), and a rank that does
 *    not take part makes the others' allgather time out naming it. */
#include <string.h>

#include "common/progress.h"
#include "runtime/dist/transport.h"
#include "t.h"

static sparq_status make_id(uint8_t id[128])
{
    for (int i = 0; i < 128; i++) id[i] = (uint8_t)(i * 7 + 3);
    return SPARQ_OK;
}
static sparq_status make_id_fail(uint8_t id[128])
{
    (void)id;
    return sparq_err(SPARQ_E_COMM, "test: no id today");
}

int main(void)
{
    sq_transport *t = NULL;
    if (sq_transport_mpi(&t) != SPARQ_OK) {
        fprintf(stderr, "SKIP: %s\n", sparq_errmsg());
        return 77;
    }
    const int me = t->rank, n = t->size;
    CHECK(n >= 2);

    uint8_t id[128], want[128];
    memset(id, 0xEE, sizeof id);
    make_id(want);
    CHECK(sq_transport_share_id(t, id, make_id) == SPARQ_OK);
    CHECK(memcmp(id, want, 128) == 0);
    CHECK(sq_transport_share_id(t, id, make_id_fail) == SPARQ_E_COMM);

    /* gather: rank r sends r*10 */
    int32_t mine = me * 10, all[16] = {0};
    CHECK(t->vt->gather(t, &mine, sizeof mine, all) == SPARQ_OK);
    if (me == 0)
        for (int r = 0; r < n && r < 16; r++) CHECK_EQ_INT(all[r], r * 10);

    /* ordered messages 0 -> 1, sizes 1..64 bytes, through two slots */
    if (me == 0) {
        static uint8_t msg[2][64];
        for (int k = 0; k < 64; k++) {
            const int slot = k & 1;
            CHECK(t->vt->wait_send(t, slot, 10) == SPARQ_OK);
            memset(msg[slot], k, sizeof msg[slot]);
            CHECK(t->vt->isend(t, 1, SQ_TAG_STEP, msg[slot], (size_t)k + 1, slot) == SPARQ_OK);
        }
        CHECK(t->vt->wait_send(t, 0, 10) == SPARQ_OK && t->vt->wait_send(t, 1, 10) == SPARQ_OK);
    } else if (me == 1) {
        for (int k = 0; k < 64; k++) {
            uint8_t buf[64];
            size_t got = 0;
            CHECK(t->vt->recv(t, 0, SQ_TAG_STEP, buf, sizeof buf, &got, 10) == SPARQ_OK);
            CHECK_EQ_INT(got, k + 1);
            CHECK_EQ_INT(buf[0], k);
        }
    }

    /* rank 1 waits for a message rank 0 never sends: a timeout naming rank 0 */
    if (me == 1) {
        uint8_t b[4];
        size_t got;
        double t0 = sparq_now();
        CHECK(t->vt->recv(t, 0, SQ_TAG_RESULT, b, sizeof b, &got, 0.3) == SPARQ_E_TIMEOUT);
        CHECK(strstr(sparq_errmsg(), "rank 0") != NULL);
        CHECK(sparq_now() - t0 < 5);
    }

    /* every rank > 0 waits (answering pings) while rank 0 asks who is silent */
    if (me == 0) {
        CHECK_EQ_INT(t->vt->find_silent(t, 5.0), -1);
        for (int r = 1; r < n; r++) CHECK(t->vt->isend(t, r, SQ_TAG_INIT, &mine, sizeof mine, 2 + r % 8) == SPARQ_OK);
        for (int r = 1; r < n; r++) CHECK(t->vt->wait_send(t, 2 + r % 8, 10) == SPARQ_OK);
    } else {
        int32_t v;
        size_t got;
        CHECK(t->vt->recv(t, 0, SQ_TAG_INIT, &v, sizeof v, &got, 30) == SPARQ_OK);
        CHECK_EQ_INT(v, 0);
    }

    int32_t word = me == 0 ? 4242 : 0;
    CHECK(t->vt->bcast(t, 0, &word, sizeof word) == SPARQ_OK);
    CHECK_EQ_INT(word, 4242);

    /* allgather: 50 rounds of 1000 ints, rank r's piece r*1e6 + round*1000 + i */
    enum { AG = 1000 };
    static int32_t piece[AG], every[16 * AG];
    int bad = 0;
    for (int k = 0; k < 50 && n <= 16; k++) {
        for (int i = 0; i < AG; i++) piece[i] = me * 1000000 + k * 1000 + i;
        CHECK(t->vt->allgather(t, piece, sizeof piece, every, 30) == SPARQ_OK);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < AG; i++) bad += every[r * AG + i] != r * 1000000 + k * 1000 + i;
    }
    CHECK_EQ_INT(bad, 0);
    /* the last rank sits this one out: the others time out naming it */
    if (me != n - 1) {
        const double t0 = sparq_now();
        CHECK(t->vt->allgather(t, piece, sizeof piece, every, 0.5) == SPARQ_E_TIMEOUT);
        char want[64];
        snprintf(want, sizeof want, "nothing from rank %d", n - 1);
        CHECK_MSG(strstr(sparq_errmsg(), want) != NULL, "%s", sparq_errmsg());
        CHECK(sparq_now() - t0 < 5);
    }
    CHECK(t->vt->bcast(t, 0, &word, sizeof word) == SPARQ_OK); /* everyone past it */

    sq_transport_close(t);
    return t_summary();
}
