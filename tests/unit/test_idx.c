/*
 * test_idx.c - CUnit suite for the IDX importer (io/idx.c): raw and gzipped
 * round trips with their normalisation attributes, and its bad inputs (bad
 * magic, truncated and mismatched files, declared sizes past the file,
 * damaged, cut and extended gzip files, FIFOs and directories, a file-size
 * limit, an output that exists or is a directory).
 *
 * Every file a test needs is made here or by io_common.c, in the
 * suite's private directory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hdf5.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "io_common.h"
#include "io/dataset.h"
#include "io/idx.h"
#include "core/status.h"

/* ---- IDX import ------------------------------------------------------------ */

#define TR_N 50

#define TE_N 20

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

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("io_idx", io_suite_init, NULL);
    CU_ADD(s, test_idx_roundtrip_raw);
    CU_ADD(s, test_idx_roundtrip_gz);
    CU_ADD(s, test_idx_norm_attrs);
    CU_ADD(s, test_idx_bad_magic);
    CU_ADD(s, test_idx_truncated_images);
    CU_ADD(s, test_idx_truncated_labels);
    CU_ADD(s, test_idx_gzip_checked);
    CU_ADD(s, test_idx_count_mismatch);
    CU_ADD(s, test_idx_label_out_of_range);
    CU_ADD(s, test_idx_missing_file);
    CU_ADD(s, test_idx_swapped);
    CU_ADD(s, test_idx_existing_output);
    CU_ADD(s, test_idx_progress);
    CU_ADD(s, test_idx_find_in_dir);
    CU_ADD(s, test_idx_not_regular);
    CU_ADD(s, test_idx_declared_sizes);
    CU_ADD(s, test_idx_file_size_limit);
    CU_ADD(s, test_idx_output_is_dir);
    return io_run_all();
}
