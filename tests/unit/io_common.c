/*
 * io_common.c - the helpers the io/ unit suites share (see io_common.h).
 */
#define _GNU_SOURCE
#include "io_common.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

char g_dir[2048];

void tpath(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", g_dir, name);
}

void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

void write_idx(const char *path, int gz, uint32_t magic, const uint32_t *dims, int nd,
               const unsigned char *data, size_t nbytes)
{
    unsigned char hdr[4 * 8];
    put_be32(hdr, magic);
    for (int d = 0; d < nd; d++)
        put_be32(hdr + 4 * (d + 1), dims[d]);
    size_t hlen = 4 * (size_t)(nd + 1);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        CU_ASSERT_FATAL(f != NULL);
        CU_ASSERT(gzwrite(f, hdr, (unsigned)hlen) == (int)hlen);
        if (nbytes)
            CU_ASSERT(gzwrite(f, data, (unsigned)nbytes) == (int)nbytes);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        CU_ASSERT_FATAL(f != NULL);
        CU_ASSERT(fwrite(hdr, 1, hlen, f) == hlen);
        if (nbytes)
            CU_ASSERT(fwrite(data, 1, nbytes, f) == nbytes);
        fclose(f);
    }
}

unsigned char pixel(uint32_t i, uint32_t p)
{
    return (unsigned char)(i * 31u + p * 7u);
}

unsigned char label_of(uint32_t i, int k)
{
    return (unsigned char)((i * 7u + 3u) % (uint32_t)k);
}

void make_pair(const char *stem, int gz, uint32_t n, uint32_t rows, uint32_t cols, int k,
               struct idx_pair *out)
{
    const char *ext = gz ? ".gz" : "";
    char name[512];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte%s", stem, ext);
    tpath(out->images, sizeof out->images, name);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte%s", stem, ext);
    tpath(out->labels, sizeof out->labels, name);
    size_t elems = (size_t)rows * cols;
    unsigned char *img = malloc(n * elems), *lab = malloc(n);
    for (uint32_t i = 0; i < n; i++) {
        for (size_t p = 0; p < elems; p++)
            img[i * elems + p] = pixel(i, (uint32_t)p);
        lab[i] = label_of(i, k);
    }
    uint32_t idims[3] = {n, rows, cols}, ldims[1] = {n};
    write_idx(out->images, gz, 0x00000803, idims, 3, img, n * elems);
    write_idx(out->labels, gz, 0x00000801, ldims, 1, lab, n);
    free(img);
    free(lab);
}

int slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    int n = (int)fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

int dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

void put_str_attr(hid_t obj, const char *name, const char *v)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(v) + 1); /* fixed-length: the importer writes variable-length */
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(H5Awrite(a, t, v) >= 0);
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
}

void put_num_attr(hid_t obj, const char *name, hid_t ftype, hid_t mtype, const void *v)
{
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(H5Awrite(a, mtype, v) >= 0);
    H5Aclose(a);
    H5Sclose(s);
}

void put_root_attrs(hid_t f, int version, int num_classes, double scale, double mean, double sd)
{
    put_str_attr(f, "dtrain_format", "dataset");
    put_num_attr(f, "format_version", H5T_STD_I64LE, H5T_NATIVE_INT, &version);
    put_str_attr(f, "task", "classification");
    put_num_attr(f, "num_classes", H5T_STD_I32LE, H5T_NATIVE_INT, &num_classes);
    put_num_attr(f, "norm_scale", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &scale);
    put_num_attr(f, "norm_mean", H5T_IEEE_F32LE, H5T_NATIVE_DOUBLE, &mean);
    put_num_attr(f, "norm_std", H5T_IEEE_F32LE, H5T_NATIVE_DOUBLE, &sd);
}

void put_split(hid_t f, const char *split, hid_t ftype, hsize_t n, hsize_t d, const float *x,
               hsize_t ny, const int32_t *y)
{
    hid_t g = H5Gcreate2(f, split, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[2] = {n, d};
    hid_t sx = H5Screate_simple(2, dims, NULL), sy = H5Screate_simple(1, &ny, NULL);
    hid_t dx = H5Dcreate2(g, "x", ftype, sx, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t dy = H5Dcreate2(g, "y", H5T_STD_I32LE, sy, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(H5Dwrite(dx, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) >= 0);
    CU_ASSERT(H5Dwrite(dy, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, y) >= 0);
    H5Dclose(dx);
    H5Dclose(dy);
    H5Sclose(sx);
    H5Sclose(sy);
    H5Gclose(g);
}

void make_ds(const char *path, hid_t ftype, hsize_t n, hsize_t d, int k, int version, double scale,
             double mean, double sd)
{
    float *x = malloc(sizeof(float) * n * d);
    int32_t *y = malloc(sizeof(int32_t) * n);
    for (hsize_t i = 0; i < n; i++) {
        for (hsize_t j = 0; j < d; j++)
            x[i * d + j] = (float)i + (float)j / 8.0f;
        y[i] = (int32_t)(i % (hsize_t)k);
    }
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    put_root_attrs(f, version, k, scale, mean, sd);
    put_split(f, "train", ftype, n, d, x, n, y);
    put_split(f, "test", ftype, n / 2, d, x, n / 2, y);
    H5Fclose(f);
    free(x);
    free(y);
}

int32_t lm_tok(int64_t i)
{
    return (int32_t)((i * 7 + 3) % LM_V);
}

void make_lm(const char *path, hid_t ftype, hsize_t ntrain, hsize_t nval, int attrs, int vocab)
{
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    int version = 1;
    put_str_attr(f, "dtrain_format", "dataset");
    put_num_attr(f, "format_version", H5T_STD_I64LE, H5T_NATIVE_INT, &version);
    put_str_attr(f, "task", "language_model");
    if (attrs != 1)
        put_num_attr(f, "vocab_size", H5T_STD_I64LE, H5T_NATIVE_INT, &vocab);
    put_str_attr(f, "tokenizer", attrs == 2 ? "sentencepiece" : "none");
    for (int k = 0; k < 2; k++) {
        hsize_t n = k ? nval : ntrain;
        int32_t *t = malloc(sizeof(int32_t) * (n ? n : 1));
        for (hsize_t i = 0; i < n; i++)
            t[i] = lm_tok((int64_t)i);
        hid_t g = H5Gcreate2(f, k ? "val" : "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        hid_t sp = H5Screate_simple(1, &n, NULL);
        hid_t d = H5Dcreate2(g, "tokens", ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        CU_ASSERT(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, t) >= 0);
        H5Dclose(d);
        H5Sclose(sp);
        H5Gclose(g);
        free(t);
    }
    H5Fclose(f);
}

void make_part(const char *name, hsize_t from, hsize_t n, double mean)
{
    char path[4096];
    const hsize_t d = 4;
    float x[64 * 4];
    int32_t y[64];
    CU_ASSERT_FATAL(n <= 64);
    for (hsize_t i = 0; i < n; i++) {
        for (hsize_t j = 0; j < d; j++)
            x[i * d + j] = (float)(from + i) + (float)j / 8.0f;
        y[i] = (int32_t)((from + i) % 3);
    }
    tpath(path, sizeof path, name);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    put_root_attrs(f, 1, 3, 1.0, mean, 1.0);
    put_split(f, "train", H5T_IEEE_F32LE, n, d, x, n, y);
    put_split(f, "test", H5T_IEEE_F32LE, n, d, x, n, y);
    H5Fclose(f);
}

dt_dataset_t *open_seq(const char *name, hsize_t n)
{
    char p[4096];
    tpath(p, sizeof p, name);
    float *x = malloc(sizeof(float) * n * 2);
    int32_t *y = malloc(sizeof(int32_t) * n);
    for (hsize_t i = 0; i < n; i++) {
        x[2 * i] = (float)i;
        x[2 * i + 1] = -(float)i;
        y[i] = (int32_t)(i % SEQ_K);
    }
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    put_root_attrs(f, 1, SEQ_K, 1, 0, 1);
    put_split(f, "train", H5T_IEEE_F32LE, n, 2, x, n, y);
    H5Fclose(f);
    free(x);
    free(y);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    return ds;
}

struct dt_loader_opts seq_opts(dt_dataset_t *ds, int64_t G, int64_t micro, int rank, int world)
{
    return (struct dt_loader_opts){.ds = ds, .split = "train", .global_batch = G,
                                   .micro_batch = micro, .rank = rank, .world = world,
                                   .seed = 1234, .shuffle = 1, .drop_last = 0,
                                   .workers = 1, .prefetch = 1};
}

void collect(const struct dt_loader_opts *o, int64_t epoch, int64_t first, struct run *out)
{
    dt_loader_t *ld = NULL;
    memset(out, 0, sizeof *out);
    ASSERT_STATUS(dt_loader_create(o, &ld), DT_OK);
    CU_ASSERT_FATAL(ld != NULL);
    ASSERT_STATUS(dt_loader_start_epoch(ld, epoch, first), DT_OK);
    for (;;) {
        struct dt_batch b;
        int end = 0;
        dt_status st = dt_loader_next(ld, &b, &end);
        ASSERT_STATUS(st, DT_OK);
        if (st != DT_OK || end)
            break;
        CU_ASSERT_FATAL(out->n < 4096 && b.rows <= 64);
        struct rec *r = &out->r[out->n++];
        r->batch = b.batch;
        r->row0 = b.row0;
        r->rows = b.rows;
        r->global_rows = b.global_rows;
        r->micro = b.micro;
        r->micro_count = b.micro_count;
        CU_ASSERT_EQUAL(b.epoch, epoch);
        for (int64_t i = 0; i < b.rows; i++) {
            uint64_t id = b.sample_ids[i];
            r->ids[i] = id;
            out->bad_rows += b.x[2 * i] != (float)id || b.x[2 * i + 1] != -(float)id ||
                             b.y[i] != (int32_t)(id % SEQ_K);
        }
        dt_loader_release(ld, &b);
    }
    out->bytes = dt_loader_bytes_read(ld);
    dt_loader_destroy(ld);
    CU_ASSERT_EQUAL(out->bad_rows, 0);
}

void make_float_ds(const char *path, hid_t ftype, hsize_t n, hsize_t d, const float *x,
                   double scale, double mean, double sd)
{
    int32_t y[64] = {0};
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0 && n <= 64);
    put_root_attrs(f, 1, 3, scale, mean, sd);
    put_split(f, "train", ftype, n, d, x, n, y);
    H5Fclose(f);
}

void check_values(const char *path, const char *split, int64_t n, int64_t per, const float *want,
                  const int32_t *labels)
{
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(path, &ds), DT_OK);
    if (!ds)
        return;
    const struct dt_dataset_info *info = dt_dataset_get_info(ds);
    uint64_t idx[16];
    float x[64];
    int32_t y[16];
    CU_ASSERT_FATAL(n <= 16 && n * per <= 64);
    for (int64_t i = 0; i < n; i++)
        idx[i] = (uint64_t)i;
    ASSERT_STATUS(dt_dataset_read(ds, split, idx, (size_t)n, x, y, NULL), DT_OK);
    for (int64_t i = 0; i < n * per; i++) {
        float expect = (want[i] * info->norm_scale - info->norm_mean) / info->norm_std;
        CU_ASSERT_DOUBLE_EQUAL(x[i], expect, 1e-5);
    }
    for (int64_t i = 0; i < n; i++)
        CU_ASSERT_EQUAL(y[i], labels[i]);
    dt_dataset_close(ds);
}

void put_image_split(hid_t f, const char *split, hid_t ftype, hsize_t n, int nd,
                     const hsize_t *dims, const float *x)
{
    hsize_t all[5] = {n}, per = 1;
    for (int d = 0; d < nd; d++) {
        all[d + 1] = dims[d];
        per *= dims[d];
    }
    int32_t *y = calloc(n ? n : 1, sizeof *y);
    for (hsize_t i = 0; i < n; i++)
        y[i] = (int32_t)(i % 2);
    hid_t g = H5Gcreate2(f, split, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t sx = H5Screate_simple(nd + 1, all, NULL), sy = H5Screate_simple(1, &n, NULL);
    hid_t dx = H5Dcreate2(g, "x", ftype, sx, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t dy = H5Dcreate2(g, "y", H5T_STD_I32LE, sy, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(H5Dwrite(dx, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) >= 0);
    CU_ASSERT(H5Dwrite(dy, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, y) >= 0);
    H5Dclose(dx);
    H5Dclose(dy);
    H5Sclose(sx);
    H5Sclose(sy);
    H5Gclose(g);
    free(y);
    (void)per;
}

void put_float_array_attr(hid_t obj, const char *name, hsize_t n, const double *v)
{
    hid_t s = H5Screate_simple(1, &n, NULL);
    hid_t a = H5Acreate2(obj, name, H5T_IEEE_F64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(H5Awrite(a, H5T_NATIVE_DOUBLE, v) >= 0);
    H5Aclose(a);
    H5Sclose(s);
}

void make_image_ds(const char *name, hid_t ftype, hsize_t n, int nd, const hsize_t *dims,
                   const float *x, double scale, int nmean, const double *mean, int nstd,
                   const double *sd)
{
    char p[4096];
    tpath(p, sizeof p, name);
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    put_root_attrs(f, 1, 2, scale, 0, 1);
    if (nmean > 0)
        put_float_array_attr(f, "norm_channel_mean", (hsize_t)nmean, mean);
    if (nstd > 0)
        put_float_array_attr(f, "norm_channel_std", (hsize_t)nstd, sd);
    put_image_split(f, "train", ftype, n, nd, dims, x);
    put_image_split(f, "test", ftype, n / 2, nd, dims, x);
    H5Fclose(f);
}

dt_status open_named(const char *name, dt_dataset_t **ds)
{
    char p[4096];
    tpath(p, sizeof p, name);
    return dt_dataset_open(p, ds);
}

float aug_value(uint64_t i, int64_t k)
{
    return (float)(i * 100 + (uint64_t)k);
}

dt_dataset_t *open_aug(void)
{
    static float x[AUG_N * AUG_ELEMS];
    for (uint64_t i = 0; i < AUG_N; i++)
        for (int k = 0; k < AUG_ELEMS; k++)
            x[i * AUG_ELEMS + (uint64_t)k] = aug_value(i, k);
    hsize_t dims[3] = {AUG_C, AUG_H, AUG_W};
    make_image_ds("aug.h5", H5T_IEEE_F32LE, AUG_N, 3, dims, x, 1, 0, NULL, 0, NULL);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(open_named("aug.h5", &ds), DT_OK);
    return ds;
}

int io_suite_init(void)
{
    snprintf(g_dir, sizeof g_dir, "%s/%s.%ld", cu_tmpdir(), program_invocation_short_name,
             (long)getpid());
    if (mkdir(g_dir, 0777) != 0)
        return -1;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* tests call HDF5 directly too */
    return 0;
}

static int rm_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return unlink(path);
    struct dirent *e;
    char sub[4096];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            rm_tree(sub);
        }
    closedir(d);
    return rmdir(path);
}

int io_run_all(void)
{
    int rc = cu_run_all();
    if (rc == 0 && g_dir[0])
        rm_tree(g_dir); /* keep the files of a failed run for a look */
    return rc;
}
