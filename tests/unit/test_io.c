/*
 * test_io.c - CUnit suites for io/: the IDX importer, the HDF5 dataset
 * reader, the prefetching loader and model files.
 *
 * Every file a test needs is made here, in a private directory under
 * cu_tmpdir(): small IDX files (raw and gzipped, some deliberately
 * broken) and small HDF5 datasets written directly with HDF5 (with bad
 * labels, odd dtypes, missing pieces). Loader tests use a dataset whose
 * first input value of sample i is i, so every row a batch hands out can
 * be checked against its sample id.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <hdf5.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "cu_util.h"
#include "io/dataset.h"
#include "io/csv.h"
#include "io/idx.h"
#include "io/npy.h"
#include "io/loader.h"
#include "io/model_file.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/status.h"

static char g_dir[2048];

static void tpath(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", g_dir, name);
}

#define ASSERT_STATUS(expr, want)                                                                  \
    do {                                                                                           \
        dt_status st_ = (expr);                                                                    \
        CU_ASSERT_EQUAL(st_, (want));                                                              \
        if (st_ != (want))                                                                         \
            fprintf(stderr, "\n    %s:%d: got '%s' (%s), wanted '%s'\n", __FILE__, __LINE__,       \
                    dt_status_str(st_), dt_last_error(), dt_status_str(want));                     \
    } while (0)

#define ASSERT_MSG(sub)                                                                            \
    do {                                                                                           \
        int ok_ = strstr(dt_last_error(), (sub)) != NULL;                                          \
        CU_ASSERT(ok_);                                                                            \
        if (!ok_)                                                                                  \
            fprintf(stderr, "\n    %s:%d: message '%s' lacks '%s'\n", __FILE__, __LINE__,          \
                    dt_last_error(), (sub));                                                       \
    } while (0)

/* ---- making IDX files ---------------------------------------------------- */

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Writes an IDX file: magic, dims, then `nbytes` of data (which may be
 * fewer than the dims say, to make a truncated file). */
static void write_idx(const char *path, int gz, uint32_t magic, const uint32_t *dims, int nd,
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

static unsigned char pixel(uint32_t i, uint32_t p) { return (unsigned char)(i * 31u + p * 7u); }
static unsigned char label_of(uint32_t i, int k) { return (unsigned char)((i * 7u + 3u) % (uint32_t)k); }

/* An IDX images/labels pair: n items of rows x cols, labels in [0, k). */
struct idx_pair {
    char images[4096], labels[4096];
};

static void make_pair(const char *stem, int gz, uint32_t n, uint32_t rows, uint32_t cols, int k,
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

static int slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    int n = (int)fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* Entries of a directory other than . and .. */
static int dir_entries(const char *dir)
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

/* ---- IDX import ------------------------------------------------------------ */

#define TR_N 50
#define TE_N 20
#define IMG_R 5
#define IMG_C 4

/* Reads /<split>/x of an imported file back as raw bytes with HDF5. */
static void check_pixels(const char *h5, const char *split, uint32_t n)
{
    char obj[64];
    snprintf(obj, sizeof obj, "/%s/x", split);
    hid_t f = H5Fopen(h5, H5F_ACC_RDONLY, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    hid_t d = H5Dopen2(f, obj, H5P_DEFAULT);
    CU_ASSERT_FATAL(d >= 0);
    unsigned char *buf = malloc((size_t)n * IMG_R * IMG_C);
    CU_ASSERT(H5Dread(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0);
    int bad = 0;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t p = 0; p < IMG_R * IMG_C; p++)
            bad += buf[i * IMG_R * IMG_C + p] != pixel(i, p);
    CU_ASSERT_EQUAL(bad, 0);
    free(buf);
    H5Dclose(d);
    H5Fclose(f);
}

/* Imports, then checks the dataset: splits, shapes, labels, pixels. */
static void roundtrip(int gz, const char *class_names, const char *out_name)
{
    struct idx_pair tr, te;
    char stem[64], out[4096];
    snprintf(stem, sizeof stem, "rt%d-train", gz);
    make_pair(stem, gz, TR_N, IMG_R, IMG_C, 10, &tr);
    snprintf(stem, sizeof stem, "rt%d-t10k", gz);
    make_pair(stem, gz, TE_N, IMG_R, IMG_C, 10, &te);
    tpath(out, sizeof out, out_name);
    struct dt_idx_import_opts o = {.train_images = tr.images, .train_labels = tr.labels,
                                   .test_images = te.images, .test_labels = te.labels,
                                   .out_path = out, .class_names = class_names};
    ASSERT_STATUS(dt_idx_import(&o, NULL), DT_OK);

    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(out, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    const struct dt_dataset_info *in = dt_dataset_get_info(ds);
    CU_ASSERT_EQUAL(in->format_version, 1);
    CU_ASSERT_EQUAL(in->num_classes, 10);
    CU_ASSERT_EQUAL(in->nsplits, 2);
    CU_ASSERT_STRING_EQUAL(in->class_names[9], class_names ? "j" : "9");
    const struct dt_split_info *si = NULL;
    ASSERT_STATUS(dt_dataset_split(ds, "train", &si), DT_OK);
    CU_ASSERT_FATAL(si != NULL);
    CU_ASSERT_EQUAL(si->n, TR_N);
    CU_ASSERT_EQUAL(si->ndim, 2);
    CU_ASSERT_EQUAL(si->shape[0], IMG_R);
    CU_ASSERT_EQUAL(si->shape[1], IMG_C);
    CU_ASSERT_EQUAL(si->x_dtype, DT_U8);
    int64_t counts[10] = {0};
    for (uint32_t i = 0; i < TR_N; i++)
        counts[label_of(i, 10)]++;
    for (int c = 0; c < 10; c++)
        CU_ASSERT_EQUAL(si->class_counts[c], counts[c]);

    /* labels and normalised pixels through the reader */
    uint64_t idx[TR_N];
    for (uint32_t i = 0; i < TR_N; i++)
        idx[i] = i;
    float *x = malloc(sizeof(float) * TR_N * IMG_R * IMG_C);
    int32_t y[TR_N];
    ASSERT_STATUS(dt_dataset_read(ds, "train", idx, TR_N, x, y, NULL), DT_OK);
    int bad_y = 0, bad_x = 0;
    for (uint32_t i = 0; i < TR_N; i++) {
        bad_y += y[i] != label_of(i, 10);
        for (uint32_t p = 0; p < IMG_R * IMG_C; p++) {
            float want = (pixel(i, p) * in->norm_scale - in->norm_mean) / in->norm_std;
            bad_x += cu_rel_diff(x[i * IMG_R * IMG_C + p], want, 1e-6) > 1e-6;
        }
    }
    CU_ASSERT_EQUAL(bad_y, 0);
    CU_ASSERT_EQUAL(bad_x, 0);
    ASSERT_STATUS(dt_dataset_split(ds, "test", &si), DT_OK);
    CU_ASSERT_EQUAL(si->n, TE_N);
    uint64_t tidx[3] = {19, 0, 7};
    ASSERT_STATUS(dt_dataset_read(ds, "test", tidx, 3, x, y, NULL), DT_OK);
    CU_ASSERT_EQUAL(y[0], label_of(19, 10));
    CU_ASSERT_EQUAL(y[1], label_of(0, 10));
    CU_ASSERT_EQUAL(y[2], label_of(7, 10));
    free(x);
    dt_dataset_close(ds);
    check_pixels(out, "train", TR_N);
    check_pixels(out, "test", TE_N);
}

static void test_idx_roundtrip_raw(void) { roundtrip(0, NULL, "rt-raw.h5"); }
static void test_idx_roundtrip_gz(void) { roundtrip(1, "a,b,c,d,e,f,g,h,i,j", "rt-gz.h5"); }

static void test_idx_norm_attrs(void)
{
    struct idx_pair tr;
    char out[4096];
    make_pair("norm-train", 0, TR_N, IMG_R, IMG_C, 4, &tr);
    tpath(out, sizeof out, "norm.h5");
    struct dt_idx_import_opts o = {.train_images = tr.images, .train_labels = tr.labels,
                                   .out_path = out};
    ASSERT_STATUS(dt_idx_import(&o, NULL), DT_OK);
    double s = 0, s2 = 0, cnt = (double)TR_N * IMG_R * IMG_C;
    for (uint32_t i = 0; i < TR_N; i++)
        for (uint32_t p = 0; p < IMG_R * IMG_C; p++) {
            double v = pixel(i, p) / 255.0;
            s += v;
            s2 += v * v;
        }
    double mean = s / cnt, sd = sqrt(s2 / cnt - mean * mean);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(out, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    const struct dt_dataset_info *in = dt_dataset_get_info(ds);
    CU_ASSERT(cu_rel_diff(in->norm_scale, 1.0 / 255.0, 1e-9) < 1e-6);
    CU_ASSERT(cu_rel_diff(in->norm_mean, mean, 1e-9) < 1e-5);
    CU_ASSERT(cu_rel_diff(in->norm_std, sd, 1e-9) < 1e-5);
    CU_ASSERT_EQUAL(in->num_classes, 4); /* max label + 1 */
    CU_ASSERT_EQUAL(in->nsplits, 1);
    dt_dataset_close(ds);
}

/* Runs an import expected to fail and checks the status, that the message
 * names `names_file`, and that nothing was left in the output directory. */
static void import_fails(const struct dt_idx_import_opts *base, const char *outdir_name,
                         dt_status want, const char *names_file, const char *also)
{
    char outdir[4096], out[4096 + 16];
    tpath(outdir, sizeof outdir, outdir_name);
    mkdir(outdir, 0777);
    snprintf(out, sizeof out, "%s/out.h5", outdir);
    struct dt_idx_import_opts o = *base;
    o.out_path = out;
    dt_clear_error();
    ASSERT_STATUS(dt_idx_import(&o, NULL), want);
    ASSERT_MSG(names_file);
    if (also)
        ASSERT_MSG(also);
    CU_ASSERT_EQUAL(dir_entries(outdir), 0); /* no output, no temporary file */
}

static void test_idx_bad_magic(void)
{
    struct idx_pair p;
    make_pair("magic-train", 0, 10, 3, 3, 2, &p);
    unsigned char junk[9 * 10] = {0};
    uint32_t dims[3] = {10, 3, 3};
    write_idx(p.images, 0, 0x12345678, dims, 3, junk, sizeof junk);
    struct dt_idx_import_opts o = {.train_images = p.images, .train_labels = p.labels};
    import_fails(&o, "out-magic", DT_ERR_BAD_DATA, p.images, "0x12345678");
    ASSERT_MSG("not an IDX file");
}

static void test_idx_truncated_images(void)
{
    struct idx_pair p;
    make_pair("trunc-img-train", 1, 3000, 4, 4, 3, &p); /* several chunks */
    unsigned char *img = malloc(3000 * 16);
    memset(img, 7, 3000 * 16);
    uint32_t dims[3] = {3000, 4, 4};
    write_idx(p.images, 1, 0x00000803, dims, 3, img, 3000 * 16 - 100);
    free(img);
    struct dt_idx_import_opts o = {.train_images = p.images, .train_labels = p.labels};
    /* found while streaming images, after the temporary file exists */
    import_fails(&o, "out-trunc-img", DT_ERR_BAD_DATA, p.images, "truncated");
    ASSERT_MSG("48000"); /* expected data bytes */
    ASSERT_MSG("47900"); /* what was there */
}

static void test_idx_truncated_labels(void)
{
    struct idx_pair p;
    make_pair("trunc-lab-train", 0, 40, 2, 2, 3, &p);
    unsigned char lab[40] = {0};
    uint32_t dims[1] = {40};
    write_idx(p.labels, 0, 0x00000801, dims, 1, lab, 33);
    struct dt_idx_import_opts o = {.train_images = p.images, .train_labels = p.labels};
    import_fails(&o, "out-trunc-lab", DT_ERR_BAD_DATA, p.labels, "truncated");
}

/* Appends len bytes to the file at path. */
static void append_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "ab");
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT(fwrite(data, 1, len, f) == len);
    fclose(f);
}

/* A gzipped file is read to its end: damage inside (a CRC-32 mismatch
 * only its trailer shows), a cut trailer, bytes or a member with more
 * data after it, and more bytes in a raw file are refused, leaving
 * nothing; a file of two members whose data is the IDX file is whole. */
static void test_idx_gzip_checked(void)
{
    struct idx_pair p, raw;
    make_pair("gzchk-train", 1, 2000, 8, 8, 4, &p); /* several chunks, incompressible-ish */
    struct dt_idx_import_opts o = {.train_images = p.images, .train_labels = p.labels};
    struct stat sb;
    CU_ASSERT_FATAL(stat(p.images, &sb) == 0);
    int fd = open(p.images, O_RDWR);
    CU_ASSERT_FATAL(fd >= 0);
    unsigned char keep[4], junk[4] = {'X', 'X', 'X', 'X'};
    CU_ASSERT(pread(fd, keep, 4, sb.st_size / 2) == 4);
    CU_ASSERT(pwrite(fd, junk, 4, sb.st_size / 2) == 4);
    import_fails(&o, "out-gz-damage", DT_ERR_BAD_DATA, p.images, "gzip");
    CU_ASSERT(pwrite(fd, keep, 4, sb.st_size / 2) == 4);
    /* the stored CRC-32 itself */
    CU_ASSERT(pread(fd, keep, 4, sb.st_size - 8) == 4);
    CU_ASSERT(pwrite(fd, junk, 4, sb.st_size - 8) == 4);
    import_fails(&o, "out-gz-crc", DT_ERR_BAD_DATA, p.images, "incorrect data check");
    CU_ASSERT(pwrite(fd, keep, 4, sb.st_size - 8) == 4);
    /* the length cut off */
    CU_ASSERT(ftruncate(fd, sb.st_size - 4) == 0);
    import_fails(&o, "out-gz-cut", DT_ERR_BAD_DATA, p.images, "ends inside its gzip data");
    close(fd);

    make_pair("gzchk-train", 1, 2000, 8, 8, 4, &p);
    append_bytes(p.images, "junk", 4);
    import_fails(&o, "out-gz-junk", DT_ERR_BAD_DATA, p.images, "4 bytes after the end of its gzip");
    make_pair("gzchk-train", 1, 2000, 8, 8, 4, &p);
    gzFile g = gzopen(p.labels, "ab"); /* a second member: one more label */
    CU_ASSERT_FATAL(g != NULL);
    CU_ASSERT(gzwrite(g, "\1", 1) == 1);
    gzclose(g);
    import_fails(&o, "out-gz-member", DT_ERR_BAD_DATA, p.labels, "1 byte of data after the 2000");

    make_pair("gzchk-raw-train", 0, 50, 3, 3, 4, &raw);
    append_bytes(raw.images, "\0", 1);
    o = (struct dt_idx_import_opts){.train_images = raw.images, .train_labels = raw.labels};
    import_fails(&o, "out-raw-more", DT_ERR_BAD_DATA, raw.images, "1 byte after the data");

    /* two members, the IDX data split between them, and an empty one */
    make_pair("gzchk-two-train", 0, 50, 3, 3, 4, &raw);
    char two[4096 + 8], out[4096];
    snprintf(two, sizeof two, "%s.gz", raw.images);
    FILE *in = fopen(raw.images, "rb");
    unsigned char buf[16 + 50 * 9];
    CU_ASSERT_FATAL(in != NULL);
    CU_ASSERT_FATAL(fread(buf, 1, sizeof buf, in) == sizeof buf);
    fclose(in);
    const size_t cut[4] = {0, 7, 200, sizeof buf};
    unlink(two);
    for (int m = 0; m < 3; m++) {
        g = gzopen(two, "ab");
        CU_ASSERT_FATAL(g != NULL);
        if (cut[m + 1] > cut[m])
            CU_ASSERT(gzwrite(g, buf + cut[m], (unsigned)(cut[m + 1] - cut[m])) ==
                      (int)(cut[m + 1] - cut[m]));
        gzclose(g);
    }
    g = gzopen(two, "ab");
    gzclose(g); /* an empty member at the end adds nothing */
    tpath(out, sizeof out, "gz-two.h5");
    o = (struct dt_idx_import_opts){
        .train_images = two, .train_labels = raw.labels, .out_path = out};
    ASSERT_STATUS(dt_idx_import(&o, NULL), DT_OK);
}

static void test_idx_count_mismatch(void)
{
    struct idx_pair a, b;
    make_pair("cnt-a-train", 0, 30, 2, 2, 3, &a);
    make_pair("cnt-b-train", 1, 29, 2, 2, 3, &b);
    struct dt_idx_import_opts o = {.train_images = a.images, .train_labels = b.labels};
    import_fails(&o, "out-count", DT_ERR_BAD_DATA, a.images, b.labels);
    ASSERT_MSG("30");
    ASSERT_MSG("29");
}

static void test_idx_label_out_of_range(void)
{
    struct idx_pair p;
    make_pair("range-train", 0, 30, 2, 2, 10, &p); /* labels up to 9 */
    struct dt_idx_import_opts o = {.train_images = p.images, .train_labels = p.labels,
                                   .class_names = "cat, dog, bird"};
    import_fails(&o, "out-range", DT_ERR_BAD_DATA, p.labels, "3 class names");
}

static void test_idx_missing_file(void)
{
    struct idx_pair p;
    make_pair("missing-train", 0, 10, 2, 2, 3, &p);
    char nope[4096];
    tpath(nope, sizeof nope, "no-such-labels-idx1-ubyte.gz");
    struct dt_idx_import_opts o = {.train_images = p.images, .train_labels = nope};
    import_fails(&o, "out-missing", DT_ERR_NOT_FOUND, nope, NULL);
}

static void test_idx_swapped(void)
{
    struct idx_pair p;
    make_pair("swap-train", 0, 10, 2, 2, 3, &p);
    struct dt_idx_import_opts o = {.train_images = p.labels, .train_labels = p.images};
    import_fails(&o, "out-swapped", DT_ERR_BAD_DATA, p.labels, "swapped");
}

static void test_idx_existing_output(void)
{
    struct idx_pair p;
    char out[4096], buf[64];
    make_pair("exist-train", 0, 10, 2, 2, 3, &p);
    tpath(out, sizeof out, "exists.h5");
    FILE *f = fopen(out, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("keep me", f);
    fclose(f);
    struct dt_idx_import_opts o = {.train_images = p.images, .train_labels = p.labels,
                                   .out_path = out};
    ASSERT_STATUS(dt_idx_import(&o, NULL), DT_ERR_USAGE);
    ASSERT_MSG(out);
    ASSERT_MSG("--force");
    int n = slurp(out, buf, sizeof buf);
    CU_ASSERT_EQUAL(n, 7);
    CU_ASSERT(n == 7 && memcmp(buf, "keep me", 7) == 0);

    o.overwrite = 1;
    ASSERT_STATUS(dt_idx_import(&o, NULL), DT_OK);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(out, &ds), DT_OK);
    dt_dataset_close(ds);
}

static void test_idx_progress(void)
{
    struct idx_pair p;
    char out[4096];
    make_pair("prog-train", 0, 10, 2, 2, 3, &p);
    tpath(out, sizeof out, "progress.h5");
    struct dt_idx_import_opts o = {.train_images = p.images, .train_labels = p.labels,
                                   .out_path = out};
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    ASSERT_STATUS(dt_idx_import(&o, mem), DT_OK);
    fclose(mem);
    CU_ASSERT(text && strstr(text, "train: 10 images of 2x2") != NULL);
    CU_ASSERT(text && strstr(text, out) != NULL);
    free(text);
}

/* Inputs that are no regular files are refused at once (66), never read
 * or waited on: a FIFO (opening one blocks until a writer comes), a
 * directory (read fails with EISDIR). */
static void test_idx_not_regular(void)
{
    struct idx_pair p;
    char fifo[4096], dir[4096], buf[4][4096];
    make_pair("nonreg-train", 0, 10, 2, 2, 3, &p);
    tpath(fifo, sizeof fifo, "fifo-images-idx3-ubyte");
    CU_ASSERT_EQUAL_FATAL(mkfifo(fifo, 0600), 0);
    tpath(dir, sizeof dir, "a-directory");
    mkdir(dir, 0777);
    struct dt_idx_import_opts o = {.train_images = fifo, .train_labels = p.labels};
    alarm(60); /* a blocking open would hang: fail loudly instead */
    import_fails(&o, "out-fifo", DT_ERR_NOT_FOUND, fifo, "not a regular file (it is a FIFO)");
    o = (struct dt_idx_import_opts){.train_images = p.images, .train_labels = dir};
    import_fails(&o, "out-dir", DT_ERR_NOT_FOUND, dir, "not a regular file (it is a directory)");
    /* found by its standard name in a directory, and still refused */
    char mnist[4096], f[4200];
    tpath(mnist, sizeof mnist, "fifodir");
    mkdir(mnist, 0777);
    snprintf(f, sizeof f, "%s/train-images-idx3-ubyte", mnist);
    CU_ASSERT_EQUAL_FATAL(mkfifo(f, 0600), 0);
    snprintf(f, sizeof f, "%s/train-labels-idx1-ubyte", mnist);
    CU_ASSERT_EQUAL(rename(p.labels, f), 0);
    o = (struct dt_idx_import_opts){0};
    ASSERT_STATUS(dt_idx_find_in_dir(mnist, &o, buf), DT_OK);
    import_fails(&o, "out-fifodir", DT_ERR_NOT_FOUND, "train-images-idx3-ubyte", "FIFO");
    alarm(0);
}

/* Writes an images file with the given header dims and `nbytes` of data,
 * and a labels file of n labels (or a header declaring lab_n labels over
 * the same n bytes). */
static void write_declared(const char *images, int gz, const uint32_t *dims, size_t nbytes,
                           const char *labels, uint32_t lab_n, int lab_gz, size_t n)
{
    unsigned char data[1024] = {0};
    CU_ASSERT_FATAL(nbytes <= sizeof data && n <= sizeof data);
    write_idx(images, gz, 0x00000803, dims, 3, data, nbytes);
    write_idx(labels, lab_gz, 0x00000801, &lab_n, 1, data, n);
}

/* Headers that declare more data than the file holds are refused as bad
 * data before anything is allocated from them: products beyond 64 bits,
 * one image of 2^62 bytes, 2^31 images in 320 bytes, raw or gzipped. */
static void test_idx_declared_sizes(void)
{
    char img[4096], lab[4096];
    const uint32_t big = UINT32_C(1) << 31;
    tpath(img, sizeof img, "decl-images");
    tpath(lab, sizeof lab, "decl-labels");
    struct dt_idx_import_opts o = {.train_images = img, .train_labels = lab};

    uint32_t huge_image[3] = {2, big, big / 2};
    write_declared(img, 0, huge_image, 320, lab, 2, 0, 2);
    import_fails(&o, "out-decl1", DT_ERR_BAD_DATA, img, "2 images of 2147483648x1073741824");
    ASSERT_MSG("more than the 64 MiB an image may have");

    uint32_t overflow[3] = {10, big, big};
    write_declared(img, 0, overflow, 320, lab, 10, 0, 10);
    import_fails(&o, "out-decl2", DT_ERR_BAD_DATA, img, "more data than any file holds");

    uint32_t many[3] = {big, 28, 28};
    write_declared(img, 0, many, 320, lab, big, 0, 10);
    import_fails(&o, "out-decl3", DT_ERR_BAD_DATA, img, "truncated");
    ASSERT_MSG("declares 2147483648 images of 28x28 (1683627180032 data bytes)");
    ASSERT_MSG("holds only 320");

    write_declared(img, 1, many, 320, lab, big, 1, 10);
    import_fails(&o, "out-decl4", DT_ERR_BAD_DATA, img, "more than a gzipped file of");

    /* labels alone: 10 good images, 2^31 labels in a few gzipped bytes */
    uint32_t ten[3] = {10, 4, 4};
    unsigned char pix[160] = {0};
    write_idx(img, 0, 0x00000803, ten, 3, pix, sizeof pix);
    write_idx(lab, 1, 0x00000801, &big, 1, pix, 10);
    import_fails(&o, "out-decl5", DT_ERR_BAD_DATA, lab, "2147483648 labels");
    /* and raw: the file must hold every label */
    write_idx(lab, 0, 0x00000801, &big, 1, pix, 10);
    import_fails(&o, "out-decl6", DT_ERR_BAD_DATA, lab, "holds only 10");
}

/* The output's space is reserved before anything is written: a file-size
 * limit fails the import at once with the system's reason, and nothing is
 * left behind. */
static void test_idx_file_size_limit(void)
{
    struct idx_pair p;
    make_pair("efbig-train", 0, 3000, 28, 28, 10, &p); /* 2.2 MiB of images */
    struct dt_idx_import_opts o = {.train_images = p.images, .train_labels = p.labels};
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 256 * 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CU_ASSERT(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    import_fails(&o, "out-efbig", DT_ERR_IO, "out.h5",
                 "File too large (the file-size limit, ulimit -f, is 256 KiB)");
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    ASSERT_MSG("free on its file system");
}

static void test_idx_output_is_dir(void)
{
    struct idx_pair p;
    char out[4096];
    make_pair("outdir-train", 0, 10, 2, 2, 3, &p);
    tpath(out, sizeof out, "an-output-dir");
    mkdir(out, 0777);
    struct dt_idx_import_opts o = {
        .train_images = p.images, .train_labels = p.labels, .out_path = out, .overwrite = 1};
    ASSERT_STATUS(dt_idx_import(&o, NULL), DT_ERR_USAGE);
    ASSERT_MSG("is a directory");
}

static void test_idx_find_in_dir(void)
{
    char dir[4096], buf[4][4096], f[4096 + 64];
    tpath(dir, sizeof dir, "mnistdir");
    mkdir(dir, 0777);
    const char *names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte.gz",
                            "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte"};
    struct dt_idx_import_opts o = {0};
    /* only train images so far: train labels are missing */
    snprintf(f, sizeof f, "%s/%s", dir, names[0]);
    fclose(fopen(f, "w"));
    ASSERT_STATUS(dt_idx_find_in_dir(dir, &o, buf), DT_ERR_NOT_FOUND);
    ASSERT_MSG("train-labels-idx1-ubyte");
    ASSERT_MSG(dir);
    /* train pair alone is enough; test stays unset */
    snprintf(f, sizeof f, "%s/%s", dir, names[1]);
    fclose(fopen(f, "w"));
    ASSERT_STATUS(dt_idx_find_in_dir(dir, &o, buf), DT_OK);
    CU_ASSERT(o.test_images == NULL && o.test_labels == NULL);
    /* half a test pair is an error */
    snprintf(f, sizeof f, "%s/%s", dir, names[2]);
    fclose(fopen(f, "w"));
    ASSERT_STATUS(dt_idx_find_in_dir(dir, &o, buf), DT_ERR_NOT_FOUND);
    ASSERT_MSG("t10k-labels-idx1-ubyte");
    snprintf(f, sizeof f, "%s/%s", dir, names[3]);
    fclose(fopen(f, "w"));
    ASSERT_STATUS(dt_idx_find_in_dir(dir, &o, buf), DT_OK);
    const char *got[4] = {o.train_images, o.train_labels, o.test_images, o.test_labels};
    for (int i = 0; i < 4; i++) {
        snprintf(f, sizeof f, "%s/%s", dir, names[i]);
        CU_ASSERT(got[i] && strcmp(got[i], f) == 0);
    }
    char nodir[4096];
    tpath(nodir, sizeof nodir, "no-such-dir");
    ASSERT_STATUS(dt_idx_find_in_dir(nodir, &o, buf), DT_ERR_NOT_FOUND);
    ASSERT_MSG(nodir);
}

/* ---- making HDF5 datasets directly --------------------------------------- */

static void put_str_attr(hid_t obj, const char *name, const char *v)
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

static void put_num_attr(hid_t obj, const char *name, hid_t ftype, hid_t mtype, const void *v)
{
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(H5Awrite(a, mtype, v) >= 0);
    H5Aclose(a);
    H5Sclose(s);
}

static void put_root_attrs(hid_t f, int version, int num_classes, double scale, double mean,
                           double sd)
{
    put_str_attr(f, "dtrain_format", "dataset");
    put_num_attr(f, "format_version", H5T_STD_I64LE, H5T_NATIVE_INT, &version);
    put_str_attr(f, "task", "classification");
    put_num_attr(f, "num_classes", H5T_STD_I32LE, H5T_NATIVE_INT, &num_classes);
    put_num_attr(f, "norm_scale", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &scale);
    put_num_attr(f, "norm_mean", H5T_IEEE_F32LE, H5T_NATIVE_DOUBLE, &mean);
    put_num_attr(f, "norm_std", H5T_IEEE_F32LE, H5T_NATIVE_DOUBLE, &sd);
}

/* Writes /<split>/x (n x d, stored as ftype, given as floats) and
 * /<split>/y (ny int32 labels) into an open file. */
static void put_split(hid_t f, const char *split, hid_t ftype, hsize_t n, hsize_t d,
                      const float *x, hsize_t ny, const int32_t *y)
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

/* IEEE half precision as an HDF5 type (HDF5 1.10 has no predefined one). */
static hid_t f16_type(void)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(t, 15, 10, 5, 0, 10);
    H5Tset_size(t, 2);
    H5Tset_ebias(t, 15);
    return t;
}

/* A small dataset: split "train" (and "test"), n x d floats where x[i][j]
 * = i + j/8 (exact in f16 for small i), labels i % k. */
static void make_ds(const char *path, hid_t ftype, hsize_t n, hsize_t d, int k, int version,
                    double scale, double mean, double sd)
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

/* ---- language-model datasets ------------------------------------------- */

#define LM_V 50

static int32_t lm_tok(int64_t i) { return (int32_t)((i * 7 + 3) % LM_V); }

/* A token-stream file: split "train" of ntrain tokens lm_tok(i) and "val"
 * of nval, stored as ftype; `attrs` 0: complete, 1: no vocab_size, 2: a
 * bad tokenizer; vocab: the vocab_size attribute. */
static void make_lm(const char *path, hid_t ftype, hsize_t ntrain, hsize_t nval, int attrs,
                    int vocab)
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

/* A part of a larger dataset: rows [from, from + n) of the pattern of
 * make_ds (x[i][j] = i + j/8, label i % 3) in "train" and in "test". */
static void make_part(const char *name, hsize_t from, hsize_t n, double mean)
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

/* ---- loader ------------------------------------------------------------------ */

#define SEQ_K 7

/* A dataset whose sample i has x = (i, -i) and label i % SEQ_K, with the
 * identity normalisation, so a batch row can be checked against its id. */
static dt_dataset_t *open_seq(const char *name, hsize_t n)
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

struct rec {
    int64_t batch, row0, rows, global_rows;
    int micro, micro_count;
    uint64_t ids[64];
};

struct run {
    struct rec r[4096];
    int n;
    int bad_rows; /* rows whose x or y do not match the sample id */
    uint64_t bytes;
};

static struct dt_loader_opts seq_opts(dt_dataset_t *ds, int64_t G, int64_t micro, int rank,
                                      int world)
{
    return (struct dt_loader_opts){.ds = ds, .split = "train", .global_batch = G,
                                   .micro_batch = micro, .rank = rank, .world = world,
                                   .seed = 1234, .shuffle = 1, .drop_last = 0,
                                   .workers = 1, .prefetch = 1};
}

/* Runs the loader from (epoch, first) to the end of the epoch. */
static void collect(const struct dt_loader_opts *o, int64_t epoch, int64_t first, struct run *out)
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

/* (global batch, position in it, sample id) of every row, sorted. */
struct trip {
    int64_t batch, pos;
    uint64_t id;
};

static int trip_cmp(const void *a, const void *b)
{
    const struct trip *x = a, *y = b;
    if (x->batch != y->batch)
        return x->batch < y->batch ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static size_t trips(const struct run *const *runs, int nruns, struct trip *out)
{
    size_t n = 0;
    for (int k = 0; k < nruns; k++)
        for (int i = 0; i < runs[k]->n; i++)
            for (int64_t j = 0; j < runs[k]->r[i].rows; j++)
                out[n++] = (struct trip){runs[k]->r[i].batch, runs[k]->r[i].row0 + j,
                                         runs[k]->r[i].ids[j]};
    qsort(out, n, sizeof *out, trip_cmp);
    return n;
}

static int same_trips(const struct trip *a, size_t na, const struct trip *b, size_t nb)
{
    return na == nb && memcmp(a, b, na * sizeof *a) == 0;
}

static struct run g_ra, g_rb, g_rc, g_rd, g_re; /* big: keep off the stack */
static struct trip g_ta[8192], g_tb[8192];

static void check_visits_once(const struct run *const *runs, int nruns, size_t n, size_t want)
{
    static int seen[1000];
    memset(seen, 0, sizeof seen);
    size_t total = 0;
    for (int k = 0; k < nruns; k++)
        for (int i = 0; i < runs[k]->n; i++)
            for (int64_t j = 0; j < runs[k]->r[i].rows; j++) {
                CU_ASSERT_FATAL(runs[k]->r[i].ids[j] < n);
                seen[runs[k]->r[i].ids[j]]++;
                total++;
            }
    CU_ASSERT_EQUAL(total, want);
    int twice = 0;
    for (size_t i = 0; i < n; i++)
        twice += seen[i] > 1;
    CU_ASSERT_EQUAL(twice, 0);
}

static void test_loader_epoch_all_samples(void)
{
    dt_dataset_t *ds = open_seq("seq103.h5", 103);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 10, 5, 0, 1);
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_EQUAL(dt_loader_batches_per_epoch(ld), 11);
    dt_loader_destroy(ld);
    collect(&o, 0, 0, &g_ra);
    const struct run *one[1] = {&g_ra};
    check_visits_once(one, 1, 103, 103);
    CU_ASSERT_EQUAL(g_ra.n, 10 * 2 + 1); /* short batch of 3: one micro-batch */
    const struct rec *last = &g_ra.r[g_ra.n - 1];
    CU_ASSERT_EQUAL(last->batch, 10);
    CU_ASSERT_EQUAL(last->global_rows, 3);
    CU_ASSERT_EQUAL(last->rows, 3);
    CU_ASSERT_EQUAL(last->micro_count, 1);
    CU_ASSERT_EQUAL(g_ra.bytes, 103 * 2 * sizeof(float));

    /* two ranks, the short batch split 1 + 2 */
    struct dt_loader_opts o0 = seq_opts(ds, 10, 5, 0, 2), o1 = seq_opts(ds, 10, 5, 1, 2);
    collect(&o0, 0, 0, &g_rb);
    collect(&o1, 0, 0, &g_rc);
    const struct run *two[2] = {&g_rb, &g_rc};
    check_visits_once(two, 2, 103, 103);
    CU_ASSERT_EQUAL(g_rb.r[g_rb.n - 1].rows, 1);
    CU_ASSERT_EQUAL(g_rc.r[g_rc.n - 1].rows, 2);
    CU_ASSERT_EQUAL(g_rc.r[g_rc.n - 1].row0, 1);
    dt_dataset_close(ds);
}

static void test_loader_drop_last(void)
{
    dt_dataset_t *ds = open_seq("seq103d.h5", 103);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 10, 5, 0, 1);
    o.drop_last = 1;
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_EQUAL(dt_loader_batches_per_epoch(ld), 10);
    dt_loader_destroy(ld);
    collect(&o, 3, 0, &g_ra);
    const struct run *one[1] = {&g_ra};
    check_visits_once(one, 1, 103, 100);
    int short_ones = 0;
    for (int i = 0; i < g_ra.n; i++)
        short_ones += g_ra.r[i].global_rows != 10 || g_ra.r[i].rows != 5;
    CU_ASSERT_EQUAL(short_ones, 0);
    CU_ASSERT_EQUAL(g_ra.n, 20);
    dt_dataset_close(ds);
}

static void test_loader_deterministic(void)
{
    dt_dataset_t *ds = open_seq("seq64.h5", 64);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 8, 4, 0, 1);
    collect(&o, 5, 0, &g_ra);
    collect(&o, 5, 0, &g_rb);
    collect(&o, 6, 0, &g_rc);
    CU_ASSERT_EQUAL(g_ra.n, 16);
    CU_ASSERT(g_ra.n == g_rb.n && memcmp(g_ra.r, g_rb.r, sizeof g_ra.r[0] * g_ra.n) == 0);
    CU_ASSERT(memcmp(g_ra.r, g_rc.r, sizeof g_ra.r[0] * g_ra.n) != 0);
    /* and the order is the one dt_rng_permutation gives */
    uint64_t perm[64];
    dt_rng_permutation(1234, 5, perm, 64);
    CU_ASSERT(g_ra.r[0].ids[0] == perm[0] && g_ra.r[15].ids[3] == perm[63]);
    /* no shuffle: rows in file order */
    o.shuffle = 0;
    collect(&o, 5, 0, &g_rd);
    int out_of_order = 0;
    for (int i = 0; i < g_rd.n; i++)
        for (int64_t j = 0; j < g_rd.r[i].rows; j++)
            out_of_order += g_rd.r[i].ids[j] != (uint64_t)(i * 4 + j);
    CU_ASSERT_EQUAL(out_of_order, 0);
    dt_dataset_close(ds);
}

static void test_loader_two_ranks(void)
{
    dt_dataset_t *ds = open_seq("seq200.h5", 200);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 16, 8, 0, 1);
    collect(&o, 2, 0, &g_ra); /* world 1, accumulation 2 */
    struct dt_loader_opts o0 = seq_opts(ds, 16, 8, 0, 2), o1 = seq_opts(ds, 16, 8, 1, 2);
    collect(&o0, 2, 0, &g_rb);
    collect(&o1, 2, 0, &g_rc);
    const struct run *one[1] = {&g_ra}, *two[2] = {&g_rb, &g_rc};
    size_t na = trips(one, 1, g_ta), nb = trips(two, 2, g_tb);
    CU_ASSERT_EQUAL(na, 200);
    CU_ASSERT(same_trips(g_ta, na, g_tb, nb));
    /* each rank reads about half */
    CU_ASSERT_EQUAL(g_rb.bytes + g_rc.bytes, g_ra.bytes);
    double share = (double)g_rb.bytes / (double)g_ra.bytes;
    CU_ASSERT(share > 0.45 && share < 0.55);
    dt_dataset_close(ds);
}

static void test_loader_accumulation_matches_ranks(void)
{
    dt_dataset_t *ds = open_seq("seq70.h5", 70);
    CU_ASSERT_FATAL(ds != NULL);
    const int64_t G = 16;
    for (int drop = 1; drop >= 0; drop--) {
        struct dt_loader_opts o = seq_opts(ds, G, G / 4, 0, 1);
        o.drop_last = drop;
        collect(&o, 1, 0, &g_ra);
        struct run *ranks[4] = {&g_rb, &g_rc, &g_rd, &g_re};
        for (int r = 0; r < 4; r++) {
            struct dt_loader_opts orr = seq_opts(ds, G, G / 4, r, 4);
            orr.drop_last = drop;
            collect(&orr, 1, 0, ranks[r]);
        }
        const struct run *one[1] = {&g_ra};
        const struct run *four[4] = {&g_rb, &g_rc, &g_rd, &g_re};
        size_t na = trips(one, 1, g_ta), nb = trips(four, 4, g_tb);
        CU_ASSERT_EQUAL(na, drop ? 64u : 70u);
        CU_ASSERT(same_trips(g_ta, na, g_tb, nb));
        if (!drop)
            continue;
        /* full batches: one rank's micro-batch j is rank j's slice */
        int mismatched = 0;
        for (int i = 0; i < g_ra.n; i++) {
            const struct rec *a = &g_ra.r[i];
            const struct rec *b = &ranks[a->micro]->r[a->batch];
            mismatched += a->micro_count != 4 || b->micro_count != 1 || a->row0 != b->row0 ||
                          a->batch != b->batch ||
                          memcmp(a->ids, b->ids, sizeof(uint64_t) * (size_t)a->rows) != 0;
        }
        CU_ASSERT_EQUAL(g_ra.n, 16);
        CU_ASSERT_EQUAL(mismatched, 0);
    }
    dt_dataset_close(ds);
}

static void test_loader_prefetch_same_sequence(void)
{
    dt_dataset_t *ds = open_seq("seq500.h5", 500);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 24, 4, 1, 2);
    collect(&o, 7, 0, &g_ra);
    o.workers = 4;
    o.prefetch = 8;
    collect(&o, 7, 0, &g_rb);
    CU_ASSERT(g_ra.n > 50);
    CU_ASSERT(g_ra.n == g_rb.n && memcmp(g_ra.r, g_rb.r, sizeof g_ra.r[0] * g_ra.n) == 0);
    CU_ASSERT_EQUAL(g_ra.bytes, g_rb.bytes);
    dt_dataset_close(ds);
}

static void test_loader_restart(void)
{
    dt_dataset_t *ds = open_seq("seq300.h5", 300);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 32, 8, 0, 2);
    o.workers = 3;
    o.prefetch = 5;
    collect(&o, 4, 0, &g_ra);
    const int64_t k = 6;
    int tail = 0;
    while (tail < g_ra.n && g_ra.r[tail].batch < k)
        tail++;
    CU_ASSERT_EQUAL(tail, k * 2);
    collect(&o, 4, k, &g_rb);
    CU_ASSERT(g_rb.n == g_ra.n - tail &&
              memcmp(g_rb.r, g_ra.r + tail, sizeof g_ra.r[0] * (size_t)g_rb.n) == 0);

    /* restart in the middle of an epoch, with batches read ahead and one held */
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_FATAL(ld != NULL);
    ASSERT_STATUS(dt_loader_start_epoch(ld, 9, 0), DT_OK);
    struct dt_batch b, held;
    int end = 0;
    for (int i = 0; i < 3; i++) {
        ASSERT_STATUS(dt_loader_next(ld, &b, &end), DT_OK);
        dt_loader_release(ld, &b);
    }
    ASSERT_STATUS(dt_loader_next(ld, &held, &end), DT_OK);
    ASSERT_STATUS(dt_loader_start_epoch(ld, 4, k), DT_OK);
    dt_loader_release(ld, &held); /* stale: ignored */
    int same = 1;
    for (int i = tail; i < g_ra.n; i++) {
        dt_status st = dt_loader_next(ld, &b, &end);
        if (st != DT_OK || end) {
            same = 0;
            break;
        }
        same &= b.batch == g_ra.r[i].batch && b.micro == g_ra.r[i].micro &&
                memcmp(b.sample_ids, g_ra.r[i].ids, sizeof(uint64_t) * (size_t)b.rows) == 0;
        dt_loader_release(ld, &b);
    }
    CU_ASSERT(same);
    ASSERT_STATUS(dt_loader_next(ld, &b, &end), DT_OK);
    CU_ASSERT_EQUAL(end, 1);
    ASSERT_STATUS(dt_loader_start_epoch(ld, 4, 99), DT_ERR_INVALID_ARG);
    dt_loader_destroy(ld);
    dt_dataset_close(ds);
}

static void test_loader_bad_micro(void)
{
    dt_dataset_t *ds = open_seq("seq50.h5", 50);
    CU_ASSERT_FATAL(ds != NULL);
    dt_loader_t *ld = (dt_loader_t *)1;
    struct dt_loader_opts o = seq_opts(ds, 24, 5, 0, 2); /* 12 rows per rank */
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    CU_ASSERT(ld == NULL);
    ASSERT_MSG("micro batch 5");
    ASSERT_MSG("1, 2, 3, 4, 6, 12");
    o = seq_opts(ds, 3, 1, 0, 4); /* fewer rows than ranks */
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    o = seq_opts(ds, 64, 8, 0, 1); /* one batch would be dropped: empty epoch */
    o.drop_last = 1;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    o = seq_opts(ds, 8, 8, 0, 1);
    o.split = "nope";
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_BAD_DATA);
    dt_dataset_close(ds);
}

static void test_loader_held_slots_and_destroy(void)
{
    dt_dataset_t *ds = open_seq("seq120.h5", 120);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 8, 4, 0, 1);
    o.workers = 3;
    o.prefetch = 2;
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_FATAL(ld != NULL);
    struct dt_batch a, b, c;
    int end = 0;
    ASSERT_STATUS(dt_loader_next(ld, &a, &end), DT_ERR_INVALID_ARG); /* not started */
    ASSERT_STATUS(dt_loader_start_epoch(ld, 0, 0), DT_OK);
    ASSERT_STATUS(dt_loader_next(ld, &a, &end), DT_OK);
    ASSERT_STATUS(dt_loader_next(ld, &b, &end), DT_OK);
    CU_ASSERT(a.x != b.x && a.micro == 0 && b.micro == 1);
    /* both slots held: an error, not a deadlock */
    ASSERT_STATUS(dt_loader_next(ld, &c, &end), DT_ERR_INVALID_ARG);
    dt_loader_release(ld, &a);
    ASSERT_STATUS(dt_loader_next(ld, &c, &end), DT_OK);
    CU_ASSERT_EQUAL(c.batch, 1);
    /* destroy mid-epoch with reads in flight and batches held */
    dt_loader_destroy(ld);
    dt_dataset_close(ds);
}

/* A global batch far larger than the split (the job allows 10^9): one
 * short batch of every row, with buffers sized by the data, not by the
 * batch (10^9 rows of 1000 floats would be 4 TB). */
static void test_loader_batch_beyond_split(void)
{
    char p[4096];
    enum { N = 30, D = 1000 };
    static float x[N * D];
    for (int i = 0; i < N * D; i++)
        x[i] = (float)(i / D);
    tpath(p, sizeof p, "wide.h5");
    int32_t y[N] = {0};
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    put_root_attrs(f, 1, 3, 1, 0, 1);
    put_split(f, "train", H5T_IEEE_F32LE, N, D, x, N, y);
    H5Fclose(f);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    struct dt_loader_opts o = seq_opts(ds, 1000000000, 1000000000, 0, 1);
    o.prefetch = 4;
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_FATAL(ld != NULL);
    CU_ASSERT_EQUAL(dt_loader_batches_per_epoch(ld), 1);
    ASSERT_STATUS(dt_loader_start_epoch(ld, 0, 0), DT_OK);
    struct dt_batch b;
    int end = 0;
    ASSERT_STATUS(dt_loader_next(ld, &b, &end), DT_OK);
    CU_ASSERT_FATAL(!end);
    CU_ASSERT_EQUAL(b.rows, N);
    int bad = 0;
    for (int64_t i = 0; i < b.rows; i++)
        bad += b.x[i * D + D - 1] != (float)b.sample_ids[i];
    CU_ASSERT_EQUAL(bad, 0);
    dt_loader_release(ld, &b);
    dt_loader_destroy(ld);
    dt_dataset_close(ds);
}

/* x stored in two external raw files; removing the second makes every read
 * of rows 20.. fail inside HDF5, in a loader worker. */
static void test_loader_read_error(void)
{
    char p[4096], ext_a[4096], ext_b[4096];
    tpath(p, sizeof p, "external.h5");
    tpath(ext_a, sizeof ext_a, "external-a.raw");
    tpath(ext_b, sizeof ext_b, "external-b.raw");
    const hsize_t n = 40;
    float x[40 * 2];
    int32_t y[40];
    for (hsize_t i = 0; i < n; i++) {
        x[2 * i] = (float)i;
        x[2 * i + 1] = -(float)i;
        y[i] = (int32_t)(i % SEQ_K);
    }
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    put_root_attrs(f, 1, SEQ_K, 1, 0, 1);
    hid_t g = H5Gcreate2(f, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[2] = {n, 2};
    hid_t sx = H5Screate_simple(2, dims, NULL), sy = H5Screate_simple(1, &n, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, ext_a, 0, 20 * 2 * sizeof(float));
    H5Pset_external(dcpl, ext_b, 0, 20 * 2 * sizeof(float));
    hid_t dx = H5Dcreate2(g, "x", H5T_NATIVE_FLOAT, sx, H5P_DEFAULT, dcpl, H5P_DEFAULT);
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
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    CU_ASSERT_EQUAL(unlink(ext_b), 0);
    struct dt_loader_opts o = seq_opts(ds, 4, 2, 0, 1);
    o.shuffle = 0;
    o.workers = 2;
    o.prefetch = 4;
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_FATAL(ld != NULL);
    for (int round = 0; round < 2; round++) {
        ASSERT_STATUS(dt_loader_start_epoch(ld, 0, 0), DT_OK);
        int ok = 0, end = 0;
        dt_status st = DT_OK;
        struct dt_batch b;
        while ((st = dt_loader_next(ld, &b, &end)) == DT_OK && !end) {
            ok += b.x[0] == (float)b.sample_ids[0];
            dt_loader_release(ld, &b);
        }
        CU_ASSERT_EQUAL(ok, 10); /* rows 0..19: 5 batches of 2 micro-batches */
        CU_ASSERT_EQUAL(end, 0);
        CU_ASSERT_EQUAL(st, DT_ERR_IO);
        ASSERT_MSG(p);
        ASSERT_MSG("rows 20..21");
        /* the error stays until the next start_epoch */
        ASSERT_STATUS(dt_loader_next(ld, &b, &end), DT_ERR_IO);
        ASSERT_MSG(p);
    }
    dt_loader_destroy(ld);
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

/* A split of n rows of d floats given in x, labels 0. */
static void make_float_ds(const char *path, hid_t ftype, hsize_t n, hsize_t d, const float *x,
                          double scale, double mean, double sd)
{
    int32_t y[64] = {0};
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0 && n <= 64);
    put_root_attrs(f, 1, 3, scale, mean, sd);
    put_split(f, "train", ftype, n, d, x, n, y);
    H5Fclose(f);
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

/* ---- model files ------------------------------------------------------------- */

/* Whole file into a malloc'd buffer (NULL when unreadable). */
static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    *len = buf && fread(buf, 1, (size_t)n, f) == (size_t)n ? (size_t)n : 0;
    fclose(f);
    return buf;
}

static void test_model_round_trip(void)
{
    char dir[4096], p[4200];
    float w[6] = {1, -2, 3.5f, 4, 5, 6}, b[3] = {0.25f, 0, -1};
    struct dt_named_tensor t[2] = {{"fc1.weight", {2, {2, 3}}, w}, {"fc1.bias", {1, {3}}, b}};
    tpath(dir, sizeof dir, "model-rt");
    mkdir(dir, 0777);
    snprintf(p, sizeof p, "%s/model.h5", dir);
    ASSERT_STATUS(dt_model_file_save(p, t, 2), DT_OK);
    CU_ASSERT_EQUAL(dir_entries(dir), 1); /* no temporary file left */
    struct dt_named_tensor *got = NULL;
    int n = 0;
    ASSERT_STATUS(dt_model_file_load(p, &got, &n), DT_OK);
    CU_ASSERT_EQUAL_FATAL(n, 2);
    CU_ASSERT_STRING_EQUAL(got[0].name, "fc1.bias"); /* name order */
    CU_ASSERT(got[0].shape.ndim == 1 && got[0].shape.dim[0] == 3 &&
              !memcmp(got[0].data, b, sizeof b));
    CU_ASSERT(got[1].shape.ndim == 2 && got[1].shape.dim[0] == 2 && got[1].shape.dim[1] == 3 &&
              !memcmp(got[1].data, w, sizeof w));
    dt_model_file_free(got, n);
}

/* Saves a 4 MiB model into dir where a small model.h5 already is, with the
 * file size limited to 256 KiB when fsize (else in whatever room dir has):
 * the save fails with the system's reason and the free space, and the old
 * model.h5 is untouched, with no temporary file beside it. */
static void failing_model_save(const char *dir, int fsize, const char *reason)
{
    enum { BIG = 1 << 20 };
    char p[4200];
    float small[4] = {1, 2, 3, 4};
    struct dt_named_tensor t = {"fc1.weight", {1, {4}}, small};
    snprintf(p, sizeof p, "%s/model.h5", dir);
    ASSERT_STATUS(dt_model_file_save(p, &t, 1), DT_OK);
    size_t before_len = 0, after_len = 0;
    char *before = read_all(p, &before_len);
    float *big = calloc(BIG, sizeof *big);
    CU_ASSERT_FATAL(before && big);
    for (size_t i = 0; i < BIG; i++)
        big[i] = (float)i;
    struct dt_named_tensor bt = {"fc1.weight", {2, {1024, 1024}}, big};
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 256 * 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CU_ASSERT(!fsize || setrlimit(RLIMIT_FSIZE, &lim) == 0);
    dt_clear_error();
    dt_status st = dt_model_file_save(p, &bt, 1);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    ASSERT_STATUS(st, DT_ERR_IO);
    ASSERT_MSG(p);
    ASSERT_MSG(reason);
    ASSERT_MSG("free on its file system");
    char *after = read_all(p, &after_len);
    CU_ASSERT(after && after_len == before_len && !memcmp(after, before, before_len));
    CU_ASSERT_EQUAL(dir_entries(dir), 1);
    free(after);
    free(before);
    free(big);
}

static void test_model_save_file_size_limit(void)
{
    char dir[4096];
    tpath(dir, sizeof dir, "model-efbig");
    mkdir(dir, 0777);
    failing_model_save(dir, 1, "File too large (the file-size limit, ulimit -f, is 256 KiB)");
}

/* A real full disk (a 1 MiB tmpfs); needs the right to mount. */
static void test_model_save_disk_full(void)
{
    char dir[4096];
    tpath(dir, sizeof dir, "model-enospc");
    mkdir(dir, 0777);
    if (mount("dtrain-test", dir, "tmpfs", 0, "size=1m,mode=0755") != 0) {
        printf("SKIPPED (cannot mount a small tmpfs: %s) ", strerror(errno));
        return;
    }
    failing_model_save(dir, 0, "cannot reserve 4.00 MiB for it: No space left on device");
    CU_ASSERT_EQUAL(umount2(dir, MNT_DETACH), 0);
}

/* Model files that are not what they claim: each is refused with a clear
 * status before anything is allocated from what it declares. */
static void test_model_bad_files(void)
{
    char dir[4096], p[4200];
    struct dt_named_tensor *got = NULL;
    int n = 0;
    tpath(dir, sizeof dir, "model-bad");
    mkdir(dir, 0777);
    ASSERT_STATUS(dt_model_file_load(dir, &got, &n), DT_ERR_NOT_FOUND);
    ASSERT_MSG("not a regular file");
    snprintf(p, sizeof p, "%s/fifo.h5", dir);
    CU_ASSERT_EQUAL_FATAL(mkfifo(p, 0600), 0);
    alarm(60); /* a blocking open would hang: fail loudly instead */
    ASSERT_STATUS(dt_model_file_load(p, &got, &n), DT_ERR_NOT_FOUND);
    alarm(0);
    ASSERT_MSG("FIFO");
    snprintf(p, sizeof p, "%s/text.h5", dir);
    FILE *fp = fopen(p, "w");
    fputs("not HDF5\n", fp);
    fclose(fp);
    ASSERT_STATUS(dt_model_file_load(p, &got, &n), DT_ERR_BAD_DATA);
    ASSERT_MSG("is damaged or is not an HDF5 file");

    /* a tensor declaring 2^60 floats it never wrote, a name longer than a
     * tensor's name buffer, a link */
    float w[2] = {1, 2};
    struct dt_named_tensor t = {"w", {1, {2}}, w};
    const char *edits[] = {"huge", "long", "link"};
    for (int k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s/%s.h5", dir, edits[k]);
        ASSERT_STATUS(dt_model_file_save(p, &t, 1), DT_OK);
        hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
        CU_ASSERT_FATAL(f >= 0);
        if (k == 0) {
            hsize_t dims[2] = {(hsize_t)1 << 40, (hsize_t)1 << 20};
            hid_t sp = H5Screate_simple(2, dims, NULL);
            hid_t d = H5Dcreate2(f, "params/huge", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT,
                                 H5P_DEFAULT);
            CU_ASSERT(d >= 0);
            H5Dclose(d);
            H5Sclose(sp);
        } else if (k == 1) {
            char name[7 + 100] = "params/";
            memset(name + 7, 'a', 99);
            name[106] = '\0';
            CU_ASSERT(H5Lcreate_hard(f, "params/w", f, name, H5P_DEFAULT, H5P_DEFAULT) >= 0);
        } else {
            CU_ASSERT(H5Lcreate_soft("/params/w", f, "params/v", H5P_DEFAULT, H5P_DEFAULT) >= 0);
        }
        H5Fclose(f);
        got = NULL;
        ASSERT_STATUS(dt_model_file_load(p, &got, &n), DT_ERR_BAD_DATA);
        CU_ASSERT(got == NULL);
        ASSERT_MSG(p);
        ASSERT_MSG(k == 0   ? "/params/huge declares"
                   : k == 1 ? "is longer than 63"
                            : "/params/v is a link");
    }
}

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

/* Reads every row of split back and checks x against want (before
 * normalisation) and y against labels. */
static void check_values(const char *path, const char *split, int64_t n, int64_t per,
                         const float *want, const int32_t *labels)
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

static void test_csv_values(void)
{
    char in[4096], out[4096];
    tpath(in, sizeof in, "v.csv");
    tpath(out, sizeof out, "v-csv.h5");
    FILE *f = fopen(in, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("f1, cls ,f2\n\n1.5,1,-2\r\n0.25,0,1e3\n-7, 2 ,0\n", f);
    fclose(f);
    float want[6] = {1.5f, -2.0f, 0.25f, 1000.0f, -7.0f, 0.0f};
    int32_t labels[3] = {1, 0, 2};
    struct dt_csv_import_opts o = {.train = in, .out_path = out, .label_column = "cls"};
    ASSERT_STATUS(dt_csv_import(&o, NULL), DT_OK);
    check_values(out, "train", 3, 2, want, labels);

    o.label_column = "4";
    o.overwrite = 1;
    ASSERT_STATUS(dt_csv_import(&o, NULL), DT_ERR_USAGE);
    ASSERT_MSG("columns 1 to 3");
    o.label_column = "2";
    o.header = DT_CSV_HEADER_NO;
    ASSERT_STATUS(dt_csv_import(&o, NULL), DT_ERR_BAD_DATA);
    ASSERT_MSG("line 1, column 1: 'f1' is not a number");
}

/* ---- images, per-channel normalisation, augmentation ---------------------- */

/* Writes /<split>/x of n samples of shape dims[0..nd) (stored as ftype,
 * given as floats) and /<split>/y (labels i % 2) into an open file. */
static void put_image_split(hid_t f, const char *split, hid_t ftype, hsize_t n, int nd,
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

static void put_float_array_attr(hid_t obj, const char *name, hsize_t n, const double *v)
{
    hid_t s = H5Screate_simple(1, &n, NULL);
    hid_t a = H5Acreate2(obj, name, H5T_IEEE_F64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(H5Awrite(a, H5T_NATIVE_DOUBLE, v) >= 0);
    H5Aclose(a);
    H5Sclose(s);
}

/* An image dataset: splits train and test of n samples of dims (x[i] =
 * given values, the test split the first n/2 of them), scalar norm
 * (scale, 0, 1), and per-channel attributes when nmean/nstd > 0. */
static void make_image_ds(const char *name, hid_t ftype, hsize_t n, int nd, const hsize_t *dims,
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

static dt_status open_named(const char *name, dt_dataset_t **ds)
{
    char p[4096];
    tpath(p, sizeof p, name);
    return dt_dataset_open(p, ds);
}

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

#define AUG_N 48
#define AUG_C 2
#define AUG_H 3
#define AUG_W 4
#define AUG_ELEMS (AUG_C * AUG_H * AUG_W)
#define AUG_PAD 1
#define AUG_SEED 777

/* Sample i of the augmentation dataset holds i * 100 + k at element k. */
static float aug_value(uint64_t i, int64_t k) { return (float)(i * 100 + (uint64_t)k); }

/* What the crop cf of sample i must be, computed here independently. */
static void aug_expect(uint64_t i, const struct dt_crop_flip *cf, int pad, float *out)
{
    for (int c = 0; c < AUG_C; c++)
        for (int y = 0; y < AUG_H; y++)
            for (int x = 0; x < AUG_W; x++) {
                int py = y + cf->top, px = (cf->flip ? AUG_W - 1 - x : x) + cf->left;
                int sy = py - pad, sx = px - pad; /* padded -> stored */
                int inside = sy >= 0 && sy < AUG_H && sx >= 0 && sx < AUG_W;
                out[(c * AUG_H + y) * AUG_W + x] =
                    inside ? aug_value(i, (c * AUG_H + sy) * AUG_W + sx) : 0.0f;
            }
}

static dt_dataset_t *open_aug(void)
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

/* Runs one rank from global batch `first` to the end of the epoch and
 * checks every row against aug_expect for the draw of (seed, epoch,
 * sample); returns the rows seen. */
static int64_t aug_epoch(const struct dt_loader_opts *o, int64_t epoch, int64_t first, int *bad)
{
    dt_loader_t *ld = NULL;
    int64_t rows = 0;
    ASSERT_STATUS(dt_loader_create(o, &ld), DT_OK);
    if (!ld)
        return 0;
    ASSERT_STATUS(dt_loader_start_epoch(ld, epoch, first), DT_OK);
    for (;;) {
        struct dt_batch b;
        int end = 0;
        dt_status st = dt_loader_next(ld, &b, &end);
        ASSERT_STATUS(st, DT_OK);
        if (st != DT_OK || end)
            break;
        for (int64_t r = 0; r < b.rows; r++) {
            struct dt_crop_flip cf;
            float want[AUG_ELEMS];
            dt_loader_augment_draw(o->seed, epoch, b.sample_ids[r], o->crop_padding, o->hflip, &cf);
            aug_expect(b.sample_ids[r], &cf, o->crop_padding, want);
            *bad += memcmp(want, b.x + r * AUG_ELEMS, sizeof want) != 0;
        }
        rows += b.rows;
        dt_loader_release(ld, &b);
    }
    dt_loader_destroy(ld);
    return rows;
}

/* The same sample in the same epoch gets the same crop and flip whatever
 * the world size, rank, micro-batch or number of workers; each row is
 * the hand-computed crop of its draw. */
static void test_loader_augment_any_world(void)
{
    dt_dataset_t *ds = open_aug();
    if (!ds)
        return;
    struct {
        int world;
        int64_t micro;
        int workers, prefetch;
    } cfgs[] = {{1, 12, 1, 1}, {2, 3, 1, 2}, {3, 4, 2, 3}, {4, 1, 3, 4}};
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++)
        for (int64_t epoch = 0; epoch < 2; epoch++) {
            int64_t rows = 0;
            int bad = 0;
            for (int rank = 0; rank < cfgs[k].world; rank++) {
                struct dt_loader_opts o = {.ds = ds,
                                           .split = "train",
                                           .global_batch = 12,
                                           .micro_batch = cfgs[k].micro,
                                           .rank = rank,
                                           .world = cfgs[k].world,
                                           .seed = AUG_SEED,
                                           .shuffle = 1,
                                           .drop_last = 0,
                                           .workers = cfgs[k].workers,
                                           .prefetch = cfgs[k].prefetch,
                                           .crop_padding = AUG_PAD,
                                           .hflip = 1};
                rows += aug_epoch(&o, epoch, 0, &bad);
            }
            CU_ASSERT_EQUAL(rows, AUG_N);
            CU_ASSERT_EQUAL(bad, 0);
            /* resumed at global batch 2 of 4: the same crops for the rest */
            rows = 0;
            for (int rank = 0; rank < cfgs[k].world; rank++) {
                struct dt_loader_opts o = {.ds = ds,
                                           .split = "train",
                                           .global_batch = 12,
                                           .micro_batch = cfgs[k].micro,
                                           .rank = rank,
                                           .world = cfgs[k].world,
                                           .seed = AUG_SEED,
                                           .shuffle = 1,
                                           .workers = cfgs[k].workers,
                                           .prefetch = cfgs[k].prefetch,
                                           .crop_padding = AUG_PAD,
                                           .hflip = 1};
                rows += aug_epoch(&o, epoch, 2, &bad);
            }
            CU_ASSERT_EQUAL(rows, AUG_N - 24);
            CU_ASSERT_EQUAL(bad, 0);
        }
    dt_dataset_close(ds);
}

/* The draws vary: across samples (every crop offset and both flips
 * occur), and across epochs for the same sample. */
static void test_loader_augment_draws(void)
{
    int tops[2 * AUG_PAD + 1] = {0}, lefts[2 * AUG_PAD + 1] = {0}, flips = 0, changed = 0;
    const int n = 1000;
    for (int i = 0; i < n; i++) {
        struct dt_crop_flip a, b, again;
        dt_loader_augment_draw(AUG_SEED, 0, (uint64_t)i, AUG_PAD, 1, &a);
        dt_loader_augment_draw(AUG_SEED, 1, (uint64_t)i, AUG_PAD, 1, &b);
        dt_loader_augment_draw(AUG_SEED, 0, (uint64_t)i, AUG_PAD, 1, &again);
        CU_ASSERT(a.top >= 0 && a.top <= 2 * AUG_PAD && a.left >= 0 && a.left <= 2 * AUG_PAD);
        CU_ASSERT(a.flip == 0 || a.flip == 1);
        CU_ASSERT(memcmp(&a, &again, sizeof a) == 0);
        tops[a.top]++;
        lefts[a.left]++;
        flips += a.flip;
        changed += memcmp(&a, &b, sizeof a) != 0;
    }
    for (int v = 0; v <= 2 * AUG_PAD; v++) {
        CU_ASSERT(tops[v] > n / 5);
        CU_ASSERT(lefts[v] > n / 5);
    }
    CU_ASSERT(flips > n / 3 && flips < 2 * n / 3);
    CU_ASSERT(changed > n / 2);
    /* off: no crop, no flip */
    struct dt_crop_flip off;
    dt_loader_augment_draw(AUG_SEED, 0, 5, 0, 0, &off);
    CU_ASSERT(off.top == 0 && off.left == 0 && off.flip == 0);
    /* the loader with augmentation off hands out the stored samples */
    dt_dataset_t *ds = open_aug();
    if (!ds)
        return;
    struct dt_loader_opts o = {.ds = ds,
                               .split = "test",
                               .global_batch = 8,
                               .micro_batch = 8,
                               .rank = 0,
                               .world = 1,
                               .seed = AUG_SEED,
                               .shuffle = 0,
                               .workers = 1,
                               .prefetch = 1};
    int bad = 0;
    CU_ASSERT_EQUAL(aug_epoch(&o, 0, 0, &bad), AUG_N / 2);
    CU_ASSERT_EQUAL(bad, 0);
    dt_dataset_close(ds);
}

/* Augmentation of vector samples, or a negative padding, is refused
 * naming the key. */
static void test_loader_augment_refused(void)
{
    dt_dataset_t *ds = open_seq("aug-vec.h5", 16);
    if (!ds)
        return;
    dt_loader_t *ld = NULL;
    struct dt_loader_opts o = seq_opts(ds, 4, 4, 0, 1);
    o.hflip = 1;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    ASSERT_MSG("data.augment.hflip asks for augmentation of split 'train'");
    ASSERT_MSG("whose samples (2) are not images");
    o.hflip = 0;
    o.crop_padding = 2;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    ASSERT_MSG("data.augment.crop_padding");
    o.crop_padding = -1;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    ASSERT_MSG("data.augment.crop_padding=-1");
    CU_ASSERT_PTR_NULL(ld);
    dt_dataset_close(ds);
}

/* ---- main ------------------------------------------------------------------- */

static int suite_init(void)
{
    snprintf(g_dir, sizeof g_dir, "%s/test_io.%ld", cu_tmpdir(), (long)getpid());
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

/* ---- data.cache: memory ------------------------------------------------------- */

/* The cache logs what it read at every loader create; the suite keeps the
 * test output to errors. */
static enum dt_log_level cache_saved_level;

static int cache_suite_init(void)
{
    cache_saved_level = dt_log_get_level();
    dt_log_set_level(DT_LOG_LEVEL_ERROR);
    return 0;
}

static int cache_suite_clean(void)
{
    dt_log_set_level(cache_saved_level);
    return 0;
}

/* Everything a loader hands out over one run, as bytes: each batch's
 * numbers, sample ids, inputs and labels. */
struct stream {
    unsigned char *p;
    size_t n, cap;
};

static void put_bytes(struct stream *s, const void *v, size_t n)
{
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->n + n)
            cap *= 2;
        unsigned char *p = realloc(s->p, cap);
        CU_ASSERT_FATAL(p != NULL);
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->n, v, n);
    s->n += n;
}

/* Runs o from (epoch, first) to the end of the epoch into s; returns the
 * loader's cache mode. */
static int loader_stream(const struct dt_loader_opts *o, int64_t epoch, int64_t first,
                         struct stream *s)
{
    const struct dt_split_info *si = NULL;
    dt_loader_t *ld = NULL;
    ASSERT_STATUS(dt_dataset_split(o->ds, o->split, &si), DT_OK);
    ASSERT_STATUS(dt_loader_create(o, &ld), DT_OK);
    if (!ld || !si)
        return -1;
    int mode = (int)dt_loader_cache_mode(ld);
    ASSERT_STATUS(dt_loader_start_epoch(ld, epoch, first), DT_OK);
    for (;;) {
        struct dt_batch b;
        int end = 0;
        dt_status st = dt_loader_next(ld, &b, &end);
        ASSERT_STATUS(st, DT_OK);
        if (st != DT_OK || end)
            break;
        int64_t nums[6] = {b.batch, b.row0, b.rows, b.global_rows, b.micro, b.micro_count};
        put_bytes(s, nums, sizeof nums);
        put_bytes(s, b.sample_ids, (size_t)b.rows * sizeof *b.sample_ids);
        put_bytes(s, b.x, (size_t)(b.rows * si->sample_elems) * sizeof *b.x);
        put_bytes(s, b.y, (size_t)b.rows * sizeof *b.y);
        dt_loader_release(ld, &b);
    }
    dt_loader_destroy(ld);
    return mode;
}

/* A uint8 image dataset of AUG_N samples (2 x 3 x 4), norm scale 1/255. */
static dt_dataset_t *open_aug_u8(void)
{
    static float x[AUG_N * AUG_ELEMS];
    for (uint64_t i = 0; i < AUG_N; i++)
        for (int k = 0; k < AUG_ELEMS; k++)
            x[i * AUG_ELEMS + (uint64_t)k] = (float)((i * 7 + (uint64_t)k * 13) % 256);
    hsize_t dims[3] = {AUG_C, AUG_H, AUG_W};
    make_image_ds("aug-u8.h5", H5T_STD_U8LE, AUG_N, 3, dims, x, 1.0 / 255, 0, NULL, 0, NULL);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(open_named("aug-u8.h5", &ds), DT_OK);
    return ds;
}

/* A split that fits is cached whole, and every batch (rows, ids, x, y)
 * is bit-identical to the uncached loader's: float32 and uint8 inputs,
 * 1 and 2 ranks, augmentation off and on, two epochs, from the start and
 * resumed at a later batch, several workers. */
static void test_cache_whole_split_same_batches(void)
{
    dt_dataset_t *dss[2] = {open_aug(), open_aug_u8()};
    for (int d = 0; d < 2; d++) {
        CU_ASSERT_FATAL(dss[d] != NULL);
        for (int world = 1; world <= 2; world++)
            for (int aug = 0; aug < 2; aug++)
                for (int64_t epoch = 0; epoch < 2; epoch++)
                    for (int64_t first = 0; first <= 2; first += 2)
                        for (int rank = 0; rank < world; rank++) {
                            struct dt_loader_opts o = {.ds = dss[d],
                                                       .split = "train",
                                                       .global_batch = 10,
                                                       .micro_batch = 5,
                                                       .rank = rank,
                                                       .world = world,
                                                       .seed = AUG_SEED,
                                                       .shuffle = 1,
                                                       .drop_last = 0,
                                                       .workers = 1,
                                                       .prefetch = 1,
                                                       .crop_padding = aug ? AUG_PAD : 0,
                                                       .hflip = aug,
                                                       .cache_max_mb = 1};
                            struct stream a = {0}, b = {0};
                            CU_ASSERT_EQUAL(loader_stream(&o, epoch, first, &a),
                                            DT_LOADER_CACHED_NONE);
                            o.cache = DT_LOADER_CACHE_MEMORY;
                            o.workers = 3;
                            o.prefetch = 4;
                            CU_ASSERT_EQUAL(loader_stream(&o, epoch, first, &b),
                                            DT_LOADER_CACHED_SPLIT);
                            CU_ASSERT(a.n > 0);
                            CU_ASSERT_EQUAL(a.n, b.n);
                            CU_ASSERT(a.n == b.n && memcmp(a.p, b.p, a.n) == 0);
                            free(a.p);
                            free(b.p);
                        }
        dt_dataset_close(dss[d]);
    }
}

#define SHARD_N 60000 /* rows of 2 floats: 1.14 MiB cached whole, half on each of 2 ranks */
#define SHARD_G 64

/* Does rank r of 2 own dataset row id in the shard layout (its half of
 * every global batch in file order, and of the short last one)? */
static int shard_owns(uint64_t id, int r)
{
    uint64_t full = SHARD_N / SHARD_G * SHARD_G, rest = SHARD_N - full;
    if (id < full)
        return id % SHARD_G / (SHARD_G / 2) == (uint64_t)r;
    return (id - full) / (rest / 2) == (uint64_t)r;
}

/* A split larger than cache_max_mb: each of 2 ranks caches its own shard
 * (reading only its rows), every sample is seen once per epoch across
 * the ranks and only by its owner, each row's x and y match its id, the
 * order changes with the epoch, a resumed run sees the same batches, and
 * without shuffling the batches are those of the uncached loader. */
static void test_cache_shard(void)
{
    dt_dataset_t *ds = open_seq("cache-shard.h5", SHARD_N);
    CU_ASSERT_FATAL(ds != NULL);
    static struct run full[2][2], tail;
    static unsigned char seen[SHARD_N];
    for (int64_t epoch = 0; epoch < 2; epoch++) {
        memset(seen, 0, sizeof seen);
        for (int r = 0; r < 2; r++) {
            struct dt_loader_opts o = seq_opts(ds, SHARD_G, SHARD_G / 2, r, 2);
            o.cache = DT_LOADER_CACHE_MEMORY;
            o.cache_max_mb = 1;
            o.workers = 2;
            o.prefetch = 3;
            dt_loader_t *ld = NULL;
            ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
            CU_ASSERT_EQUAL(dt_loader_cache_mode(ld), DT_LOADER_CACHED_SHARD);
            CU_ASSERT_EQUAL(dt_loader_cache_bytes(ld), (uint64_t)(SHARD_N / 2) * 20);
            dt_loader_destroy(ld);
            struct run *fr = &full[epoch][r];
            collect(&o, epoch, 0, fr);
            /* the fill read this rank's half of x, and the batches nothing more */
            CU_ASSERT_EQUAL(fr->bytes, (uint64_t)(SHARD_N / 2) * 2 * sizeof(float));
            int64_t rows = 0, strangers = 0;
            for (int i = 0; i < fr->n; i++)
                for (int64_t k = 0; k < fr->r[i].rows; k++) {
                    uint64_t id = fr->r[i].ids[k];
                    seen[id]++;
                    strangers += !shard_owns(id, r);
                    rows++;
                }
            CU_ASSERT_EQUAL(rows, SHARD_N / 2);
            CU_ASSERT_EQUAL(strangers, 0);
            /* resumed at global batch 100: the rest of the same epoch */
            collect(&o, epoch, 100, &tail);
            CU_ASSERT_EQUAL(tail.n, fr->n - 100);
            CU_ASSERT(tail.n == fr->n - 100 &&
                      memcmp(tail.r, fr->r + 100, (size_t)tail.n * sizeof *tail.r) == 0);
        }
        int64_t once = 0;
        for (int i = 0; i < SHARD_N; i++)
            once += seen[i] == 1;
        CU_ASSERT_EQUAL(once, SHARD_N);
    }
    CU_ASSERT(memcmp(full[0][0].r[0].ids, full[1][0].r[0].ids, sizeof full[0][0].r[0].ids) != 0);
    int identity = 1; /* the shuffled shard order is not the file order */
    for (int k = 0; k < SHARD_G / 2; k++)
        identity &= full[0][0].r[0].ids[k] == (uint64_t)k;
    CU_ASSERT(!identity);
    /* no shuffling: the shard order is the file order, as without the cache */
    for (int r = 0; r < 2; r++) {
        struct stream a = {0}, b = {0};
        struct dt_loader_opts o = seq_opts(ds, SHARD_G, SHARD_G / 2, r, 2);
        o.shuffle = 0;
        o.cache_max_mb = 1;
        CU_ASSERT_EQUAL(loader_stream(&o, 1, 0, &a), DT_LOADER_CACHED_NONE);
        o.cache = DT_LOADER_CACHE_MEMORY;
        CU_ASSERT_EQUAL(loader_stream(&o, 1, 0, &b), DT_LOADER_CACHED_SHARD);
        CU_ASSERT(a.n > 0 && a.n == b.n && memcmp(a.p, b.p, a.n) == 0);
        free(a.p);
        free(b.p);
    }
    /* drop_last: the full batches only, still no sample twice */
    {
        struct dt_loader_opts o = seq_opts(ds, SHARD_G, SHARD_G / 2, 1, 2);
        o.drop_last = 1;
        o.cache = DT_LOADER_CACHE_MEMORY;
        o.cache_max_mb = 1;
        collect(&o, 3, 0, &tail);
        memset(seen, 0, sizeof seen);
        int64_t rows = 0, twice = 0, strangers = 0;
        for (int i = 0; i < tail.n; i++)
            for (int64_t k = 0; k < tail.r[i].rows; k++) {
                uint64_t id = tail.r[i].ids[k];
                twice += seen[id]++ > 0;
                strangers += !shard_owns(id, 1);
                rows++;
            }
        CU_ASSERT_EQUAL(rows, SHARD_N / SHARD_G * (SHARD_G / 2));
        CU_ASSERT_EQUAL(twice, 0);
        CU_ASSERT_EQUAL(strangers, 0);
    }
    dt_dataset_close(ds);
}

/* Refused with a message naming the key: a shard larger than
 * data.cache_max_mb, a bad data.cache_max_mb, a language-model split. */
static void test_cache_refused(void)
{
    dt_dataset_t *ds = open_seq("cache-big.h5", SHARD_N);
    CU_ASSERT_FATAL(ds != NULL);
    dt_loader_t *ld = NULL;
    struct dt_loader_opts o = seq_opts(ds, SHARD_G, SHARD_G, 0, 1);
    o.cache = DT_LOADER_CACHE_MEMORY;
    o.cache_max_mb = 1;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    ASSERT_MSG("needs 2 MiB, more than data.cache_max_mb=1");
    CU_ASSERT_PTR_NULL(ld);
    o.cache_max_mb = 0;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    ASSERT_MSG("data.cache_max_mb=0");
    o.cache_max_mb = 2; /* fits whole again */
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_OK);
    CU_ASSERT_EQUAL(dt_loader_cache_mode(ld), DT_LOADER_CACHED_SPLIT);
    dt_loader_destroy(ld);
    dt_dataset_close(ds);

    char p[4096];
    tpath(p, sizeof p, "cache-lm.h5");
    make_lm(p, H5T_STD_U16LE, 400, 10, 0, LM_V);
    ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    ASSERT_STATUS(dt_dataset_set_seq_len(ds, 4), DT_OK);
    o = seq_opts(ds, 8, 8, 0, 1);
    o.cache = DT_LOADER_CACHE_MEMORY;
    o.cache_max_mb = 64;
    ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_USAGE);
    ASSERT_MSG("data.cache=memory is not implemented for language-model datasets");
    dt_dataset_close(ds);

    /* a NaN stored in x: refused when the cache is read, naming the row;
     * a normalisation that overflows: refused by the batch that meets it */
    float x[8 * 3];
    for (int i = 0; i < 24; i++)
        x[i] = (float)i;
    x[5 * 3 + 1] = NAN;
    tpath(p, sizeof p, "cache-nan.h5");
    make_float_ds(p, H5T_IEEE_F32LE, 8, 3, x, 1, 0, 1);
    ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    o = seq_opts(ds, 4, 4, 0, 1);
    o.cache = DT_LOADER_CACHE_MEMORY;
    o.cache_max_mb = 1;
    ld = NULL;
    ASSERT_STATUS(dt_loader_create(&o, &ld), DT_ERR_BAD_DATA);
    ASSERT_MSG("split 'train', row 5: x holds nan at element 1; inputs must be finite");
    dt_dataset_close(ds);
    x[5 * 3 + 1] = 3e38f;
    make_float_ds(p, H5T_IEEE_F32LE, 8, 3, x, 10, 0, 1);
    ds = NULL;
    ASSERT_STATUS(dt_dataset_open(p, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    dt_row_cache_t *rc = NULL;
    const int64_t from[1] = {0}, all[1] = {8};
    ASSERT_STATUS(dt_row_cache_create(ds, "train", from, all, 1, &rc), DT_OK);
    uint64_t pos[2] = {4, 5};
    float out[2 * 3];
    ASSERT_STATUS(dt_row_cache_read(rc, pos, 1, 0, NULL, out, NULL), DT_OK);
    ASSERT_STATUS(dt_row_cache_read(rc, pos, 2, 0, NULL, out, NULL), DT_ERR_BAD_DATA);
    ASSERT_MSG("row 5: x holds 3e+38 at element 1, which normalisation");
    dt_row_cache_destroy(rc);
    dt_dataset_close(ds);
}

/* A cache over several files: rows that cross file boundaries, the same
 * values and labels as dt_dataset_read. */
static void test_cache_three_files(void)
{
    make_part("c-a.h5", 0, 30, 0.5);
    make_part("c-b.h5", 30, 20, 0.5);
    make_part("c-c.h5", 50, 50, 0.5);
    char a[4096], b[4096], c[4096], spec[3 * 4096 + 4];
    tpath(a, sizeof a, "c-a.h5");
    tpath(b, sizeof b, "c-b.h5");
    tpath(c, sizeof c, "c-c.h5");
    snprintf(spec, sizeof spec, "%s\n%s\n%s", a, b, c);
    dt_dataset_t *ds = NULL;
    ASSERT_STATUS(dt_dataset_open(spec, &ds), DT_OK);
    CU_ASSERT_FATAL(ds != NULL);
    const int64_t start[2] = {25, 90}, count[2] = {40, 10}; /* 25..64 crosses two boundaries */
    dt_row_cache_t *rc = NULL;
    ASSERT_STATUS(dt_row_cache_create(ds, "train", start, count, 2, &rc), DT_OK);
    CU_ASSERT_FATAL(rc != NULL);
    CU_ASSERT_EQUAL(dt_row_cache_rows(rc), 50);
    CU_ASSERT_EQUAL(dt_row_cache_bytes_read(rc), 50 * 4 * sizeof(float));
    uint64_t pos[50], ids[50];
    for (int i = 0; i < 50; i++) {
        pos[i] = (uint64_t)(49 - i);
        ids[i] = dt_row_cache_row_id(rc, (int64_t)pos[i]);
    }
    CU_ASSERT_EQUAL(ids[0], 99);
    CU_ASSERT_EQUAL(ids[49], 25);
    float x1[50 * 4], x2[50 * 4];
    int32_t y1[50], y2[50];
    ASSERT_STATUS(dt_row_cache_read(rc, pos, 50, 0, NULL, x1, y1), DT_OK);
    ASSERT_STATUS(dt_dataset_read(ds, "train", ids, 50, x2, y2, NULL), DT_OK);
    CU_ASSERT(memcmp(x1, x2, sizeof x1) == 0);
    CU_ASSERT(memcmp(y1, y2, sizeof y1) == 0);
    uint64_t bad = 50;
    ASSERT_STATUS(dt_row_cache_read(rc, &bad, 1, 0, NULL, x1, y1), DT_ERR_INVALID_ARG);
    dt_row_cache_destroy(rc);
    const int64_t past[1] = {95}, n10[1] = {10};
    ASSERT_STATUS(dt_row_cache_create(ds, "train", past, n10, 1, &rc), DT_ERR_INVALID_ARG);
    dt_dataset_close(ds);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite idx = CU_add_suite("io_idx", suite_init, NULL);
    CU_ADD(idx, test_idx_roundtrip_raw);
    CU_ADD(idx, test_idx_roundtrip_gz);
    CU_ADD(idx, test_idx_norm_attrs);
    CU_ADD(idx, test_idx_bad_magic);
    CU_ADD(idx, test_idx_truncated_images);
    CU_ADD(idx, test_idx_truncated_labels);
    CU_ADD(idx, test_idx_gzip_checked);
    CU_ADD(idx, test_idx_count_mismatch);
    CU_ADD(idx, test_idx_label_out_of_range);
    CU_ADD(idx, test_idx_missing_file);
    CU_ADD(idx, test_idx_swapped);
    CU_ADD(idx, test_idx_existing_output);
    CU_ADD(idx, test_idx_progress);
    CU_ADD(idx, test_idx_find_in_dir);
    CU_ADD(idx, test_idx_not_regular);
    CU_ADD(idx, test_idx_declared_sizes);
    CU_ADD(idx, test_idx_file_size_limit);
    CU_ADD(idx, test_idx_output_is_dir);
    CU_pSuite imp = CU_add_suite("io_import", NULL, NULL);
    CU_ADD(imp, test_npy_values);
    CU_ADD(imp, test_csv_values);
    CU_ADD(imp, test_npy_channels);
    CU_pSuite dsu = CU_add_suite("io_dataset", NULL, NULL);
    CU_ADD(dsu, test_ds_missing_file);
    CU_ADD(dsu, test_ds_not_hdf5);
    CU_ADD(dsu, test_ds_not_dtrain);
    CU_ADD(dsu, test_ds_bad_version_and_norm);
    CU_ADD(dsu, test_ds_missing_split);
    CU_ADD(dsu, test_ds_label_out_of_range);
    CU_ADD(dsu, test_ds_count_mismatch);
    CU_ADD(dsu, test_ds_unsupported_dtype);
    CU_ADD(dsu, test_ds_missing_y);
    CU_ADD(dsu, test_ds_read_permuted_u8);
    CU_ADD(dsu, test_ds_read_f32);
    CU_ADD(dsu, test_ds_read_f16);
    CU_ADD(dsu, test_ds_print);
    CU_ADD(dsu, test_ds_several_files);
    CU_ADD(dsu, test_ds_several_files_refused);
    CU_ADD(dsu, test_ds_not_regular);
    CU_ADD(dsu, test_ds_declared_rows);
    CU_ADD(dsu, test_ds_nonfinite);
    CU_ADD(dsu, test_ds_norm_overflow);
    CU_ADD(dsu, test_ds_links);
    CU_ADD(dsu, test_ds_locked);
    CU_ADD(dsu, test_ds_empty_split);
    CU_ADD(dsu, test_ds_huge_chunks);
    CU_ADD(dsu, test_ds_class_names_printable);
    CU_ADD(dsu, test_ds_image_shapes);
    CU_ADD(dsu, test_ds_channel_norm_u8);
    CU_ADD(dsu, test_ds_channel_norm_f32);
    CU_ADD(dsu, test_ds_scalar_norm_unchanged);
    CU_ADD(dsu, test_ds_channel_norm_refused);
    CU_ADD(dsu, test_ds_crop_flip_by_hand);
    CU_ADD(dsu, test_lm_windows);
    CU_ADD(dsu, test_lm_refused);
    CU_ADD(dsu, test_lm_loader);
    CU_pSuite ldr = CU_add_suite("io_loader", NULL, NULL);
    CU_ADD(ldr, test_loader_augment_any_world);
    CU_ADD(ldr, test_loader_augment_draws);
    CU_ADD(ldr, test_loader_augment_refused);
    CU_ADD(ldr, test_loader_epoch_all_samples);
    CU_ADD(ldr, test_loader_drop_last);
    CU_ADD(ldr, test_loader_deterministic);
    CU_ADD(ldr, test_loader_two_ranks);
    CU_ADD(ldr, test_loader_accumulation_matches_ranks);
    CU_ADD(ldr, test_loader_prefetch_same_sequence);
    CU_ADD(ldr, test_loader_restart);
    CU_ADD(ldr, test_loader_bad_micro);
    CU_ADD(ldr, test_loader_held_slots_and_destroy);
    CU_ADD(ldr, test_loader_read_error);
    CU_ADD(ldr, test_loader_batch_beyond_split);
    CU_pSuite cch = CU_add_suite("io_cache", cache_suite_init, cache_suite_clean);
    CU_ADD(cch, test_cache_whole_split_same_batches);
    CU_ADD(cch, test_cache_shard);
    CU_ADD(cch, test_cache_refused);
    CU_ADD(cch, test_cache_three_files);
    CU_pSuite mdl = CU_add_suite("io_model", NULL, NULL);
    CU_ADD(mdl, test_model_round_trip);
    CU_ADD(mdl, test_model_save_file_size_limit);
    CU_ADD(mdl, test_model_save_disk_full);
    CU_ADD(mdl, test_model_bad_files);
    int rc = cu_run_all();
    if (rc == 0 && g_dir[0])
        rm_tree(g_dir); /* keep the files of a failed run for a look */
    return rc;
}
