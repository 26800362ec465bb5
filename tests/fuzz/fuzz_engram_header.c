/* tests/fuzz/fuzz_engram_header.c — libFuzzer target for the Engram table
 * header parser (sq_engram_header_parse). Input: 8 bytes little-endian file
 * size, then the header bytes. An accepted header must place every column
 * inside the data region, without overlap, in order, and its token map must
 * only hold compressed ids below n_compressed. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/engram.h"
#define XXH_INLINE_ALL
#include <xxhash.h>

/* The header ends with its own XXH3-64, which random mutations never get
 * right: fix it up (when the claimed header size fits the input) so the
 * fuzzer exercises every check behind it. Inputs whose size prefix has its
 * top bit set keep their checksum as given, so the mismatch path stays
 * covered. */
static void fix_checksum(uint8_t *h, size_t len)
{
    if (len < 16) return;
    uint32_t hb = (uint32_t)h[12] | (uint32_t)h[13] << 8 | (uint32_t)h[14] << 16 | (uint32_t)h[15] << 24;
    if (hb < 16 || hb > len) return;
    uint64_t x = XXH3_64bits(h, hb - 8);
    for (int i = 0; i < 8; i++) h[hb - 8 + i] = (uint8_t)(x >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8) return 0;
    uint64_t file_size = 0;
    for (int i = 7; i >= 0; i--) file_size = file_size << 8 | data[i];
    uint8_t *copy = malloc(size - 8 ? size - 8 : 1);
    if (!copy) return 0;
    memcpy(copy, data + 8, size - 8);
    if (!(data[7] & 0x80)) fix_checksum(copy, size - 8);
    sq_engram_header h;
    sparq_status st = sq_engram_header_parse(&h, copy, size - 8, file_size, "fuzz/engram.bin");
    free(copy);
    if (st == SPARQ_OK) {
        uint64_t at = h.data_offset;
        for (uint32_t l = 0; l < h.layout.n_layers; l++)
            for (uint32_t c = 0; c < h.layout.n_columns; c++) {
                if (h.file_offset[l][c] != at) __builtin_trap();
                at += h.layout.primes[l][c] * h.layout.row_bytes;
            }
        if (at != h.data_offset + h.data_bytes || at > file_size) __builtin_trap();
        const size_t map_at = SQ_ENGRAM_FIXED_BYTES + 40u * h.layout.n_layers + 24u * h.layout.n_layers * h.layout.n_columns;
        if (map_at + 4ull * h.layout.n_tokens + 8 > h.header_bytes) __builtin_trap();
        for (uint32_t i = 0; i < h.layout.n_tokens; i++) {
            const uint8_t *q = data + 8 + map_at + 4 * (size_t)i;
            const uint32_t v = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
            if (v >= h.layout.n_compressed) __builtin_trap();
        }
    }
    return 0;
}
