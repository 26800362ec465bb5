/* formats/safetensors.c — safetensors reader (mmap, sharded index), dtype
 * conversion, FP8/MXFP4 dequantisation and the aligned atomic writer.
 *
 * Reading one image: 8-byte little-endian header length N (≤ 100 MB and not
 * past the end), N bytes of JSON starting with '{' (parsed with duplicate keys
 * rejected), then the data buffer. Each tensor's size is computed in bits
 * (numel × dtype bits, overflow-checked, a whole number of bytes) and must
 * equal its data_offsets span; sorted by offset, the spans must tile the
 * buffer exactly (no hole, no overlap, nothing left over). Tensors of every
 * shard go into one table sorted by name so lookups are a binary search.
 *
 * Status codes: malformed input is SPARQ_E_FORMAT, sizes/offsets that
 * overflow or pass a limit SPARQ_E_RANGE, a dtype we do not know
 * SPARQ_E_UNSUPPORTED, a missing shard or index entry SPARQ_E_NOTFOUND. */
#include "formats/safetensors.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/half.h"
#include "formats/json.h"

#define SF_MAX_HEADER 100000000ull /* the reference implementation's cap */
#define SF_ALIGN 4096u

/* --- dtypes ------------------------------------------------------------- */

static const struct {
    const char *name;
    unsigned bits;
} dtype_info_[SF_DTYPE_COUNT] = {
    [SF_BOOL] = {"BOOL", 8},       [SF_U8] = {"U8", 8},           [SF_I8] = {"I8", 8},
    [SF_U16] = {"U16", 16},        [SF_I16] = {"I16", 16},        [SF_U32] = {"U32", 32},
    [SF_I32] = {"I32", 32},        [SF_U64] = {"U64", 64},        [SF_I64] = {"I64", 64},
    [SF_F16] = {"F16", 16},        [SF_BF16] = {"BF16", 16},      [SF_F32] = {"F32", 32},
    [SF_F64] = {"F64", 64},        [SF_F8_E4M3] = {"F8_E4M3", 8}, [SF_F8_E5M2] = {"F8_E5M2", 8},
    [SF_F8_E8M0] = {"F8_E8M0", 8}, [SF_F4] = {"F4", 4},
};

const char *sf_dtype_name(sf_dtype dt)
{
    return ((unsigned)dt < SF_DTYPE_COUNT) ? dtype_info_[dt].name : NULL;
}

bool sf_dtype_parse(const char *name, sf_dtype *out)
{
    for (int i = 0; i < SF_DTYPE_COUNT; i++)
        if (!strcmp(name, dtype_info_[i].name)) {
            *out = (sf_dtype)i;
            return true;
        }
    return false;
}

unsigned sf_dtype_bits(sf_dtype dt) { return ((unsigned)dt < SF_DTYPE_COUNT) ? dtype_info_[dt].bits : 0; }

/* Bytes of a tensor of dtype × shape; false on overflow or a fractional byte
 * count (odd number of F4 values). */
static bool tensor_size(sf_dtype dt, int ndim, const uint64_t *shape, uint64_t *numel, uint64_t *nbytes,
                        bool *fractional)
{
    uint64_t n = 1, bits;
    *fractional = false;
    for (int i = 0; i < ndim; i++)
        if (!sparq_mul_u64(n, shape[i], &n)) return false;
    if (!sparq_mul_u64(n, sf_dtype_bits(dt), &bits)) return false;
    *numel = n;
    *fractional = bits % 8 != 0;
    *nbytes = bits / 8;
    return true;
}

/* --- the model table ---------------------------------------------------- */

typedef struct sf_meta {
    int file;
    char *key, *value;
} sf_meta;

struct sf_model {
    sf_tensor *t;
    size_t n, cap;
    sf_meta *meta;
    size_t nmeta, capmeta;
    char **paths;
    sparq_mmap *maps;
    int nfiles;
};

void sf_close(sf_model *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) sparq_free((char *)m->t[i].name);
    sparq_free(m->t);
    for (size_t i = 0; i < m->nmeta; i++) {
        sparq_free(m->meta[i].key);
        sparq_free(m->meta[i].value);
    }
    sparq_free(m->meta);
    for (int i = 0; i < m->nfiles; i++) {
        sparq_free(m->paths[i]);
        if (m->maps) sparq_mmap_close(&m->maps[i]);
    }
    sparq_free(m->paths);
    sparq_free(m->maps);
    sparq_free(m);
}

size_t sf_count(const sf_model *m) { return m->n; }
const sf_tensor *sf_at(const sf_model *m, size_t i) { return i < m->n ? &m->t[i] : NULL; }
int sf_file_count(const sf_model *m) { return m->nfiles; }
const char *sf_file_path(const sf_model *m, int file)
{
    return (file >= 0 && file < m->nfiles) ? m->paths[file] : "?";
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const sf_tensor *)a)->name, ((const sf_tensor *)b)->name);
}

/* qsort that accepts an empty (possibly NULL) array, which qsort itself does not. */
static void sort_any(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *))
{
    if (n > 1) qsort(base, n, size, cmp);
}

const sf_tensor *sf_find(const sf_model *m, const char *name)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->t[mid].name, name);
        if (c == 0) return &m->t[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const char *sf_metadata(const sf_model *m, const char *key)
{
    const sf_meta *best = NULL;
    for (size_t i = 0; i < m->nmeta; i++)
        if (!strcmp(m->meta[i].key, key) && (!best || m->meta[i].file < best->file)) best = &m->meta[i];
    return best ? best->value : NULL;
}

static sf_model *model_new(void) { return sparq_calloc(1, sizeof(sf_model)); }

/* Append a file slot (path copied, no mapping yet). Returns its index or -1. */
static int model_add_file(sf_model *m, const char *path)
{
    char **p = sparq_realloc(m->paths, (size_t)(m->nfiles + 1) * sizeof *p);
    if (!p) return -1;
    m->paths = p;
    sparq_mmap *mp = sparq_realloc(m->maps, (size_t)(m->nfiles + 1) * sizeof *mp);
    if (!mp) return -1;
    m->maps = mp;
    m->maps[m->nfiles] = (sparq_mmap){0};
    m->paths[m->nfiles] = sparq_strdup(path);
    if (!m->paths[m->nfiles]) return -1;
    return m->nfiles++;
}

static sf_tensor *model_push_tensor(sf_model *m)
{
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        sf_tensor *t = sparq_realloc(m->t, cap * sizeof *t);
        if (!t) return NULL;
        m->t = t;
        m->cap = cap;
    }
    memset(&m->t[m->n], 0, sizeof m->t[0]);
    return &m->t[m->n++];
}

static bool model_push_meta(sf_model *m, int file, const char *key, const char *value)
{
    if (m->nmeta == m->capmeta) {
        size_t cap = m->capmeta ? m->capmeta * 2 : 8;
        sf_meta *p = sparq_realloc(m->meta, cap * sizeof *p);
        if (!p) return false;
        m->meta = p;
        m->capmeta = cap;
    }
    sf_meta *e = &m->meta[m->nmeta];
    e->file = file;
    e->key = sparq_strdup(key);
    e->value = sparq_strdup(value);
    if (!e->key || !e->value) {
        sparq_free(e->key);
        sparq_free(e->value);
        return false;
    }
    m->nmeta++;
    return true;
}

/* --- parsing one image -------------------------------------------------- */

typedef struct span {
    uint64_t begin, end;
    size_t idx; /* index into m->t */
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static sparq_status parse_metadata(sf_model *m, int file, const json_t *v, const char *name)
{
    RETURN_IF(!json_is_object(v), SPARQ_E_FORMAT, "%s: __metadata__ must be an object of strings", name);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val)
    {
        RETURN_IF(!json_is_string(val), SPARQ_E_FORMAT, "%s: __metadata__ '%s' is not a string", name, key);
        RETURN_IF(!model_push_meta(m, file, key, json_string_value(val)), SPARQ_E_NOMEM, "%s: out of memory", name);
    }
    return SPARQ_OK;
}

/* Read one u64 JSON integer array entry. */
static bool json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static sparq_status parse_tensor_entry(sf_model *m, int file, const char *tname, const json_t *v,
                                       const char *name, uint64_t *begin, uint64_t *end)
{
    RETURN_IF(!json_is_object(v), SPARQ_E_FORMAT, "%s: tensor '%s': entry must be an object", name, tname);
    const json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
                 *jo = json_object_get(v, "data_offsets");
    RETURN_IF(!json_is_string(jd), SPARQ_E_FORMAT, "%s: tensor '%s': 'dtype' missing or not a string", name, tname);
    RETURN_IF(!json_is_array(js), SPARQ_E_FORMAT, "%s: tensor '%s': 'shape' missing or not a list", name, tname);
    RETURN_IF(!json_is_array(jo) || json_array_size(jo) != 2, SPARQ_E_FORMAT,
              "%s: tensor '%s': 'data_offsets' must be a list [begin, end]", name, tname);
    sf_dtype dt;
    RETURN_IF(!sf_dtype_parse(json_string_value(jd), &dt), SPARQ_E_UNSUPPORTED,
              "%s: tensor '%s': unknown dtype '%s' (known: BOOL U8 I8 U16 I16 U32 I32 U64 I64 F16 BF16 F32 F64 "
              "F8_E4M3 F8_E5M2 F8_E8M0 F4)",
              name, tname, json_string_value(jd));
    size_t nd = json_array_size(js);
    RETURN_IF(nd > SF_MAX_DIMS, SPARQ_E_UNSUPPORTED, "%s: tensor '%s': %zu dimensions, at most %d supported", name,
              tname, nd, SF_MAX_DIMS);
    uint64_t shape[SF_MAX_DIMS] = {0};
    for (size_t i = 0; i < nd; i++)
        RETURN_IF(!json_u64(json_array_get(js, i), &shape[i]), SPARQ_E_FORMAT,
                  "%s: tensor '%s': shape[%zu] is not a non-negative integer", name, tname, i);
    RETURN_IF(!json_u64(json_array_get(jo, 0), begin) || !json_u64(json_array_get(jo, 1), end), SPARQ_E_FORMAT,
              "%s: tensor '%s': data_offsets must be non-negative integers", name, tname);
    RETURN_IF(*end < *begin, SPARQ_E_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) end before begin", name,
              tname, (unsigned long long)*begin, (unsigned long long)*end);
    uint64_t numel, nbytes;
    bool frac;
    RETURN_IF(!tensor_size(dt, (int)nd, shape, &numel, &nbytes, &frac), SPARQ_E_RANGE,
              "%s: tensor '%s': size of %s shape overflows 64 bits", name, tname, sf_dtype_name(dt));
    RETURN_IF(frac, SPARQ_E_FORMAT, "%s: tensor '%s': %llu %s values are not a whole number of bytes", name, tname,
              (unsigned long long)numel, sf_dtype_name(dt));
    RETURN_IF(*end - *begin != nbytes, SPARQ_E_FORMAT,
              "%s: tensor '%s': data_offsets [%llu, %llu) hold %llu bytes but %s with %llu elements needs %llu",
              name, tname, (unsigned long long)*begin, (unsigned long long)*end,
              (unsigned long long)(*end - *begin), sf_dtype_name(dt), (unsigned long long)numel,
              (unsigned long long)nbytes);
    sf_tensor *t = model_push_tensor(m);
    RETURN_IF(!t, SPARQ_E_NOMEM, "%s: out of memory", name);
    t->name = sparq_strdup(tname);
    if (!t->name) {
        m->n--;
        return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", name);
    }
    t->dtype = dt;
    t->ndim = (int)nd;
    memcpy(t->shape, shape, sizeof shape);
    t->numel = numel;
    t->nbytes = nbytes;
    t->file = file;
    return SPARQ_OK;
}

/* Parse the image `buf` of `size` bytes as file `file` of m, appending its
 * tensors (unsorted) and metadata. */
static sparq_status parse_image(sf_model *m, int file, const uint8_t *buf, size_t size, const char *name)
{
    RETURN_IF(size < 8, SPARQ_E_FORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length", name,
              size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    RETURN_IF(hlen > SF_MAX_HEADER, SPARQ_E_RANGE, "%s: header length %llu exceeds the 100 MB limit", name,
              (unsigned long long)hlen);
    RETURN_IF(hlen > size - 8, SPARQ_E_FORMAT, "%s: truncated: header length %llu runs past the end of the %zu-byte file",
              name, (unsigned long long)hlen, size);
    RETURN_IF(hlen < 2 || buf[8] != '{', SPARQ_E_FORMAT, "%s: header does not start with '{'", name);
    json_t *root;
    FORWARD_IF(sq_json_parse(&root, (const char *)buf + 8, (size_t)hlen, name));
    sparq_status st = SPARQ_OK;
    span *spans = NULL;
    size_t first = m->n, first_meta = m->nmeta, ns = 0;
    if (!json_is_object(root)) {
        st = sparq_err(SPARQ_E_FORMAT, "%s: header is not a JSON object", name);
        goto done;
    }
    size_t count = json_object_size(root);
    spans = sparq_calloc(count ? count : 1, sizeof *spans);
    if (!spans) {
        st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", name);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (!strcmp(key, "__metadata__")) {
            st = parse_metadata(m, file, val, name);
        } else {
            st = parse_tensor_entry(m, file, key, val, name, &spans[ns].begin, &spans[ns].end);
            if (st == SPARQ_OK) spans[ns].idx = m->n - 1, ns++;
        }
        if (st != SPARQ_OK) goto done;
    }
    /* The spans must tile [0, data_size) exactly. */
    const uint64_t data_size = (uint64_t)size - 8 - hlen;
    sort_any(spans, ns, sizeof *spans, cmp_span);
    uint64_t pos = 0;
    for (size_t i = 0; i < ns; i++) {
        const char *tn = m->t[spans[i].idx].name;
        if (spans[i].begin < pos) {
            st = sparq_err(SPARQ_E_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) overlap the previous tensor (ends at %llu)",
                           name, tn, (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end,
                           (unsigned long long)pos);
            goto done;
        }
        if (spans[i].begin > pos) {
            st = sparq_err(SPARQ_E_FORMAT, "%s: tensor '%s': hole in the data buffer: bytes [%llu, %llu) belong to no tensor",
                           name, tn, (unsigned long long)pos, (unsigned long long)spans[i].begin);
            goto done;
        }
        if (spans[i].end > data_size) {
            st = sparq_err(SPARQ_E_FORMAT, "%s: tensor '%s': truncated: data_offsets end %llu past the %llu-byte data buffer",
                           name, tn, (unsigned long long)spans[i].end, (unsigned long long)data_size);
            goto done;
        }
        m->t[spans[i].idx].data = buf + 8 + hlen + spans[i].begin;
        pos = spans[i].end;
    }
    if (pos != data_size) {
        st = sparq_err(SPARQ_E_FORMAT, "%s: %llu bytes after the last tensor belong to no tensor", name,
                       (unsigned long long)(data_size - pos));
        goto done;
    }
done:
    sparq_free(spans);
    json_decref(root);
    if (st != SPARQ_OK) {
        /* Leave the tables as they were before this file. */
        for (size_t i = first; i < m->n; i++) sparq_free((char *)m->t[i].name);
        m->n = first;
        for (size_t i = first_meta; i < m->nmeta; i++) {
            sparq_free(m->meta[i].key);
            sparq_free(m->meta[i].value);
        }
        m->nmeta = first_meta;
    }
    return st;
}

sparq_status sf_parse_buffer(sf_model **out, const uint8_t *buf, size_t size, const char *name)
{
    *out = NULL;
    sf_model *m = model_new();
    RETURN_IF(!m, SPARQ_E_NOMEM, "%s: out of memory", name);
    sparq_status st;
    if (model_add_file(m, name) < 0) {
        st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", name);
    } else {
        st = parse_image(m, 0, buf, size, name);
    }
    if (st != SPARQ_OK) {
        sf_close(m);
        return st;
    }
    sort_any(m->t, m->n, sizeof *m->t, cmp_tensor_name);
    *out = m;
    return SPARQ_OK;
}

/* Map and parse `path` as file slot `file` of m. */
static sparq_status open_shard(sf_model *m, int file)
{
    const char *path = m->paths[file];
    FORWARD_IF(sparq_mmap_open(&m->maps[file], path));
    return parse_image(m, file, m->maps[file].data, m->maps[file].size, path);
}

/* --- sharded directories ------------------------------------------------ */

typedef struct index_entry {
    const char *tensor, *file;
} index_entry;

static int cmp_index_entry(const void *a, const void *b)
{
    const index_entry *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    return c ? c : strcmp(x->tensor, y->tensor);
}

/* Check shard `file`'s tensors (m->t[first..m->n), sorted here) against the
 * index entries e[0..ne) (sorted by tensor name) that name this shard. */
static sparq_status check_shard_against_index(sf_model *m, size_t first, const index_entry *e, size_t ne,
                                              const char *shard, const char *index_path)
{
    if (m->n > first) sort_any(m->t + first, m->n - first, sizeof *m->t, cmp_tensor_name);
    size_t i = first, j = 0;
    while (i < m->n || j < ne) {
        int c = i == m->n ? 1 : j == ne ? -1 : strcmp(m->t[i].name, e[j].tensor);
        RETURN_IF(c < 0, SPARQ_E_FORMAT, "%s: tensor '%s' is not mapped to this shard by %s", shard, m->t[i].name,
                  index_path);
        RETURN_IF(c > 0, SPARQ_E_NOTFOUND, "%s: tensor '%s' is mapped to %s, which does not hold it", index_path,
                  e[j].tensor, shard);
        i++, j++;
    }
    return SPARQ_OK;
}

static sparq_status open_index(sf_model *m, const char *dir, const char *index_path)
{
    json_t *root;
    FORWARD_IF(sq_json_load_file(&root, index_path, SF_MAX_HEADER));
    sparq_status st = SPARQ_OK;
    index_entry *e = NULL;
    char *shard = NULL;
    const json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        st = sparq_err(SPARQ_E_FORMAT, "%s: no 'weight_map' object", index_path);
        goto done;
    }
    size_t n = json_object_size(wm), k = 0;
    e = sparq_calloc(n ? n : 1, sizeof *e);
    if (!e) {
        st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)wm, key, val)
    {
        if (!json_is_string(val)) {
            st = sparq_err(SPARQ_E_FORMAT, "%s: weight_map '%s' is not a file name", index_path, key);
            goto done;
        }
        const char *f = json_string_value(val);
        if (!f[0] || strchr(f, '/') || !strcmp(f, "..") || !strcmp(f, ".")) {
            st = sparq_err(SPARQ_E_FORMAT, "%s: weight_map '%s' names '%s', not a file in the model directory",
                           index_path, key, f);
            goto done;
        }
        e[k++] = (index_entry){key, f};
    }
    if (n == 0) {
        st = sparq_err(SPARQ_E_FORMAT, "%s: weight_map is empty", index_path);
        goto done;
    }
    sort_any(e, n, sizeof *e, cmp_index_entry);
    for (size_t a = 0; a < n;) {
        size_t b = a;
        while (b < n && !strcmp(e[b].file, e[a].file)) b++;
        shard = sparq_path_join(dir, e[a].file);
        if (!shard) {
            st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", index_path);
            goto done;
        }
        if (!sparq_path_exists(shard)) {
            st = sparq_err(SPARQ_E_NOTFOUND, "%s: shard '%s' (holding '%s') does not exist", index_path, e[a].file,
                           e[a].tensor);
            goto done;
        }
        int file = model_add_file(m, shard);
        if (file < 0) {
            st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", index_path);
            goto done;
        }
        size_t first = m->n;
        st = open_shard(m, file);
        if (st == SPARQ_OK) st = check_shard_against_index(m, first, e + a, b - a, shard, index_path);
        if (st != SPARQ_OK) goto done;
        sparq_free(shard);
        shard = NULL;
        a = b;
    }
done:
    sparq_free(shard);
    sparq_free(e);
    json_decref(root);
    return st;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* A directory without an index must hold exactly one *.safetensors file. */
static sparq_status find_single_file(const char *dir, char **out)
{
    *out = NULL;
    DIR *d = opendir(dir);
    RETURN_IF(!d, SPARQ_E_IO, "%s: cannot open directory", dir);
    struct dirent *de;
    int count = 0;
    char first[512] = "";
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || !ends_with(de->d_name, ".safetensors")) continue;
        if (count++ == 0) snprintf(first, sizeof first, "%s", de->d_name);
    }
    closedir(d);
    RETURN_IF(count == 0, SPARQ_E_NOTFOUND, "%s: no model.safetensors.index.json and no *.safetensors file", dir);
    RETURN_IF(count > 1, SPARQ_E_FORMAT,
              "%s: %d *.safetensors files but no model.safetensors.index.json to say which tensors each holds", dir,
              count);
    *out = sparq_path_join(dir, first);
    RETURN_IF(!*out, SPARQ_E_NOMEM, "%s: out of memory", dir);
    return SPARQ_OK;
}

sparq_status sf_open(sf_model **out, const char *path)
{
    *out = NULL;
    sf_model *m = model_new();
    RETURN_IF(!m, SPARQ_E_NOMEM, "%s: out of memory", path);
    sparq_status st = SPARQ_OK;
    char *index = NULL, *single = NULL;
    if (sparq_path_is_dir(path)) {
        index = sparq_path_join(path, "model.safetensors.index.json");
        if (!index) {
            st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path);
        } else if (sparq_path_exists(index)) {
            st = open_index(m, path, index);
        } else {
            st = find_single_file(path, &single);
            if (st == SPARQ_OK) {
                int f = model_add_file(m, single);
                st = f < 0 ? sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path) : open_shard(m, f);
            }
        }
    } else if (!sparq_path_exists(path)) {
        st = sparq_err(SPARQ_E_NOTFOUND, "%s: no such file or directory", path);
    } else {
        int f = model_add_file(m, path);
        st = f < 0 ? sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path) : open_shard(m, f);
    }
    sparq_free(index);
    sparq_free(single);
    if (st != SPARQ_OK) {
        sf_close(m);
        return st;
    }
    sort_any(m->t, m->n, sizeof *m->t, cmp_tensor_name);
    *out = m;
    return SPARQ_OK;
}

/* --- overlay ------------------------------------------------------------ */

/* The module of a tensor name (its length): the name without its last
 * ".part", or for a name ending "_blocks" / "_scales" (gpt-oss MXFP4) without
 * that suffix. */
static size_t module_len(const char *name)
{
    const size_t n = strlen(name);
    if (ends_with(name, "_blocks") || ends_with(name, "_scales")) return n - 7;
    const char *dot = strrchr(name, '.');
    return dot ? (size_t)(dot - name) : n;
}

typedef struct module_ref {
    const char *p;
    size_t n;
} module_ref;

static int cmp_module(const void *a, const void *b)
{
    const module_ref *x = a, *y = b;
    const size_t n = x->n < y->n ? x->n : y->n;
    const int c = memcmp(x->p, y->p, n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

sparq_status sf_open_overlay(sf_model **out, const char *top_path, const char *base_path)
{
    *out = NULL;
    sf_model *top = NULL, *base = NULL;
    FORWARD_IF(sf_open(&top, top_path));
    sparq_status st = sf_open(&base, base_path);
    module_ref *mods = st == SPARQ_OK ? sparq_calloc(top->n ? top->n : 1, sizeof *mods) : NULL;
    char **paths = NULL;
    sparq_mmap *maps = NULL;
    if (st == SPARQ_OK && !mods) st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", top_path);
    if (st == SPARQ_OK) {
        const size_t nf = (size_t)(top->nfiles + base->nfiles);
        paths = sparq_realloc(top->paths, nf * sizeof *paths);
        if (paths) top->paths = paths;
        maps = paths ? sparq_realloc(top->maps, nf * sizeof *maps) : NULL;
        if (maps) top->maps = maps;
        if (!paths || !maps) st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", top_path);
    }
    if (st != SPARQ_OK) {
        sparq_free(mods);
        sf_close(base);
        sf_close(top);
        return st;
    }
    for (size_t i = 0; i < top->n; i++) mods[i] = (module_ref){top->t[i].name, module_len(top->t[i].name)};
    sort_any(mods, top->n, sizeof *mods, cmp_module);
    /* base's files become top's (their mappings move: tensor data pointers stay valid) */
    const int f0 = top->nfiles;
    for (int f = 0; f < base->nfiles; f++) {
        top->paths[f0 + f] = base->paths[f];
        top->maps[f0 + f] = base->maps[f];
    }
    top->nfiles += base->nfiles;
    base->nfiles = 0;
    const size_t n_top = top->n;
    for (size_t i = 0; i < base->n && st == SPARQ_OK; i++) {
        sf_tensor *x = &base->t[i];
        const module_ref key = {x->name, module_len(x->name)};
        if (bsearch(&key, mods, n_top, sizeof *mods, cmp_module)) continue; /* a name top has: its module too */
        sf_tensor *y = model_push_tensor(top);
        if (!y) {
            st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", top_path);
            break;
        }
        *y = *x;
        y->file += f0;
        x->name = NULL; /* moved */
    }
    for (size_t i = 0; i < base->nmeta && st == SPARQ_OK; i++)
        if (!model_push_meta(top, base->meta[i].file + f0, base->meta[i].key, base->meta[i].value))
            st = sparq_err(SPARQ_E_NOMEM, "%s: out of memory", top_path);
    sparq_free(mods);
    sf_close(base);
    if (st != SPARQ_OK) {
        sf_close(top);
        return st;
    }
    sort_any(top->t, top->n, sizeof *top->t, cmp_tensor_name);
    *out = top;
    return SPARQ_OK;
}

/* --- conversion --------------------------------------------------------- */

float sf_e4m3_to_f32(uint8_t b)
{
    const int sign = b >> 7, e = (b >> 3) & 0xF, mant = b & 7;
    float v;
    if (e == 0xF && mant == 7) return NAN;
    if (e == 0) v = ldexpf((float)mant, -9); /* subnormal: mant/8 · 2^-6 */
    else v = ldexpf((float)(8 + mant), e - 10); /* (1 + mant/8) · 2^(e-7) */
    return sign ? -v : v;
}

/* E5M2 is the top byte of an IEEE fp16. */
float sf_e5m2_to_f32(uint8_t b) { return sparq_f16_to_f32((uint16_t)((uint16_t)b << 8)); }

float sf_e8m0_to_f32(uint8_t b)
{
    if (b == 0xFF) return NAN;
    return ldexpf(1.0f, (int)b - 127);
}

float sf_e2m1_to_f32(uint8_t nibble)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float v = mag[nibble & 7];
    return (nibble & 8) ? -v : v;
}

/* The 256 values of an 8-bit float format: a table lookup per element
 * instead of the bit decoding (≈ 10x faster on large tensors). */
static void byte_lut(sf_dtype dt, float lut[256])
{
    for (int b = 0; b < 256; b++)
        lut[b] = dt == SF_F8_E4M3 ? sf_e4m3_to_f32((uint8_t)b)
                 : dt == SF_F8_E5M2 ? sf_e5m2_to_f32((uint8_t)b)
                                    : sf_e8m0_to_f32((uint8_t)b);
}

sparq_status sf_to_f32_range(const sf_tensor *t, uint64_t first, uint64_t n, float *out)
{
    uint64_t last;
    RETURN_IF(!sparq_add_u64(first, n, &last) || last > t->numel, SPARQ_E_RANGE,
              "tensor '%s': elements [%llu, +%llu) are past its %llu elements", t->name, (unsigned long long)first,
              (unsigned long long)n, (unsigned long long)t->numel);
    const uint8_t *p = (const uint8_t *)t->data;
    switch (t->dtype) {
    case SF_F32:
        memcpy(out, p + first * 4, n * 4);
        break;
    case SF_F64:
        for (uint64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + (first + i) * 8, 8);
            out[i] = (float)d;
        }
        break;
    case SF_F16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + (first + i) * 2, 2);
            out[i] = sparq_f16_to_f32(h);
        }
        break;
    case SF_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + (first + i) * 2, 2);
            out[i] = sparq_bf16_to_f32(h);
        }
        break;
    case SF_F8_E4M3:
    case SF_F8_E5M2:
    case SF_F8_E8M0: {
        float lut[256];
        byte_lut(t->dtype, lut);
        for (uint64_t i = 0; i < n; i++) out[i] = lut[p[first + i]];
        break;
    }
    default:
        return sparq_err(SPARQ_E_UNSUPPORTED, "tensor '%s': cannot convert %s to fp32 (float dtypes only)", t->name,
                         sf_dtype_name(t->dtype));
    }
    return SPARQ_OK;
}

sparq_status sf_to_f32(const sf_tensor *t, float *out) { return sf_to_f32_range(t, 0, t->numel, out); }

/* Values of `size` bytes (little endian) whose bits under `exp` are all ones:
 * NaN when any bit under `man` is set too, else Inf. */
static inline void count_exp_ones(const uint8_t *p, uint64_t n, unsigned size, uint64_t exp, uint64_t man,
                                  uint64_t *nan, uint64_t *inf)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t b = 0;
        memcpy(&b, p + (size_t)size * i, size);
        if ((b & exp) == exp) {
            if (b & man) ++*nan;
            else ++*inf;
        }
    }
}

void sf_count_nonfinite(const sf_tensor *t, uint64_t *n_nan, uint64_t *n_inf)
{
    const uint8_t *p = t->data;
    const uint64_t n = t->numel;
    *n_nan = *n_inf = 0;
    switch (t->dtype) {
    case SF_F32: count_exp_ones(p, n, 4, 0x7F800000u, 0x007FFFFFu, n_nan, n_inf); break;
    case SF_F64: count_exp_ones(p, n, 8, 0x7FF0000000000000ull, 0x000FFFFFFFFFFFFFull, n_nan, n_inf); break;
    case SF_F16: count_exp_ones(p, n, 2, 0x7C00u, 0x03FFu, n_nan, n_inf); break;
    case SF_BF16: count_exp_ones(p, n, 2, 0x7F80u, 0x007Fu, n_nan, n_inf); break;
    case SF_F8_E5M2: count_exp_ones(p, n, 1, 0x7Cu, 0x03u, n_nan, n_inf); break;
    case SF_F8_E4M3: count_exp_ones(p, n, 1, 0x7Fu, 0x7Fu, n_nan, n_inf); break; /* e4m3fn: NaN = S.1111.111, no Inf */
    case SF_F8_E8M0: count_exp_ones(p, n, 1, 0xFFu, 0xFFu, n_nan, n_inf); break; /* 0xFF is NaN */
    default: break; /* integers, BOOL, F4 (E2M1): every value is finite */
    }
}

/* One scale value of a block-scale tensor, as a multiplier. */
static float scale_at(const sf_tensor *s, uint64_t i)
{
    const uint8_t *p = (const uint8_t *)s->data;
    uint16_t h;
    switch (s->dtype) {
    case SF_F32: {
        float f;
        memcpy(&f, p + i * 4, 4);
        return f;
    }
    case SF_BF16:
        memcpy(&h, p + i * 2, 2);
        return sparq_bf16_to_f32(h);
    case SF_F16:
        memcpy(&h, p + i * 2, 2);
        return sparq_f16_to_f32(h);
    default:
        return sf_e8m0_to_f32(p[i]);
    }
}

/* Scale checks shared by the FP8 and MXFP4 paths: dtype, 2-D shape equal to
 * [rows, cols], and no E8M0 255 (NaN) code. */
static sparq_status check_scale(const sf_tensor *w, const sf_tensor *s, uint64_t rows, uint64_t cols, bool e8m0_only)
{
    RETURN_IF(e8m0_only ? s->dtype != SF_F8_E8M0
                        : (s->dtype != SF_F8_E8M0 && s->dtype != SF_F32 && s->dtype != SF_BF16 && s->dtype != SF_F16),
              SPARQ_E_SHAPE, "tensor '%s': scale '%s' has dtype %s, expected %s", w->name, s->name,
              sf_dtype_name(s->dtype), e8m0_only ? "F8_E8M0" : "F8_E8M0, F32, BF16 or F16");
    RETURN_IF(s->ndim != 2 || s->shape[0] != rows || s->shape[1] != cols, SPARQ_E_SHAPE,
              "tensor '%s': scale '%s' must be [%llu, %llu]", w->name, s->name, (unsigned long long)rows,
              (unsigned long long)cols);
    if (s->dtype == SF_F8_E8M0) {
        const uint8_t *p = (const uint8_t *)s->data;
        for (uint64_t i = 0; i < s->numel; i++)
            RETURN_IF(p[i] == 0xFF, SPARQ_E_FORMAT, "tensor '%s': scale '%s' element %llu is the E8M0 NaN code 255",
                      w->name, s->name, (unsigned long long)i);
    }
    return SPARQ_OK;
}

sparq_status sf_dequant_fp8(const sf_tensor *w, const sf_tensor *scale, int block_rows, int block_cols, float *out)
{
    RETURN_IF(w->dtype != SF_F8_E4M3 && w->dtype != SF_F8_E5M2, SPARQ_E_SHAPE,
              "tensor '%s': dtype %s is not FP8 (F8_E4M3 or F8_E5M2)", w->name, sf_dtype_name(w->dtype));
    RETURN_IF(w->ndim != 2, SPARQ_E_SHAPE, "tensor '%s': FP8 block dequantisation needs a 2-D weight, not %d-D",
              w->name, w->ndim);
    RETURN_IF(block_rows < 1 || block_cols < 1, SPARQ_E_ARG, "tensor '%s': block %dx%d", w->name, block_rows,
              block_cols);
    const uint64_t O = w->shape[0], I = w->shape[1];
    const uint64_t br = (uint64_t)block_rows, bc = (uint64_t)block_cols;
    FORWARD_IF(check_scale(w, scale, (O + br - 1) / br, (I + bc - 1) / bc, false));
    const uint8_t *p = (const uint8_t *)w->data;
    const uint64_t scols = scale->shape[1];
    float lut[256];
    byte_lut(w->dtype, lut);
    for (uint64_t r = 0; r < O; r++) {
        const uint8_t *row = p + r * I;
        float *orow = out + r * I;
        if (w->dtype == SF_F8_E4M3)
            for (uint64_t c = 0; c < I; c++)
                RETURN_IF((row[c] & 0x7F) == 0x7F, SPARQ_E_FORMAT,
                          "tensor '%s': element [%llu, %llu] is an E4M3 NaN code", w->name, (unsigned long long)r,
                          (unsigned long long)c);
        /* one scale per run of bc columns */
        for (uint64_t c0 = 0; c0 < I; c0 += bc) {
            const float f = scale_at(scale, (r / br) * scols + c0 / bc);
            const uint64_t c1 = c0 + bc < I ? c0 + bc : I;
            for (uint64_t c = c0; c < c1; c++) orow[c] = lut[row[c]] * f;
        }
    }
    return SPARQ_OK;
}

sparq_status sf_dequant_mxfp4(const sf_tensor *w, const sf_tensor *scale, float *out)
{
    RETURN_IF(w->ndim != 2, SPARQ_E_SHAPE, "tensor '%s': MXFP4 dequantisation needs a 2-D weight, not %d-D", w->name,
              w->ndim);
    RETURN_IF(w->dtype != SF_F4 && w->dtype != SF_I8 && w->dtype != SF_U8, SPARQ_E_SHAPE,
              "tensor '%s': dtype %s is not MXFP4 storage (I8, U8 or F4)", w->name, sf_dtype_name(w->dtype));
    const uint64_t O = w->shape[0];
    uint64_t I = w->shape[1];
    /* I8/U8 rows hold two values per byte. */
    if (w->dtype != SF_F4)
        RETURN_IF(!sparq_mul_u64(I, 2, &I), SPARQ_E_RANGE, "tensor '%s': shape overflows", w->name);
    RETURN_IF(I % 2, SPARQ_E_SHAPE, "tensor '%s': MXFP4 rows need an even number of values", w->name);
    FORWARD_IF(check_scale(w, scale, O, (I + 31) / 32, true));
    const uint8_t *p = (const uint8_t *)w->data, *s = (const uint8_t *)scale->data;
    const uint64_t scols = scale->shape[1];
    /* I is even and groups are 32 wide, so both values of a byte share a scale. */
    float e2m1[16];
    for (int i = 0; i < 16; i++) e2m1[i] = sf_e2m1_to_f32((uint8_t)i);
    for (uint64_t r = 0; r < O; r++) {
        const uint8_t *row = p + r * (I / 2);
        float *orow = out + r * I;
        for (uint64_t c0 = 0; c0 < I; c0 += 32) {
            const float f = sf_e8m0_to_f32(s[r * scols + c0 / 32]);
            const uint64_t c1 = c0 + 32 < I ? c0 + 32 : I;
            for (uint64_t c = c0; c < c1; c += 2) {
                const uint8_t b = row[c / 2];
                orow[c] = e2m1[b & 0xF] * f;
                orow[c + 1] = e2m1[b >> 4] * f;
            }
        }
    }
    return SPARQ_OK;
}

/* --- writing ------------------------------------------------------------ */

typedef struct sf_wentry {
    char *name;
    sf_dtype dtype;
    int ndim;
    uint64_t shape[SF_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
    bool owned;
    bool hole; /* no data: the bytes are skipped (sf_writer_add_hole) */
    bool stream; /* referenced, written in pieces reported to the on_written hook (sf_writer_add_streamed) */
} sf_wentry;

struct sf_writer {
    char *path;
    sf_wentry *e;
    size_t n, cap;
    char **mkeys, **mvals;
    size_t nmeta;
    uint64_t piece;                                    /* sf_writer_on_written: bytes per write */
    void (*written)(void *user, const void *p, uint64_t n);
    void *user;
};

sparq_status sf_writer_create(sf_writer **out, const char *path)
{
    *out = NULL;
    sf_writer *w = sparq_calloc(1, sizeof *w);
    RETURN_IF(!w, SPARQ_E_NOMEM, "%s: out of memory", path);
    w->path = sparq_strdup(path);
    if (!w->path) {
        sparq_free(w);
        return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", path);
    }
    *out = w;
    return SPARQ_OK;
}

void sf_writer_free(sf_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) {
        sparq_free(w->e[i].name);
        if (w->e[i].owned) sparq_free((void *)w->e[i].data);
    }
    sparq_free(w->e);
    for (size_t i = 0; i < w->nmeta; i++) {
        sparq_free(w->mkeys[i]);
        sparq_free(w->mvals[i]);
    }
    sparq_free(w->mkeys);
    sparq_free(w->mvals);
    sparq_free(w->path);
    sparq_free(w);
}

static sparq_status writer_add(sf_writer *w, const char *name, sf_dtype dt, int ndim, const uint64_t *shape,
                               const void *data, uint64_t nbytes, bool copy, bool hole)
{
    RETURN_IF((unsigned)dt >= SF_DTYPE_COUNT, SPARQ_E_ARG, "%s: tensor '%s': invalid dtype %d", w->path, name,
              (int)dt);
    RETURN_IF(ndim < 0 || ndim > SF_MAX_DIMS, SPARQ_E_ARG, "%s: tensor '%s': %d dimensions (0..%d)", w->path, name,
              ndim, SF_MAX_DIMS);
    RETURN_IF(!strcmp(name, "__metadata__"), SPARQ_E_ARG, "%s: '__metadata__' is reserved, not a tensor name",
              w->path);
    uint64_t numel, need;
    bool frac;
    RETURN_IF(!tensor_size(dt, ndim, shape, &numel, &need, &frac), SPARQ_E_RANGE,
              "%s: tensor '%s': size overflows 64 bits", w->path, name);
    RETURN_IF(frac, SPARQ_E_SHAPE, "%s: tensor '%s': %llu %s values are not a whole number of bytes", w->path, name,
              (unsigned long long)numel, sf_dtype_name(dt));
    RETURN_IF(need != nbytes, SPARQ_E_SHAPE, "%s: tensor '%s': %llu bytes given but %s with %llu elements needs %llu",
              w->path, name, (unsigned long long)nbytes, sf_dtype_name(dt), (unsigned long long)numel,
              (unsigned long long)need);
    RETURN_IF(nbytes && !data && !hole, SPARQ_E_ARG, "%s: tensor '%s': no data", w->path, name);
    for (size_t i = 0; i < w->n; i++)
        RETURN_IF(!strcmp(w->e[i].name, name), SPARQ_E_ARG, "%s: tensor '%s' added twice", w->path, name);
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 16;
        sf_wentry *e = sparq_realloc(w->e, cap * sizeof *e);
        RETURN_IF(!e, SPARQ_E_NOMEM, "%s: out of memory", w->path);
        w->e = e;
        w->cap = cap;
    }
    sf_wentry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->name = sparq_strdup(name);
    RETURN_IF(!e->name, SPARQ_E_NOMEM, "%s: out of memory", w->path);
    if (hole) {
        e->hole = true;
    } else if (copy && nbytes) {
        RETURN_IF(nbytes > SIZE_MAX, SPARQ_E_RANGE, "%s: tensor '%s' too large", w->path, name);
        void *d = sparq_malloc((size_t)nbytes);
        if (!d) {
            sparq_free(e->name);
            return sparq_err(SPARQ_E_NOMEM, "%s: tensor '%s': out of memory copying %llu bytes", w->path, name,
                             (unsigned long long)nbytes);
        }
        memcpy(d, data, (size_t)nbytes);
        e->data = d;
        e->owned = true;
    } else {
        e->data = data;
    }
    e->dtype = dt;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = nbytes;
    w->n++;
    return SPARQ_OK;
}

sparq_status sf_writer_add(sf_writer *w, const char *name, sf_dtype dt, int ndim, const uint64_t *shape,
                           const void *data, uint64_t nbytes)
{
    return writer_add(w, name, dt, ndim, shape, data, nbytes, true, false);
}

sparq_status sf_writer_add_ref(sf_writer *w, const char *name, sf_dtype dt, int ndim, const uint64_t *shape,
                               const void *data, uint64_t nbytes)
{
    return writer_add(w, name, dt, ndim, shape, data, nbytes, false, false);
}

sparq_status sf_writer_add_streamed(sf_writer *w, const char *name, sf_dtype dt, int ndim, const uint64_t *shape,
                                    const void *data, uint64_t nbytes)
{
    FORWARD_IF(writer_add(w, name, dt, ndim, shape, data, nbytes, false, false));
    w->e[w->n - 1].stream = true;
    return SPARQ_OK;
}

sparq_status sf_writer_add_hole(sf_writer *w, const char *name, sf_dtype dt, int ndim, const uint64_t *shape)
{
    uint64_t numel, need;
    bool frac;
    RETURN_IF(ndim < 0 || ndim > SF_MAX_DIMS || (unsigned)dt >= SF_DTYPE_COUNT, SPARQ_E_ARG,
              "%s: tensor '%s': invalid dtype or dimensions", w->path, name);
    RETURN_IF(!tensor_size(dt, ndim, shape, &numel, &need, &frac), SPARQ_E_RANGE,
              "%s: tensor '%s': size overflows 64 bits", w->path, name);
    return writer_add(w, name, dt, ndim, shape, NULL, need, false, true);
}

void sf_writer_on_written(sf_writer *w, uint64_t piece, void (*written)(void *user, const void *p, uint64_t n),
                          void *user)
{
    w->piece = piece;
    w->written = written;
    w->user = user;
}

sparq_status sf_writer_set_metadata(sf_writer *w, const char *key, const char *value)
{
    for (size_t i = 0; i < w->nmeta; i++)
        if (!strcmp(w->mkeys[i], key)) {
            char *v = sparq_strdup(value);
            RETURN_IF(!v, SPARQ_E_NOMEM, "%s: out of memory", w->path);
            sparq_free(w->mvals[i]);
            w->mvals[i] = v;
            return SPARQ_OK;
        }
    char **k = sparq_realloc(w->mkeys, (w->nmeta + 1) * sizeof *k);
    RETURN_IF(!k, SPARQ_E_NOMEM, "%s: out of memory", w->path);
    w->mkeys = k;
    char **v = sparq_realloc(w->mvals, (w->nmeta + 1) * sizeof *v);
    RETURN_IF(!v, SPARQ_E_NOMEM, "%s: out of memory", w->path);
    w->mvals = v;
    w->mkeys[w->nmeta] = sparq_strdup(key);
    w->mvals[w->nmeta] = sparq_strdup(value);
    if (!w->mkeys[w->nmeta] || !w->mvals[w->nmeta]) {
        sparq_free(w->mkeys[w->nmeta]);
        sparq_free(w->mvals[w->nmeta]);
        return sparq_err(SPARQ_E_NOMEM, "%s: out of memory", w->path);
    }
    w->nmeta++;
    return SPARQ_OK;
}

/* A growable text buffer for the header. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = sparq_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* A JSON string literal: escape quote, backslash and control bytes. */
static void sb_json_str(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c;
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static void sb_u64(sbuf *b, uint64_t v)
{
    char t[24];
    snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    sb_str(b, t);
}

static int cmp_wentry(const void *a, const void *b)
{
    return strcmp(((const sf_wentry *)a)->name, ((const sf_wentry *)b)->name);
}

/* Header JSON (tensors in name order, data laid out in the same order),
 * padded with spaces so 8 + length is a multiple of SF_ALIGN. */
static sparq_status build_header(sf_writer *w, sbuf *b)
{
    sort_any(w->e, w->n, sizeof *w->e, cmp_wentry);
    sb_str(b, "{");
    bool comma = false;
    if (w->nmeta) {
        sb_str(b, "\"__metadata__\":{");
        for (size_t i = 0; i < w->nmeta; i++) {
            if (i) sb_str(b, ",");
            sb_json_str(b, w->mkeys[i]);
            sb_str(b, ":");
            sb_json_str(b, w->mvals[i]);
        }
        sb_str(b, "}");
        comma = true;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        const sf_wentry *e = &w->e[i];
        if (comma) sb_str(b, ",");
        comma = true;
        sb_json_str(b, e->name);
        sb_str(b, ":{\"dtype\":\"");
        sb_str(b, sf_dtype_name(e->dtype));
        sb_str(b, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            if (d) sb_str(b, ",");
            sb_u64(b, e->shape[d]);
        }
        sb_str(b, "],\"data_offsets\":[");
        sb_u64(b, off);
        sb_str(b, ",");
        RETURN_IF(!sparq_add_u64(off, e->nbytes, &off), SPARQ_E_RANGE, "%s: total size overflows", w->path);
        sb_u64(b, off);
        sb_str(b, "]}");
    }
    sb_str(b, "}");
    const size_t pad = (SF_ALIGN - (8 + b->n) % SF_ALIGN) % SF_ALIGN;
    for (size_t i = 0; i < pad; i++) sb_put(b, " ", 1);
    RETURN_IF(b->oom, SPARQ_E_NOMEM, "%s: out of memory building the header", w->path);
    RETURN_IF(b->n > SF_MAX_HEADER, SPARQ_E_RANGE, "%s: header of %zu bytes exceeds the 100 MB limit", w->path, b->n);
    return SPARQ_OK;
}

sparq_status sf_writer_finish(sf_writer *w)
{
    sbuf b = {0};
    sparq_status st = build_header(w, &b);
    sparq_atomic_file f = {0};
    bool opened = false;
    if (st == SPARQ_OK) {
        st = sparq_atomic_open(&f, w->path);
        opened = st == SPARQ_OK;
    }
    if (st == SPARQ_OK) {
        uint8_t len[8];
        for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)b.n >> (8 * i));
        st = sparq_atomic_write(&f, len, 8);
        if (st == SPARQ_OK) st = sparq_atomic_write(&f, b.p, b.n);
        for (size_t i = 0; i < w->n && st == SPARQ_OK; i++) {
            const sf_wentry *e = &w->e[i];
            if (e->hole) {
                st = sparq_atomic_skip(&f, e->nbytes);
                continue;
            }
            /* a streamed tensor goes out in pieces, each handed to the caller's hook once written */
            const bool report = e->stream && w->written;
            const uint64_t piece = report && w->piece ? w->piece : e->nbytes;
            for (uint64_t at = 0; at < e->nbytes && st == SPARQ_OK; at += piece) {
                const uint64_t n = e->nbytes - at < piece ? e->nbytes - at : piece;
                const uint8_t *p = (const uint8_t *)e->data + at;
                st = sparq_atomic_write(&f, p, (size_t)n);
                if (st == SPARQ_OK && report) w->written(w->user, p, n);
            }
        }
        if (st == SPARQ_OK) {
            st = sparq_atomic_commit(&f);
            opened = false;
        }
    }
    if (opened) sparq_atomic_abort(&f);
    sparq_free(b.p);
    sf_writer_free(w);
    return st;
}
