/*
 * test_scaler.c - the fp16 loss-scale state machine, driven by injected
 * overflows: back-off and skip, growth after clean steps, the floor.
 */
#include "runtime/train/scaler.h"
#include <string.h>

#include "cu_util.h"

static void test_defaults(void)
{
    struct dt_scaler s;
    dt_scaler_init(&s);
    CU_ASSERT_DOUBLE_EQUAL(s.scale, 65536.0, 0);
    CU_ASSERT_DOUBLE_EQUAL(dt_scaler_unscale(&s), 1.0 / 65536.0, 0);
}

static void test_overflow_halves_and_skips(void)
{
    struct dt_scaler s;
    int skip = 0;
    dt_scaler_init(&s);
    CU_ASSERT_EQUAL(dt_scaler_update(&s, 0, &skip), DT_OK);
    CU_ASSERT_EQUAL(skip, 1);
    CU_ASSERT_DOUBLE_EQUAL(s.scale, 32768.0, 0);
    CU_ASSERT_EQUAL(dt_scaler_update(&s, 1, &skip), DT_OK);
    CU_ASSERT_EQUAL(skip, 0);
    CU_ASSERT_DOUBLE_EQUAL(s.scale, 32768.0, 0);
    CU_ASSERT_EQUAL(s.overflows, 1);
}

static void test_growth_after_clean_steps(void)
{
    struct dt_scaler s;
    int skip = 1;
    dt_scaler_init(&s);
    for (int i = 0; i < DT_SCALER_GROWTH_INTERVAL - 1; i++)
        CU_ASSERT_EQUAL_FATAL(dt_scaler_update(&s, 1, &skip), DT_OK);
    CU_ASSERT_DOUBLE_EQUAL(s.scale, 65536.0, 0);
    CU_ASSERT_EQUAL(dt_scaler_update(&s, 1, &skip), DT_OK);
    CU_ASSERT_DOUBLE_EQUAL(s.scale, 131072.0, 0);
    /* an overflow restarts the count */
    for (int i = 0; i < 1500; i++)
        dt_scaler_update(&s, 1, &skip);
    dt_scaler_update(&s, 0, &skip);
    CU_ASSERT_DOUBLE_EQUAL(s.scale, 65536.0, 0);
    for (int i = 0; i < 1999; i++)
        dt_scaler_update(&s, 1, &skip);
    CU_ASSERT_DOUBLE_EQUAL(s.scale, 65536.0, 0);
    dt_scaler_update(&s, 1, &skip);
    CU_ASSERT_DOUBLE_EQUAL(s.scale, 131072.0, 0);
}

static void test_floor_stops(void)
{
    struct dt_scaler s;
    int skip = 0, steps = 0;
    dt_status st = DT_OK;
    dt_scaler_init(&s);
    while (st == DT_OK && steps < 100) {
        st = dt_scaler_update(&s, 0, &skip);
        steps++;
    }
    /* 2^16 halves 16 times to 1; the 17th overflow would go below the floor */
    CU_ASSERT_EQUAL(st, DT_ERR_BAD_DATA);
    CU_ASSERT_EQUAL(steps, 17);
    CU_ASSERT_DOUBLE_EQUAL(s.scale, 1.0, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "floor"));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("scaler", NULL, NULL);
    CU_ADD(s, test_defaults);
    CU_ADD(s, test_overflow_halves_and_skips);
    CU_ADD(s, test_growth_after_clean_steps);
    CU_ADD(s, test_floor_stops);
    return cu_run_all();
}
