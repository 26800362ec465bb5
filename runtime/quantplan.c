/* runtime/quantplan.c — bits per linear and the tensors of a quantized target
 * (quantplan.h has the rule and the byte formula). */
#include "runtime/quantplan.h"

#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

#define ADD sparq_sat_add_u64

void sq_bits_policy_default(sq_bits_policy *p, double bits)
{
    memset(p, 0, sizeof *p);
    p->bits = bits;
    p->head_bits = 6;
}

int sq_bits_for(const sq_bits_policy *p, const char *key, int layer, sq_lin_role role)
{
    int base = (int)floor(p->bits + 1e-9);
    const double frac = p->bits - base;
    if (frac > 1e-9 && layer >= 0 && floor((layer + 1) * frac + 1e-9) > floor(layer * frac + 1e-9)) base++;
    int K;
    if (layer < 0) K = p->head_bits;
    else if (role == SQ_ROLE_EXPERT) K = base;
    else if (role == SQ_ROLE_ATTN) K = p->attn_bits ? p->attn_bits : base + 2;
    else K = p->shared_bits ? p->shared_bits : base + 1;
    for (int r = 0; r < p->n_rules; r++)
        if (fnmatch(p->rules[r].pattern, key, 0) == 0) K = p->rules[r].K;
    return K < 1 ? 1 : K > 8 ? 8 : K;
}

uint64_t sq_exl3_linear_bytes(uint64_t in, uint64_t out, int K)
{
    const uint64_t tr = sparq_sat_mul_u64(sparq_sat_mul_u64(in, out), (uint64_t)K) / 8;
    return ADD(ADD(tr, 2 * in), ADD(2 * out, 4));
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* One quantized linear of the target. */
typedef struct qlin {
    const char *key;
    uint64_t in, out;
    int K, layer;
    sq_lin_role role; /* SQ_ROLE_COUNT_ for the head */
} qlin;

static const char *const parts[4] = {".trellis", ".suh", ".svh", ".mul1"};

/* Walk every quantized linear instance (and the head when present): count
 * them and the bytes their names need (pass NULL lins), or fill lins/names. */
static sparq_status walk(const sq_model_config *cfg, const sf_model *sf, const sq_bits_policy *p, qlin *lins,
                         char *names, size_t *n_lins, size_t *n_chars)
{
    const sq_arch_info *a = sq_arch_of(cfg);
    RETURN_IF(!a, SPARQ_E_UNSUPPORTED, "plan: no architecture for model_type '%s'", cfg->model_type);
    size_t nl = 0, nc = 0;
    char key[256];
    sq_layer_desc d;
    for (int L = 0; L < (int)cfg->num_hidden_layers; L++) {
        FORWARD_IF(sq_arch_layer(cfg, L, &d));
        for (int s = 0; s < d.n_slots; s++) {
            const sq_lin_desc *lin = &d.slot[s];
            if (!lin->quantize) continue;
            for (int e = 0; e < lin->instances; e++) {
                FORWARD_IF(sq_lin_key(lin, L, e, key, sizeof key));
                const size_t kl = strlen(key);
                if (lins) {
                    char *at = names + nc;
                    memcpy(at, key, kl + 1);
                    lins[nl] = (qlin){at, (uint64_t)lin->in, (uint64_t)lin->out,
                                      sq_bits_for(p, key, L, lin->role), L, lin->role};
                }
                nl++;
                nc += 5 * kl + 26; /* the key and its four parts (.trellis .suh .svh .mul1), NUL-terminated */
            }
        }
    }
    /* the head, when the checkpoint has its own (a tied head has none) */
    snprintf(key, sizeof key, "%s.weight", a->head_key);
    char alt[256];
    snprintf(alt, sizeof alt, "%s.trellis", a->head_key);
    const sf_tensor *h = sf_find(sf, key);
    if (h || sf_find(sf, alt)) {
        const size_t kl = strlen(a->head_key);
        if (lins) {
            char *at = names + nc;
            memcpy(at, a->head_key, kl + 1);
            lins[nl] = (qlin){at, (uint64_t)cfg->hidden_size, (uint64_t)cfg->vocab_size,
                              sq_bits_for(p, a->head_key, -1, SQ_ROLE_COUNT_), -1, SQ_ROLE_COUNT_};
        }
        nl++;
        nc += 5 * kl + 26;
    }
    *n_lins = nl;
    *n_chars = nc;
    return SPARQ_OK;
}

sparq_status sq_quantplan_tensors(const sq_model_config *cfg, const sf_model *sf, const sq_bits_policy *p,
                                  sq_quantplan *out, sq_quantplan_summary *summary)
{
    memset(out, 0, sizeof *out);
    sq_quantplan_summary sm;
    memset(&sm, 0, sizeof sm);
    RETURN_IF(!(p->bits >= 1 && p->bits <= 8), SPARQ_E_ARG, "--bits %g is not in 1..8", p->bits);
    size_t nl = 0, nc = 0;
    FORWARD_IF(walk(cfg, sf, p, NULL, NULL, &nl, &nc));
    qlin *lins = sparq_calloc(nl ? nl : 1, sizeof *lins);
    const char **keys = sparq_calloc(nl ? nl : 1, sizeof *keys);
    out->names = sparq_malloc(nc ? nc : 1);
    const size_t nsf = sf_count(sf);
    out->tensors = sparq_calloc(4 * nl + nsf + 1, sizeof *out->tensors);
    sparq_status st = lins && keys && out->names && out->tensors ? SPARQ_OK
                                                                   : sparq_err(SPARQ_E_NOMEM, "plan: out of memory");
    if (st == SPARQ_OK) st = walk(cfg, sf, p, lins, out->names, &nl, &nc);
    double ew = 0, ebits = 0;
    size_t n = 0;
    for (size_t i = 0; st == SPARQ_OK && i < nl; i++) {
        const qlin *q = &lins[i];
        keys[i] = q->key;
        /* the four parts' names follow the key in the names buffer */
        char *at = (char *)q->key + strlen(q->key) + 1;
        const uint64_t bytes[4] = {sparq_sat_mul_u64(q->in * q->out, (uint64_t)q->K) / 8, 2 * q->in, 2 * q->out, 4};
        for (int k = 0; k < 4; k++) {
            const size_t len = (size_t)sprintf(at, "%s%s", q->key, parts[k]);
            out->tensors[n++] = (sq_memplan_tensor){at, bytes[k]};
            at += len + 1;
        }
        const uint64_t b = sq_exl3_linear_bytes(q->in, q->out, q->K);
        sm.linears_at[q->K]++;
        switch (q->role) {
        case SQ_ROLE_EXPERT:
            sm.experts = ADD(sm.experts, b);
            ew += (double)q->in * (double)q->out;
            ebits += (double)q->in * (double)q->out * q->K;
            break;
        case SQ_ROLE_ATTN: sm.attn = ADD(sm.attn, b); break;
        case SQ_ROLE_COUNT_: sm.head = ADD(sm.head, b); break;
        default: sm.shared = ADD(sm.shared, b); break;
        }
    }
    if (st == SPARQ_OK) qsort(keys, nl, sizeof *keys, cmp_str);
    /* every stored tensor whose key (its name less the last ".part") is a quantized linear goes */
    char stem[512];
    for (size_t i = 0; st == SPARQ_OK && i < nsf; i++) {
        const sf_tensor *t = sf_at(sf, i);
        const char *dot = strrchr(t->name, '.');
        snprintf(stem, sizeof stem, "%.*s", dot ? (int)(dot - t->name) : (int)strlen(t->name), t->name);
        const char *sp = stem;
        if (nl && bsearch(&sp, keys, nl, sizeof *keys, cmp_str)) continue;
        out->tensors[n++] = (sq_memplan_tensor){t->name, t->nbytes};
        if (sq_memplan_classify(t->name, NULL, NULL) == SQ_TENSOR_ENGRAM_TABLE)
            sm.engram_tables = ADD(sm.engram_tables, t->nbytes);
        else
            sm.native = ADD(sm.native, t->nbytes);
    }
    sm.total = sq_memplan_sum(5, (const uint64_t[]){sm.experts, sm.attn, sm.shared, sm.head, sm.native});
    sm.expert_bpw = ew > 0 ? ebits / ew : 0;
    sparq_free(lins);
    sparq_free(keys);
    if (st != SPARQ_OK) {
        sq_quantplan_free(out);
        return st;
    }
    out->n_tensors = n;
    if (summary) *summary = sm;
    return SPARQ_OK;
}

void sq_quantplan_free(sq_quantplan *q)
{
    if (!q) return;
    sparq_free(q->tensors);
    sparq_free(q->names);
    memset(q, 0, sizeof *q);
}
