/*
 * test_gpu_streams.c - the cuda backend's ordering promises, where work
 * on the device runs later than the host call that queued it:
 *
 *   - uploads ahead (dt_backend_upload_ahead, the model's input batches on
 *     the copy stream): a slot is rewritten only after the ops queued
 *     before its dt_backend_slot_free have read it, and the ops queued
 *     after an upload read the new bytes; several batches in a row with no
 *     host wait between them, as an evaluation runs;
 *   - a pinned buffer (dt_backend_host_alloc) may be refilled once
 *     dt_backend_host_idle returns, and the upload queued before still
 *     brings the old bytes;
 *   - an upload from pageable memory, and a slot out of range.
 *
 * On a GPU the order is whatever the hardware's timing makes it, so these
 * pass or fail by luck there; under the host emulation ctest runs the
 * suite three times, with DTRAIN_CUDA_EMU_STREAMS=sync, deferred (every
 * stream's work as late as its waits allow) and split (the compute stream
 * late, the copy stream at once), which turn each missing wait into a
 * wrong result (docs/testing.md). Exits 77 (skipped) without a usable GPU.
 */
#include <string.h>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "tests/unit/cu_util.h"

#define SKIP_CODE 77
#define N 1000    /* floats per batch */
#define BATCHES 6 /* more than the slots, so each slot is reused */

static dt_backend_t *be;
static const struct dt_ops *ops;

static int suite_init(void)
{
    struct dt_backend_opts o = {.threads = 1, .precision = DT_F32};
    if (dt_backend_create("cuda", &o, &be) != DT_OK)
        return 1;
    ops = dt_backend_ops(be);
    return 0;
}

static int suite_cleanup(void)
{
    dt_backend_destroy(be);
    be = NULL;
    return 0;
}

/* Downloads n floats of d and counts those not equal to want. */
static int count_not(const float *d, size_t n, float want)
{
    float host[N];
    CU_ASSERT_FATAL(n <= N);
    CU_ASSERT_EQUAL_FATAL(dt_backend_copy(be, host, d, n * sizeof(float), DT_COPY_D2H), DT_OK);
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += host[i] != want;
    if (bad)
        printf("\n  %d values are not %g (the first: %g)", bad, (double)want, (double)host[0]);
    return bad;
}

/* Batch b (value b + 1 everywhere) from its own pinned buffer into slot
 * b % 2, read by accumulate into out[b] right after; the previous slot
 * freed before each upload, as the model does. No host wait until the
 * end, so the slots are rewritten while earlier batches' reads are still
 * queued. */
static void test_upload_ahead_slots(void)
{
    float *host[BATCHES] = {0}, *slot[DT_BACKEND_INPUT_SLOTS] = {0}, *out[BATCHES] = {0};
    for (int b = 0; b < BATCHES; b++) {
        CU_ASSERT_EQUAL_FATAL(dt_backend_host_alloc(be, N * sizeof(float), (void **)&host[b]),
                              DT_OK);
        CU_ASSERT_EQUAL_FATAL(dt_backend_alloc(be, N * sizeof(float), (void **)&out[b]), DT_OK);
        for (int i = 0; i < N; i++)
            host[b][i] = (float)(b + 1);
    }
    for (int k = 0; k < DT_BACKEND_INPUT_SLOTS; k++)
        CU_ASSERT_EQUAL_FATAL(dt_backend_alloc(be, N * sizeof(float), (void **)&slot[k]), DT_OK);
    for (int b = 0; b < BATCHES; b++) {
        int k = b % DT_BACKEND_INPUT_SLOTS;
        int prev = (k + DT_BACKEND_INPUT_SLOTS - 1) % DT_BACKEND_INPUT_SLOTS;
        CU_ASSERT_EQUAL(dt_backend_slot_free(be, prev), DT_OK);
        CU_ASSERT_EQUAL(dt_backend_upload_ahead(be, k, slot[k], host[b], N * sizeof(float)), DT_OK);
        CU_ASSERT_EQUAL(ops->accumulate(be, out[b], slot[k], N), DT_OK);
    }
    CU_ASSERT_EQUAL(dt_backend_sync(be), DT_OK);
    for (int b = 0; b < BATCHES; b++) {
        int bad = count_not(out[b], N, (float)(b + 1));
        if (bad)
            printf("\n  batch %d: %d of %d values read from another batch\n", b, bad, N);
        CU_ASSERT_EQUAL(bad, 0);
    }
    for (int b = 0; b < BATCHES; b++) {
        dt_backend_host_free(be, host[b]);
        dt_backend_free(be, out[b]);
    }
    for (int k = 0; k < DT_BACKEND_INPUT_SLOTS; k++)
        dt_backend_free(be, slot[k]);
}

/* One pinned buffer refilled between uploads, as a loader worker does:
 * host_idle first, then the new bytes; each upload brings its own. */
static void test_host_idle_refill(void)
{
    float *host = NULL, *slot[DT_BACKEND_INPUT_SLOTS] = {0}, *out[BATCHES] = {0};
    CU_ASSERT_EQUAL_FATAL(dt_backend_host_alloc(be, N * sizeof(float), (void **)&host), DT_OK);
    for (int k = 0; k < DT_BACKEND_INPUT_SLOTS; k++)
        CU_ASSERT_EQUAL_FATAL(dt_backend_alloc(be, N * sizeof(float), (void **)&slot[k]), DT_OK);
    for (int b = 0; b < BATCHES; b++) {
        CU_ASSERT_EQUAL_FATAL(dt_backend_alloc(be, N * sizeof(float), (void **)&out[b]), DT_OK);
        int k = b % DT_BACKEND_INPUT_SLOTS;
        CU_ASSERT_EQUAL(dt_backend_host_idle(be, host), DT_OK);
        for (int i = 0; i < N; i++)
            host[i] = (float)(10 * (b + 1));
        CU_ASSERT_EQUAL(dt_backend_slot_free(be, (k + 1) % DT_BACKEND_INPUT_SLOTS), DT_OK);
        CU_ASSERT_EQUAL(dt_backend_upload_ahead(be, k, slot[k], host, N * sizeof(float)), DT_OK);
        CU_ASSERT_EQUAL(ops->accumulate(be, out[b], slot[k], N), DT_OK);
    }
    CU_ASSERT_EQUAL(dt_backend_sync(be), DT_OK);
    for (int b = 0; b < BATCHES; b++) {
        int bad = count_not(out[b], N, (float)(10 * (b + 1)));
        if (bad)
            printf("\n  upload %d: %d of %d values from a later fill of the buffer\n", b, bad, N);
        CU_ASSERT_EQUAL(bad, 0);
        dt_backend_free(be, out[b]);
    }
    dt_backend_host_free(be, host);
    for (int k = 0; k < DT_BACKEND_INPUT_SLOTS; k++)
        dt_backend_free(be, slot[k]);
}

/* From pageable memory the upload is an ordinary copy: the caller may
 * change its buffer at once. A slot outside the range is refused. */
static void test_upload_ahead_pageable(void)
{
    float host[N], *slot = NULL, *out = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_backend_alloc(be, N * sizeof(float), (void **)&slot), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_backend_alloc(be, N * sizeof(float), (void **)&out), DT_OK);
    for (int i = 0; i < N; i++)
        host[i] = 3.0f;
    CU_ASSERT_EQUAL(dt_backend_upload_ahead(be, 0, slot, host, sizeof host), DT_OK);
    for (int i = 0; i < N; i++)
        host[i] = -1.0f;
    CU_ASSERT_EQUAL(ops->accumulate(be, out, slot, N), DT_OK);
    CU_ASSERT_EQUAL(count_not(out, N, 3.0f), 0);
    CU_ASSERT_EQUAL(dt_backend_upload_ahead(be, DT_BACKEND_INPUT_SLOTS, slot, host, sizeof host),
                    DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "slot"));
    CU_ASSERT_EQUAL(dt_backend_slot_free(be, -1), DT_ERR_INVALID_ARG);
    dt_backend_free(be, slot);
    dt_backend_free(be, out);
}

int main(void)
{
    char why[512];
    if (!dt_cuda_usable(why, sizeof why)) {
        printf("test_gpu_streams: SKIPPED: %s\n", why);
        return SKIP_CODE;
    }
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("cuda_streams", suite_init, suite_cleanup);
    CU_ADD(s, test_upload_ahead_slots);
    CU_ADD(s, test_host_idle_refill);
    CU_ADD(s, test_upload_ahead_pageable);
    return cu_run_all();
}
