/* tests/formats/test_safetensors.c — the safetensors reader, writer and
 * converters: round trips of every dtype, hand-computed conversions and
 * dequantisation, every malformed-input rule with its status and message,
 * sharded directories, and allocation fault injection over sf_open. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "formats/safetensors.h"
#include "t.h"

/* --- helpers ------------------------------------------------------------ */

/* A safetensors image: u64 length, `json`, then data_len bytes 0..255. */
static uint8_t *image(const char *json, size_t data_len, size_t *size)
{
    size_t hl = strlen(json);
    *size = 8 + hl + data_len;
    uint8_t *b = malloc(*size);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (uint8_t)i;
    return b;
}

/* Parse an image and expect status `want` with a message containing `needle`. */
static void expect_bad(const char *json, size_t data_len, sparq_status want, const char *needle)
{
    size_t n;
    uint8_t *b = image(json, data_len, &n);
    sf_model *m = (sf_model *)1;
    sparq_status st = sf_parse_buffer(&m, b, n, "bad.safetensors");
    CHECK_MSG(st == want, "status %d (%s), want %d, for %s", st, sparq_errmsg(), want, json);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(sparq_errmsg(), "bad.safetensors");
    CHECK_STR_CONTAINS(sparq_errmsg(), needle);
    free(b);
}

static char *tmp_file(const char *name)
{
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", t_tmpdir(), name);
    return buf;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* --- dtypes and round trips -------------------------------------------- */

static void test_dtype_names(void)
{
    for (int d = 0; d < SF_DTYPE_COUNT; d++) {
        sf_dtype back;
        CHECK(sf_dtype_parse(sf_dtype_name((sf_dtype)d), &back) && back == (sf_dtype)d);
    }
    sf_dtype x;
    CHECK(!sf_dtype_parse("F7", &x));
    CHECK(sf_dtype_name(SF_DTYPE_COUNT) == NULL);
    CHECK_EQ_INT(sf_dtype_bits(SF_F4), 4);
    CHECK_EQ_INT(sf_dtype_bits(SF_BOOL), 8);
    CHECK_EQ_INT(sf_dtype_bits(SF_BF16), 16);
    CHECK_EQ_INT(sf_dtype_bits(SF_F8_E8M0), 8);
    CHECK_EQ_INT(sf_dtype_bits(SF_I64), 64);
}

static void test_round_trip_every_dtype(void)
{
    const char *path = tmp_file("all.safetensors");
    sf_writer *w;
    CHECK_EQ_INT(sf_writer_create(&w, path), SPARQ_OK);
    uint8_t data[SF_DTYPE_COUNT][3 * 4 * 8];
    for (int d = 0; d < SF_DTYPE_COUNT; d++) {
        const uint64_t shape[2] = {3, 4};
        const uint64_t nbytes = 12 * sf_dtype_bits((sf_dtype)d) / 8;
        for (uint64_t i = 0; i < nbytes; i++) data[d][i] = (uint8_t)(i * 7 + d);
        char name[32];
        snprintf(name, sizeof name, "t.%s", sf_dtype_name((sf_dtype)d));
        /* half by copy, half by reference */
        sparq_status st = (d & 1) ? sf_writer_add_ref(w, name, (sf_dtype)d, 2, shape, data[d], nbytes)
                                  : sf_writer_add(w, name, (sf_dtype)d, 2, shape, data[d], nbytes);
        CHECK_EQ_INT(st, SPARQ_OK);
    }
    const uint64_t scalar_shape[1] = {0};
    const int32_t one = 1;
    CHECK_EQ_INT(sf_writer_add(w, "scalar", SF_I32, 0, scalar_shape, &one, 4), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_add(w, "empty", SF_F32, 1, scalar_shape, NULL, 0), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_set_metadata(w, "format", "pt"), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_set_metadata(w, "quote\"key", "line\nbreak"), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_finish(w), SPARQ_OK);

    /* data starts 4096-aligned; no temporary file left behind */
    FILE *f = fopen(path, "rb");
    uint8_t len[8];
    CHECK(f && fread(len, 1, 8, f) == 8);
    if (f) fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | len[i];
    CHECK_EQ_INT((8 + hl) % 4096, 0);
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(!sparq_path_exists(tmp));

    sf_model *m;
    CHECK_EQ_INT(sf_open(&m, path), SPARQ_OK);
    if (!m) return;
    CHECK_EQ_INT(sf_count(m), SF_DTYPE_COUNT + 2);
    CHECK(!strcmp(sf_metadata(m, "format"), "pt"));
    CHECK(!strcmp(sf_metadata(m, "quote\"key"), "line\nbreak"));
    CHECK(sf_metadata(m, "nope") == NULL);
    for (int d = 0; d < SF_DTYPE_COUNT; d++) {
        char name[32];
        snprintf(name, sizeof name, "t.%s", sf_dtype_name((sf_dtype)d));
        const sf_tensor *t = sf_find(m, name);
        CHECK_MSG(t != NULL, "%s missing", name);
        if (!t) continue;
        CHECK_EQ_INT(t->dtype, d);
        CHECK_EQ_INT(t->ndim, 2);
        CHECK(t->shape[0] == 3 && t->shape[1] == 4);
        CHECK_EQ_INT(t->numel, 12);
        CHECK_EQ_INT(t->nbytes, 12 * sf_dtype_bits((sf_dtype)d) / 8);
        CHECK_MSG(!memcmp(t->data, data[d], t->nbytes), "%s data differs", name);
        CHECK_EQ_INT(t->file, 0);
    }
    const sf_tensor *s = sf_find(m, "scalar");
    CHECK(s && s->ndim == 0 && s->numel == 1 && s->nbytes == 4 && *(const int32_t *)s->data == 1);
    const sf_tensor *e = sf_find(m, "empty");
    CHECK(e && e->numel == 0 && e->nbytes == 0);
    /* sorted by name */
    for (size_t i = 1; i < sf_count(m); i++) CHECK(strcmp(sf_at(m, i - 1)->name, sf_at(m, i)->name) < 0);
    CHECK(sf_at(m, sf_count(m)) == NULL);
    CHECK(!strcmp(sf_file_path(m, 0), path));
    sf_close(m);
}

static void test_writer_rejects(void)
{
    sf_writer *w;
    const uint64_t shape[1] = {3};
    float v[3] = {1, 2, 3};
    CHECK_EQ_INT(sf_writer_create(&w, tmp_file("rej.safetensors")), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_add(w, "a", SF_F32, 1, shape, v, 8), SPARQ_E_SHAPE);
    CHECK_STR_CONTAINS(sparq_errmsg(), "tensor 'a'");
    CHECK_EQ_INT(sf_writer_add(w, "a", SF_F32, 1, shape, v, 12), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_add(w, "a", SF_F32, 1, shape, v, 12), SPARQ_E_ARG);
    CHECK_STR_CONTAINS(sparq_errmsg(), "added twice");
    CHECK_EQ_INT(sf_writer_add(w, "__metadata__", SF_F32, 1, shape, v, 12), SPARQ_E_ARG);
    CHECK_EQ_INT(sf_writer_add(w, "f4", SF_F4, 1, shape, v, 1), SPARQ_E_SHAPE); /* 3 nibbles */
    sf_writer_free(w);
    CHECK(!sparq_path_exists(tmp_file("rej.safetensors")));
}

/* Holes: the tensors between and after real data read as zeros, the file has
 * its full size, and what follows a hole is where the header says. */
static void test_writer_holes(void)
{
    const char *path = tmp_file("holes.safetensors");
    sf_writer *w;
    const uint64_t big[2] = {1024, 1024}, small[1] = {4};
    const float v[4] = {1, 2, 3, 4};
    CHECK_EQ_INT(sf_writer_create(&w, path), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_add_hole(w, "a.hole", SF_BF16, 2, big), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_add(w, "b.data", SF_F32, 1, small, v, 16), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_add_hole(w, "c.hole", SF_F8_E4M3, 2, big), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_add_hole(w, "a.hole", SF_BF16, 2, big), SPARQ_E_ARG);
    CHECK_EQ_INT(sf_writer_finish(w), SPARQ_OK);
    sf_model *m;
    CHECK_EQ_INT(sf_open(&m, path), SPARQ_OK);
    if (!m) return;
    const sf_tensor *a = sf_find(m, "a.hole"), *b = sf_find(m, "b.data"), *c = sf_find(m, "c.hole");
    CHECK(a && b && c);
    if (a && b && c) {
        CHECK_EQ_INT(a->nbytes, 2u << 20);
        CHECK_EQ_INT(c->nbytes, 1u << 20);
        CHECK(!memcmp(b->data, v, 16));
        const uint8_t *pa = a->data, *pc = c->data;
        CHECK(pa[0] == 0 && pa[a->nbytes - 1] == 0 && pc[0] == 0 && pc[c->nbytes - 1] == 0);
    }
    sf_close(m);
}

/* The pieces sf_writer_on_written reports. */
typedef struct pieces {
    const uint8_t *at[16];
    uint64_t n[16];
    int count;
} pieces;

static void note_piece(void *user, const void *p, uint64_t n)
{
    pieces *q = user;
    if (q->count < 16) q->at[q->count] = p, q->n[q->count] = n;
    q->count++;
}

static void test_writer_pieces(void)
{
    const char *path = tmp_file("pieces.safetensors");
    static uint8_t big[300], small[100];
    for (int i = 0; i < 300; i++) big[i] = (uint8_t)(i * 7);
    for (int i = 0; i < 100; i++) small[i] = (uint8_t)(255 - i);
    const uint64_t s300[1] = {300}, s100[1] = {100};
    sf_writer *w;
    pieces q = {0};
    CHECK_EQ_INT(sf_writer_create(&w, path), SPARQ_OK);
    sf_writer_on_written(w, 64, note_piece, &q);
    CHECK_EQ_INT(sf_writer_add_streamed(w, "a.ref", SF_U8, 1, s300, big, 300), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_add(w, "b.copy", SF_U8, 1, s100, small, 100), SPARQ_OK);     /* not streamed: */
    CHECK_EQ_INT(sf_writer_add_ref(w, "c.ref", SF_U8, 1, s100, small, 100), SPARQ_OK);  /* not reported */
    CHECK_EQ_INT(sf_writer_finish(w), SPARQ_OK);
    /* the streamed tensor in order, in pieces of at most 64 bytes: 4 x 64 + 44 */
    CHECK_EQ_INT(q.count, 5);
    for (int i = 0; i < 5 && i < q.count; i++) {
        CHECK(q.at[i] == big + 64 * i);
        CHECK_EQ_INT(q.n[i], i < 4 ? 64 : 44);
    }
    sf_model *m;
    CHECK_EQ_INT(sf_open(&m, path), SPARQ_OK);
    if (!m) return;
    const sf_tensor *a = sf_find(m, "a.ref"), *b = sf_find(m, "b.copy"), *c = sf_find(m, "c.ref");
    CHECK(a && b && c && a->nbytes == 300 && b->nbytes == 100 && !memcmp(a->data, big, 300) &&
          !memcmp(b->data, small, 100) && !memcmp(c->data, small, 100));
    sf_close(m);
}

/* --- overlay ------------------------------------------------------------- */

static void put_u8(sf_writer *w, const char *name, uint64_t n, uint8_t v)
{
    uint8_t b[64];
    memset(b, v, sizeof b);
    const uint64_t sh[1] = {n};
    CHECK_EQ_INT(sf_writer_add(w, name, SF_U8, 1, sh, b, n), SPARQ_OK);
}

static void test_overlay(void)
{
    /* base: a checkpoint as a source has it; top: what a quantize skeleton stores in another form */
    char base[1100], top[1100];
    snprintf(base, sizeof base, "%s", tmp_file("overlay-base.safetensors"));
    snprintf(top, sizeof top, "%s", tmp_file("overlay-top.safetensors"));
    sf_writer *w;
    CHECK_EQ_INT(sf_writer_create(&w, base), SPARQ_OK);
    put_u8(w, "l.w1.weight", 16, 1);          /* FP8 weight + scale: hidden by top's l.w1.trellis */
    put_u8(w, "l.w1.scale", 4, 2);
    put_u8(w, "l.norm.weight", 8, 3);         /* kept */
    put_u8(w, "embed.weight", 16, 4);         /* top stores it dequantised: base's both parts hidden */
    put_u8(w, "embed.scale", 4, 5);
    put_u8(w, "e.gate_up_proj_blocks", 8, 6); /* gpt-oss naming: module e.gate_up_proj */
    put_u8(w, "e.gate_up_proj_scales", 4, 7);
    put_u8(w, "e.gate_up_proj_bias", 4, 8);   /* module e: kept */
    put_u8(w, "t.embed.weight", 32, 9);       /* a table top does not have: kept */
    CHECK_EQ_INT(sf_writer_set_metadata(w, "from", "base"), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_finish(w), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_create(&w, top), SPARQ_OK);
    put_u8(w, "l.w1.trellis", 8, 10);
    put_u8(w, "embed.weight", 64, 11);
    put_u8(w, "e.gate_up_proj.trellis", 8, 12);
    CHECK_EQ_INT(sf_writer_set_metadata(w, "from", "top"), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_finish(w), SPARQ_OK);
    sf_model *m = NULL;
    CHECK_EQ_INT(sf_open_overlay(&m, top, base), SPARQ_OK);
    if (!m) return;
    static const char *const want[] = {"e.gate_up_proj.trellis", "e.gate_up_proj_bias", "embed.weight",
                                       "l.norm.weight", "l.w1.trellis", "t.embed.weight"};
    CHECK_EQ_INT(sf_count(m), 6);
    for (size_t i = 0; i < 6 && i < sf_count(m); i++) CHECK_MSG(!strcmp(sf_at(m, i)->name, want[i]), "%s", sf_at(m, i)->name);
    const sf_tensor *e = sf_find(m, "embed.weight"), *t = sf_find(m, "t.embed.weight"),
                    *nw = sf_find(m, "l.norm.weight");
    CHECK(e && e->nbytes == 64 && ((const uint8_t *)e->data)[63] == 11); /* top's wins */
    CHECK(t && t->nbytes == 32 && ((const uint8_t *)t->data)[0] == 9 && ((const uint8_t *)t->data)[31] == 9);
    CHECK(nw && ((const uint8_t *)nw->data)[7] == 3);
    CHECK_EQ_INT(sf_file_count(m), 2);
    if (t) CHECK_MSG(!strcmp(sf_file_path(m, t->file), base), "%s", sf_file_path(m, t->file));
    if (e) CHECK_MSG(!strcmp(sf_file_path(m, e->file), top), "%s", sf_file_path(m, e->file));
    const char *md = sf_metadata(m, "from");
    CHECK(md && !strcmp(md, "top"));
    sf_close(m);
    CHECK_EQ_INT(sf_open_overlay(&m, top, tmp_file("no-such-base")), SPARQ_E_NOTFOUND);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(sparq_errmsg(), "no-such-base");
    sparq_err_clear();
}

/* --- conversion by hand -------------------------------------------------- */

static void test_scalar_decoders(void)
{
    CHECK(sf_e4m3_to_f32(0x38) == 1.0f);
    CHECK(sf_e4m3_to_f32(0x7E) == 448.0f);
    CHECK(sf_e4m3_to_f32(0x01) == 0.001953125f); /* 2^-9, smallest subnormal */
    CHECK(sf_e4m3_to_f32(0x08) == 0.015625f);    /* 2^-6, smallest normal */
    CHECK(sf_e4m3_to_f32(0xC0) == -2.0f);
    CHECK(sf_e4m3_to_f32(0x3C) == 1.5f);
    CHECK(isnan(sf_e4m3_to_f32(0x7F)) && isnan(sf_e4m3_to_f32(0xFF)));
    CHECK(sf_e5m2_to_f32(0x3C) == 1.0f);
    CHECK(sf_e5m2_to_f32(0x7B) == 57344.0f);
    CHECK(sf_e5m2_to_f32(0x01) == 1.0f / 65536.0f);
    CHECK(isinf(sf_e5m2_to_f32(0x7C)));
    CHECK(sf_e5m2_to_f32(0xC0) == -2.0f);
    CHECK(sf_e8m0_to_f32(127) == 1.0f);
    CHECK(sf_e8m0_to_f32(128) == 2.0f);
    CHECK(sf_e8m0_to_f32(120) == 1.0f / 128);
    CHECK(sf_e8m0_to_f32(0) == ldexpf(1.0f, -127));
    CHECK(sf_e8m0_to_f32(254) == ldexpf(1.0f, 127));
    CHECK(isnan(sf_e8m0_to_f32(255)));
    const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int i = 0; i < 16; i++) CHECK_MSG(sf_e2m1_to_f32((uint8_t)i) == e2m1[i], "nibble %d", i);
}

static sf_tensor mk(const char *name, sf_dtype dt, uint64_t rows, uint64_t cols, const void *data)
{
    sf_tensor t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.dtype = dt;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.numel = rows * cols;
    t.nbytes = t.numel * sf_dtype_bits(dt) / 8;
    t.data = data;
    return t;
}

static void test_to_f32(void)
{
    const uint16_t f16[4] = {0x3C00, 0xC000, 0x3555, 0x0001};
    const uint16_t bf16[4] = {0x3F80, 0xC020, 0x4049, 0x0000};
    const double f64[4] = {-2.5, 1e-3, 3.0, 65504.0};
    const uint8_t e4[4] = {0x38, 0x7E, 0x01, 0xC0};
    const uint8_t e5[4] = {0x3C, 0x7B, 0x01, 0xC0};
    const uint8_t e8[4] = {127, 128, 0, 120};
    const float f32[4] = {1.25f, -7, 0, 3};
    float out[4];
    sf_tensor t = mk("h", SF_F16, 2, 2, f16);
    CHECK_EQ_INT(sf_to_f32(&t, out), SPARQ_OK);
    CHECK(out[0] == 1.0f && out[1] == -2.0f && out[3] == 1.0f / 16777216.0f);
    CHECK_NEAR(out[2], 0.333251953125, 0);
    t = mk("b", SF_BF16, 2, 2, bf16);
    CHECK_EQ_INT(sf_to_f32(&t, out), SPARQ_OK);
    CHECK(out[0] == 1.0f && out[1] == -2.5f && out[2] == 3.140625f && out[3] == 0.0f);
    t = mk("d", SF_F64, 2, 2, f64);
    CHECK_EQ_INT(sf_to_f32(&t, out), SPARQ_OK);
    CHECK(out[0] == -2.5f && out[1] == 1e-3f && out[3] == 65504.0f);
    t = mk("e4", SF_F8_E4M3, 2, 2, e4);
    CHECK_EQ_INT(sf_to_f32(&t, out), SPARQ_OK);
    CHECK(out[0] == 1.0f && out[1] == 448.0f && out[2] == 0.001953125f && out[3] == -2.0f);
    t = mk("e5", SF_F8_E5M2, 2, 2, e5);
    CHECK_EQ_INT(sf_to_f32(&t, out), SPARQ_OK);
    CHECK(out[0] == 1.0f && out[1] == 57344.0f && out[3] == -2.0f);
    t = mk("e8", SF_F8_E8M0, 2, 2, e8);
    CHECK_EQ_INT(sf_to_f32(&t, out), SPARQ_OK);
    CHECK(out[0] == 1.0f && out[1] == 2.0f && out[3] == 1.0f / 128);
    t = mk("f", SF_F32, 2, 2, f32);
    CHECK_EQ_INT(sf_to_f32_range(&t, 1, 2, out), SPARQ_OK);
    CHECK(out[0] == -7.0f && out[1] == 0.0f);
    CHECK_EQ_INT(sf_to_f32_range(&t, 3, 2, out), SPARQ_E_RANGE);
    CHECK_STR_CONTAINS(sparq_errmsg(), "tensor 'f'");
    const int32_t i32[4] = {0};
    t = mk("ints", SF_I32, 2, 2, i32);
    CHECK_EQ_INT(sf_to_f32(&t, out), SPARQ_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(sparq_errmsg(), "tensor 'ints'");
}

/* DeepSeek V3: E4M3 [130, 260] with F32 weight_scale_inv [2, 3] per 128x128. */
/* NaN and Inf counted by their bits, in every float dtype; unaligned data. */
static void test_count_nonfinite(void)
{
    struct {
        sf_dtype dt;
        unsigned size;
        uint64_t bits[6]; /* values as stored, little endian */
        uint64_t nan, inf;
    } cases[] = {
        {SF_F32, 4, {0x3F800000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F7FFFFFu, 0xFF800001u}, 2, 2},
        {SF_F64, 8, {0x7FF0000000000000ull, 0x7FF8000000000000ull, 0x3FF0000000000000ull, 0, 0, 0}, 1, 1},
        {SF_F16, 2, {0x7C00, 0xFC00, 0x7E00, 0x7BFF, 0x3C00, 0x7C01}, 2, 2},
        {SF_BF16, 2, {0x7F80, 0x7FC0, 0xFF81, 0x7F7F, 0x3F80, 0}, 2, 1},
        {SF_F8_E4M3, 1, {0x7F, 0xFF, 0x7E, 0x78, 0, 0x80}, 2, 0},
        {SF_F8_E5M2, 1, {0x7C, 0xFC, 0x7D, 0x7B, 0xFF, 0}, 2, 2},
        {SF_F8_E8M0, 1, {0xFF, 0xFE, 0, 0x7F, 0xFF, 1}, 2, 0},
        {SF_I16, 2, {0xFFFF, 0x7C00, 0x7F80, 0, 0, 0}, 0, 0},
        {SF_F4, 1, {0xFF, 0x77, 0, 0, 0, 0}, 0, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint8_t buf[1 + 6 * 8];
        for (int i = 0; i < 6; i++) memcpy(buf + 1 + i * cases[c].size, &cases[c].bits[i], cases[c].size);
        const uint64_t n = cases[c].dt == SF_F4 ? 12 : 6;
        sf_tensor t = {.name = "t", .dtype = cases[c].dt, .ndim = 1, .shape = {n}, .numel = n, .data = buf + 1};
        uint64_t nan = 99, inf = 99;
        sf_count_nonfinite(&t, &nan, &inf);
        CHECK_MSG(nan == cases[c].nan && inf == cases[c].inf, "%s: %llu NaN, %llu Inf; want %llu, %llu",
                  sf_dtype_name(cases[c].dt), (unsigned long long)nan, (unsigned long long)inf,
                  (unsigned long long)cases[c].nan, (unsigned long long)cases[c].inf);
    }
}

static void test_dequant_fp8_128(void)
{
    enum { O = 130, I = 260 };
    static uint8_t w[O * I];
    static float out[O * I];
    memset(w, 0x38, sizeof w); /* 1.0 */
    w[1 * I + 256] = 0x40;     /* 2.0 */
    w[129 * I + 0] = 0xB8;     /* -1.0 */
    const float sc[6] = {0.5f, 2, 4, 8, 0.25f, 3};
    sf_tensor tw = mk("model.layers.0.mlp.down_proj.weight", SF_F8_E4M3, O, I, w);
    sf_tensor ts = mk("model.layers.0.mlp.down_proj.weight_scale_inv", SF_F32, 2, 3, sc);
    CHECK_EQ_INT(sf_dequant_fp8(&tw, &ts, 128, 128, out), SPARQ_OK);
    CHECK(out[0] == 0.5f);
    CHECK(out[127 * I + 129] == 2.0f);
    CHECK(out[1 * I + 256] == 8.0f); /* 2.0 x 4 */
    CHECK(out[128 * I + 0] == 8.0f);
    CHECK(out[129 * I + 0] == -8.0f);
    CHECK(out[129 * I + 200] == 0.25f);
    CHECK(out[129 * I + 259] == 3.0f);
    /* BF16 scales work the same */
    const uint16_t scb[6] = {0x3F00, 0x4000, 0x4080, 0x4100, 0x3E80, 0x4040};
    sf_tensor tsb = mk("s", SF_BF16, 2, 3, scb);
    CHECK_EQ_INT(sf_dequant_fp8(&tw, &tsb, 128, 128, out), SPARQ_OK);
    CHECK(out[129 * I + 259] == 3.0f && out[1 * I + 256] == 8.0f);
    /* wrong scale shape */
    sf_tensor bad = mk("s", SF_F32, 3, 2, sc);
    CHECK_EQ_INT(sf_dequant_fp8(&tw, &bad, 128, 128, out), SPARQ_E_SHAPE);
    CHECK_STR_CONTAINS(sparq_errmsg(), "down_proj.weight");
    /* NaN code rejected with its position */
    w[5] = 0x7F;
    CHECK_EQ_INT(sf_dequant_fp8(&tw, &ts, 128, 128, out), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "[0, 5]");
    w[5] = 0x38;
    sf_tensor notfp8 = mk("x", SF_BF16, 2, 2, w);
    CHECK_EQ_INT(sf_dequant_fp8(&notfp8, &ts, 128, 128, out), SPARQ_E_SHAPE);
}

/* DeepSeek V4.1: E8M0 32x32 blocks and 1x32 row groups. */
static void test_dequant_fp8_e8m0(void)
{
    enum { O = 40, I = 70 };
    static uint8_t w[O * I];
    static float out[O * I];
    memset(w, 0x38, sizeof w);
    const uint8_t sc[6] = {127, 128, 126, 130, 100, 127}; /* 1, 2, 0.5, 8, 2^-27, 1 */
    sf_tensor tw = mk("layers.3.attn.wq_a.weight", SF_F8_E4M3, O, I, w);
    sf_tensor ts = mk("layers.3.attn.wq_a.scale", SF_F8_E8M0, 2, 3, sc);
    CHECK_EQ_INT(sf_dequant_fp8(&tw, &ts, 32, 32, out), SPARQ_OK);
    CHECK(out[0] == 1.0f && out[31 * I + 32] == 2.0f && out[0 * I + 69] == 0.5f);
    CHECK(out[32 * I + 0] == 8.0f && out[39 * I + 40] == ldexpf(1, -27) && out[39 * I + 69] == 1.0f);
    uint8_t sc255[6] = {127, 127, 255, 127, 127, 127};
    sf_tensor t255 = mk("layers.3.attn.wq_a.scale", SF_F8_E8M0, 2, 3, sc255);
    CHECK_EQ_INT(sf_dequant_fp8(&tw, &t255, 32, 32, out), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "255");
    /* 1x32 groups: [O, ceil(I/32)] = [2, 2] for a [2, 64] weight */
    uint8_t w2[2 * 64];
    memset(w2, 0x40, sizeof w2); /* 2.0 */
    const uint8_t sc2[4] = {127, 129, 125, 128};
    sf_tensor tw2 = mk("w", SF_F8_E4M3, 2, 64, w2), ts2 = mk("w.scale", SF_F8_E8M0, 2, 2, sc2);
    CHECK_EQ_INT(sf_dequant_fp8(&tw2, &ts2, 1, 32, out), SPARQ_OK);
    CHECK(out[0] == 2.0f && out[32] == 8.0f && out[64] == 0.5f && out[127] == 4.0f);
}

static void test_dequant_mxfp4(void)
{
    uint8_t w[2 * 32]; /* [2, 32] bytes = [2, 64] values */
    memset(w, 0x21, sizeof w); /* low nibble 1 (0.5), high nibble 2 (1.0) */
    w[31] = 0xF7;              /* values 62, 63: 6.0, -6.0 */
    w[32] = 0x9C;              /* row 1 values 0, 1: -2.0 (0xC), -0.5 (0x9) */
    const uint8_t sc[4] = {128, 127, 126, 130}; /* 2, 1 / 0.5, 8 */
    float out[128];
    sf_tensor tw = mk("layers.5.ffn.experts.7.w1.weight", SF_I8, 2, 32, w);
    sf_tensor ts = mk("layers.5.ffn.experts.7.w1.scale", SF_F8_E8M0, 2, 2, sc);
    CHECK_EQ_INT(sf_dequant_mxfp4(&tw, &ts, out), SPARQ_OK);
    CHECK(out[0] == 1.0f && out[1] == 2.0f);    /* x2 */
    CHECK(out[32] == 0.5f && out[33] == 1.0f);  /* x1 */
    CHECK(out[62] == 6.0f && out[63] == -6.0f); /* x1 */
    CHECK(out[64] == -1.0f && out[65] == -0.25f); /* -2.0, -0.5 x0.5 */
    CHECK(out[127] == 8.0f);                    /* 1.0 x 8 */
    /* the same bytes as F4 [2, 64] */
    sf_tensor tf4 = mk("f4", SF_F4, 2, 64, w);
    float out2[128];
    CHECK_EQ_INT(sf_dequant_mxfp4(&tf4, &ts, out2), SPARQ_OK);
    CHECK(!memcmp(out, out2, sizeof out));
    sf_tensor bad = mk("s", SF_F8_E8M0, 2, 1, sc);
    CHECK_EQ_INT(sf_dequant_mxfp4(&tw, &bad, out), SPARQ_E_SHAPE);
    CHECK_STR_CONTAINS(sparq_errmsg(), "w1.weight");
    sf_tensor badt = mk("s", SF_F32, 2, 2, sc);
    CHECK_EQ_INT(sf_dequant_mxfp4(&tw, &badt, out), SPARQ_E_SHAPE);
}

/* --- malformed input ----------------------------------------------------- */

static void test_malformed(void)
{
    /* truncated: shorter than the length field */
    sf_model *m;
    const uint8_t five[5] = {1, 0, 0, 0, 0};
    CHECK_EQ_INT(sf_parse_buffer(&m, five, 5, "bad.safetensors"), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "bad.safetensors: truncated");
    /* header length past EOF */
    uint8_t b[32] = {0};
    b[0] = 100;
    b[8] = '{';
    CHECK_EQ_INT(sf_parse_buffer(&m, b, sizeof b, "bad.safetensors"), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "runs past the end");
    /* header > 100 MB (checked before anything is read) */
    const uint64_t huge = 100000001;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(huge >> (8 * i));
    CHECK_EQ_INT(sf_parse_buffer(&m, b, sizeof b, "bad.safetensors"), SPARQ_E_RANGE);
    CHECK_STR_CONTAINS(sparq_errmsg(), "100 MB");

    expect_bad("{\"a\": {\"dtype\": \"F32\"", 0, SPARQ_E_FORMAT, "invalid JSON");
    expect_bad("{not json}", 0, SPARQ_E_FORMAT, "invalid JSON");
    expect_bad(" {}", 0, SPARQ_E_FORMAT, "start with '{'");
    expect_bad("[1, 2]", 0, SPARQ_E_FORMAT, "start with '{'");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               2, SPARQ_E_FORMAT, "duplicate");
    expect_bad("{\"__metadata__\":{\"format\":\"pt\",\"n\":1}}", 0, SPARQ_E_FORMAT, "'n' is not a string");
    expect_bad("{\"__metadata__\":[\"x\"]}", 0, SPARQ_E_FORMAT, "__metadata__");
    expect_bad("{\"w\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, SPARQ_E_UNSUPPORTED,
               "tensor 'w': unknown dtype 'F7'");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,10]}}", 10, SPARQ_E_FORMAT,
               "tensor 'w': data_offsets [0, 10) hold 10 bytes but F32 with 3 elements needs 12");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, SPARQ_E_FORMAT, "tensor 'b': data_offsets [4, 12) overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
               12, SPARQ_E_FORMAT, "tensor 'b': hole in the data buffer: bytes [4, 8)");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, SPARQ_E_FORMAT,
               "tensor 'a': hole");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6, SPARQ_E_FORMAT,
               "2 bytes after the last tensor");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, SPARQ_E_FORMAT,
               "tensor 'a': truncated");
    /* offset overflow: shape product, and offsets near 2^63 */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}", 4,
               SPARQ_E_RANGE, "tensor 'a': size of F32 shape overflows");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[9223372036854775803,9223372036854775807]}}",
               4, SPARQ_E_FORMAT, "tensor 'a'");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}", 1,
               SPARQ_E_FORMAT, "invalid JSON");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, SPARQ_E_FORMAT,
               "tensor 'a': shape[0]");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,1]}}", 1, SPARQ_E_FORMAT,
               "end before begin");
    expect_bad("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", 1, SPARQ_E_FORMAT,
               "not a whole number of bytes");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
               SPARQ_E_UNSUPPORTED, "dimensions");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, SPARQ_E_FORMAT, "data_offsets");

    /* valid: header padded with spaces, zero-size tensors, odd (unaligned) data start */
    size_t n;
    uint8_t *ok = image("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,8]}}   ",
                        8, &n);
    CHECK_EQ_INT(sf_parse_buffer(&m, ok, n, "ok.safetensors"), SPARQ_OK);
    if (m) {
        CHECK_EQ_INT(sf_count(m), 2);
        CHECK(!strcmp(sf_at(m, 0)->name, "a"));
        const sf_tensor *t = sf_find(m, "b");
        CHECK(t && t->data == ok + n - 8);
        sf_close(m);
    }
    free(ok);
}

static void test_truncated_file(void)
{
    const char *path = tmp_file("trunc.safetensors");
    sf_writer *w;
    float v[64] = {0};
    const uint64_t shape[1] = {64};
    CHECK_EQ_INT(sf_writer_create(&w, path), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_add(w, "model.norm.weight", SF_F32, 1, shape, v, sizeof v), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_finish(w), SPARQ_OK);
    struct stat st;
    CHECK(stat(path, &st) == 0);
    CHECK(truncate(path, st.st_size - 1) == 0);
    sf_model *m;
    CHECK_EQ_INT(sf_open(&m, path), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), path);
    CHECK_STR_CONTAINS(sparq_errmsg(), "tensor 'model.norm.weight': truncated");
    CHECK(truncate(path, 4) == 0);
    CHECK_EQ_INT(sf_open(&m, path), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "truncated");
    CHECK_EQ_INT(sf_open(&m, tmp_file("no-such.safetensors")), SPARQ_E_NOTFOUND);
    CHECK_STR_CONTAINS(sparq_errmsg(), "no-such.safetensors");
}

/* --- sharded directories ------------------------------------------------- */

static void write_shard(const char *dir, const char *file, const char *const *names, int n, float base)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    sf_writer *w;
    CHECK_EQ_INT(sf_writer_create(&w, path), SPARQ_OK);
    for (int i = 0; i < n; i++) {
        const float v[2] = {base + (float)i, -1};
        const uint64_t shape[1] = {2};
        CHECK_EQ_INT(sf_writer_add(w, names[i], SF_F32, 1, shape, v, sizeof v), SPARQ_OK);
    }
    CHECK_EQ_INT(sf_writer_set_metadata(w, "format", file), SPARQ_OK);
    CHECK_EQ_INT(sf_writer_finish(w), SPARQ_OK);
}

static const char *make_sharded(const char *sub, const char *index_json)
{
    static char dir[1100];
    snprintf(dir, sizeof dir, "%s/%s", t_tmpdir(), sub);
    mkdir(dir, 0755);
    const char *s1[] = {"model.embed_tokens.weight", "model.layers.0.mlp.gate.weight"};
    const char *s2[] = {"model.norm.weight"};
    write_shard(dir, "model-00001-of-00002.safetensors", s1, 2, 10);
    write_shard(dir, "model-00002-of-00002.safetensors", s2, 1, 20);
    char ip[1200];
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", dir);
    if (index_json) write_text(ip, index_json);
    return dir;
}

static void test_sharded(void)
{
    const char *good = "{\"metadata\":{\"total_size\":24},\"weight_map\":{"
                       "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                       "\"model.layers.0.mlp.gate.weight\":\"model-00001-of-00002.safetensors\","
                       "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"}}";
    const char *dir = make_sharded("sharded", good);
    sf_model *m;
    CHECK_EQ_INT(sf_open(&m, dir), SPARQ_OK);
    if (m) {
        CHECK_EQ_INT(sf_count(m), 3);
        CHECK_EQ_INT(sf_file_count(m), 2);
        const sf_tensor *t = sf_find(m, "model.norm.weight");
        CHECK(t && t->file == 1 && ((const float *)t->data)[0] == 20.0f);
        CHECK_STR_CONTAINS(sf_file_path(m, t ? t->file : 0), "model-00002-of-00002.safetensors");
        t = sf_find(m, "model.layers.0.mlp.gate.weight");
        float v[2];
        CHECK(t && sf_to_f32(t, v) == SPARQ_OK && v[0] == 11.0f && v[1] == -1.0f);
        CHECK(!strcmp(sf_metadata(m, "format"), "model-00001-of-00002.safetensors"));
        sf_close(m);
    }

    /* a shard named in the index is missing */
    dir = make_sharded("missing", "{\"weight_map\":{"
                                  "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                                  "\"model.layers.0.mlp.gate.weight\":\"model-00001-of-00002.safetensors\","
                                  "\"model.norm.weight\":\"model-00002-of-00002.safetensors\","
                                  "\"lm_head.weight\":\"model-00003-of-00003.safetensors\"}}");
    CHECK_EQ_INT(sf_open(&m, dir), SPARQ_E_NOTFOUND);
    CHECK_STR_CONTAINS(sparq_errmsg(), "model.safetensors.index.json: shard 'model-00003-of-00003.safetensors'");
    CHECK_STR_CONTAINS(sparq_errmsg(), "lm_head.weight");

    /* the index maps a tensor to a shard that does not hold it */
    dir = make_sharded("wrongmap", "{\"weight_map\":{"
                                   "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                                   "\"model.layers.0.mlp.gate.weight\":\"model-00001-of-00002.safetensors\","
                                   "\"model.norm.weight\":\"model-00001-of-00002.safetensors\"}}");
    CHECK_EQ_INT(sf_open(&m, dir), SPARQ_E_NOTFOUND);
    CHECK_STR_CONTAINS(sparq_errmsg(), "tensor 'model.norm.weight' is mapped to");

    /* a shard holds a tensor the index does not map to it */
    dir = make_sharded("unmapped", "{\"weight_map\":{"
                                   "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                                   "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"}}");
    CHECK_EQ_INT(sf_open(&m, dir), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "tensor 'model.layers.0.mlp.gate.weight' is not mapped");

    dir = make_sharded("badindex", "{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}");
    CHECK_EQ_INT(sf_open(&m, dir), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "duplicate");
    dir = make_sharded("escape", "{\"weight_map\":{\"a\":\"../x.safetensors\"}}");
    CHECK_EQ_INT(sf_open(&m, dir), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "not a file in the model directory");

    /* no index and two files: ambiguous */
    dir = make_sharded("noindex", NULL);
    CHECK_EQ_INT(sf_open(&m, dir), SPARQ_E_FORMAT);
    CHECK_STR_CONTAINS(sparq_errmsg(), "no model.safetensors.index.json");

    /* no index and one file: that file */
    char one[1200];
    snprintf(one, sizeof one, "%s/single", t_tmpdir());
    mkdir(one, 0755);
    const char *names[] = {"x"};
    write_shard(one, "model.safetensors", names, 1, 5);
    CHECK_EQ_INT(sf_open(&m, one), SPARQ_OK);
    if (m) {
        CHECK(sf_count(m) == 1 && sf_find(m, "x"));
        sf_close(m);
    }
}

/* --- fault injection ----------------------------------------------------- */

/* Fail the nth allocation of sf_open, for every n until it succeeds: every
 * failure must be a clean status (ASan in the fuzz build checks leaks). */
static void fault_sweep(const char *path, int expect_tensors)
{
    int failures = 0, n;
    for (n = 1; n < 5000; n++) {
        sf_model *m = NULL;
        sparq_alloc_fail_at((uint64_t)n, false);
        sparq_status st = sf_open(&m, path);
        sparq_alloc_fail_at(0, false);
        if (st == SPARQ_OK) {
            CHECK(m != NULL && (int)sf_count(m) == expect_tensors);
            sf_close(m);
            break;
        }
        CHECK(m == NULL);
        CHECK_MSG(st == SPARQ_E_NOMEM || st == SPARQ_E_FORMAT, "n=%d status %d: %s", n, st, sparq_errmsg());
        failures++;
    }
    CHECK_MSG(failures > 5, "only %d allocation points in sf_open(%s)", failures, path);
    /* sticky: every allocation from the nth on fails */
    for (int k = 1; k < n; k += 3) {
        sf_model *m = NULL;
        sparq_alloc_fail_at((uint64_t)k, true);
        sparq_status st = sf_open(&m, path);
        sparq_alloc_fail_at(0, false);
        CHECK(st != SPARQ_OK && m == NULL);
    }
}

static void test_fault_injection(void)
{
    fault_sweep(tmp_file("all.safetensors"), SF_DTYPE_COUNT + 2);
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/sharded", t_tmpdir());
    fault_sweep(dir, 3);
    /* the writer too */
    for (int n = 1; n < 200; n++) {
        sf_writer *w = NULL;
        float v[4] = {1, 2, 3, 4};
        const uint64_t shape[1] = {4};
        sparq_alloc_fail_at((uint64_t)n, false);
        sparq_status st = sf_writer_create(&w, tmp_file("fault.safetensors"));
        if (st == SPARQ_OK) st = sf_writer_add(w, "a", SF_F32, 1, shape, v, sizeof v);
        if (st == SPARQ_OK) st = sf_writer_set_metadata(w, "k", "v");
        if (st == SPARQ_OK) {
            st = sf_writer_finish(w);
            w = NULL;
        }
        sparq_alloc_fail_at(0, false);
        sf_writer_free(w);
        if (st == SPARQ_OK) break;
        CHECK_EQ_INT(st, SPARQ_E_NOMEM);
    }
}

int main(void)
{
    RUN(test_dtype_names);
    RUN(test_round_trip_every_dtype);
    RUN(test_writer_rejects);
    RUN(test_writer_holes);
    RUN(test_writer_pieces);
    RUN(test_overlay);
    RUN(test_scalar_decoders);
    RUN(test_to_f32);
    RUN(test_count_nonfinite);
    RUN(test_dequant_fp8_128);
    RUN(test_dequant_fp8_e8m0);
    RUN(test_dequant_mxfp4);
    RUN(test_malformed);
    RUN(test_truncated_file);
    RUN(test_sharded);
    RUN(test_fault_injection);
    return t_summary();
}
