/*
 * cu_util.h - shared scaffolding for the CUnit suites: a main that runs
 * the registered suites in basic mode and returns non-zero on any failure,
 * plus float comparison helpers.
 */
#ifndef DT_CU_UTIL_H
#define DT_CU_UTIL_H

#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Relative difference |a-b| / max(|a|, |b|, floor). */
static inline double cu_rel_diff(double a, double b, double floor_)
{
    double m = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    if (m < floor_)
        m = floor_;
    return fabs(a - b) / m;
}

/* Temporary directory for files a test writes (set by ctest). */
static inline const char *cu_tmpdir(void)
{
    const char *d = getenv("DTRAIN_TEST_TMP");
    return d && *d ? d : "/tmp";
}

/* Runs every registered suite; exit status is the number of failures. */
static inline int cu_run_all(void)
{
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}

#define CU_ADD(suite, fn) CU_add_test(suite, #fn, fn)

#endif
