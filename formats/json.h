/* formats/json.h — small shared helpers over jansson for every JSON file
 * sparq reads (config.json, model.safetensors.index.json, safetensors
 * headers, manifests).
 *
 * Parsing always rejects duplicate keys (JSON_REJECT_DUPLICATES) and NUL
 * bytes inside strings, and turns jansson's error into a sparq_status whose
 * message names the file, line and column. jansson allocates with plain
 * malloc (see json.c for why it is not routed through the fault injector).
 *
 * The typed getters read an optional member of an object: absent or JSON null
 * leaves the default, a value of the wrong type is SPARQ_E_FORMAT naming the
 * file and the key. */
#ifndef SPARQ_FORMATS_JSON_H
#define SPARQ_FORMATS_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Parse `len` bytes of JSON (no NUL terminator needed). `name` is used in
 * messages. *out is a new reference (json_decref it). */
sparq_status sq_json_parse(json_t **out, const char *text, size_t len, const char *name);

/* Read and parse a whole file (at most max_size bytes; 0 = no limit). */
sparq_status sq_json_load_file(json_t **out, const char *path, size_t max_size);

/* Typed optional members of `obj`. `name` (the file) and `key` appear in
 * messages. *out keeps its previous value when the key is absent or null. */
sparq_status sq_json_get_int(const json_t *obj, const char *key, int64_t *out, const char *name);
/* Accepts integers and reals. */
sparq_status sq_json_get_double(const json_t *obj, const char *key, double *out, const char *name);
sparq_status sq_json_get_bool(const json_t *obj, const char *key, bool *out, const char *name);
/* Copies into buf (cap bytes, NUL terminated); too long is SPARQ_E_FORMAT. */
sparq_status sq_json_get_str(const json_t *obj, const char *key, char *buf, size_t cap, const char *name);

#endif
