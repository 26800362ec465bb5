/* tests/fuzz/fuzz_manifest.c — libFuzzer target for the bundle manifest
 * parser (sq_manifest_parse). An accepted manifest must describe nodes that
 * tile the layers and files whose block lists match their sizes. */
#include <stddef.h>
#include <stdint.h>

#include "formats/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sq_manifest m;
    if (sq_manifest_parse(&m, (const char *)data, size, "fuzz/manifest.json") == SPARQ_OK) {
        int64_t next = 0;
        for (int k = 0; k < m.boxes; k++) {
            if (m.nodes[k].first_layer != next || m.nodes[k].n_layers < 1) __builtin_trap();
            next += m.nodes[k].n_layers;
        }
        for (size_t i = 0; i < m.n_files; i++) {
            const sq_manifest_file *f = &m.files[i];
            if (f->n_blocks != f->size / m.block_size + (f->size % m.block_size != 0)) __builtin_trap();
            if (sq_manifest_find(&m, f->path) != f) __builtin_trap();
        }
    }
    sq_manifest_free(&m);
    return 0;
}
