/* tests/fuzz/fuzz_recipe.c — the quantizer's recipe parser (quantize/recipe.c,
 * `sparq quantize --recipe FILE`) on arbitrary bytes: parse, read every rule
 * (pattern and K), free. */
#include <stdint.h>
#include <string.h>

#include "quantize/driver.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qz_recipe r;
    if (qz_recipe_parse("fuzz", (const char *)data, size, &r) == SPARQ_OK) {
        size_t sum = 0;
        for (int i = 0; i < r.n; i++) {
            if (r.rules[i].K < 1 || r.rules[i].K > 8) __builtin_trap();
            sum += strlen(r.rules[i].pattern);
        }
        (void)sum;
        qz_recipe_free(&r);
    }
    return 0;
}
