/* tests/fuzz/fuzz_openai.c — libFuzzer target for the OpenAI request parser
 * (sq_oai_parse, runtime/serve/openai.h), both kinds. An accepted request must
 * hold what sparq can run (one prompt or 1..256 messages, ≤ 4 stop strings,
 * sampler values in range); a refused one names an error and holds nothing. */
#include <stddef.h>
#include <stdint.h>

#include "runtime/serve/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int kind = 0; kind < 2; kind++) {
        sq_oai_request r;
        const char *param;
        if (sq_oai_parse((const char *)data, size, (sq_oai_kind)kind, &r, &param) != SPARQ_OK) {
            if (r.prompt || r.n_msgs || r.n_stop) __builtin_trap();
            continue;
        }
        if (kind == SQ_OAI_COMPLETION && !r.prompt) __builtin_trap();
        if (kind == SQ_OAI_CHAT && (r.n_msgs < 1 || r.n_msgs > SQ_OAI_MAX_MSGS)) __builtin_trap();
        for (int i = 0; i < r.n_msgs; i++)
            if (!r.msgs[i].content) __builtin_trap();
        if (r.n_stop > SQ_OAI_MAX_STOP || r.max_tokens < -1) __builtin_trap();
        for (int i = 0; i < r.n_stop; i++)
            if (!r.stop[i] || !r.stop[i][0]) __builtin_trap();
        if (!(r.sampler.temp >= 0) || !(r.sampler.top_p > 0 && r.sampler.top_p <= 1) || r.sampler.top_k < 0)
            __builtin_trap();
        sq_oai_request_free(&r);
    }
    return 0;
}
