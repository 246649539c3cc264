/*
 * fuzz_idx.c - fuzz target: importing IDX files (io/idx.h: dt_idx_import,
 * dt_idx_find_in_dir).
 *
 * The input writes up to four IDX files (train and test, images and
 * labels) into the scratch directory, then imports them. Each file is, as
 * the input chooses: a well-formed IDX file whose counts agree with its
 * partner's (byte 0), raw input bytes, either of those gzipped, a
 * well-formed header with hostile dimensions, a file cut short or with
 * bytes after its data, missing, or a directory. Further choices: class
 * names, files found by their standard names in a folder, an output that
 * already exists, with or without overwrite. A gzipped file may then be
 * damaged: bytes of it overwritten, the file cut, or bytes appended (which
 * the importer finds only by reading every file to its end). Besides "no crash, no leak",
 * the target checks what idx.h promises: a failure says why and leaves no
 * output and no temporary file behind; a success leaves a dataset that
 * dt_dataset_open accepts, with the imported number of samples.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fz_h5.h"
#include "fz_util.h"
#include "io/dataset.h"
#include "io/idx.h"

#define RAW_MAX 4096 /* bytes of one file taken from the input */
#define PATH_LEN 1024

enum {
    WITH_TEST = 1,
    WITH_CLASSES = 2,
    FIND_IN_DIR = 4,
    OVERWRITE = 8,
    OUT_EXISTS = 16,
    WITH_PROGRESS = 32
};

/* Standard names, as dt_idx_find_in_dir looks for them. */
static const char *const std_names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

struct shape {
    uint32_t n, rows, cols;
};

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* A well-formed IDX file of sh (images, or labels below 10), its data
 * from the input's bytes; dims_hostile replaces its dimensions; cut
 * shortens or lengthens it. malloc'd, length in *len. */
static uint8_t *idx_file(struct fz_in *in, int images, struct shape sh, int dims_hostile, int cut,
                         size_t *len)
{
    uint32_t dims[3] = {sh.n, sh.rows, sh.cols};
    int nd = images ? 3 : 1;
    const uint8_t *raw;
    size_t rawlen = fz_blob(in, RAW_MAX, &raw);
    if (dims_hostile)
        for (int d = 0; d < nd; d++)
            dims[d] = (uint32_t)fz_dim(in, dims[d]);
    size_t data = (size_t)sh.n * (images ? (size_t)sh.rows * sh.cols : 1);
    size_t hdr = 4 + 4 * (size_t)nd, total = hdr + data;
    if (cut) total = fz_pick(in, 2) ? total + fz_u8(in) : (fz_u16(in) % (total + 1));
    uint8_t *b = calloc(total + hdr, 1);
    FZ_REQUIRE(b, "out of memory");
    put_be32(b, images ? 0x00000803u : 0x00000801u);
    for (int d = 0; d < nd; d++)
        put_be32(b + 4 + 4 * d, dims[d]);
    for (size_t i = hdr; i < total; i++) {
        size_t k = i - hdr;
        uint8_t v = rawlen ? raw[k % rawlen] : (uint8_t)(k * 31);
        b[i] = images ? v : (uint8_t)((rawlen ? v : k * 3) % 10);
    }
    *len = total;
    return b;
}

/* Damages the file at path as the input chooses: up to 4 bytes
 * overwritten at an offset, cut at an offset, or a blob appended. */
static void damage(struct fz_in *in, const char *path)
{
    FILE *f = fopen(path, "r+b");
    FZ_REQUIRE(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f), at = size ? (long)(fz_u32(in) % (uint32_t)size) : 0;
    const uint8_t *raw;
    switch (fz_pick(in, 3)) {
    case 0:
        fseek(f, at, SEEK_SET);
        for (int k = fz_pick(in, 4); k >= 0 && at + k < size; k--)
            fputc(fz_u8(in) | 1, f);
        break;
    case 1:
        FZ_REQUIRE(ftruncate(fileno(f), at) == 0, "cannot cut %s", path);
        break;
    default: {
        size_t n = fz_blob(in, 64, &raw);
        if (n) FZ_REQUIRE(fwrite(raw, 1, n, f) == n, "cannot append to %s", path);
    }
    }
    fclose(f);
}

/* Writes file `which` (0..3) to path, as the input chooses (gzipped or
 * not, whatever its name says), maybe damaged. Returns 1 when it is
 * well-formed. */
static int make_file(struct fz_in *in, const char *path, int which, struct shape sh)
{
    int images = which % 2 == 0;
    const uint8_t *raw;
    size_t len = 0, rawlen;
    uint8_t *b = NULL;
    int good = 0;
    switch (fz_u8(in) % 10) {
    case 1: /* raw bytes */
    case 3: /* raw bytes, gzipped */
        rawlen = fz_blob(in, RAW_MAX, &raw);
        b = malloc(rawlen + 1);
        FZ_REQUIRE(b, "out of memory");
        memcpy(b, raw, rawlen);
        len = rawlen;
        break;
    case 4:
        b = idx_file(in, images, sh, 1, 0, &len);
        break;
    case 5:
        b = idx_file(in, images, sh, 0, 1, &len);
        break;
    case 6:
        return 0; /* missing */
    case 7:
        mkdir(path, 0700);
        return 0;
    default:
        b = idx_file(in, images, sh, 0, 0, &len);
        good = 1;
    }
    if (fz_pick(in, 2)) {
        fz_write_gz(path, b, len);
        if (fz_pick(in, 4) == 3) {
            damage(in, path);
            good = 0;
        }
    } else {
        fz_write_file(path, b, len);
    }
    free(b);
    return good;
}

/* No "<out>.tmp.<host>.<pid>" may outlive an import. */
static void check_no_temp(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    FZ_REQUIRE(d, "cannot list %s", dir);
    while ((de = readdir(d)) != NULL)
        FZ_REQUIRE(!strstr(de->d_name, ".tmp."), "an import left %s behind", de->d_name);
    closedir(d);
}

/* n_train: the samples the train files declare, 0 when unknown. */
static void check_output(const char *out, uint32_t n_train)
{
    dt_dataset_t *ds = NULL;
    const struct dt_split_info *s;
    dt_status st = dt_dataset_open(out, &ds);
    FZ_REQUIRE(st == DT_OK, "an imported dataset does not open: %s", dt_last_error());
    st = dt_dataset_split(ds, "train", &s);
    FZ_REQUIRE(st == DT_OK, "an imported dataset has no train split: %s", dt_last_error());
    FZ_REQUIRE(!n_train || s->n == n_train, "imported %lld train samples, the header says %u",
               (long long)s->n, n_train);
    dt_dataset_close(ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_in in = {data, size};
    char dir[PATH_LEN], files[4][PATH_LEN + 64], out[PATH_LEN], found[4][4096], classes[512];
    struct dt_idx_import_opts o = {0};
    fz_quiet();
    fz_h5_quiet();
    unsigned flags = fz_u8(&in);
    fz_scratch_path(dir, sizeof dir, "idx");
    fz_scratch_path(out, sizeof out, "out.h5");
    FZ_REQUIRE(mkdir(dir, 0700) == 0, "cannot make %s", dir);

    struct shape sh[2];
    for (int s = 0; s < 2; s++) {
        unsigned n = fz_u8(&in), r = fz_u8(&in), c = fz_u8(&in);
        sh[s] = (struct shape){n ? n : 6, r ? r % 32 : 4, c ? c % 32 : 4};
    }
    int nfiles = flags & WITH_TEST ? 4 : 2, good = 0;
    for (int i = 0; i < nfiles; i++) {
        int gz = fz_pick(&in, 2);
        snprintf(files[i], sizeof files[i], "%s/%s%s", dir, std_names[i], gz ? ".gz" : "");
        good += make_file(&in, files[i], i, sh[i / 2]) && i < 2;
    }
    if (flags & WITH_CLASSES) {
        fz_str(&in, classes, sizeof classes);
        o.class_names = classes;
    }
    if (flags & OUT_EXISTS) fz_write_file(out, "old", 3);
    o.overwrite = (flags & OVERWRITE) != 0;
    o.out_path = out;

    dt_status st = DT_OK;
    if (flags & FIND_IN_DIR) {
        st = dt_idx_find_in_dir(dir, &o, found);
    } else {
        o.train_images = files[0];
        o.train_labels = files[1];
        o.test_images = nfiles == 4 ? files[2] : NULL;
        o.test_labels = nfiles == 4 ? files[3] : NULL;
    }
    char *progress_text = NULL;
    size_t progress_len = 0;
    FILE *progress = flags & WITH_PROGRESS ? open_memstream(&progress_text, &progress_len) : NULL;
    if (st == DT_OK) st = dt_idx_import(&o, progress);
    fz_note("dt_idx_import", st);
    /* The builder's own check: the well-formed files import. */
    FZ_REQUIRE(size || st == DT_OK, "the empty input's files do not import: %s", dt_last_error());
    if (progress) fclose(progress);
    free(progress_text);

    struct stat sb;
    check_no_temp(fz_scratch());
    if (st == DT_OK) {
        check_output(out, good == 2 ? sh[0].n : 0);
    } else {
        fz_check_error(st, "dt_idx_import");
        if (!(flags & OUT_EXISTS))
            FZ_REQUIRE(stat(out, &sb) != 0, "a failed import left its output behind");
    }
    FZ_REQUIRE(fz_h5_open_objects() == 0, "dtrain left %ld HDF5 objects open",
               fz_h5_open_objects());
    fz_scratch_clear();
    return 0;
}
