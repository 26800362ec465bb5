/* tests/gpu/test_gpu_present.c — first test of the gpu suite: reports the GPUs
 * found, or exits 77 (skipped) saying why there are none. */
#include "../t.h"
#include "gpu_probe.h"

int main(void)
{
    const char *why = "";
    int n = gpu_probe_count(&why);
    if (n == 0) T_SKIP("gpu suite skipped: %s", why);
    printf("%d CUDA device(s)\n", n);
    CHECK(n > 0);
    return t_summary();
}
