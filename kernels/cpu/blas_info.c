/*
 * blas_info.c - names the CPU BLAS this binary runs with, for `dtrain
 * doctor`. OpenBLAS describes itself at run time (openblas_get_config:
 * version, target CPU, threading, maximum threads), which is what was
 * really loaded, not what the build saw; another CBLAS has no such call, so
 * only that it is not OpenBLAS can be said.
 */
#include <stdio.h>
#include <string.h>

#include "kernels/backend.h"

/* Last: it pulls in <complex.h>, whose macro `I` clashes with ops.h. */
#include <cblas.h>
#undef I

void dt_blas_info(char *buf, size_t len)
{
#ifdef OPENBLAS_VERSION
    const char *config = openblas_get_config();
    snprintf(buf, len, "OpenBLAS (%s)", config ? config : "no configuration string");
#else
    snprintf(buf, len, "a CBLAS other than OpenBLAS (its version is not known)");
#endif
}
