/* tests/formats/test_npy.c — tests/npy.h, the .npy reader other tests use:
 * the golden arrays of tests/data/exl3-model read with the right dtype, shape
 * and values (checked against numpy), and unsupported files refused. */
#include "npy.h"
#include "t.h"

static void test_golden_arrays(void)
{
    npy_array a;
    CHECK_EQ_INT(npy_load(t_data_path("exl3-model/ids.npy"), &a), 0);
    CHECK(a.kind == 'i' && a.itemsize == 4 && a.ndim == 1 && a.shape[0] == 512 && a.count == 512);
    if (a.data) {
        const int32_t *ids = a.data;
        CHECK(ids[0] == 201 && ids[1] == 422 && ids[2] == 2190);
    }
    npy_free(&a);
    CHECK_EQ_INT(npy_load(t_data_path("exl3-model/exl3_top20_lp.npy"), &a), 0);
    CHECK(a.kind == 'f' && a.itemsize == 4 && a.ndim == 2 && a.shape[0] == 512 && a.shape[1] == 20);
    if (a.data) CHECK_NEAR(((const float *)a.data)[0], -1.8952055, 1e-6);
    npy_free(&a);
    CHECK_EQ_INT(npy_load(t_data_path("exl3-model/exl3_logits128.npy"), &a), 0);
    CHECK(a.ndim == 2 && a.shape[0] == 128 && a.shape[1] == 4096);
    if (a.data) CHECK_NEAR(((const float *)a.data)[0], -0.9355469, 1e-6);
    npy_free(&a);
}

static void test_refused(void)
{
    npy_array a;
    CHECK_EQ_INT(npy_load(t_data_path("exl3-model/text.txt"), &a), -1); /* not .npy */
    CHECK(a.data == NULL);
    CHECK_EQ_INT(npy_load(t_data_path("exl3-model/no-such.npy"), &a), -1);
    char path[512];
    snprintf(path, sizeof path, "%s/f8.npy", t_tmpdir());
    FILE *f = fopen(path, "wb");
    const char hdr[] = "\x93NUMPY\x01\x00\x36\x00{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }\n";
    fwrite(hdr, 1, sizeof hdr - 1, f);
    fclose(f);
    CHECK_EQ_INT(npy_load(path, &a), -1); /* float64 unsupported */
}

int main(void)
{
    RUN(test_golden_arrays);
    RUN(test_refused);
    return t_summary();
}
