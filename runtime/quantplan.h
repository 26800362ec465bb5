/* runtime/quantplan.h — the what-if of a quantized target: which bits every
 * linear gets (sq_bits_for) and what a checkpoint's tensors would weigh once
 * its linears are EXL3 at those bits (sq_quantplan_tensors), so `sparq plan
 * --bits K` can plan a pack from the native checkpoint (FP8 / FP4 / BF16, or
 * a header-only copy) before anything is quantized.
 *
 * The bit rule is the quantizer's (quantize/layer.c qz_bits_for, held equal
 * to this by tests/runtime/test_quantplan.c): base = floor(bits); with a
 * fraction f = bits - base, layer L gets base + 1 when floor((L+1)·f) >
 * floor(L·f) (an evenly spread share f of the layers); routed experts get the
 * layer's base, attention projections base + 2 and shared / dense MLPs base +
 * 1 unless the policy fixes them (attn_bits, shared_bits), the head head_bits;
 * then the rules (fnmatch on the tensor key, the last match wins); clamped to
 * 1..8.
 *
 * An EXL3 linear of in → out at K bits is stored as exllamav3 lays it out
 * (docs/exl3.md): `.trellis` I16 [in/16, out/16, 16·K] = in·out·K/8 bytes,
 * `.suh` F16 [in], `.svh` F16 [out], `.mul1` I32 scalar:
 *     in·out·K/8 + 2·in + 2·out + 4 bytes.
 * Every other tensor keeps its stored size (the Engram tables, the routers,
 * norms, the embedding, the compressor and indexer projections). */
#ifndef SPARQ_RUNTIME_QUANTPLAN_H
#define SPARQ_RUNTIME_QUANTPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "formats/hfconfig.h"
#include "formats/safetensors.h"
#include "runtime/arch.h"
#include "runtime/memplan.h"

typedef struct sq_bits_rule {
    const char *pattern; /* fnmatch on the tensor key ("layers.2[0-2].ffn.experts.*") */
    int K;
} sq_bits_rule;

typedef struct sq_bits_policy {
    double bits;      /* routed experts, 1..8, fractional allowed */
    int attn_bits;    /* attention projections; 0: base + 2 (the quantizer's default) */
    int shared_bits;  /* shared experts and dense MLPs; 0: base + 1 */
    int head_bits;    /* the output head (6) */
    const sq_bits_rule *rules;
    int n_rules;
} sq_bits_policy;

/* The quantizer's default policy at `bits` (attn / shared from base, head 6, no rules). */
void sq_bits_policy_default(sq_bits_policy *p, double bits);

/* The bits of the linear `key` of layer `layer` (-1: the head) and role. */
int sq_bits_for(const sq_bits_policy *p, const char *key, int layer, sq_lin_role role);

/* Bytes of an EXL3 linear in → out at K bits (the formula above). */
uint64_t sq_exl3_linear_bytes(uint64_t in, uint64_t out, int K);

/* What the target holds, summed by kind (bytes), and how many linears get each K. */
typedef struct sq_quantplan_summary {
    uint64_t experts, attn, shared, head, native, engram_tables, total; /* total: everything but the tables */
    uint64_t linears_at[9];  /* [K] linear instances quantized at K bits */
    double expert_bpw;       /* mean bits per routed-expert weight (trellis only) */
} sq_quantplan_summary;

/* The tensor list of the target: every linear the architecture quantizes
 * (its slots with `quantize`, and the head) replaced by its four EXL3 parts
 * at the policy's bits, whatever it is stored as now (FP8 + scale, FP4 +
 * scale, BF16, EXL3); every other tensor of `sf` as it is. *out (names owned
 * by it, free with sq_quantplan_free) feeds sq_memplan_build. summary may be NULL. */
typedef struct sq_quantplan {
    sq_memplan_tensor *tensors;
    size_t n_tensors;
    char *names;             /* storage of the new tensors' names */
} sq_quantplan;

sparq_status sq_quantplan_tensors(const sq_model_config *cfg, const sf_model *sf, const sq_bits_policy *p,
                                  sq_quantplan *out, sq_quantplan_summary *summary);
void sq_quantplan_free(sq_quantplan *q);

#endif
