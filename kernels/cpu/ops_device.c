/* kernels/cpu/ops_device.c — choosing where a forward pass runs.
 *
 * sq_exec_create_on() is the one entry point the runtime uses: the CPU exec
 * (kernels/cpu/ops.c) or the CUDA exec (kernels/cuda/backend_cuda.h). It
 * lives beside the CPU backend, not in kernels/cuda/, because it must exist
 * in builds without CUDA too, where asking for "cuda" is a clear error rather
 * than a link failure.
 *
 * The CUDA backend is not linked into the sparq binary: it is the module
 * libsparq_cuda.so (meson.build says why: cuBLAS alone costs ~215 MB of
 * resident memory at start-up), opened here on the first request for a CUDA
 * exec. It is looked for in $SPARQ_CUDA_MODULE, then beside the executable,
 * one directory up (the build tree), and in ../lib/sparq and the like (an
 * install).
 * Programs that link the CUDA code statically (the GPU tests) provide
 * sq_exec_create_cuda themselves, and that definition is used instead. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/cuda/calib_cuda.h"
#include "kernels/cuda/ldlq_cuda.h"
#include "sparq_version.h"

/* Defined when the program links kernels/cuda statically. */
extern sparq_status sq_exec_create_cuda(sq_exec **out, int n_threads) __attribute__((weak));
extern const ldlq_cuda_ops *ldlq_cuda_get_ops(void) __attribute__((weak));
extern const calib_cuda_ops *calib_cuda_get_ops(void) __attribute__((weak));

sparq_status sq_device_parse(const char *s, sq_device *out)
{
    if (s && strcmp(s, "cpu") == 0) *out = SQ_DEVICE_CPU;
    else if (s && strcmp(s, "cuda") == 0) *out = SQ_DEVICE_CUDA;
    else return sparq_err(SPARQ_E_ARG, "device '%s': expected cpu or cuda", s ? s : "(null)");
    return SPARQ_OK;
}

#if SPARQ_HAVE_CUDA
typedef sparq_status (*create_fn)(sq_exec **out, int n_threads);

/* Open the module and find `sym` in it; on failure *why says what was tried. */
static void *load_module_symbol(const char *sym, char *why, size_t why_len)
{
    static void *handle;
    if (handle) {
        void *f = dlsym(handle, sym);
        if (!f) snprintf(why, why_len, "the CUDA module has no %s", sym);
        return f;
    }
    char exe[PATH_MAX], cand[PATH_MAX + 64];
    _Static_assert(sizeof cand > sizeof exe, "room for a suffix");
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    const char *env = getenv("SPARQ_CUDA_MODULE");
    const char *const rel[] = {"/libsparq_cuda.so", "/../libsparq_cuda.so", "/../lib/sparq/libsparq_cuda.so",
                               "/../lib64/sparq/libsparq_cuda.so", "/../lib/x86_64-linux-gnu/sparq/libsparq_cuda.so",
                               "/../lib/aarch64-linux-gnu/sparq/libsparq_cuda.so"};
    size_t wl = 0;
    why[0] = 0;
    for (int i = -1; i < (int)(sizeof rel / sizeof rel[0]); i++) {
        if (i < 0 && !env) continue;
        if (i < 0) snprintf(cand, sizeof cand, "%s", env);
        else snprintf(cand, sizeof cand, "%s%s", exe, rel[i]);
        if (access(cand, R_OK) != 0) continue;
        void *h = dlopen(cand, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            int w = snprintf(why + wl, why_len - wl, "%s%s", wl ? "; " : "", dlerror());
            if (w > 0 && (size_t)w < why_len - wl) wl += (size_t)w;
            continue;
        }
        void *f = dlsym(h, sym);
        if (f) {
            handle = h;
            return f;
        }
        int w = snprintf(why + wl, why_len - wl, "%s%s: no %s", wl ? "; " : "", cand, sym);
        if (w > 0 && (size_t)w < why_len - wl) wl += (size_t)w;
        dlclose(h);
    }
    if (!why[0]) snprintf(why, why_len, "libsparq_cuda.so not found beside %.900s (or set SPARQ_CUDA_MODULE)", exe);
    return NULL;
}
#endif

sparq_status sq_exec_create_on(sq_exec **out, sq_device dev, int n_threads)
{
    *out = NULL;
    if (dev == SQ_DEVICE_CPU) return sq_exec_create(out, n_threads);
#if SPARQ_HAVE_CUDA
    if (sq_exec_create_cuda) return sq_exec_create_cuda(out, n_threads);
    char why[1024];
    create_fn f = (create_fn)load_module_symbol("sq_exec_create_cuda", why, sizeof why);
    if (!f) return sparq_err(SPARQ_E_UNSUPPORTED, "device cuda: cannot load the CUDA backend module: %s", why);
    return f(out, n_threads);
#else
    (void)n_threads;
    return sparq_err(SPARQ_E_UNSUPPORTED, "device cuda: this sparq was built without CUDA (meson -Dcuda=enabled)");
#endif
}

/* A table getter of the CUDA module: the linked one (the GPU tests link the
 * objects; `linked` is then set), else `sym` from the dlopen-ed module. */
typedef const void *(*table_fn)(void);
static const void *cuda_table(table_fn linked, const char *sym)
{
#if SPARQ_HAVE_CUDA
    if (linked) return linked();
    char why[1024];
    table_fn f = (table_fn)load_module_symbol(sym, why, sizeof why);
    if (!f) {
        sparq_err(SPARQ_E_UNSUPPORTED, "device cuda: cannot load the CUDA module: %s", why);
        return NULL;
    }
    return f();
#else
    (void)linked;
    (void)sym;
    sparq_err(SPARQ_E_UNSUPPORTED, "device cuda: this sparq was built without CUDA (meson -Dcuda=enabled)");
    return NULL;
#endif
}

const ldlq_cuda_ops *sq_cuda_ldlq_ops(void)
{
    return cuda_table(ldlq_cuda_get_ops ? (table_fn)ldlq_cuda_get_ops : NULL, "ldlq_cuda_get_ops");
}

const calib_cuda_ops *sq_cuda_calib_ops(void)
{
    return cuda_table(calib_cuda_get_ops ? (table_fn)calib_cuda_get_ops : NULL, "calib_cuda_get_ops");
}
