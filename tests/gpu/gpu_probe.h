/* tests/gpu/gpu_probe.h — does this machine have a usable NVIDIA GPU?
 * Loads the driver library at run time (no link-time CUDA dependency), so the
 * same test binary says "skipped: no GPU" on CI and runs on the GPU machine. */
#ifndef SPARQ_TESTS_GPU_PROBE_H
#define SPARQ_TESTS_GPU_PROBE_H
#include <dlfcn.h>

/* Number of CUDA devices, or 0 with *why set when there is none. */
static inline int gpu_probe_count(const char **why)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        *why = "no NVIDIA driver (libcuda.so.1 not found)";
        return 0;
    }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    int n = 0;
    if (!init || !count || init(0) != 0 || count(&n) != 0 || n == 0) {
        *why = "NVIDIA driver present but no usable GPU";
        n = 0;
    }
    return n;
}
#endif
