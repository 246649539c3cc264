/*
 * test_dataset.c - CUnit suite for the HDF5 dataset reader (io/dataset*.c):
 * open errors and their messages, permuted reads of uint8, float16 and
 * float32 x, datasets of several files, hostile files (declared rows never
 * written, non-finite inputs and normalisation, links, locked files, huge
 * chunks), images read channels first, per-channel normalisation, crops and
 * flips against hand-computed results.
 *
 * Every file a test needs is made here or by io_common.c, in the
 * suite's private directory.
 */
#define _GNU_SOURCE
#include <hdf5.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io_common.h"
#include "io/dataset.h"
#include "io/idx.h"
#include "io/loader.h"
#include "core/status.h"

/* ---- making HDF5 datasets directly --------------------------------------- */

/* IEEE half precision as an HDF5 type (HDF5 1.10 has no predefined one). */
static hid_t f16_type(void)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(t, 15, 10, 5, 0, 10);
    H5Tset_size(t, 2);
    H5Tset_ebias(t, 15);
    return t;
}

/* ---- dataset open errors ------------------------------------------------- */

static void test_ds_missing_file(void)
{
    char p[4096];
    dt_dataset_t *ds = (dt_dataset_t *)1;
    tpath(p, sizeof p, "no-such.h5");
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_NOT_FOUND);
    ASSERT_MSG(p);
    CU_ASSERT(ds == NULL);
}

static void test_ds_not_hdf5(void)
{
    char p[4096];
    tpath(p, sizeof p, "random.h5");
    FILE *f = fopen(p, "wb");
    CU_ASSERT_FATAL(f != NULL);
    for (int i = 0; i < 4096; i++)
        fputc((i * 131 + 17) & 0xff, f);
    fclose(f);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG(p);
    ASSERT_MSG("not an HDF5 file");
}

static void test_ds_not_dtrain(void)
{
    char p[4096];
    tpath(p, sizeof p, "plain.h5");
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(f);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG(p);
    ASSERT_MSG("dtrain_format");
}

static void test_ds_bad_version_and_norm(void)
{
    char p[4096];
    dt_dataset_t *ds = NULL;
    tpath(p, sizeof p, "v2.h5");
    make_ds(p, H5T_IEEE_F32LE, 8, 3, 2, 2, 1, 0, 1);
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG(p);
    ASSERT_MSG("version 2");
    tpath(p, sizeof p, "std0.h5");
    make_ds(p, H5T_IEEE_F32LE, 8, 3, 2, 1, 1, 0, 0);
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG("norm_std");
}

static void test_ds_missing_split(void)
{
    char p[4096];
    tpath(p, sizeof p, "splits.h5");
    make_ds(p, H5T_IEEE_F32LE, 8, 3, 2, 1, 1, 0, 1);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    const struct dt_split_info *si = (const struct dt_split_info *)1;
    ASSERT_STATUS(dt_dataset_split(ds, "validation", &si), DT_ERR_BAD_DATA);
    CU_ASSERT(si == NULL);
    ASSERT_MSG(p);
    ASSERT_MSG("'validation'");
    ASSERT_MSG("'train'");
    ASSERT_MSG("'test'");
    float x[3];
    uint64_t i0 = 0;
    ASSERT_STATUS(dt_dataset_read(ds, "validation", &i0, 1, x, NULL, NULL), DT_ERR_BAD_DATA);
    dt_dataset_close(ds);
}

static void test_ds_label_out_of_range(void)
{
    char p[4096];
    tpath(p, sizeof p, "badlabel.h5");
    float x[10 * 2] = {0};
    int32_t y[10] = {0, 1, 2, 0, 1, 2, 0, 12, 1, 2};
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    put_root_attrs(f, 1, 3, 1, 0, 1);
    put_split(f, "train", H5T_IEEE_F32LE, 10, 2, x, 10, y);
    H5Fclose(f);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG(p);
    ASSERT_MSG("'train'");
    ASSERT_MSG("label 12");
    ASSERT_MSG("index 7");
}

static void test_ds_count_mismatch(void)
{
    char p[4096];
    tpath(p, sizeof p, "xy.h5");
    float x[10 * 2] = {0};
    int32_t y[10] = {0};
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    put_root_attrs(f, 1, 3, 1, 0, 1);
    put_split(f, "train", H5T_IEEE_F32LE, 10, 2, x, 9, y);
    H5Fclose(f);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG(p);
    ASSERT_MSG("10 samples in x but 9 labels");
}

static void test_ds_unsupported_dtype(void)
{
    char p[4096];
    dt_dataset_t *ds = NULL;
    tpath(p, sizeof p, "i16.h5");
    make_ds(p, H5T_STD_I16LE, 8, 3, 2, 1, 1, 0, 1);
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG(p);
    ASSERT_MSG("/test/x"); /* splits are checked in name order */
    ASSERT_MSG("unsupported type");
    tpath(p, sizeof p, "f64.h5");
    make_ds(p, H5T_IEEE_F64LE, 8, 3, 2, 1, 1, 0, 1);
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG("float, 8 bytes");
}

static void test_ds_missing_y(void)
{
    char p[4096];
    tpath(p, sizeof p, "noy.h5");
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    put_root_attrs(f, 1, 3, 1, 0, 1);
    hid_t g = H5Gcreate2(f, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[2] = {4, 2};
    hid_t s = H5Screate_simple(2, dims, NULL);
    hid_t d = H5Dcreate2(g, "x", H5T_STD_U8LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(d);
    H5Sclose(s);
    H5Gclose(g);
    H5Fclose(f);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG("/train/y");
}

/* ---- reading ---------------------------------------------------------------- */

static void test_ds_read_permuted_u8(void)
{
    struct idx_pair p;
    char out[4096];
    make_pair("perm-train", 0, 3000, IMG_R, IMG_C, 10, &p); /* 3 chunks of x */
    tpath(out, sizeof out, "perm.h5");
    struct dt_idx_import_opts o = {.train_images = p.images, .train_labels = p.labels,
                                   .out_path = out};
    ASSERT_STATUS(dt_idx_import(&o, NULL), DT_OK);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(out, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    const struct dt_dataset_info *in = dt_dataset_get_info(ds);
    /* runs, singletons, a duplicate, chunk boundaries, descending order */
    const uint64_t idx[] = {2999, 17, 3, 3, 1024, 1023, 0, 41, 40, 42, 2048, 1};
    const size_t n = sizeof idx / sizeof idx[0];
    const size_t e = IMG_R * IMG_C;
    float x[sizeof idx / sizeof idx[0] * IMG_R * IMG_C];
    int32_t y[sizeof idx / sizeof idx[0]];
    uint64_t bytes = 5;
    ASSERT_STATUS(dt_dataset_read(ds, "train", idx, n, x, y, &bytes), DT_OK);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad += y[i] != label_of((uint32_t)idx[i], 10);
        for (size_t q = 0; q < e; q++) {
            float want = (pixel((uint32_t)idx[i], (uint32_t)q) * in->norm_scale - in->norm_mean) /
                         in->norm_std;
            bad += cu_rel_diff(x[i * e + q], want, 1e-6) > 1e-6;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(bytes, 5 + (n - 1) * e); /* 11 distinct rows of 20 bytes */
    /* y may be NULL; an index past the end is refused */
    ASSERT_STATUS(dt_dataset_read(ds, "train", idx, 2, x, NULL, NULL), DT_OK);
    const uint64_t past = 3000;
    ASSERT_STATUS(dt_dataset_read(ds, "train", &past, 1, x, y, NULL), DT_ERR_INVALID_ARG);
    ASSERT_MSG("3000");
    dt_dataset_close(ds);
}

static void read_float_ds(hid_t ftype, const char *name, enum dt_dtype want_dtype)
{
    char p[4096];
    tpath(p, sizeof p, name);
    const double scale = 2.0, mean = 1.0, sd = 4.0;
    make_ds(p, ftype, 40, 3, 5, 1, scale, mean, sd);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    const struct dt_split_info *si = NULL;
    ASSERT_STATUS(dt_dataset_split(ds, "train", &si), DT_OK);
    CU_ASSERT_FATAL(si != NULL);
    CU_ASSERT_EQUAL(si->x_dtype, want_dtype);
    CU_ASSERT_EQUAL(si->y_dtype, DT_I32);
    CU_ASSERT_EQUAL(si->sample_elems, 3);
    CU_ASSERT_EQUAL(si->class_counts[0], 8);
    const uint64_t idx[4] = {39, 5, 6, 0};
    float x[12];
    int32_t y[4];
    uint64_t bytes = 0;
    ASSERT_STATUS(dt_dataset_read(ds, "train", idx, 4, x, y, &bytes), DT_OK);
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        bad += y[i] != (int32_t)(idx[i] % 5);
        for (int j = 0; j < 3; j++) {
            double v = (double)idx[i] + j / 8.0;
            bad += cu_rel_diff(x[i * 3 + j], (v * scale - mean) / sd, 1e-6) > 1e-6;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(bytes, 4 * 3 * (want_dtype == DT_F16 ? 2 : 4));
    dt_dataset_close(ds);
}

static void test_ds_read_f32(void) { read_float_ds(H5T_IEEE_F32LE, "f32.h5", DT_F32); }

static void test_ds_read_f16(void)
{
    hid_t t = f16_type();
    read_float_ds(t, "f16.h5", DT_F16);
    H5Tclose(t);
}

/* ---- several files ----------------------------------------------------------- */

/* Reads rows of a three-file dataset (0..29, 30..49, 50..99) in any order
 * and checks values, labels and bytes read. */
static void check_three(const char *spec)
{
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(spec, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    const struct dt_split_info *si = NULL;
    ASSERT_STATUS(dt_dataset_split(ds, "train", &si), DT_OK);
    CU_ASSERT_EQUAL(si->n, 100);
    CU_ASSERT_EQUAL(si->class_counts[0], 34);
    CU_ASSERT_EQUAL(dt_dataset_nfiles(ds), 3);
    CU_ASSERT_EQUAL(dt_dataset_file_info(ds, 1)->splits[0].n, 20);
    CU_ASSERT_PTR_NULL(dt_dataset_file_info(ds, 3));
    /* across every file boundary, a duplicate, descending order */
    const uint64_t idx[] = {99, 0, 29, 30, 49, 50, 31, 31, 75, 1};
    const size_t n = sizeof idx / sizeof idx[0];
    float x[sizeof idx / sizeof idx[0] * 4];
    int32_t y[sizeof idx / sizeof idx[0]];
    uint64_t bytes = 7;
    ASSERT_STATUS(dt_dataset_read(ds, "train", idx, n, x, y, &bytes), DT_OK);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad += y[i] != (int32_t)(idx[i] % 3);
        for (size_t j = 0; j < 4; j++)
            bad += x[i * 4 + j] != (float)idx[i] + (float)j / 8.0f;
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(bytes, 7 + 9 * 4 * sizeof(float)); /* 9 distinct rows */
    const uint64_t past = 100;
    ASSERT_STATUS(dt_dataset_read(ds, "train", &past, 1, x, y, NULL), DT_ERR_INVALID_ARG);
    ASSERT_MSG("100");
    dt_dataset_close(ds);
}

static void test_ds_several_files(void)
{
    char a[4096], b[4096], c[4096], list[3 * 4096 + 4], pat[4096];
    make_part("mf-part-1.h5", 0, 30, 0.0);
    make_part("mf-part-2.h5", 30, 20, 0.0);
    make_part("mf-part-3.h5", 50, 50, 0.0);
    tpath(a, sizeof a, "mf-part-1.h5");
    tpath(b, sizeof b, "mf-part-2.h5");
    tpath(c, sizeof c, "mf-part-3.h5");
    snprintf(list, sizeof list, "%s\n%s\n%s", a, b, c);
    check_three(list);
    tpath(pat, sizeof pat, "mf-part-?.h5");
    check_three(pat);

    /* a list keeps its order: part 3 first puts its rows first */
    dt_dataset_t *ds = NULL;
    float x[4];
    const uint64_t zero = 0;
    snprintf(list, sizeof list, "%s\n%s", c, a);
    ASSERT_STATUS(dt_dataset_open(list, &ds), DT_OK);
    ASSERT_STATUS(dt_dataset_read(ds, "train", &zero, 1, x, NULL, NULL), DT_OK);
    CU_ASSERT_EQUAL(x[0], 50.0f);
    dt_dataset_close(ds);
}

static void test_ds_several_files_refused(void)
{
    char a[4096], b[4096], list[2 * 4096 + 4], pat[4096];
    dt_dataset_t *ds = NULL;
    make_part("mf-odd.h5", 30, 20, 0.5); /* another normalisation */
    make_part("mf-one.h5", 0, 30, 0.0);
    tpath(a, sizeof a, "mf-one.h5");
    tpath(b, sizeof b, "mf-odd.h5");
    snprintf(list, sizeof list, "%s\n%s", a, b);
    ASSERT_STATUS(dt_dataset_open(list, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG("mf-one.h5 and ");
    ASSERT_MSG("mf-odd.h5 differ in the normalisation");
    CU_ASSERT_PTR_NULL(ds);
    tpath(pat, sizeof pat, "mf-none-*.h5");
    ASSERT_STATUS(dt_dataset_open(pat, &ds), DT_ERR_NOT_FOUND);
    ASSERT_MSG("matches no file");
    snprintf(list, sizeof list, "%s\n%s/mf-absent.h5", a, g_dir);
    ASSERT_STATUS(dt_dataset_open(list, &ds), DT_ERR_NOT_FOUND);
    ASSERT_MSG("mf-absent.h5");
    snprintf(list, sizeof list, "%s\n\n%s", a, a);
    ASSERT_STATUS(dt_dataset_open(list, &ds), DT_ERR_INVALID_ARG);
    ASSERT_MSG("entry 2 is empty");
}

static void test_ds_print(void)
{
    char p[4096];
    tpath(p, sizeof p, "print.h5");
    make_ds(p, H5T_IEEE_F32LE, 12, 3, 4, 1, 1, 0, 1);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    dt_dataset_print(ds, mem);
    fclose(mem);
    CU_ASSERT(strstr(text, p) != NULL);
    CU_ASSERT(strstr(text, "split train: 12 samples of 3, x f32, y i32") != NULL);
    CU_ASSERT(strstr(text, "split test: 6 samples") != NULL);
    CU_ASSERT(strstr(text, "3 each") != NULL);         /* train: 12 over 4 classes */
    CU_ASSERT(strstr(text, "0:2 1:2 2:1 3:1") != NULL); /* test: 6 over 4 */
    CU_ASSERT(strstr(text, "classes (4)") != NULL);
    free(text);
    CU_ASSERT_STRING_EQUAL(dt_dtype_name(DT_F16), "f16");
    dt_dataset_close(ds);
}

/* Class names are printed: control characters in them (a terminal escape)
 * are shown as '?', never sent to the terminal. */
static void test_ds_class_names_printable(void)
{
    char p[4096];
    tpath(p, sizeof p, "escapes.h5");
    make_ds(p, H5T_IEEE_F32LE, 6, 3, 2, 1, 1, 0, 1);
    hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 8);
    hsize_t two = 2;
    hid_t sp = H5Screate_simple(1, &two, NULL);
    char names[2][8] = {"cat\x1b[2J", "dog\n"};
    hid_t a = H5Acreate2(f, "class_names", t, sp, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(H5Awrite(a, t, names) >= 0);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
    H5Fclose(f);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    CU_ASSERT_STRING_EQUAL(dt_dataset_get_info(ds)->class_names[0], "cat?[2J");
    CU_ASSERT_STRING_EQUAL(dt_dataset_get_info(ds)->class_names[1], "dog?");
    dt_dataset_close(ds);
}

/* ---- hostile datasets ------------------------------------------------------ */

static void test_ds_not_regular(void)
{
    char p[4096];
    dt_dataset_t *ds = NULL;
    tpath(p, sizeof p, "ds-fifo.h5");
    CU_ASSERT_EQUAL_FATAL(mkfifo(p, 0600), 0);
    alarm(60); /* a blocking open would hang: fail loudly instead */
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_NOT_FOUND);
    alarm(0);
    ASSERT_MSG("not a regular file (it is a FIFO)");
    tpath(p, sizeof p, "ds-dir.h5");
    mkdir(p, 0777);
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_NOT_FOUND);
    ASSERT_MSG("(it is a directory)");
    CU_ASSERT(ds == NULL);
}

/* A split whose x and y are created with `dcpl` and n rows of d floats,
 * only the first `written` rows written (a hyperslab). */
static void put_sparse_split(hid_t f, const char *split, hid_t dcpl, hsize_t n, hsize_t d,
                             hsize_t written)
{
    hid_t g = H5Gcreate2(f, split, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[2] = {n, d};
    hid_t sx = H5Screate_simple(2, dims, NULL), sy = H5Screate_simple(1, &n, NULL);
    hid_t ycpl = H5Pcopy(dcpl);
    if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
        hsize_t chunk[2];
        H5Pget_chunk(dcpl, 2, chunk);
        H5Pset_chunk(ycpl, 1, chunk);
    }
    hid_t dx = H5Dcreate2(g, "x", H5T_IEEE_F32LE, sx, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    hid_t dy = H5Dcreate2(g, "y", H5T_STD_I32LE, sy, H5P_DEFAULT, ycpl, H5P_DEFAULT);
    CU_ASSERT(dx >= 0 && dy >= 0);
    if (written) {
        float x[64] = {0};
        int32_t y[32] = {0};
        hsize_t start[2] = {0, 0}, count[2] = {written, d};
        CU_ASSERT_FATAL(written * d <= 64 && written <= 32);
        hid_t mx = H5Screate_simple(2, count, NULL), my = H5Screate_simple(1, count, NULL);
        H5Sselect_hyperslab(sx, H5S_SELECT_SET, start, NULL, count, NULL);
        H5Sselect_hyperslab(sy, H5S_SELECT_SET, start, NULL, count, NULL);
        CU_ASSERT(H5Dwrite(dx, H5T_NATIVE_FLOAT, mx, sx, H5P_DEFAULT, x) >= 0);
        CU_ASSERT(H5Dwrite(dy, H5T_NATIVE_INT32, my, sy, H5P_DEFAULT, y) >= 0);
        H5Sclose(mx);
        H5Sclose(my);
    }
    H5Dclose(dx);
    H5Dclose(dy);
    H5Pclose(ycpl);
    H5Sclose(sx);
    H5Sclose(sy);
    H5Gclose(g);
}

/* x and y declaring rows they never wrote: refused as bad data before the
 * labels are allocated (2^40 of them would be 8 TiB). */
static void test_ds_declared_rows(void)
{
    char p[4096];
    dt_dataset_t *ds = NULL;
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t chunk[2] = {1, 2};
    H5Pset_chunk(dcpl, 2, chunk);
    const struct {
        const char *name;
        hsize_t n, written;
        int chunked;
        const char *needle;
    } cases[] = {
        {"rows-2p40.h5", (hsize_t)1 << 40, 0, 1, "only 0 of its 1099511627776 chunks"},
        {"rows-part.h5", 100, 10, 1, "only 10 of its 100 chunks"},
        {"rows-late.h5", 1000, 0, 0, "its data was never written"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tpath(p, sizeof p, cases[k].name);
        hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        put_root_attrs(f, 1, 3, 1, 0, 1);
        hid_t c = cases[k].chunked ? dcpl : H5P_DEFAULT;
        if (!cases[k].chunked) {
            c = H5Pcreate(H5P_DATASET_CREATE);
            H5Pset_alloc_time(c, H5D_ALLOC_TIME_LATE);
        }
        put_sparse_split(f, "train", c, cases[k].n, 2, cases[k].written);
        if (!cases[k].chunked) H5Pclose(c);
        H5Fclose(f);
        ds = NULL;
        ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
        ASSERT_MSG(p);
        ASSERT_MSG("/train/x declares");
        ASSERT_MSG(cases[k].needle);
        dt_dataset_close(ds);
    }
    H5Pclose(dcpl);
}

/* Non-finite inputs are refused when read, naming file, split, row and
 * value: a NaN or an infinity stored in x, or a value that normalisation
 * takes past float32's range. Rows around them read fine. */
static void test_ds_nonfinite(void)
{
    char p[4096];
    float x[8 * 3];
    float x_out[8 * 3];
    for (int i = 0; i < 24; i++)
        x[i] = (float)i;
    const struct {
        const char *name;
        int f16;
        int at;
        float v;
        double scale;
        const char *needle;
    } cases[] = {
        {"nan32.h5", 0, 5 * 3 + 1, NAN, 1, "row 5: x holds nan at element 1"},
        {"inf16.h5", 1, 6 * 3 + 2, INFINITY, 1, "row 6: x holds inf at element 2"},
        {"big32.h5", 0, 2 * 3, 3e38f, 10,
         "row 2: x holds 3e+38 at element 0, which "
         "normalisation ((v * 10 - 0) / 1) turns into inf"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        float xs[24];
        memcpy(xs, x, sizeof xs);
        xs[cases[k].at] = cases[k].v;
        tpath(p, sizeof p, cases[k].name);
        hid_t t = cases[k].f16 ? f16_type() : H5Tcopy(H5T_IEEE_F32LE);
        make_float_ds(p, t, 8, 3, xs, cases[k].scale, 0, 1);
        H5Tclose(t);
        dt_dataset_t *ds = NULL;
        ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
        CU_ASSERT_FATAL(ds != NULL);
        const uint64_t good[3] = {7, 0, 4}, with_bad[3] = {7, (uint64_t)cases[k].at / 3, 0};
        ASSERT_STATUS(dt_dataset_read(ds, "train", good, 3, x_out, NULL, NULL), DT_OK);
        ASSERT_STATUS(dt_dataset_read(ds, "train", with_bad, 3, x_out, NULL, NULL),
                      DT_ERR_BAD_DATA);
        ASSERT_MSG(p);
        ASSERT_MSG("split 'train'");
        ASSERT_MSG(cases[k].needle);
        dt_dataset_close(ds);
    }
}

/* Normalisation that overflows float32: uint8 inputs are mapped through
 * a table, checked at open; attribute values are checked as the float32
 * values they become. */
static void test_ds_norm_overflow(void)
{
    char p[4096];
    struct idx_pair ip;
    char out[4096];
    make_pair("lut-train", 0, 10, 2, 2, 3, &ip);
    tpath(out, sizeof out, "lut.h5");
    struct dt_idx_import_opts o = {
        .train_images = ip.images, .train_labels = ip.labels, .out_path = out};
    ASSERT_STATUS(dt_idx_import(&o, NULL), DT_OK);
    hid_t f = H5Fopen(out, H5F_ACC_RDWR, H5P_DEFAULT);
    float scale = 1e38f, sd = 1e-3f;
    hid_t a = H5Aopen(f, "norm_scale", H5P_DEFAULT);
    CU_ASSERT(H5Awrite(a, H5T_NATIVE_FLOAT, &scale) >= 0);
    H5Aclose(a);
    a = H5Aopen(f, "norm_std", H5P_DEFAULT);
    CU_ASSERT(H5Awrite(a, H5T_NATIVE_FLOAT, &sd) >= 0);
    H5Aclose(a);
    H5Fclose(f);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(out, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG(out);
    ASSERT_MSG("turns the uint8 value 1 into inf");

    /* finite as doubles, not as float32 */
    float x[6] = {0};
    tpath(p, sizeof p, "norm-1e300.h5");
    make_float_ds(p, H5T_IEEE_F32LE, 2, 3, x, 1e300, 0, 1);
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG("norm_scale 1e+300");
    tpath(p, sizeof p, "norm-std-tiny.h5");
    make_float_ds(p, H5T_IEEE_F32LE, 2, 3, x, 1, 0, 1);
    f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    double tiny = 1e-50; /* a positive double, 0 as float32 */
    H5Adelete(f, "norm_std");
    put_num_attr(f, "norm_std", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &tiny);
    H5Fclose(f);
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG("norm_std 1e-50");
}

/* Links and external storage that lead out of the file are refused before
 * anything follows them (an external link to a FIFO would block). */
static void test_ds_links(void)
{
    char p[4096], fifo[4096];
    dt_dataset_t *ds = NULL;
    tpath(fifo, sizeof fifo, "ds-link-fifo");
    CU_ASSERT_EQUAL_FATAL(mkfifo(fifo, 0600), 0);
    alarm(60);
    for (int k = 0; k < 4; k++) {
        tpath(p, sizeof p, "ds-links.h5");
        make_ds(p, H5T_IEEE_F32LE, 8, 3, 2, 1, 1, 0, 1);
        hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
        CU_ASSERT_FATAL(f >= 0);
        herr_t e = 0;
        if (k == 0) {
            e = H5Lcreate_soft("/test", f, "validation", H5P_DEFAULT, H5P_DEFAULT);
        } else if (k == 1) {
            e = H5Lcreate_external(fifo, "/g", f, "elsewhere", H5P_DEFAULT, H5P_DEFAULT);
        } else if (k == 2) {
            H5Ldelete(f, "test/x", H5P_DEFAULT);
            e = H5Lcreate_external(fifo, "/test/x", f, "test/x", H5P_DEFAULT, H5P_DEFAULT);
        } else {
            /* x kept in an external raw file, here a FIFO */
            H5Ldelete(f, "test/x", H5P_DEFAULT);
            hsize_t dims[2] = {4, 3};
            hid_t sx = H5Screate_simple(2, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
            H5Pset_external(dcpl, fifo, 0, 4 * 3 * sizeof(float));
            hid_t d = H5Dcreate2(f, "test/x", H5T_IEEE_F32LE, sx, H5P_DEFAULT, dcpl, H5P_DEFAULT);
            e = d >= 0 ? 0 : -1;
            H5Dclose(d);
            H5Pclose(dcpl);
            H5Sclose(sx);
        }
        CU_ASSERT(e >= 0);
        H5Fclose(f);
        ds = NULL;
        ASSERT_STATUS(dt_dataset_open(p, &ds), k == 3 ? DT_ERR_NOT_FOUND : DT_ERR_BAD_DATA);
        ASSERT_MSG(k == 3 ? "not a regular file (it is a FIFO)" : "is a link to elsewhere");
        dt_dataset_close(ds);
    }
    alarm(0);
}

/* A dataset another process holds locked is an I/O error (74, worth a
 * retry), not "damaged" (65). */
static void test_ds_locked(void)
{
    char p[4096];
    int ready[2];
    tpath(p, sizeof p, "locked.h5");
    make_ds(p, H5T_IEEE_F32LE, 8, 3, 2, 1, 1, 0, 1);
    CU_ASSERT_EQUAL_FATAL(pipe(ready), 0);
    pid_t child = fork();
    CU_ASSERT_FATAL(child >= 0);
    if (child == 0) {
        int fd = open(p, O_RDONLY);
        char c = flock(fd, LOCK_EX) == 0 ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    char c = 'n';
    CU_ASSERT_EQUAL(read(ready[0], &c, 1), 1);
    dt_dataset_t *ds = NULL;
    dt_status st = dt_dataset_open(p, &ds);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    close(ready[0]);
    close(ready[1]);
    dt_dataset_close(ds);
    if (st == DT_OK) {
        printf("SKIPPED (HDF5 file locking is off) ");
        return;
    }
    CU_ASSERT_EQUAL(c, 'y');
    ASSERT_STATUS(st, DT_ERR_IO);
    ASSERT_MSG("cannot open it");
}

/* A split with no rows: opened and shown (data info), never read from or
 * divided by. */
static void test_ds_empty_split(void)
{
    char p[4096];
    float x[10 * 3] = {0};
    int32_t y[10] = {0};
    tpath(p, sizeof p, "empty-split.h5");
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    put_root_attrs(f, 1, 4, 1, 0, 1);
    put_split(f, "train", H5T_IEEE_F32LE, 0, 3, x, 0, y);
    put_split(f, "test", H5T_IEEE_F32LE, 10, 3, x, 10, y);
    H5Fclose(f);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    const struct dt_split_info *si = NULL;
    ASSERT_STATUS(dt_dataset_split(ds, "train", &si), DT_OK);
    CU_ASSERT(si && si->n == 0 && si->sample_elems == 3);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    dt_dataset_print(ds, mem);
    fclose(mem);
    CU_ASSERT(text && strstr(text, "split train: 0 samples of 3") != NULL);
    CU_ASSERT(text && strstr(text, "per class: 0 each") != NULL);
    free(text);
    float out[3];
    const uint64_t row0 = 0;
    ASSERT_STATUS(dt_dataset_read(ds, "train", &row0, 1, out, NULL, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_dataset_read(ds, "train", &row0, 0, out, NULL, NULL), DT_OK);
    struct dt_loader_opts o = seq_opts(ds, 4, 4, 0, 1);
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_BAD_DATA);
    ASSERT_MSG("'train' is empty");
    ASSERT_STATUS(dt_dataset_read(ds, "test", &row0, 1, out, NULL, NULL), DT_OK);
    dt_dataset_close(ds);
}

/* A compressed x in chunks too big to inflate for every row read. */
static void test_ds_huge_chunks(void)
{
    char p[4096];
    float x[2 * 3] = {1, 2, 3, 4, 5, 6};
    int32_t y[2] = {0, 1};
    tpath(p, sizeof p, "huge-chunks.h5");
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    put_root_attrs(f, 1, 3, 1, 0, 1);
    hid_t g = H5Gcreate2(f, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[2] = {2, 3}, maxd[2] = {H5S_UNLIMITED, H5S_UNLIMITED}, chunk[2] = {1, 1 << 25};
    hsize_t ny = 2;
    hid_t sx = H5Screate_simple(2, dims, maxd), sy = H5Screate_simple(1, &ny, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 2, chunk);
    H5Pset_deflate(dcpl, 9);
    hid_t dx = H5Dcreate2(g, "x", H5T_IEEE_F32LE, sx, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    hid_t dy = H5Dcreate2(g, "y", H5T_STD_I32LE, sy, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(H5Dwrite(dx, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) >= 0);
    CU_ASSERT(H5Dwrite(dy, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, y) >= 0);
    H5Dclose(dx);
    H5Dclose(dy);
    H5Pclose(dcpl);
    H5Sclose(sx);
    H5Sclose(sy);
    H5Gclose(g);
    H5Fclose(f);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG("/train/x is compressed in chunks of more than 64 MiB");
}

/* ---- images, per-channel normalisation, augmentation ---------------------- */

/* (N, H, W) is read as (1, H, W) images, (N, C, H, W) as (C, H, W), (N, D)
 * stays a vector; data info says so. */
static void test_ds_image_shapes(void)
{
    float x[4 * 2 * 3 * 5] = {0};
    hsize_t hw[2] = {3, 5}, chw[3] = {2, 3, 5}, d[1] = {7};
    struct {
        const char *name;
        int nd;
        const hsize_t *dims;
        int image;
        int64_t c, h, w;
    } cases[] = {{"img-hw.h5", 2, hw, 1, 1, 3, 5},
                 {"img-chw.h5", 3, chw, 1, 2, 3, 5},
                 {"img-vec.h5", 1, d, 0, 0, 0, 0}};
    for (int k = 0; k < 3; k++) {
        dt_dataset_t *ds = NULL;
        make_image_ds(cases[k].name, H5T_IEEE_F32LE, 4, cases[k].nd, cases[k].dims, x, 1, 0, NULL,
                      0, NULL);
        ASSERT_STATUS(open_named(cases[k].name, &ds), DT_OK);
        if (!ds)
            continue;
        const struct dt_split_info *si = NULL;
        ASSERT_STATUS(dt_dataset_split(ds, "train", &si), DT_OK);
        int64_t c = 0, h = 0, w = 0;
        CU_ASSERT_EQUAL(dt_split_image_shape(si, &c, &h, &w), cases[k].image);
        if (cases[k].image) {
            CU_ASSERT_EQUAL(c, cases[k].c);
            CU_ASSERT_EQUAL(h, cases[k].h);
            CU_ASSERT_EQUAL(w, cases[k].w);
        }
        char out[4096], text[8192] = "";
        tpath(out, sizeof out, "img-print.txt");
        FILE *f = fopen(out, "w");
        dt_dataset_print(ds, f);
        fclose(f);
        slurp(out, text, sizeof text);
        char want[64];
        snprintf(want, sizeof want, "C x H x W = %lldx%lldx%lld", (long long)cases[k].c,
                 (long long)cases[k].h, (long long)cases[k].w);
        CU_ASSERT_EQUAL(strstr(text, want) != NULL, cases[k].image);
        dt_dataset_close(ds);
    }
}

/* Per-channel normalisation, exact: 2 samples of (2, 1, 2), scale 0.5,
 * channel means (1, -2), stds (2, 4): v -> (v * 0.5 - mean[c]) / std[c]. */
static void channel_values(hid_t ftype, const char *name)
{
    float x[8] = {2, 4, 8, 16, 0, 6, 10, 255};
    double mean[2] = {1, -2}, sd[2] = {2, 4};
    hsize_t dims[3] = {2, 1, 2};
    make_image_ds(name, ftype, 2, 3, dims, x, 0.5, 2, mean, 2, sd);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(open_named(name, &ds), DT_OK);
    if (!ds)
        return;
    const struct dt_dataset_info *in = dt_dataset_get_info(ds);
    CU_ASSERT_EQUAL(in->norm_channels, 2);
    float got[8];
    const uint64_t idx[2] = {1, 0};
    ASSERT_STATUS(dt_dataset_read(ds, "train", idx, 2, got, NULL, NULL), DT_OK);
    /* row 1 first: (0, 6 | 10, 255), then row 0: (2, 4 | 8, 16) */
    const float want[8] = {-0.5f, 1.0f, 1.75f, 32.375f, 0.0f, 0.5f, 1.5f, 2.5f};
    for (int i = 0; i < 8; i++)
        CU_ASSERT_EQUAL(got[i], want[i]);
    dt_dataset_close(ds);
}

static void test_ds_channel_norm_u8(void) { channel_values(H5T_STD_U8LE, "ch-u8.h5"); }

static void test_ds_channel_norm_f32(void) { channel_values(H5T_IEEE_F32LE, "ch-f32.h5"); }

/* Without per-channel attributes the scalar arithmetic is unchanged. */
static void test_ds_scalar_norm_unchanged(void)
{
    float x[8] = {2, 4, 8, 16, 0, 6, 10, 255};
    hsize_t dims[3] = {2, 1, 2};
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "sc-f32.h5" : "sc-u8.h5";
        make_image_ds(name, k ? H5T_IEEE_F32LE : H5T_STD_U8LE, 2, 3, dims, x, 0.5, 0, NULL, 0,
                      NULL);
        dt_dataset_t *ds = NULL;
        ASSERT_STATUS(open_named(name, &ds), DT_OK);
        if (!ds)
            continue;
        CU_ASSERT_EQUAL(dt_dataset_get_info(ds)->norm_channels, 0);
        float got[8];
        const uint64_t idx[2] = {0, 1};
        ASSERT_STATUS(dt_dataset_read(ds, "train", idx, 2, got, NULL, NULL), DT_OK);
        for (int i = 0; i < 8; i++)
            CU_ASSERT_EQUAL(got[i], (x[i] * 0.5f - 0.0f) / 1.0f);
        dt_dataset_close(ds);
    }
}

static void test_ds_channel_norm_refused(void)
{
    float x[8] = {0};
    hsize_t chw[3] = {2, 1, 2}, vec[1] = {4};
    double m2[2] = {0, 0}, s2[2] = {1, 1}, m3[3] = {0, 0, 0}, s3[3] = {1, 1, 1};
    double bad_sd[2] = {1, 0}, inf_mean[2] = {0, 1e300}, neg_sd[2] = {-1, 1};
    struct {
        const char *name;
        int nd;
        const hsize_t *dims;
        int nm;
        const double *m;
        int ns;
        const double *s;
        const char *needle;
    } cases[] = {
        {"chb-len.h5", 3, chw, 3, m3, 3, s3, "has 2 channel(s)"},
        {"chb-mis.h5", 3, chw, 2, m2, 3, s3,
         "'norm_channel_mean' has 2 values but "
         "'norm_channel_std' has 3"},
        {"chb-zero.h5", 3, chw, 2, m2, 2, bad_sd, "'norm_channel_std' holds 0 for channel 1"},
        {"chb-neg.h5", 3, chw, 2, m2, 2, neg_sd, "'norm_channel_std' holds -1 for channel 0"},
        {"chb-inf.h5", 3, chw, 2, inf_mean, 2, s2, "'norm_channel_mean' holds 1e+300"},
        {"chb-one.h5", 3, chw, 2, m2, 0, NULL, "'norm_channel_mean' without 'norm_channel_std'"},
        {"chb-vec.h5", 1, vec, 1, m2, 1, s2, "the samples of split 'test' are not images"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dt_dataset_t *ds = NULL;
        make_image_ds(cases[k].name, H5T_IEEE_F32LE, 2, cases[k].nd, cases[k].dims, x, 1,
                      cases[k].nm, cases[k].m, cases[k].ns, cases[k].s);
        ASSERT_STATUS(open_named(cases[k].name, &ds), DT_ERR_BAD_DATA);
        ASSERT_MSG(cases[k].name);
        ASSERT_MSG(cases[k].needle);
        CU_ASSERT_PTR_NULL(ds);
    }
    /* several files must agree on the per-channel attributes */
    double other[2] = {0, 0.5};
    make_image_ds("chm-a.h5", H5T_IEEE_F32LE, 2, 3, chw, x, 1, 2, m2, 2, s2);
    make_image_ds("chm-b.h5", H5T_IEEE_F32LE, 2, 3, chw, x, 1, 2, other, 2, s2);
    make_image_ds("chm-c.h5", H5T_IEEE_F32LE, 2, 3, chw, x, 1, 0, NULL, 0, NULL);
    char a[4096], b[4096], c[4096], list[3 * 4096 + 4];
    tpath(a, sizeof a, "chm-a.h5");
    tpath(b, sizeof b, "chm-b.h5");
    tpath(c, sizeof c, "chm-c.h5");
    dt_dataset_t *ds = NULL;
    snprintf(list, sizeof list, "%s\n%s", a, b);
    ASSERT_STATUS(dt_dataset_open(list, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG("differ in the per-channel normalisation");
    snprintf(list, sizeof list, "%s\n%s", a, c);
    ASSERT_STATUS(dt_dataset_open(list, &ds), DT_ERR_BAD_DATA);
    ASSERT_MSG("differ in the per-channel normalisation");
    snprintf(list, sizeof list, "%s\n%s", a, a);
    ASSERT_STATUS(dt_dataset_open(list, &ds), DT_OK);
    dt_dataset_close(ds);
}

/* A crop and flip against hand-computed results: one 1 x 3 x 3 image
 * 1..9, padding 1 (zeros outside). */
static void test_ds_crop_flip_by_hand(void)
{
    float x[2 * 9];
    for (int i = 0; i < 18; i++)
        x[i] = (float)(i % 9 + 1);
    hsize_t hw[2] = {3, 3};
    make_image_ds("crop.h5", H5T_STD_U8LE, 2, 2, hw, x, 1, 0, NULL, 0, NULL);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(open_named("crop.h5", &ds), DT_OK);
    if (!ds)
        return;
    const uint64_t idx[4] = {0, 1, 0, 1};
    struct dt_crop_flip cf[4] = {{0, 0, 0}, {0, 0, 1}, {2, 1, 0}, {1, 2, 1}};
    const float want[4][9] = {
        {0, 0, 0, 0, 1, 2, 0, 4, 5}, /* top-left window of the padded image */
        {0, 0, 0, 2, 1, 0, 5, 4, 0}, /* the same, flipped */
        {4, 5, 6, 7, 8, 9, 0, 0, 0}, /* one row down, centred */
        {0, 3, 2, 0, 6, 5, 0, 9, 8}, /* rows centred, one right ([[2,3,0],..]), flipped */
    };
    float got[4 * 9];
    int32_t y[4];
    ASSERT_STATUS(dt_dataset_read_crop_flip(ds, "train", idx, 4, 1, cf, got, y, NULL), DT_OK);
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 9; i++)
            CU_ASSERT_EQUAL(got[r * 9 + i], want[r][i]);
    CU_ASSERT_EQUAL(y[1], 1);
    /* no padding, no flip: the plain read */
    struct dt_crop_flip none[2] = {{0, 0, 0}, {0, 0, 0}};
    float plain[18];
    ASSERT_STATUS(dt_dataset_read_crop_flip(ds, "train", idx, 2, 0, none, got, NULL, NULL), DT_OK);
    ASSERT_STATUS(dt_dataset_read(ds, "train", idx, 2, plain, NULL, NULL), DT_OK);
    CU_ASSERT_EQUAL(memcmp(got, plain, sizeof plain), 0);
    /* a crop outside [0, 2 * pad] is refused */
    struct dt_crop_flip far = {3, 0, 0};
    ASSERT_STATUS(dt_dataset_read_crop_flip(ds, "train", idx, 1, 1, &far, got, NULL, NULL),
                  DT_ERR_INVALID_ARG);
    ASSERT_MSG("outside [0, 2]");
    dt_dataset_close(ds);

    /* two files: each row keeps its own crop through the split by file */
    char one[4096], list[2 * 4096 + 2];
    tpath(one, sizeof one, "crop.h5");
    snprintf(list, sizeof list, "%s\n%s", one, one);
    ASSERT_STATUS(dt_dataset_open(list, &ds), DT_OK);
    if (!ds)
        return;
    const uint64_t rows[4] = {2, 1, 0, 3}; /* file 2 row 0, file 1 row 1, file 1 row 0, ... */
    ASSERT_STATUS(dt_dataset_read_crop_flip(ds, "train", rows, 4, 1, cf, got, NULL, NULL), DT_OK);
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 9; i++)
            CU_ASSERT_EQUAL(got[r * 9 + i], want[r][i]);
    dt_dataset_close(ds);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("io_dataset", io_suite_init, NULL);
    CU_ADD(s, test_ds_missing_file);
    CU_ADD(s, test_ds_not_hdf5);
    CU_ADD(s, test_ds_not_dtrain);
    CU_ADD(s, test_ds_bad_version_and_norm);
    CU_ADD(s, test_ds_missing_split);
    CU_ADD(s, test_ds_label_out_of_range);
    CU_ADD(s, test_ds_count_mismatch);
    CU_ADD(s, test_ds_unsupported_dtype);
    CU_ADD(s, test_ds_missing_y);
    CU_ADD(s, test_ds_read_permuted_u8);
    CU_ADD(s, test_ds_read_f32);
    CU_ADD(s, test_ds_read_f16);
    CU_ADD(s, test_ds_print);
    CU_ADD(s, test_ds_several_files);
    CU_ADD(s, test_ds_several_files_refused);
    CU_ADD(s, test_ds_not_regular);
    CU_ADD(s, test_ds_declared_rows);
    CU_ADD(s, test_ds_nonfinite);
    CU_ADD(s, test_ds_norm_overflow);
    CU_ADD(s, test_ds_links);
    CU_ADD(s, test_ds_locked);
    CU_ADD(s, test_ds_empty_split);
    CU_ADD(s, test_ds_huge_chunks);
    CU_ADD(s, test_ds_class_names_printable);
    CU_ADD(s, test_ds_image_shapes);
    CU_ADD(s, test_ds_channel_norm_u8);
    CU_ADD(s, test_ds_channel_norm_f32);
    CU_ADD(s, test_ds_scalar_norm_unchanged);
    CU_ADD(s, test_ds_channel_norm_refused);
    CU_ADD(s, test_ds_crop_flip_by_hand);
    return io_run_all();
}
