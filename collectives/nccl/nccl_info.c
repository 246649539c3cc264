/*
 * nccl_info.c - the NCCL version, for `dtrain doctor`: the library loaded
 * at run time (ncclGetVersion) and, when it differs, the headers this
 * build was compiled against.
 */
#include <nccl.h>
#include <stdio.h>

#include "collectives/comm_impl.h"

/* NCCL codes are 10000*major + 100*minor + patch since 2.9. */
static void format_code(int code, char *buf, size_t len)
{
    snprintf(buf, len, "%d.%d.%d", code / 10000, code % 10000 / 100, code % 100);
}

void dt_nccl_library_version(char *buf, size_t len)
{
    int code = 0;
    char run[32], built[32];
    format_code(NCCL_VERSION_CODE, built, sizeof built);
    if (ncclGetVersion(&code) != ncclSuccess) {
        snprintf(buf, len, "NCCL (built with %s; the library did not say its version)", built);
        return;
    }
    format_code(code, run, sizeof run);
    if (code == NCCL_VERSION_CODE)
        snprintf(buf, len, "NCCL %s", run);
    else
        snprintf(buf, len, "NCCL %s (built with %s)", run, built);
}
