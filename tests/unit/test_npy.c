/*
 * test_npy.c - CUnit suite for the .npy importer (io/npy.c): values as
 * numpy.save writes them, and (N, C, H, W) arrays with their per-channel
 * mean and std.
 *
 * Every file a test needs is made here or by io_common.c, in the
 * suite's private directory.
 */
#define _GNU_SOURCE
#include <hdf5.h>
#include <stdint.h>
#include <string.h>

#include "io_common.h"
#include "io/dataset.h"
#include "io/npy.h"
#include "core/status.h"

/* ---- the .npy and CSV importers ------------------------------------------- */

/* A .npy file as numpy.save writes it: magic, version, header length,
 * the dict padded to 64 bytes and a newline, then the data. */
static void write_npy(const char *path, int version, const char *descr, const char *shape,
                      const void *data, size_t bytes)
{
    char hdr[256];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr, shape);
    size_t pre = version == 1 ? 10 : 12;
    while ((pre + (size_t)n + 1) % 64)
        hdr[n++] = ' ';
    hdr[n++] = '\n';
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f != NULL);
    unsigned char lead[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)version, 0,
                              (unsigned char)(n & 0xff), (unsigned char)(n >> 8), 0, 0};
    fwrite(lead, 1, pre, f);
    fwrite(hdr, 1, (size_t)n, f);
    fwrite(data, 1, bytes, f);
    fclose(f);
}

static void test_npy_values(void)
{
    char xp[4096], yp[4096], out[4096];
    double x64[3 * 2 * 2];
    float want[3 * 2 * 2];
    int16_t y16[3] = {2, 0, 1};
    int32_t labels[3] = {2, 0, 1};
    for (int i = 0; i < 12; i++) {
        x64[i] = 0.25 * i - 1.0;
        want[i] = (float)x64[i];
    }
    tpath(xp, sizeof xp, "v-x.npy");
    tpath(yp, sizeof yp, "v-y.npy");
    tpath(out, sizeof out, "v-npy.h5");
    write_npy(xp, 2, "<f8", "(3, 2, 2)", x64, sizeof x64);
    write_npy(yp, 1, "<i2", "(3,)", y16, sizeof y16);
    struct dt_npy_import_opts o = {.train_x = xp, .train_y = yp, .out_path = out,
                                   .class_names = "a,b,c"};
    ASSERT_STATUS(dt_npy_import(&o, NULL), DT_OK);
    check_values(out, "train", 3, 4, want, labels);

    /* a truncated array: refused, nothing written */
    write_npy(xp, 1, "<f8", "(3, 2, 2)", x64, sizeof x64 - 8);
    o.overwrite = 1;
    ASSERT_STATUS(dt_npy_import(&o, NULL), DT_ERR_BAD_DATA);
    ASSERT_MSG("truncated");
    check_values(out, "train", 3, 4, want, labels); /* the old file is untouched */
}

/* .npy of (N, C, H, W): per-channel mean and std over the training split;
 * (N, H, W) keeps the scalar normalisation. */
static void test_npy_channels(void)
{
    char xp[4096], yp[4096], out[4096];
    /* 2 samples of (2, 1, 2): channel 0 holds 1, 3 (mean 2, std 1),
     * channel 1 holds 0, 4 (mean 2, std 2) */
    float x[8] = {1, 3, 0, 4, 1, 3, 0, 4};
    int32_t y[2] = {0, 1};
    tpath(xp, sizeof xp, "ch-x.npy");
    tpath(yp, sizeof yp, "ch-y.npy");
    tpath(out, sizeof out, "ch-npy.h5");
    write_npy(xp, 1, "<f4", "(2, 2, 1, 2)", x, sizeof x);
    write_npy(yp, 1, "<i4", "(2,)", y, sizeof y);
    struct dt_npy_import_opts o = {.train_x = xp, .train_y = yp, .out_path = out};
    ASSERT_STATUS(dt_npy_import(&o, NULL), DT_OK);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(out, &ds), DT_OK);
    if (!ds)
        return;
    const struct dt_dataset_info *in = dt_dataset_get_info(ds);
    CU_ASSERT_EQUAL(in->norm_channels, 2);
    CU_ASSERT_EQUAL(in->norm_channel_mean[0], 2.0f);
    CU_ASSERT_EQUAL(in->norm_channel_mean[1], 2.0f);
    CU_ASSERT_EQUAL(in->norm_channel_std[0], 1.0f);
    CU_ASSERT_EQUAL(in->norm_channel_std[1], 2.0f);
    float got[8];
    const uint64_t idx[2] = {0, 1};
    ASSERT_STATUS(dt_dataset_read(ds, "train", idx, 2, got, NULL, NULL), DT_OK);
    for (int i = 0; i < 8; i++)
        CU_ASSERT_EQUAL(got[i], i % 2 ? 1.0f : -1.0f);
    dt_dataset_close(ds);

    /* (N, H, W): one channel, scalar attributes only */
    write_npy(xp, 1, "<f4", "(2, 2, 2)", x, sizeof x);
    o.overwrite = 1;
    ASSERT_STATUS(dt_npy_import(&o, NULL), DT_OK);
    ASSERT_STATUS(dt_dataset_open(out, &ds), DT_OK);
    if (ds)
        CU_ASSERT_EQUAL(dt_dataset_get_info(ds)->norm_channels, 0);
    dt_dataset_close(ds);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("io_npy", io_suite_init, NULL);
    CU_ADD(s, test_npy_values);
    CU_ADD(s, test_npy_channels);
    return io_run_all();
}
