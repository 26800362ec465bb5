/* tests/quantize/test_devices_arg.c — `sparq quantize --devices LIST`'s parser
 * (qz_devices_parse, quantize/driver.h), no GPU needed: the lists it takes
 * (one device, several, the same one twice, the most there may be), those it
 * refuses (empty, an empty entry, not a number, a sign, too many), and that
 * each refusal's message names what is wrong. */
#include <string.h>

#include "quantize/driver.h"
#include "t.h"

static void test_accepted(void)
{
    int d[QZ_MAX_DEVICES], n = -1;
    CHECK(qz_devices_parse("0", d, &n) == SPARQ_OK);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(d[0], 0);
    CHECK(qz_devices_parse("3,1,12", d, &n) == SPARQ_OK);
    CHECK_EQ_INT(n, 3);
    CHECK(d[0] == 3 && d[1] == 1 && d[2] == 12);
    CHECK(qz_devices_parse("0,0", d, &n) == SPARQ_OK); /* duplicates: two contexts on one GPU */
    CHECK(n == 2 && d[0] == 0 && d[1] == 0);
    CHECK(qz_devices_parse("0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,7", d, &n) == SPARQ_OK);
    CHECK(n == QZ_MAX_DEVICES && d[15] == 7);
}

static void refused(const char *list, const char *want)
{
    int d[QZ_MAX_DEVICES], n = -1;
    CHECK_MSG(qz_devices_parse(list, d, &n) == SPARQ_E_ARG, "'%s' was accepted", list);
    CHECK_MSG(n == 0, "'%s': n = %d after a refusal", list, n);
    CHECK_MSG(strstr(sparq_errmsg(), want) != NULL, "'%s': message '%s' lacks '%s'", list, sparq_errmsg(), want);
}

static void test_refused(void)
{
    refused("", "empty list");
    refused("a", "'a' is not a CUDA device ordinal");
    refused("-1", "'-1' is not a CUDA device ordinal");
    refused("0,,1", "entry 2 is empty");
    refused("0,", "entry 2 is empty");
    refused(",0", "entry 1 is empty");
    refused("1, 2", "' 2' is not a CUDA device ordinal");
    refused("0,1x", "'1x' is not");
    refused("1000", "'1000' is not a CUDA device ordinal (0..999)");
    refused("0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0", "more than 16 devices");
}

int main(void)
{
    RUN(test_accepted);
    RUN(test_refused);
    return t_summary();
}
