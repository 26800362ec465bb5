/* runtime/models/registry.c — the table of architectures (runtime/arch.h) and
 * the walks over their descriptions that the rest of the chain uses: slot
 * lookup, tensor keys from "{L}" / "{E}" patterns, and whether a tensor key
 * names a linear the quantizer converts. A new architecture is one row of
 * `archs` and one file beside this one. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "runtime/models/model_impl.h"

static const sq_arch_info *const archs[] = {&sq_arch_qwen3moe};

const char *sq_lin_role_name(sq_lin_role r)
{
    static const char *const n[SQ_ROLE_COUNT_] = {"attn", "router", "expert", "shared", "mlp"};
    return (unsigned)r < SQ_ROLE_COUNT_ ? n[r] : "?";
}

const sq_arch_info *sq_arch_of(const sq_model_config *cfg)
{
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (archs[i]->id == cfg->arch) return archs[i];
    return NULL;
}

sparq_status sq_arch_layer(const sq_model_config *cfg, int layer, sq_layer_desc *out)
{
    const sq_arch_info *a = sq_arch_of(cfg);
    RETURN_IF(!a, SPARQ_E_UNSUPPORTED, "architecture '%s' not supported", cfg->model_type);
    RETURN_IF(layer < 0 || layer >= cfg->num_hidden_layers, SPARQ_E_RANGE, "layer %d outside [0, %lld)", layer,
              (long long)cfg->num_hidden_layers);
    return a->layer(cfg, layer, out);
}

int sq_layer_find(const sq_layer_desc *d, const char *name)
{
    for (int s = 0; s < d->n_slots; s++)
        if (strcmp(d->slot[s].name, name) == 0) return s;
    return -1;
}

sparq_status sq_lin_key(const sq_lin_desc *lin, int layer, int inst, char *buf, size_t n)
{
    size_t o = 0;
    for (const char *p = lin->key; *p; p++) {
        char num[24];
        const char *put = NULL;
        size_t len = 1;
        if (p[0] == '{' && (p[1] == 'L' || p[1] == 'E') && p[2] == '}') {
            snprintf(num, sizeof num, "%d", p[1] == 'L' ? layer : inst);
            put = num;
            len = strlen(num);
            p += 2;
        } else {
            put = p;
        }
        RETURN_IF(o + len >= n, SPARQ_E_RANGE, "tensor key of '%s' (layer %d) longer than %zu bytes", lin->name, layer,
                  n);
        memcpy(buf + o, put, len);
        o += len;
    }
    buf[o] = 0;
    return SPARQ_OK;
}

/* Does key match pattern, "{L}" and "{E}" standing for decimal numbers?
 * *layer / *inst get them (-1 if absent). */
static bool key_match(const char *pat, const char *key, long *layer, long *inst)
{
    *layer = *inst = -1;
    while (*pat) {
        if (pat[0] == '{' && (pat[1] == 'L' || pat[1] == 'E') && pat[2] == '}') {
            if (!isdigit((unsigned char)*key)) return false;
            long v = 0;
            while (isdigit((unsigned char)*key) && v < 100000000) v = v * 10 + (*key++ - '0');
            *(pat[1] == 'L' ? layer : inst) = v;
            pat += 3;
        } else if (*pat++ != *key++) {
            return false;
        }
    }
    return *key == 0;
}

bool sq_arch_is_quant_linear(const sq_model_config *cfg, const char *key, int *layer)
{
    if (layer) *layer = -1;
    const sq_arch_info *a = sq_arch_of(cfg);
    const size_t np = a ? strlen(a->layer_prefix) : 0;
    if (!a || strncmp(key, a->layer_prefix, np) != 0 || !isdigit((unsigned char)key[np])) return false;
    long L = 0;
    for (const char *p = key + np; isdigit((unsigned char)*p) && L < 100000000; p++) L = L * 10 + (*p - '0');
    sq_layer_desc d;
    if (L >= cfg->num_hidden_layers || sq_arch_layer(cfg, (int)L, &d) != SPARQ_OK) return false;
    for (int s = 0; s < d.n_slots; s++) {
        long kl, ki;
        if (!d.slot[s].quantize || !key_match(d.slot[s].key, key, &kl, &ki)) continue;
        if (kl != L || ki >= d.slot[s].instances) continue;
        if (layer) *layer = (int)L;
        return true;
    }
    return false;
}
