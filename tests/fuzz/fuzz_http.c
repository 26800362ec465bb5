/* tests/fuzz/fuzz_http.c — libFuzzer target for the HTTP request parser
 * (sq_http_parse, runtime/serve/http.h): what `sparq serve` reads from any client.
 * A complete request must lie inside the input, with its body at the end of
 * its headers; every prefix of a complete request must be "need more" or the
 * same error (the reader calls the parser on every prefix it receives).
 * And the parser only looks ahead soundly: if a prefix of the input is
 * complete, so is the input (the same request); if a prefix is refused (an
 * unfinished line no ending could save), so is the input. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "runtime/serve/http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sq_http_request r;
    const char *why;
    const long n = sq_http_parse((const char *)data, size, &r, &why);
    if (n > 0) {
        if ((size_t)n > size || r.header_len + r.body_len != (size_t)n) __builtin_trap();
        if (r.body != (const char *)data + r.header_len || r.body_len > SQ_HTTP_MAX_BODY) __builtin_trap();
        if (r.path[0] != '/' || !r.method[0] || memchr(r.path, '?', strlen(r.path))) __builtin_trap();
        for (size_t cut = 0; cut < (size_t)n; cut += 1 + (size_t)n / 64) {
            sq_http_request p;
            if (sq_http_parse((const char *)data, cut, &p, &why) != 0) __builtin_trap();
        }
    } else if (n < 0) {
        if (!why || !why[0] || n < -505 || n > -400) __builtin_trap();
    }
    for (size_t cut = 0; cut < size; cut += 1 + size / 16) {
        sq_http_request p;
        const long m = sq_http_parse((const char *)data, cut, &p, &why);
        if ((m > 0 && m != n) || (m < 0 && n >= 0)) __builtin_trap();
    }
    return 0;
}
