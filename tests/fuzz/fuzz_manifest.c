/* tests/fuzz/fuzz_manifest.c — libFuzzer target for the bundle manifest
 * parser (sq_manifest_parse). An accepted manifest must describe nodes that
 * tile the layers (a pipeline) or all hold the same layers and an expert set
 * of their own (the expert split), and files whose block lists match their
 * sizes. */
#include <stddef.h>
#include <stdint.h>

#include "formats/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sq_manifest m;
    if (sq_manifest_parse(&m, (const char *)data, size, "fuzz/manifest.json") == SPARQ_OK) {
        int64_t next = 0;
        const bool experts = m.split == SQ_MANIFEST_SPLIT_EXPERTS;
        if (experts != (m.format_version == SQ_MANIFEST_VERSION_EXPERTS)) __builtin_trap();
        for (int k = 0; k < m.boxes; k++) {
            const sq_manifest_node *nd = &m.nodes[k];
            if (nd->n_layers < 1) __builtin_trap();
            if (experts) {
                if (nd->first_layer != 0 || nd->n_layers != m.nodes[0].n_layers || nd->n_expert_set < 1 ||
                    nd->expert_set_max % m.boxes != k)
                    __builtin_trap();
                continue;
            }
            if (nd->first_layer != next || nd->n_expert_set != 0) __builtin_trap();
            next += nd->n_layers;
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
