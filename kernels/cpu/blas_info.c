/*
 * blas_info.c - the CPU BLAS this binary runs with: its description for
 * `dtrain doctor` and `dtrain version`, and the check of the kernels
 * OpenBLAS chose.
 *
 * OpenBLAS describes itself at run time (openblas_get_config: version,
 * target CPU, threading, maximum threads), which is what was really
 * loaded, not what the build saw; another CBLAS has no such call, so only
 * that it is not OpenBLAS can be said.
 *
 * An OpenBLAS built for many CPUs (DYNAMIC_ARCH, as distributions ship
 * it) picks its kernels once, as it loads, from the CPU's family and
 * model number. A CPU newer than the library (OpenBLAS 0.3.21 on Emerald
 * Rapids, model 207) is not in its table and gets the oldest x86-64
 * kernels (Prescott, SSE3): a quarter of the speed of the AVX-512 ones on
 * the same core. dt_blas_better_core names the kernels the CPU's own
 * instruction sets call for when OpenBLAS fell back like that; main()
 * then sets OPENBLAS_CORETYPE, which OpenBLAS documents for choosing the
 * kernels, and starts dtrain again so the library loads with it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/backend.h"

/* Last: it pulls in <complex.h>, whose macro `I` clashes with ops.h. */
#include <cblas.h>
#undef I

/* Kernels from before AVX2: OpenBLAS chose one of these for a CPU with
 * AVX2 and FMA only when it did not know the CPU's model. */
static const char *const pre_avx2[] = {
    "Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge", "Atom",
    "Nano", "Katmai", "Coppermine", "Northwood", "Banias", "Athlon", "Opteron",
    "Opteron_SSE3", "Barcelona", "Bobcat",
};

/* The kernels this CPU's instruction sets call for, or NULL (not x86-64,
 * or no AVX2 and FMA). __builtin_cpu_supports also asks whether the
 * operating system saves the AVX and AVX-512 registers. */
static const char *cpu_core(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512cd"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
#endif
    return NULL;
}

const char *dt_blas_core_for(const char *chosen)
{
    const char *want = cpu_core();
    if (!chosen || !want)
        return NULL;
    for (size_t i = 0; i < sizeof pre_avx2 / sizeof pre_avx2[0]; i++)
        if (!strcasecmp(chosen, pre_avx2[i]))
            return want;
    return NULL;
}

const char *dt_blas_better_core(char *chosen, size_t len)
{
    if (len)
        chosen[0] = '\0';
#ifdef OPENBLAS_VERSION
    if (getenv("OPENBLAS_CORETYPE"))
        return NULL; /* the user's choice */
    const char *core = openblas_get_corename(), *want = dt_blas_core_for(core);
    if (want)
        snprintf(chosen, len, "%s", core);
    return want;
#else
    return NULL;
#endif
}

void dt_blas_info(char *buf, size_t len)
{
#ifdef OPENBLAS_VERSION
    const char *config = openblas_get_config();
    const char *fallback = getenv(DT_BLAS_FALLBACK_ENV), *forced = getenv("OPENBLAS_CORETYPE");
    int n = snprintf(buf, len, "OpenBLAS (%s)", config ? config : "no configuration string");
    if (fallback && forced && n >= 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n,
                 "; OPENBLAS_CORETYPE=%s set by dtrain: OpenBLAS chose %s, older than this CPU",
                 forced, fallback);
#else
    snprintf(buf, len, "a CBLAS other than OpenBLAS (its version is not known)");
#endif
}
