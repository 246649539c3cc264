/*
 * fuzz_dataset.c - fuzz target: opening and reading dtrain datasets
 * (io/dataset.h: dt_dataset_open, dt_dataset_split, dt_dataset_read,
 * dt_dataset_print).
 *
 * Structure-aware: the input drives fz_h5's builder, which writes a valid
 * HDF5 file shaped like a dtrain dataset (root attributes, splits with x
 * and y) with hostile content: attributes of other types, sizes and
 * values, splits that are links or datasets or missing pieces, x and y of
 * other dtypes and dimensions (huge ones declared and never written
 * included), layouts, partial writes and labels out of range. The rest of
 * the input picks rows to read. Besides "no crash, no leak", the target
 * checks what dataset.h promises: a failure says why; an opened dataset's
 * info is consistent (shapes, per-class counts, labels in range); a read of
 * rows out of range fails; and every HDF5 object dtrain opened is closed.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "fz_h5.h"
#include "fz_util.h"
#include "io/dataset.h"
#include "io/hdf5_lock.h"

#define MAX_SPLITS 5
#define MAX_ROWS 64
#define READ_CAP ((int64_t)1 << 20) /* floats the target reads at once, at most */
#define SAMPLE_ROWS 4
#define SAMPLE_COLS 3

static const char *const split_names[MAX_SPLITS] = {"train", "test", "val", "extra", "more"};

static void root_attrs(struct fz_in *in, hid_t f, int k)
{
    static const char *const fmt[] = {"dataset"}, *const task[] = {"classification"};
    static const char *const names[] = {"zero", "one",   "two",   "three", "four", "five",
                                        "six",  "seven", "eight", "nine",  "ten",  "eleven"};
    struct fz_attr a[] = {
        {.name = "dtrain_format", .kind = FZ_ATTR_STR, .vlen = 1, .strs = fmt},
        {.name = "format_version", .kind = FZ_ATTR_INT, .type = H5T_STD_I32LE, .i = 1},
        {.name = "task", .kind = FZ_ATTR_STR, .vlen = 1, .strs = task},
        {.name = "num_classes", .kind = FZ_ATTR_INT, .type = H5T_STD_I32LE, .i = k},
        {.name = "class_names", .kind = FZ_ATTR_STR, .vlen = 1, .strs = names, .nstrs = k},
        {.name = "norm_scale", .kind = FZ_ATTR_FLOAT, .type = H5T_IEEE_F32LE, .f = 1.0 / 255},
        {.name = "norm_mean", .kind = FZ_ATTR_FLOAT, .type = H5T_IEEE_F32LE, .f = 0.5},
        {.name = "norm_std", .kind = FZ_ATTR_FLOAT, .type = H5T_IEEE_F32LE, .f = 0.25},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        fz_h5_attr(in, f, &a[i]);
    fz_h5_junk_attrs(in, f);
}

/* /<name>/x and /<name>/y for n samples of SAMPLE_ROWS x SAMPLE_COLS. */
static void split_data(struct fz_in *in, hid_t g, int k)
{
    unsigned ncode = fz_u8(in), xt = fz_pick(in, 3);
    uint64_t n = ncode ? ncode % 40 : 8, elems = n * SAMPLE_ROWS * SAMPLE_COLS;
    float *xv = calloc(elems ? elems : 1, sizeof *xv);
    int64_t *yv = calloc(n ? n : 1, sizeof *yv);
    FZ_REQUIRE(xv && yv, "out of memory");
    for (uint64_t i = 0; i < elems; i++)
        xv[i] = (float)(i * 7 % 256);
    for (uint64_t i = 0; i < n; i++)
        yv[i] = (int64_t)(i % (uint64_t)k);
    hid_t f16 = fz_h5_f16();
    hid_t xtype = xt == 0 ? H5T_STD_U8LE : xt == 1 ? H5T_IEEE_F32LE : f16;
    struct fz_dset x = {.name = "x",
                        .type = xtype,
                        .ndims = 3,
                        .dims = {n, SAMPLE_ROWS, SAMPLE_COLS},
                        .mem_type = H5T_NATIVE_FLOAT,
                        .values = xv,
                        .chunked = 1};
    struct fz_dset y = {.name = "y",
                        .type = H5T_STD_U8LE,
                        .ndims = 1,
                        .dims = {n},
                        .mem_type = H5T_NATIVE_INT64,
                        .values = yv};
    fz_h5_dataset(in, g, &x, NULL);
    fz_h5_dataset(in, g, &y, NULL);
    fz_h5_junk_attrs(in, g);
    H5Tclose(f16);
    free(yv);
    free(xv);
}

/* One split: a group with x and y, or something else under its name. */
static void split(struct fz_in *in, hid_t f, int i, int k)
{
    char name[128];
    snprintf(name, sizeof name, "%s", split_names[i]);
    hid_t g = -1;
    switch (fz_u8(in) % 10) {
    case 1: { /* a dataset where a group belongs */
        struct fz_dset d = {.name = name,
                            .type = H5T_STD_U8LE,
                            .ndims = 1,
                            .dims = {4},
                            .mem_type = H5T_NATIVE_UCHAR};
        fz_h5_dataset(in, f, &d, NULL);
        return;
    }
    case 2:
        H5Lcreate_soft("/nowhere", f, name, H5P_DEFAULT, H5P_DEFAULT);
        return;
    case 3:
        H5Lcreate_hard(f, split_names[0], f, name, H5P_DEFAULT, H5P_DEFAULT);
        return;
    case 4:
        H5Lcreate_external("missing.h5", "/train", f, name, H5P_DEFAULT, H5P_DEFAULT);
        return;
    case 5:
        g = H5Gcreate2(f, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        break; /* empty */
    case 6:    /* a name from the input */
        fz_str(in, name, sizeof name);
        if (!name[0]) snprintf(name, sizeof name, "%s", split_names[i]);
        /* fall through */
    default:
        g = H5Gcreate2(f, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g >= 0) split_data(in, g, k);
    }
    dt_h5_close(g);
}

static void build(struct fz_in *in, const char *path)
{
    unsigned kcode = fz_u8(in), scode = fz_u8(in);
    int k = kcode ? 1 + (int)(kcode % 12) : 3;
    int nsplits = scode ? (int)(scode % (MAX_SPLITS + 1)) : 2;
    hid_t f = fz_h5_create(in, path);
    root_attrs(in, f, k);
    for (int i = 0; i < nsplits; i++)
        split(in, f, i, k);
    fz_h5_close(f);
}

/* Shapes, counts and classes agree with each other. */
static void check_info(const struct dt_dataset_info *info)
{
    FZ_REQUIRE(info->nsplits >= 1 && info->nsplits <= DT_DATASET_MAX_SPLITS, "%d splits",
               info->nsplits);
    FZ_REQUIRE(info->num_classes >= 1 && info->num_classes <= DT_DATASET_MAX_CLASSES, "%d classes",
               info->num_classes);
    for (int i = 0; i < info->nsplits; i++) {
        const struct dt_split_info *s = &info->splits[i];
        int64_t elems = 1, counted = 0;
        FZ_REQUIRE(s->ndim >= 1 && s->ndim <= DT_DATASET_MAX_DIMS, "split %s: ndim %d", s->name,
                   s->ndim);
        for (int d = 0; d < s->ndim; d++) {
            FZ_REQUIRE(s->shape[d] >= 1, "split %s: dimension %d is %lld", s->name, d,
                       (long long)s->shape[d]);
            FZ_REQUIRE(!__builtin_mul_overflow(elems, s->shape[d], &elems),
                       "split %s: the sample shape overflows", s->name);
        }
        FZ_REQUIRE(elems == s->sample_elems, "split %s: sample_elems %lld, shape gives %lld",
                   s->name, (long long)s->sample_elems, (long long)elems);
        FZ_REQUIRE(s->n >= 0, "split %s: %lld samples", s->name, (long long)s->n);
        for (int c = 0; c < info->num_classes; c++)
            counted += s->class_counts[c];
        FZ_REQUIRE(counted == s->n, "split %s: class counts add up to %lld of %lld", s->name,
                   (long long)counted, (long long)s->n);
    }
}

/* Reads a few rows (some maybe out of range) and checks what comes back. */
static void read_rows(struct fz_in *in, dt_dataset_t *ds, const struct dt_split_info *s, int k)
{
    uint64_t idx[MAX_ROWS];
    size_t n = 1 + fz_u8(in) % MAX_ROWS;
    int out_of_range = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = fz_u64(in);
        idx[i] = s->n > 0 ? r % ((uint64_t)s->n + 1) : r % 2;
        out_of_range |= idx[i] >= (uint64_t)s->n;
    }
    if (s->sample_elems > READ_CAP / (int64_t)n)
        return; /* more than the target allocates; dt_dataset_read is not at fault */
    float *x = malloc(n * (size_t)s->sample_elems * sizeof *x);
    int32_t *y = malloc(n * sizeof *y);
    uint64_t bytes = 0;
    int want_y = !fz_pick(in, 2);
    FZ_REQUIRE(x && y, "out of memory");
    dt_status st = dt_dataset_read(ds, s->name, idx, n, x, want_y ? y : NULL, &bytes);
    if (out_of_range)
        FZ_REQUIRE(st != DT_OK, "rows out of range of split %s (%lld rows) were read", s->name,
                   (long long)s->n);
    if (st != DT_OK) {
        fz_check_error(st, "dt_dataset_read");
    } else {
        for (size_t i = 0; want_y && i < n; i++)
            FZ_REQUIRE(y[i] >= 0 && y[i] < k, "label %d of %d classes", y[i], k);
    }
    free(y);
    free(x);
}

static void use(struct fz_in *in, dt_dataset_t *ds)
{
    const struct dt_dataset_info *info = dt_dataset_get_info(ds);
    const struct dt_split_info *s;
    check_info(info);
    for (int i = 0; i < info->nsplits; i++) {
        dt_status st = dt_dataset_split(ds, info->splits[i].name, &s);
        FZ_REQUIRE(st == DT_OK && s == &info->splits[i], "split %s not found",
                   info->splits[i].name);
        if (i < 2) read_rows(in, ds, s, info->num_classes);
    }
    dt_status st = dt_dataset_split(ds, "no such split", &s);
    FZ_REQUIRE(st != DT_OK && !s, "a missing split was found");
    fz_check_error(st, "dt_dataset_split");

    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    FZ_REQUIRE(out, "open_memstream");
    dt_dataset_print(ds, out);
    fclose(out);
    FZ_REQUIRE(len > 0, "dt_dataset_print printed nothing");
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_in in = {data, size};
    char path[1024];
    dt_dataset_t *ds = NULL;
    fz_quiet();
    fz_h5_quiet();
    fz_scratch_path(path, sizeof path, "dataset.h5");
    build(&in, path);

    dt_status st = dt_dataset_open(path, &ds);
    fz_note("dt_dataset_open", st);
    /* The builder's own check: the well-formed dataset opens. */
    FZ_REQUIRE(size || st == DT_OK, "the empty input's dataset does not open: %s", dt_last_error());
    if (st == DT_OK) {
        use(&in, ds);
        dt_dataset_close(ds);
    } else {
        fz_check_error(st, "dt_dataset_open");
        FZ_REQUIRE(!ds, "a failed open returned a handle");
    }
    FZ_REQUIRE(fz_h5_open_objects() == 0, "dtrain left %ld HDF5 objects open",
               fz_h5_open_objects());
    fz_scratch_clear();
    return 0;
}
