/*
 * test_dataset_lm.c - CUnit suite for language-model datasets
 * (io/dataset_lm.c): token windows at every offset, uint16 and int32
 * tokens, short splits, tokens past the vocabulary, bad attributes and
 * types, and the loader's moving windows.
 *
 * Every file a test needs is made here or by io_common.c, in the
 * suite's private directory.
 */
#define _GNU_SOURCE
#include <hdf5.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "io_common.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "core/status.h"

/* ---- language-model datasets ------------------------------------------- */

static void test_lm_windows(void)
{
    char p[4096];
    const hid_t types[2] = {H5T_STD_U16LE, H5T_STD_I32LE};
    for (int k = 0; k < 2; k++) {
        tpath(p, sizeof p, k ? "lm32.h5" : "lm16.h5");
        make_lm(p, types[k], 23, 5, 0, LM_V);
        dt_dataset_t *ds = NULL;
        ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
        CU_ASSERT_FATAL(ds != NULL);
        const struct dt_dataset_info *in = dt_dataset_get_info(ds);
        CU_ASSERT_EQUAL(in->lm, 1);
        CU_ASSERT_EQUAL(in->vocab_size, LM_V);
        const struct dt_split_info *tr, *va;
        ASSERT_STATUS(dt_dataset_split(ds, "train", &tr), DT_OK);
        ASSERT_STATUS(dt_dataset_split(ds, "val", &va), DT_OK);
        CU_ASSERT_EQUAL(tr->tokens, 23);
        CU_ASSERT_EQUAL(tr->x_dtype, k ? DT_I32 : DT_U16);
        CU_ASSERT_EQUAL(tr->n, 0); /* no windows before a sequence length */
        ASSERT_STATUS(dt_dataset_set_seq_len(ds, 4), DT_OK);
        /* 22 / 4 = 5 whole windows: 4 offered, at any of 4 offsets */
        CU_ASSERT_EQUAL(tr->n, 4);
        CU_ASSERT_EQUAL(tr->window_shifts, 4);
        CU_ASSERT_EQUAL(tr->sample_elems, 4);
        /* 5 tokens are exactly one window, at offset 0 only */
        CU_ASSERT_EQUAL(va->n, 1);
        CU_ASSERT_EQUAL(va->window_shifts, 1);
        uint64_t idx[3] = {3, 0, 2};
        float x[12];
        int32_t y[12];
        for (int64_t shift = 0; shift < 4; shift++) {
            uint64_t bytes = 0;
            ASSERT_STATUS(dt_dataset_read_windows(ds, "train", idx, 3, shift, x, y, &bytes),
                          DT_OK);
            int bad = 0;
            for (int i = 0; i < 3; i++)
                for (int t = 0; t < 4; t++) {
                    int64_t at = shift + (int64_t)idx[i] * 4 + t;
                    bad += x[i * 4 + t] != (float)lm_tok(at) || y[i * 4 + t] != lm_tok(at + 1);
                }
            CU_ASSERT_EQUAL(bad, 0);
            CU_ASSERT_EQUAL(bytes, 3 * 5 * (k ? 4u : 2u));
        }
        /* the plain read is offset 0 */
        float x0[12];
        int32_t y0[12];
        ASSERT_STATUS(dt_dataset_read(ds, "train", idx, 3, x0, y0, NULL), DT_OK);
        ASSERT_STATUS(dt_dataset_read_windows(ds, "train", idx, 3, 0, x, y, NULL), DT_OK);
        CU_ASSERT(memcmp(x0, x, sizeof x) == 0 && memcmp(y0, y, sizeof y) == 0);
        ASSERT_STATUS(dt_dataset_read_windows(ds, "train", idx, 3, 4, x, y, NULL),
                      DT_ERR_INVALID_ARG);
        ASSERT_STATUS(dt_dataset_read_windows(ds, "val", idx + 1, 1, 1, x, y, NULL),
                      DT_ERR_INVALID_ARG);
        uint64_t far = 4;
        ASSERT_STATUS(dt_dataset_read_windows(ds, "train", &far, 1, 0, x, y, NULL),
                      DT_ERR_INVALID_ARG);
        /* too long a window for the val split */
        ASSERT_STATUS(dt_dataset_set_seq_len(ds, 5), DT_ERR_BAD_DATA);
        ASSERT_MSG("split 'val' has 5 tokens, fewer than one window of seq_len + 1 = 6");
        ASSERT_STATUS(dt_dataset_set_seq_len(ds, 0), DT_ERR_USAGE);
        dt_dataset_close(ds);
    }
}

static void test_lm_refused(void)
{
    char p[4096], q[4096], both[8200];
    dt_dataset_t *ds = NULL;
    /* a token past the vocabulary: refused where a read meets it */
    tpath(p, sizeof p, "lm-vocab.h5");
    make_lm(p, H5T_STD_U16LE, 40, 10, 0, 20);
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    ASSERT_STATUS(dt_dataset_set_seq_len(ds, 4), DT_OK);
    uint64_t idx = 0;
    float x[4];
    int32_t y[4];
    ASSERT_STATUS(dt_dataset_read_windows(ds, "train", &idx, 1, 0, x, y, NULL), DT_ERR_BAD_DATA);
    ASSERT_MSG("token 3 of split 'train' is 24, outside the vocabulary [0, 20)");
    dt_dataset_close(ds);
    ds = NULL;
    tpath(p, sizeof p, "lm-novocab.h5");
    make_lm(p, H5T_STD_U16LE, 40, 10, 1, LM_V);
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG("needs a 'vocab_size' attribute");
    tpath(p, sizeof p, "lm-tok.h5");
    make_lm(p, H5T_STD_U16LE, 40, 10, 2, LM_V);
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG("tokenizer 'sentencepiece' is not one dtrain knows");
    tpath(p, sizeof p, "lm-f32.h5");
    make_lm(p, H5T_IEEE_F32LE, 40, 10, 0, LM_V);
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG("token ids must be uint16 or int32");
    tpath(p, sizeof p, "lm-a.h5");
    tpath(q, sizeof q, "lm-b.h5");
    make_lm(p, H5T_STD_U16LE, 40, 10, 0, LM_V);
    make_lm(q, H5T_STD_U16LE, 40, 10, 0, LM_V);
    snprintf(both, sizeof both, "%s\n%s", p, q);
    ASSERT_STATUS(dt_dataset_open(both, &ds), DT_ERR_USAGE);
    ASSERT_MSG("a language-model dataset is one file");
    /* a classification file has no windows */
    tpath(p, sizeof p, "lm-cls.h5");
    make_ds(p, H5T_IEEE_F32LE, 10, 3, 2, 1, 1, 0, 1);
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    ASSERT_STATUS(dt_dataset_set_seq_len(ds, 4), DT_ERR_USAGE);
    dt_dataset_close(ds);
}

/* The loader reads windows at the epoch's offset, seq_len labels a row. */
static void test_lm_loader(void)
{
    char p[4096];
    tpath(p, sizeof p, "lm-loader.h5");
    make_lm(p, H5T_STD_U16LE, 1000, 100, 0, LM_V);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    ASSERT_STATUS(dt_dataset_set_seq_len(ds, 8), DT_OK);
    const int64_t T = 8;
    int shifts_seen = 0;
    int64_t first = -1;
    for (int64_t epoch = 0; epoch < 4; epoch++) {
        struct dt_loader_opts o = {.ds = ds, .split = "train", .global_batch = 16,
                                   .micro_batch = 8, .rank = 0, .world = 1, .seed = 7,
                                   .shuffle = 1, .drop_last = 1, .workers = 2, .prefetch = 2,
                                   .shift_windows = 1};
        dt_loader_t *ld = NULL;
        ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
        CU_ASSERT_FATAL(ld != NULL);
        ASSERT_STATUS(dt_loader_start_epoch(ld, epoch, 0), DT_OK);
        int64_t shift = dt_loader_window_shift(7, epoch, T);
        CU_ASSERT(shift >= 0 && shift < T);
        if (first < 0)
            first = shift;
        else
            shifts_seen += shift != first;
        int bad = 0, end = 0;
        for (;;) {
            struct dt_batch b;
            ASSERT_STATUS(dt_loader_next(ld, &b, &end), DT_OK);
            if (end)
                break;
            for (int64_t i = 0; i < b.rows; i++)
                for (int64_t t = 0; t < T; t++) {
                    int64_t at = shift + (int64_t)b.sample_ids[i] * T + t;
                    bad += b.x[i * T + t] != (float)lm_tok(at) || b.y[i * T + t] != lm_tok(at + 1);
                }
            dt_loader_release(ld, &b);
        }
        CU_ASSERT_EQUAL(bad, 0);
        dt_loader_destroy(ld);
    }
    CU_ASSERT(shifts_seen > 0); /* the boundaries move between epochs */
    dt_dataset_close(ds);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("io_dataset_lm", io_suite_init, NULL);
    CU_ADD(s, test_lm_windows);
    CU_ADD(s, test_lm_refused);
    CU_ADD(s, test_lm_loader);
    return io_run_all();
}
