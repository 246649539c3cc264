/*
 * test_ckpt.c - checkpoint files on one rank: the checksum, a save /
 * verify / load round trip, damaged files (truncated at many lengths, a
 * byte flipped inside a tensor's data, not a checkpoint at all), the
 * checkpoint directory (listing, latest, retention) and failing saves
 * (a file-size limit, a disk that fills up mid-write, a missing directory,
 * bad arguments) that must leave the earlier checkpoint and latest exactly
 * as they were.
 *
 * The save is collective, so the suite runs as a one-rank MPI job
 * (singleton MPI_Init) with an "mpi" communicator. Damage is real: files
 * are truncated with truncate(2) and bytes overwritten with pwrite(2) at
 * the offset HDF5 reports for a contiguous dataset.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "collectives/comm.h"
#include "io/checkpoint.h"
#include "io/hdf5_lock.h"
#include "io/model_file.h"
#include "cu_util.h"

/* Open MPI's start-up leaks need the slow unwinder for tests/lsan.supp to
 * match them (see test_comm.c); dtrain's own allocations stay checked. */
#if defined(__SANITIZE_ADDRESS__)
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "fast_unwind_on_malloc=0";
}
#endif

#define ROWS 37
#define COLS 53
#define NT 3

static dt_comm_t *comm;

/* ---- helpers --------------------------------------------------------------- */

/* A fresh, empty directory under the test tmp dir (the same name on
 * every run, so runs do not pile up). */
static void fresh_dir(const char *what, char *dir, size_t len)
{
    snprintf(dir, len, "%s/ckpt_%s", cu_tmpdir(), what);
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        char p[4400];
        while ((de = readdir(d)) != NULL)
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
                unlink(p);
            }
        closedir(d);
    } else {
        CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0777), 0);
    }
}

static int exists(const char *dir, const char *name)
{
    char p[4400];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

/* Whole file into a malloc'd buffer; *len its size. NULL if unreadable. */
static char *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    *len = buf && fread(buf, 1, (size_t)n, fp) == (size_t)n ? (size_t)n : 0;
    fclose(fp);
    return buf;
}

static void copy_file(const char *from, const char *to)
{
    size_t n = 0;
    char *buf = slurp(from, &n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    FILE *fp = fopen(to, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(fp);
    CU_ASSERT_EQUAL(fwrite(buf, 1, n, fp), n);
    fclose(fp);
    free(buf);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *fp = fopen(p, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(fp);
    fputs(text, fp);
    fclose(fp);
}

/* Deterministic values with varied bit patterns (signs, exponents). */
static void fill(float *x, size_t n, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (float)(1 + (i % 7));
    }
}

/* The three tensors every test saves (name order differs from this). */
struct set {
    float w[ROWS * COLS], b[COLS], m[ROWS * COLS];
    struct dt_ckpt_tensor t[NT];
};

static void make_set(struct set *s, uint32_t seed)
{
    fill(s->w, ROWS * COLS, seed);
    fill(s->b, COLS, seed + 1);
    fill(s->m, ROWS * COLS, seed + 2);
    s->t[0] = (struct dt_ckpt_tensor){"params/fc1.weight", {2, {ROWS, COLS}}, s->w, NULL, 0};
    s->t[1] = (struct dt_ckpt_tensor){"params/fc1.bias", {1, {COLS}}, s->b, NULL, 0};
    s->t[2] = (struct dt_ckpt_tensor){"optim/m/fc1.weight", {2, {ROWS, COLS}}, s->m, NULL, 0};
}

/* Zeroed buffers of the same names and shapes, for loading into. */
static void empty_like(struct set *dst, const struct set *src)
{
    memset(dst, 0, sizeof *dst);
    for (int i = 0; i < NT; i++)
        dst->t[i] = src->t[i];
    dst->t[0].data = dst->w;
    dst->t[1].data = dst->b;
    dst->t[2].data = dst->m;
}

static struct dt_ckpt_meta make_meta(int64_t step)
{
    struct dt_ckpt_meta m = {.step = step,
                             .epoch = 3,
                             .batch = 17,
                             .samples = step * 64,
                             .seed = UINT64_C(0xfedcba9876543210),
                             .world = 1,
                             .loss_scale = 32768.0,
                             .optim_t = step + 5,
                             .bad_steps = 2,
                             .rollbacks = 1,
                             .created = 1700000000.25};
    snprintf(m.version, sizeof m.version, "9.8.7");
    snprintf(m.optimizer, sizeof m.optimizer, "adamw");
    return m;
}

static dt_status save_step(const char *dir, int64_t step, const struct set *s, char *path,
                           size_t len)
{
    struct dt_ckpt_meta m = make_meta(step);
    return dt_ckpt_save(comm, dir, &m, s->t, NT, "model: mlp\n", path, len);
}

/* ---- checksum --------------------------------------------------------------- */

static void test_checksum(void)
{
    enum { N = 1000 };
    static float x[N], y[N];
    fill(x, N, 7);
    memcpy(y, x, sizeof x);
    uint64_t h = dt_ckpt_checksum(x, N);
    CU_ASSERT_EQUAL(dt_ckpt_checksum(y, N), h);
    CU_ASSERT_NOT_EQUAL(dt_ckpt_checksum(x, N - 1), h);
    CU_ASSERT_NOT_EQUAL(dt_ckpt_checksum(x, 0), h);
    /* one value changed by one ulp */
    uint32_t bits;
    memcpy(&bits, &y[500], 4);
    bits ^= 1;
    memcpy(&y[500], &bits, 4);
    CU_ASSERT_NOT_EQUAL(dt_ckpt_checksum(y, N), h);
    /* two values swapped */
    memcpy(y, x, sizeof x);
    y[10] = x[900];
    y[900] = x[10];
    CU_ASSERT_NOT_EQUAL(dt_ckpt_checksum(y, N), h);
    /* neighbours swapped */
    memcpy(y, x, sizeof x);
    y[0] = x[1];
    y[1] = x[0];
    CU_ASSERT_NOT_EQUAL(dt_ckpt_checksum(y, N), h);
    /* +0 and -0 are different bits */
    float pz = 0.0f, nz = -0.0f;
    CU_ASSERT_NOT_EQUAL(dt_ckpt_checksum(&pz, 1), dt_ckpt_checksum(&nz, 1));
    /* all zeros of different lengths */
    static float z[N];
    CU_ASSERT_NOT_EQUAL(dt_ckpt_checksum(z, N), dt_ckpt_checksum(z, N - 1));
}

/* ---- round trip --------------------------------------------------------------- */

static void check_info(const struct dt_ckpt_info *info, const struct set *s, const char *yaml)
{
    struct dt_ckpt_meta want = make_meta(42);
    CU_ASSERT_EQUAL(info->meta.step, 42);
    CU_ASSERT_EQUAL(info->meta.epoch, want.epoch);
    CU_ASSERT_EQUAL(info->meta.batch, want.batch);
    CU_ASSERT_EQUAL(info->meta.samples, want.samples);
    CU_ASSERT_EQUAL(info->meta.seed, want.seed);
    CU_ASSERT_EQUAL(info->meta.world, want.world);
    CU_ASSERT_EQUAL(info->meta.loss_scale, want.loss_scale);
    CU_ASSERT_EQUAL(info->meta.optim_t, want.optim_t);
    CU_ASSERT_EQUAL(info->meta.bad_steps, want.bad_steps);
    CU_ASSERT_EQUAL(info->meta.rollbacks, want.rollbacks);
    CU_ASSERT_EQUAL(info->meta.created, want.created);
    CU_ASSERT_STRING_EQUAL(info->meta.version, "9.8.7");
    CU_ASSERT_STRING_EQUAL(info->meta.optimizer, "adamw");
    CU_ASSERT_EQUAL_FATAL(info->ntensors, NT);
    /* name order */
    CU_ASSERT_STRING_EQUAL(info->names[0], "optim/m/fc1.weight");
    CU_ASSERT_STRING_EQUAL(info->names[1], "params/fc1.bias");
    CU_ASSERT_STRING_EQUAL(info->names[2], "params/fc1.weight");
    CU_ASSERT_EQUAL(info->numel[0], ROWS * COLS);
    CU_ASSERT_EQUAL(info->numel[1], COLS);
    CU_ASSERT_EQUAL(info->shape[1].ndim, 1);
    CU_ASSERT_EQUAL(info->shape[2].ndim, 2);
    CU_ASSERT_EQUAL(info->shape[2].dim[0], ROWS);
    CU_ASSERT_EQUAL(info->shape[2].dim[1], COLS);
    CU_ASSERT_EQUAL(info->format_version, DT_CKPT_FORMAT_VERSION);
    CU_ASSERT(info->file_bytes > (int64_t)sizeof s->w * 2);
    CU_ASSERT_PTR_NOT_NULL_FATAL(info->job_yaml);
    CU_ASSERT_STRING_EQUAL(info->job_yaml, yaml);
}

static void test_round_trip(void)
{
    char dir[4096], path[4400], latest[256];
    static struct set s, back;
    struct dt_ckpt_info *info = calloc(1, sizeof *info);
    struct dt_ckpt_meta m = make_meta(42), got;
    mode_t old = umask(022);
    fresh_dir("rt", dir, sizeof dir);
    make_set(&s, 1);
    dt_status st = dt_ckpt_save(comm, dir, &m, s.t, NT, "model: mlp\nlr: 0.1\n", path, sizeof path);
    umask(old);
    CU_ASSERT_EQUAL_FATAL(st, DT_OK);
    char want[4400];
    snprintf(want, sizeof want, "%s/ckpt-0000000042.h5", dir);
    CU_ASSERT_STRING_EQUAL(path, want);
    struct stat sb;
    CU_ASSERT_EQUAL_FATAL(stat(path, &sb), 0);
    CU_ASSERT_EQUAL(sb.st_mode & 0022, 0); /* umask honoured, never world-writable */
    CU_ASSERT_FALSE(exists(dir, ".ckpt-0000000042.h5.tmp"));
    CU_ASSERT_FALSE(exists(dir, ".latest.tmp"));
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, latest, sizeof latest), DT_OK);
    CU_ASSERT_STRING_EQUAL(latest, "ckpt-0000000042.h5");

    CU_ASSERT_EQUAL_FATAL(dt_ckpt_verify(path, info), DT_OK);
    check_info(info, &s, "model: mlp\nlr: 0.1\n");
    dt_ckpt_info_free(info);
    CU_ASSERT_PTR_NULL(info->job_yaml);
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_OK);

    empty_like(&back, &s);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_load(path, &got, back.t, NT), DT_OK);
    CU_ASSERT_EQUAL(memcmp(back.w, s.w, sizeof s.w), 0);
    CU_ASSERT_EQUAL(memcmp(back.b, s.b, sizeof s.b), 0);
    CU_ASSERT_EQUAL(memcmp(back.m, s.m, sizeof s.m), 0);
    CU_ASSERT_EQUAL(got.step, 42);
    CU_ASSERT_EQUAL(got.seed, m.seed);
    CU_ASSERT_STRING_EQUAL(got.optimizer, "adamw");
    /* a subset loads too, in any order */
    empty_like(&back, &s);
    CU_ASSERT_EQUAL(dt_ckpt_load(path, NULL, &back.t[1], 1), DT_OK);
    CU_ASSERT_EQUAL(memcmp(back.b, s.b, sizeof s.b), 0);
    free(info);
}

/* Created time and version are filled in when left empty; a big job YAML
 * (beyond HDF5's 64 KiB compact attribute limit) survives. */
static void test_defaults_and_big_yaml(void)
{
    char dir[4096], path[4400];
    static struct set s;
    struct dt_ckpt_info *info = calloc(1, sizeof *info);
    struct dt_ckpt_meta m = make_meta(3);
    size_t ylen = 200000;
    char *yaml = malloc(ylen + 1);
    for (size_t i = 0; i < ylen; i++)
        yaml[i] = i % 61 == 60 ? '\n' : (char)('a' + i % 26);
    yaml[ylen] = '\0';
    m.created = 0;
    m.version[0] = '\0';
    fresh_dir("big", dir, sizeof dir);
    make_set(&s, 2);
    double now = (double)time(NULL);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_save(comm, dir, &m, s.t, NT, yaml, path, sizeof path), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_verify(path, info), DT_OK);
    CU_ASSERT(info->meta.created >= now - 5 && info->meta.created <= now + 5);
    CU_ASSERT_STRING_EQUAL(info->meta.version, DT_VERSION);
    CU_ASSERT_EQUAL(strcmp(info->job_yaml, yaml), 0);
    dt_ckpt_info_free(info);
    free(info);
    free(yaml);
}

/* Empty and one-element tensors, and a checkpoint with no tensors. */
static void test_tiny_tensors(void)
{
    char dir[4096], path[4400];
    float one = 3.5f, back = 0;
    struct dt_ckpt_tensor t[2] = {{"empty", {1, {0}}, NULL, NULL, 0}, {"a/b/c/one", {2, {1, 1}}, &one, NULL, 0}};
    struct dt_ckpt_meta m = make_meta(8);
    fresh_dir("tiny", dir, sizeof dir);
    dt_status st = dt_ckpt_save(comm, dir, &m, t, 2, NULL, path, sizeof path);
    if (st != DT_OK) fprintf(stderr, "tiny tensors: %s\n", dt_last_error());
    CU_ASSERT_EQUAL_FATAL(st, DT_OK);
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_OK);
    t[1].data = &back;
    CU_ASSERT_EQUAL(dt_ckpt_load(path, NULL, t, 2), DT_OK);
    CU_ASSERT_EQUAL(back, 3.5f);
    m.step = 9;
    CU_ASSERT_EQUAL(dt_ckpt_save(comm, dir, &m, NULL, 0, "", path, sizeof path), DT_OK);
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_OK);
}

/* ---- loading errors ----------------------------------------------------------- */

static void test_load_errors(void)
{
    char dir[4096], path[4400], p[4400];
    static struct set s, back;
    fresh_dir("lerr", dir, sizeof dir);
    make_set(&s, 3);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 42, &s, path, sizeof path), DT_OK);
    empty_like(&back, &s);
    snprintf(back.t[1].name, DT_CKPT_NAME, "params/fc2.bias");
    CU_ASSERT_EQUAL(dt_ckpt_load(path, NULL, back.t, NT), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "params/fc2.bias"));
    empty_like(&back, &s);
    back.t[0].shape.dim[0] = COLS;
    back.t[0].shape.dim[1] = ROWS;
    CU_ASSERT_EQUAL(dt_ckpt_load(path, NULL, back.t, NT), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "params/fc1.weight has shape 37x53"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "the model expects 53x37"));
    empty_like(&back, &s);
    back.t[1].shape.ndim = 2;
    back.t[1].shape.dim[1] = 1;
    CU_ASSERT_EQUAL(dt_ckpt_load(path, NULL, back.t, NT), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "the model expects 53x1"));
    snprintf(p, sizeof p, "%s/ckpt-0000000099.h5", dir);
    CU_ASSERT_EQUAL(dt_ckpt_load(p, NULL, back.t, NT), DT_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(dt_ckpt_verify(p, NULL), DT_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), p));
    /* a directory or a FIFO is no input file: 66, never a hang */
    CU_ASSERT_EQUAL(dt_ckpt_verify(dir, NULL), DT_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "not a regular file"));
    snprintf(p, sizeof p, "%s/fifo.h5", dir);
    CU_ASSERT_EQUAL_FATAL(mkfifo(p, 0600), 0);
    alarm(60); /* a blocking open would hang here: fail loudly instead */
    CU_ASSERT_EQUAL(dt_ckpt_verify(p, NULL), DT_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "(it is a FIFO)"));
    CU_ASSERT_EQUAL(dt_ckpt_load(p, NULL, back.t, NT), DT_ERR_NOT_FOUND);
    alarm(0);
}

static void test_not_a_checkpoint(void)
{
    char dir[4096], p[4400];
    float w[6] = {1, 2, 3, 4, 5, 6};
    struct dt_named_tensor t = {"w", {2, {2, 3}}, w};
    fresh_dir("notck", dir, sizeof dir);
    write_text(dir, "ckpt-0000000001.h5", "this is not HDF5\n");
    snprintf(p, sizeof p, "%s/ckpt-0000000001.h5", dir);
    CU_ASSERT_EQUAL(dt_ckpt_verify(p, NULL), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "HDF5"));
    /* an HDF5 file of another kind (a dtrain model) */
    snprintf(p, sizeof p, "%s/model.h5", dir);
    CU_ASSERT_EQUAL_FATAL(dt_model_file_save(p, &t, 1), DT_OK);
    CU_ASSERT_EQUAL(dt_ckpt_verify(p, NULL), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "not a dtrain checkpoint"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "model file"));
    /* an HDF5 file with nothing of dtrain in it */
    snprintf(p, sizeof p, "%s/plain.h5", dir);
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    H5Fclose(f);
    CU_ASSERT_EQUAL(dt_ckpt_verify(p, NULL), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "not a dtrain checkpoint"));
}

/* A checkpoint that lost its dtrain_format, or whose dtrain_format says
 * something else, is a damaged checkpoint: its other attributes and its
 * tensors say what it was. */
static void test_damaged_not_foreign(void)
{
    char dir[4096], path[4400], p[4400];
    static struct set s;
    fresh_dir("dmg", dir, sizeof dir);
    make_set(&s, 13);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 42, &s, path, sizeof path), DT_OK);
    for (int k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s/edited%d.h5", dir, k);
        copy_file(path, p);
        hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
        CU_ASSERT_FATAL(f >= 0);
        CU_ASSERT(H5Adelete(f, "dtrain_format") >= 0);
        if (k == 1) {
            hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
            H5Tset_size(t, 6);
            hid_t a = H5Acreate2(f, "dtrain_format", t, sp, H5P_DEFAULT, H5P_DEFAULT);
            CU_ASSERT(H5Awrite(a, t, "model") >= 0);
            H5Aclose(a);
            H5Sclose(sp);
            H5Tclose(t);
        }
        if (k == 2) /* no checkpoint attribute left: the tensors still tell */
            for (const char *const *n =
                     (const char *const[]){"step", "epoch", "batch", "samples", "seed", "world",
                                           "optim_t", "bad_steps", "rollbacks", "meta_checksum",
                                           NULL};
                 *n; n++)
                CU_ASSERT(H5Adelete(f, *n) >= 0);
        H5Fclose(f);
        CU_ASSERT_EQUAL(dt_ckpt_verify(p, NULL), DT_ERR_BAD_DATA);
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "is damaged"));
        CU_ASSERT_PTR_NULL(strstr(dt_last_error(), "not a dtrain checkpoint"));
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), p));
    }
}

/* ---- damage --------------------------------------------------------------------- */

static void test_truncated(void)
{
    char dir[4096], path[4400], cut[4400];
    static struct set s, back;
    struct stat sb;
    fresh_dir("trunc", dir, sizeof dir);
    make_set(&s, 4);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 42, &s, path, sizeof path), DT_OK);
    CU_ASSERT_EQUAL_FATAL(stat(path, &sb), 0);
    off_t size = sb.st_size;
    off_t lens[] = {0,    1,        8,        100,         512,      2048,
                    4096, size / 3, size / 2, size - 4096, size - 8, size - 1};
    snprintf(cut, sizeof cut, "%s/cut.h5", dir);
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        copy_file(path, cut);
        CU_ASSERT_EQUAL_FATAL(truncate(cut, lens[i]), 0);
        dt_status st = dt_ckpt_verify(cut, NULL);
        CU_ASSERT_EQUAL(st, DT_ERR_BAD_DATA);
        if (st != DT_ERR_BAD_DATA)
            fprintf(stderr, "truncated at %lld of %lld: %s\n", (long long)lens[i], (long long)size,
                    st == DT_OK ? "verified" : dt_last_error());
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), cut));
        empty_like(&back, &s);
        CU_ASSERT_EQUAL(dt_ckpt_load(cut, NULL, back.t, NT), DT_ERR_BAD_DATA);
    }
}

/* File offset of a contiguous dataset's data, from HDF5 itself. */
static haddr_t data_offset(const char *path, const char *name)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = f < 0 ? -1 : H5Dopen2(f, name, H5P_DEFAULT);
    haddr_t off = d < 0 ? HADDR_UNDEF : H5Dget_offset(d);
    dt_h5_close(d);
    dt_h5_close(f);
    return off;
}

static void flip_byte(const char *path, off_t at)
{
    unsigned char c = 0;
    int fd = open(path, O_RDWR);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_EQUAL(pread(fd, &c, 1, at), 1);
    c ^= 0x10;
    CU_ASSERT_EQUAL(pwrite(fd, &c, 1, at), 1);
    close(fd);
}

static void check_flip(const char *path, const char *copy, const char *tensor, int64_t elem,
                       const struct set *s)
{
    static struct set back;
    haddr_t off = data_offset(path, tensor);
    CU_ASSERT_FATAL(off != HADDR_UNDEF);
    copy_file(path, copy);
    flip_byte(copy, (off_t)off + 4 * elem + 2);
    CU_ASSERT_EQUAL(dt_ckpt_verify(copy, NULL), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), tensor));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "checksum"));
    empty_like(&back, s);
    CU_ASSERT_EQUAL(dt_ckpt_load(copy, NULL, back.t, NT), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), tensor));
}

static void test_bit_flip(void)
{
    char dir[4096], path[4400], copy[4400];
    static struct set s;
    fresh_dir("flip", dir, sizeof dir);
    make_set(&s, 5);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 42, &s, path, sizeof path), DT_OK);
    snprintf(copy, sizeof copy, "%s/flipped.h5", dir);
    check_flip(path, copy, "params/fc1.weight", 1000, &s);
    check_flip(path, copy, "params/fc1.bias", COLS - 1, &s);
    check_flip(path, copy, "optim/m/fc1.weight", 0, &s);
    /* damage in the superblock (checksummed in this file format) */
    copy_file(path, copy);
    flip_byte(copy, 20);
    CU_ASSERT_EQUAL(dt_ckpt_verify(copy, NULL), DT_ERR_BAD_DATA);
    /* the original is untouched */
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_OK);
}

/* Is what a damaged copy handed back exactly what was saved? */
static int same_as_saved(const struct dt_ckpt_info *got, const struct dt_ckpt_info *want)
{
    const struct dt_ckpt_meta *a = &got->meta, *b = &want->meta;
    int same =
        a->step == b->step && a->epoch == b->epoch && a->batch == b->batch &&
        a->samples == b->samples && a->seed == b->seed && a->world == b->world &&
        !memcmp(&a->loss_scale, &b->loss_scale, sizeof a->loss_scale) && a->optim_t == b->optim_t &&
        a->bad_steps == b->bad_steps && a->rollbacks == b->rollbacks &&
        !memcmp(&a->created, &b->created, sizeof a->created) && !strcmp(a->version, b->version) &&
        !strcmp(a->optimizer, b->optimizer) && got->ntensors == want->ntensors && got->job_yaml &&
        want->job_yaml && !strcmp(got->job_yaml, want->job_yaml);
    for (int i = 0; same && i < got->ntensors; i++)
        same = !strcmp(got->names[i], want->names[i]) &&
               dt_shape_equal(&got->shape[i], &want->shape[i]);
    return same;
}

/* A failure of a damaged copy: bad data, naming the file, never "not a
 * dtrain checkpoint". Returns 1 when the message is as it should be. */
static int damage_reported(dt_status st, const char *path)
{
    const char *msg = dt_last_error();
    return st == DT_ERR_BAD_DATA && strstr(msg, path) && !strstr(msg, "not a dtrain checkpoint");
}

/* One bit flipped at a time all over a real checkpoint (every byte of its
 * metadata, every 61st byte of tensor data): each copy must either fail as
 * damaged, or (a bit HDF5 never reads) verify and load exactly what was
 * saved. Nothing may crash (under AddressSanitizer too). The job YAML is
 * over 4 KiB: as an attribute HDF5 would keep it where it has no checksum
 * and read a damaged one out of bounds. */
static void test_flip_everywhere(void)
{
    char dir[4096], path[4400], copy[4400];
    static struct set s, back;
    struct dt_ckpt_info *want = calloc(1, sizeof *want), *got = calloc(1, sizeof *got);
    struct stat sb;
    static char yaml[6001];
    for (int i = 0; i < 6000; i++)
        yaml[i] = i % 61 == 60 ? '\n' : (char)('a' + i % 26);
    struct dt_ckpt_meta m = make_meta(42);
    fresh_dir("flipall", dir, sizeof dir);
    make_set(&s, 12);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_save(comm, dir, &m, s.t, NT, yaml, path, sizeof path), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_verify(path, want), DT_OK);
    CU_ASSERT_EQUAL_FATAL(stat(path, &sb), 0);
    /* raw data (the tensors and the job's bytes), checked by dtrain's own
     * checksums: a sample of it is enough */
    haddr_t data[NT + 1], data_end[NT + 1];
    for (int i = 0; i <= NT; i++) {
        data[i] = data_offset(path, i < NT ? s.t[i].name : "job");
        CU_ASSERT_FATAL(data[i] != HADDR_UNDEF);
        data_end[i] =
            data[i] + (i < NT ? 4 * (haddr_t)dt_shape_numel(&s.t[i].shape) : sizeof yaml - 1);
    }
    snprintf(copy, sizeof copy, "%s/flipped.h5", dir);
    copy_file(path, copy);
    int fd = open(copy, O_RDWR);
    CU_ASSERT_FATAL(fd >= 0);
    int tried = 0, wrong_msg = 0, passed_wrongly = 0, harmless = 0;
    for (off_t at = 0; at < sb.st_size; at++) {
        int in_data = 0;
        for (int i = 0; i <= NT; i++)
            in_data |= (haddr_t)at >= data[i] && (haddr_t)at < data_end[i];
        if (in_data && at % 61 != 0) continue;
        unsigned char c, flipped;
        CU_ASSERT_EQUAL_FATAL(pread(fd, &c, 1, at), 1);
        flipped = c ^ (unsigned char)(1u << (at % 8));
        CU_ASSERT_EQUAL_FATAL(pwrite(fd, &flipped, 1, at), 1);
        tried++;
        memset(got, 0, sizeof *got);
        dt_status st = dt_ckpt_verify(copy, got);
        if (st == DT_OK) {
            int same = same_as_saved(got, want);
            dt_ckpt_info_free(got);
            empty_like(&back, &s);
            same = same && dt_ckpt_load(copy, NULL, back.t, NT) == DT_OK &&
                   !memcmp(back.w, s.w, sizeof s.w) && !memcmp(back.b, s.b, sizeof s.b) &&
                   !memcmp(back.m, s.m, sizeof s.m);
            harmless += same;
            if (!same && passed_wrongly++ < 5)
                fprintf(stderr, "\n    bit %d of byte %lld: verifies but holds other values",
                        (int)(at % 8), (long long)at);
        } else if (!damage_reported(st, copy) && wrong_msg++ < 5) {
            fprintf(stderr, "\n    bit %d of byte %lld: %s (%s)", (int)(at % 8), (long long)at,
                    dt_last_error(), dt_status_str(st));
        }
        if (st != DT_OK) {
            empty_like(&back, &s);
            dt_status lst = dt_ckpt_load(copy, NULL, back.t, NT);
            if (lst == DT_OK &&
                (memcmp(back.w, s.w, sizeof s.w) || memcmp(back.b, s.b, sizeof s.b) ||
                 memcmp(back.m, s.m, sizeof s.m)) &&
                passed_wrongly++ < 5)
                fprintf(stderr, "\n    bit %d of byte %lld: loads other values", (int)(at % 8),
                        (long long)at);
            if (lst != DT_OK && !damage_reported(lst, copy) && wrong_msg++ < 5)
                fprintf(stderr, "\n    bit %d of byte %lld: load: %s", (int)(at % 8), (long long)at,
                        dt_last_error());
        }
        CU_ASSERT_EQUAL_FATAL(pwrite(fd, &c, 1, at), 1);
    }
    close(fd);
    printf("(%d flips, %d harmless, %d wrong msg, %d passed wrongly) ", tried, harmless, wrong_msg,
           passed_wrongly);
    CU_ASSERT(tried > 1000);
    CU_ASSERT_EQUAL(wrong_msg, 0);
    CU_ASSERT_EQUAL(passed_wrongly, 0);
    dt_ckpt_info_free(want);
    free(want);
    free(got);
}

/* A copy of a good checkpoint, opened read-write for editing. */
static hid_t edit_copy(const char *path, const char *dir, const char *name, char *copy, size_t len)
{
    snprintf(copy, len, "%s/%s", dir, name);
    copy_file(path, copy);
    hid_t f = H5Fopen(copy, H5F_ACC_RDWR, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    return f;
}

/* Replaces root attribute `name` by n values of type t. */
static void replace_attr(hid_t f, const char *name, hid_t t, hsize_t n, const void *v)
{
    CU_ASSERT(H5Adelete(f, name) >= 0);
    hid_t sp = n ? H5Screate_simple(1, &n, NULL) : H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(a >= 0 && H5Awrite(a, t, v) >= 0);
    H5Aclose(a);
    H5Sclose(sp);
}

/* Verify and load both refuse the edited copy as bad data with `needle`. */
static void refused(const char *copy, const struct set *s, const char *needle)
{
    static struct set back;
    dt_status st = dt_ckpt_verify(copy, NULL);
    CU_ASSERT_EQUAL(st, DT_ERR_BAD_DATA);
    if (!strstr(dt_last_error(), needle))
        fprintf(stderr, "\n    verify %s: '%s' lacks '%s'", copy, dt_last_error(), needle);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), needle));
    empty_like(&back, s);
    CU_ASSERT_EQUAL(dt_ckpt_load(copy, NULL, back.t, NT), DT_ERR_BAD_DATA);
    if (!strstr(dt_last_error(), needle))
        fprintf(stderr, "\n    load %s: '%s' lacks '%s'", copy, dt_last_error(), needle);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), needle));
}

/* Checkpoints edited the way a hostile or buggy writer could: attributes
 * of the wrong type or size, impossible values, a tensor whose shape
 * declares more than the file holds, tensors that are links. Each is
 * refused as bad data before anything is allocated from it. */
static void test_hostile_checkpoints(void)
{
    char dir[4096], path[4400], copy[4400];
    static struct set s;
    fresh_dir("hostile", dir, sizeof dir);
    make_set(&s, 14);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 42, &s, path, sizeof path), DT_OK);

    int64_t many[100] = {0};
    hid_t f = edit_copy(path, dir, "array-step.h5", copy, sizeof copy);
    replace_attr(f, "step", H5T_NATIVE_INT64, 100, many);
    H5Fclose(f);
    refused(copy, &s, "attribute 'step' is not a single integer");

    /* the job as a 2-D array of floats instead of bytes */
    f = edit_copy(path, dir, "float-job.h5", copy, sizeof copy);
    CU_ASSERT(H5Ldelete(f, "job", H5P_DEFAULT) >= 0);
    hsize_t jd[2] = {4, 4};
    hid_t jsp = H5Screate_simple(2, jd, NULL);
    hid_t jds = H5Dcreate2(f, "job", H5T_IEEE_F32LE, jsp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(jds >= 0);
    H5Dclose(jds);
    H5Sclose(jsp);
    H5Fclose(f);
    refused(copy, &s, "its job is not a run of bytes the file holds");

    const char *three[3] = {"model: a", "model: b", "model: c"};
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 9);
    char fixed[3][9];
    for (int i = 0; i < 3; i++)
        snprintf(fixed[i], sizeof fixed[i], "%s", three[i]);
    f = edit_copy(path, dir, "array-version.h5", copy, sizeof copy);
    replace_attr(f, "dtrain_version", t, 3, fixed);
    H5Fclose(f);
    H5Tclose(t);
    refused(copy, &s, "attribute 'dtrain_version' is not a single fixed-length string");

    double half = 0.5;
    f = edit_copy(path, dir, "float-world.h5", copy, sizeof copy);
    replace_attr(f, "world", H5T_NATIVE_DOUBLE, 0, &half);
    H5Fclose(f);
    refused(copy, &s, "attribute 'world' is not a single integer");

    int zero = 0;
    f = edit_copy(path, dir, "world0.h5", copy, sizeof copy);
    replace_attr(f, "world", H5T_NATIVE_INT, 0, &zero);
    H5Fclose(f);
    refused(copy, &s, "attribute 'world' is 0");

    /* a tensor declaring 2^60 values it never wrote, and one of 4 GB */
    hsize_t huge[2][2] = {{(hsize_t)1 << 40, (hsize_t)1 << 20}, {1000000, 1000}};
    for (int k = 0; k < 2; k++) {
        f = edit_copy(path, dir, k ? "big.h5" : "huge.h5", copy, sizeof copy);
        hid_t sp = H5Screate_simple(2, huge[k], NULL);
        hid_t d =
            H5Dcreate2(f, "params/huge", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        uint64_t sum = 7;
        hid_t asp = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(d, "checksum", H5T_STD_U64LE, asp, H5P_DEFAULT, H5P_DEFAULT);
        CU_ASSERT(a >= 0 && H5Awrite(a, H5T_NATIVE_UINT64, &sum) >= 0);
        H5Aclose(a);
        H5Sclose(asp);
        H5Dclose(d);
        H5Sclose(sp);
        H5Fclose(f);
        CU_ASSERT_EQUAL(dt_ckpt_verify(copy, NULL), DT_ERR_BAD_DATA);
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "is damaged: tensor params/huge declares"));
    }

    /* a tensor that is a link to another of the same shape: never followed */
    for (int k = 0; k < 2; k++) {
        f = edit_copy(path, dir, k ? "elink.h5" : "slink.h5", copy, sizeof copy);
        CU_ASSERT(H5Ldelete(f, "params/fc1.weight", H5P_DEFAULT) >= 0);
        herr_t e = k ? H5Lcreate_external(path, "/optim/m/fc1.weight", f, "params/fc1.weight",
                                          H5P_DEFAULT, H5P_DEFAULT)
                     : H5Lcreate_soft("/optim/m/fc1.weight", f, "params/fc1.weight", H5P_DEFAULT,
                                      H5P_DEFAULT);
        CU_ASSERT(e >= 0);
        H5Fclose(f);
        refused(copy, &s, "params/fc1.weight is a link to elsewhere");
    }
}

/* A version 1 checkpoint (the job in a root attribute, no meta_checksum)
 * still verifies and loads. */
static void test_reads_version_1(void)
{
    char dir[4096], path[4400], copy[4400];
    static struct set s, back;
    struct dt_ckpt_info *info = calloc(1, sizeof *info);
    fresh_dir("v1", dir, sizeof dir);
    make_set(&s, 17);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 42, &s, path, sizeof path), DT_OK);
    hid_t f = edit_copy(path, dir, "v1.h5", copy, sizeof copy);
    int one = 1;
    CU_ASSERT(H5Ldelete(f, "job", H5P_DEFAULT) >= 0);
    CU_ASSERT(H5Adelete(f, "meta_checksum") >= 0);
    replace_attr(f, "format_version", H5T_NATIVE_INT, 0, &one);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen("model: mlp\n") + 1);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "job", t, sp, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(a >= 0 && H5Awrite(a, t, "model: mlp\n") >= 0);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
    H5Fclose(f);
    CU_ASSERT_EQUAL(dt_ckpt_verify(copy, info), DT_OK);
    CU_ASSERT(info->job_yaml && !strcmp(info->job_yaml, "model: mlp\n"));
    CU_ASSERT_EQUAL(info->ntensors, NT);
    dt_ckpt_info_free(info);
    free(info);
    empty_like(&back, &s);
    CU_ASSERT_EQUAL(dt_ckpt_load(copy, NULL, back.t, NT), DT_OK);
    CU_ASSERT_EQUAL(memcmp(back.w, s.w, sizeof s.w), 0);
    /* a version 2 file without meta_checksum is damaged */
    f = edit_copy(path, dir, "v2-nosum.h5", copy, sizeof copy);
    CU_ASSERT(H5Adelete(f, "meta_checksum") >= 0);
    H5Fclose(f);
    refused(copy, &s, "attribute 'meta_checksum' is missing");
}

/* ---- N-d tensors, format versions ---------------------------------------------- */

#define ND_T 5

/* Tensors of 2 to DT_MAX_DIMS dimensions, one of them empty. */
struct nd_set {
    float *data[ND_T];
    struct dt_ckpt_tensor t[ND_T];
};

static void make_nd_set(struct nd_set *s, uint32_t seed, int with_data)
{
    static const struct {
        const char *name;
        struct dt_shape shape;
    } spec[ND_T] = {
        {"params/c3", {3, {3, 5, 7}}},
        {"params/conv1.weight", {4, {4, 3, 3, 3}}}, /* K x C x R x S */
        {"optim/m/eight", {DT_MAX_DIMS, {2, 1, 2, 1, 3, 1, 2, 2}}},
        {"params/empty5", {5, {3, 0, 2, 1, 4}}},
        {"params/fc.weight", {2, {6, 9}}},
    };
    for (int i = 0; i < ND_T; i++) {
        size_t n = (size_t)dt_shape_numel(&spec[i].shape);
        s->data[i] = calloc(n + 1, sizeof(float));
        CU_ASSERT_PTR_NOT_NULL_FATAL(s->data[i]);
        if (with_data)
            fill(s->data[i], n, seed + (uint32_t)i);
        s->t[i] = (struct dt_ckpt_tensor){"", spec[i].shape, s->data[i], NULL, 0};
        snprintf(s->t[i].name, DT_CKPT_NAME, "%s", spec[i].name);
    }
}

static void free_nd_set(struct nd_set *s)
{
    for (int i = 0; i < ND_T; i++)
        free(s->data[i]);
}

static int info_index(const struct dt_ckpt_info *info, const char *name)
{
    for (int i = 0; i < info->ntensors; i++)
        if (!strcmp(info->names[i], name))
            return i;
    return -1;
}

/* 3-D, 4-D, 8-D and empty 5-D tensors: saved in their shapes (HDF5 sees
 * them so), listed with them, loaded bit for bit; a tensor asked for in
 * another shape of the same size is refused naming both. */
static void test_nd_round_trip(void)
{
    char dir[4096], path[4400];
    struct nd_set s, back;
    struct dt_ckpt_info *info = calloc(1, sizeof *info);
    struct dt_ckpt_meta m = make_meta(5);
    CU_ASSERT_PTR_NOT_NULL_FATAL(info);
    fresh_dir("nd", dir, sizeof dir);
    make_nd_set(&s, 21, 1);
    make_nd_set(&back, 0, 0);
    dt_status st = dt_ckpt_save(comm, dir, &m, s.t, ND_T, "model: cnn\n", path, sizeof path);
    if (st != DT_OK)
        fprintf(stderr, "\n    save: %s", dt_last_error());
    CU_ASSERT_EQUAL_FATAL(st, DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_verify(path, info), DT_OK);
    CU_ASSERT_EQUAL(info->format_version, 3);
    CU_ASSERT_EQUAL(info->ntensors, ND_T);
    for (int i = 0; i < ND_T; i++) {
        int k = info_index(info, s.t[i].name);
        CU_ASSERT_FATAL(k >= 0);
        CU_ASSERT(dt_shape_equal(&info->shape[k], &s.t[i].shape));
        CU_ASSERT_EQUAL(info->numel[k], dt_shape_numel(&s.t[i].shape));
    }
    /* HDF5 itself sees the 4-D shape */
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "params/conv1.weight", H5P_DEFAULT);
    hid_t sp = H5Dget_space(d);
    hsize_t dims[4] = {0};
    CU_ASSERT_EQUAL(H5Sget_simple_extent_ndims(sp), 4);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    CU_ASSERT(dims[0] == 4 && dims[1] == 3 && dims[2] == 3 && dims[3] == 3);
    H5Sclose(sp);
    H5Dclose(d);
    H5Fclose(f);
    CU_ASSERT_EQUAL(dt_ckpt_load(path, NULL, back.t, ND_T), DT_OK);
    for (int i = 0; i < ND_T; i++)
        CU_ASSERT_EQUAL(
            memcmp(back.data[i], s.data[i], (size_t)dt_shape_numel(&s.t[i].shape) * sizeof(float)),
            0);
    back.t[1].shape = (struct dt_shape){2, {4, 27}};
    CU_ASSERT_EQUAL(dt_ckpt_load(path, NULL, back.t, ND_T), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(
        strstr(dt_last_error(), "params/conv1.weight has shape 4x3x3x3, the model expects 4x27"));
    back.t[1].shape = (struct dt_shape){4, {4, 3, 9, 1}};
    CU_ASSERT_EQUAL(dt_ckpt_load(path, NULL, back.t, ND_T), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "the model expects 4x3x9x1"));
    dt_ckpt_info_free(info);
    free(info);
    free_nd_set(&s);
    free_nd_set(&back);
}

/* Replaces tensor `name` of the open file (of at most 1024 values) by a
 * float32 dataset of shape dims (at most 1024 values), holding its first
 * values, with the old checksum attribute's value. */
static void reshape_tensor(hid_t f, const char *name, int nd, const hsize_t *dims)
{
    static float v[1024];
    uint64_t sum = 0;
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t a = H5Aopen(d, "checksum", H5P_DEFAULT);
    CU_ASSERT(a >= 0 && H5Aread(a, H5T_NATIVE_UINT64, &sum) >= 0);
    CU_ASSERT(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    H5Aclose(a);
    H5Dclose(d);
    CU_ASSERT(H5Ldelete(f, name, H5P_DEFAULT) >= 0);
    hid_t sp = H5Screate_simple(nd, dims, NULL);
    d = H5Dcreate2(f, name, H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    hid_t asp = H5Screate(H5S_SCALAR);
    a = H5Acreate2(d, "checksum", H5T_STD_U64LE, asp, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(a >= 0 && H5Awrite(a, H5T_NATIVE_UINT64, &sum) >= 0);
    H5Aclose(a);
    H5Sclose(asp);
    H5Dclose(d);
    H5Sclose(sp);
}

/* verify and load both refuse path as bad data with `needle`. */
static void nd_refused(const char *path, const char *needle)
{
    struct nd_set back;
    make_nd_set(&back, 0, 0);
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_ERR_BAD_DATA);
    if (!strstr(dt_last_error(), needle))
        fprintf(stderr, "\n    verify %s: '%s' lacks '%s'", path, dt_last_error(), needle);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), needle));
    CU_ASSERT_EQUAL(dt_ckpt_load(path, NULL, back.t, ND_T), DT_ERR_BAD_DATA);
    if (!strstr(dt_last_error(), needle))
        fprintf(stderr, "\n    load %s: '%s' lacks '%s'", path, dt_last_error(), needle);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), needle));
    free_nd_set(&back);
}

/* Damage to an N-d checkpoint is found: a flipped bit in a 4-D tensor's
 * values (its checksum), a tensor given another shape of the same size
 * (the meta checksum covers shapes), a 4-D tensor in a file that says
 * version 2, a tensor of more than DT_MAX_DIMS dimensions. */
static void test_nd_damaged(void)
{
    char dir[4096], path[4400], copy[4400];
    struct nd_set s;
    struct dt_ckpt_meta m = make_meta(6);
    fresh_dir("nddmg", dir, sizeof dir);
    make_nd_set(&s, 31, 1);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_save(comm, dir, &m, s.t, ND_T, "model: cnn\n", path, sizeof path),
                          DT_OK);
    haddr_t off = data_offset(path, "params/conv1.weight");
    CU_ASSERT_FATAL(off != HADDR_UNDEF);
    snprintf(copy, sizeof copy, "%s/flipped.h5", dir);
    copy_file(path, copy);
    flip_byte(copy, (off_t)off + 4 * 100 + 3); /* element (3, 2, 0, 1) */
    nd_refused(copy, "tensor params/conv1.weight fails its checksum");

    hsize_t flat[2] = {4, 27};
    hid_t f = edit_copy(path, dir, "reshaped.h5", copy, sizeof copy);
    reshape_tensor(f, "params/conv1.weight", 2, flat);
    H5Fclose(f);
    CU_ASSERT_EQUAL(dt_ckpt_verify(copy, NULL), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(
        strstr(dt_last_error(), "its attributes or its list of tensors fail their checksum"));

    int two = 2;
    f = edit_copy(path, dir, "v2-with-4d.h5", copy, sizeof copy);
    replace_attr(f, "format_version", H5T_NATIVE_INT, 0, &two);
    H5Fclose(f);
    nd_refused(copy, "tensor optim/m/eight has 8 dimensions; a checkpoint of format version 2 "
                     "holds only 1-D and 2-D tensors");

    hsize_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    f = edit_copy(path, dir, "nine.h5", copy, sizeof copy);
    reshape_tensor(f, "params/fc.weight", 9, nine);
    H5Fclose(f);
    nd_refused(copy, "tensor params/fc.weight is not a float32 array of 1 to 8 dimensions");
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_OK); /* the original is untouched */
    free_nd_set(&s);
}

/* A checkpoint of a newer format version is refused, naming the file, its
 * version and the versions this dtrain reads; so is a newer model file. */
static void test_refuses_newer_version(void)
{
    char dir[4096], path[4400], copy[4400], want[4600];
    static struct set s, back;
    fresh_dir("newer", dir, sizeof dir);
    make_set(&s, 18);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 42, &s, path, sizeof path), DT_OK);
    int four = DT_CKPT_FORMAT_VERSION + 1;
    hid_t f = edit_copy(path, dir, "v4.h5", copy, sizeof copy);
    replace_attr(f, "format_version", H5T_NATIVE_INT, 0, &four);
    H5Fclose(f);
    snprintf(want, sizeof want,
             "checkpoint %s has format version 4; this dtrain reads versions 1 to 3: use a "
             "newer dtrain",
             copy);
    CU_ASSERT_EQUAL(dt_ckpt_verify(copy, NULL), DT_ERR_BAD_DATA);
    CU_ASSERT_STRING_EQUAL(dt_last_error(), want);
    empty_like(&back, &s);
    CU_ASSERT_EQUAL(dt_ckpt_load(copy, NULL, back.t, NT), DT_ERR_BAD_DATA);
    CU_ASSERT_STRING_EQUAL(dt_last_error(), want);

    float w[6] = {1, 2, 3, 4, 5, 6};
    struct dt_named_tensor t = {"w", {2, {2, 3}}, w}, *got = NULL;
    int n = 0, two = 2;
    snprintf(copy, sizeof copy, "%s/model.h5", dir);
    CU_ASSERT_EQUAL_FATAL(dt_model_file_save(copy, &t, 1), DT_OK);
    f = H5Fopen(copy, H5F_ACC_RDWR, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    replace_attr(f, "format_version", H5T_NATIVE_INT, 0, &two);
    H5Fclose(f);
    CU_ASSERT_EQUAL(dt_model_file_load(copy, &got, &n), DT_ERR_BAD_DATA);
    snprintf(want, sizeof want,
             "model %s has format version 2; this dtrain reads version 1: use a newer dtrain",
             copy);
    CU_ASSERT_STRING_EQUAL(dt_last_error(), want);
    CU_ASSERT_PTR_NULL(got);
}

/* A format-version-2 checkpoint written by an earlier dtrain (the fixture:
 * step 3 of a 784-8-10 MLP with AdamW) verifies, meta checksum included,
 * and loads; its parameters are those of the same run's model file, a
 * format-version-1 model.h5, which loads too. A flipped value in it is
 * still found. */
static void test_reads_old_files(void)
{
    char dir[4096], copy[4400];
    const char *ckpt = DT_TEST_FIXTURES "/ckpt-v2-mlp8.h5";
    const char *model = DT_TEST_FIXTURES "/model-v1-mlp8.h5";
    struct dt_ckpt_info *info = calloc(1, sizeof *info);
    struct dt_ckpt_tensor t[DT_CKPT_MAX_TENSORS / 64];
    struct dt_named_tensor *mt = NULL;
    struct dt_ckpt_meta meta;
    int n = 0;
    CU_ASSERT_PTR_NOT_NULL_FATAL(info);
    dt_status st = dt_ckpt_verify(ckpt, info);
    if (st != DT_OK)
        fprintf(stderr, "\n    %s", dt_last_error());
    CU_ASSERT_EQUAL_FATAL(st, DT_OK);
    CU_ASSERT_EQUAL(info->format_version, 2);
    CU_ASSERT_EQUAL(info->meta.step, 3);
    CU_ASSERT_EQUAL(info->meta.samples, 384);
    CU_ASSERT_STRING_EQUAL(info->meta.optimizer, "adamw");
    CU_ASSERT_EQUAL_FATAL(info->ntensors, 12);
    int k = info_index(info, "params/fc1.weight");
    CU_ASSERT_FATAL(k >= 0);
    CU_ASSERT(dt_shape_equal(&info->shape[k], &(struct dt_shape){2, {8, 784}}));
    k = info_index(info, "optim/v/fc2.bias");
    CU_ASSERT_FATAL(k >= 0);
    CU_ASSERT(dt_shape_equal(&info->shape[k], &(struct dt_shape){1, {10}}));
    memset(t, 0, sizeof t);
    for (int i = 0; i < info->ntensors; i++) {
        snprintf(t[i].name, DT_CKPT_NAME, "%s", info->names[i]);
        t[i].shape = info->shape[i];
        t[i].data = calloc((size_t)info->numel[i], sizeof(float));
        CU_ASSERT_PTR_NOT_NULL_FATAL(t[i].data);
    }
    CU_ASSERT_EQUAL(dt_ckpt_load(ckpt, &meta, t, info->ntensors), DT_OK);
    CU_ASSERT_EQUAL(meta.step, 3);
    CU_ASSERT_EQUAL(dt_model_file_load(model, &mt, &n), DT_OK);
    CU_ASSERT_EQUAL(n, 4);
    for (int j = 0; j < n && mt; j++) {
        char name[DT_CKPT_NAME];
        snprintf(name, sizeof name, "params/%s", mt[j].name);
        k = info_index(info, name);
        CU_ASSERT_FATAL(k >= 0);
        CU_ASSERT(dt_shape_equal(&mt[j].shape, &t[k].shape));
        CU_ASSERT_EQUAL(memcmp(mt[j].data, t[k].data, (size_t)info->numel[k] * sizeof(float)), 0);
    }
    dt_model_file_free(mt, n);
    fresh_dir("oldfiles", dir, sizeof dir);
    snprintf(copy, sizeof copy, "%s/flipped.h5", dir);
    copy_file(ckpt, copy);
    haddr_t off = data_offset(copy, "optim/m/fc1.weight");
    CU_ASSERT_FATAL(off != HADDR_UNDEF);
    flip_byte(copy, (off_t)off + 4 * 777 + 2);
    CU_ASSERT_EQUAL(dt_ckpt_verify(copy, NULL), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "optim/m/fc1.weight fails its checksum"));
    for (int i = 0; i < info->ntensors; i++)
        free(t[i].data);
    dt_ckpt_info_free(info);
    free(info);
}

/* Model files hold N-d tensors too; shapes outside 1 to DT_MAX_DIMS
 * dimensions are refused. */
static void test_model_nd(void)
{
    char dir[4096], p[4400];
    float w[36], b[4];
    fill(w, 36, 41);
    fill(b, 4, 42);
    struct dt_named_tensor t[2] = {{"conv1.weight", {4, {4, 1, 3, 3}}, w},
                                   {"conv1.bias", {1, {4}}, b}},
                           *got = NULL;
    int n = 0;
    fresh_dir("modelnd", dir, sizeof dir);
    snprintf(p, sizeof p, "%s/model.h5", dir);
    CU_ASSERT_EQUAL_FATAL(dt_model_file_save(p, t, 2), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_model_file_load(p, &got, &n), DT_OK);
    CU_ASSERT_EQUAL_FATAL(n, 2);
    CU_ASSERT_STRING_EQUAL(got[1].name, "conv1.weight");
    CU_ASSERT(dt_shape_equal(&got[1].shape, &t[0].shape));
    CU_ASSERT_EQUAL(memcmp(got[1].data, w, sizeof w), 0);
    CU_ASSERT(dt_shape_equal(&got[0].shape, &t[1].shape));
    dt_model_file_free(got, n);
    t[0].shape.ndim = 0;
    CU_ASSERT_EQUAL(dt_model_file_save(p, t, 2), DT_ERR_INVALID_ARG);
    t[0].shape.ndim = DT_MAX_DIMS + 1;
    CU_ASSERT_EQUAL(dt_model_file_save(p, t, 2), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "conv1.weight"));
}

/* A checkpoint another process holds locked (HDF5 takes a lock on open)
 * is an I/O error, not a damaged file: nothing is wrong with it. */
static void test_locked_not_damaged(void)
{
    char dir[4096], path[4400];
    static struct set s;
    int ready[2];
    fresh_dir("locked", dir, sizeof dir);
    make_set(&s, 15);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 42, &s, path, sizeof path), DT_OK);
    CU_ASSERT_EQUAL_FATAL(pipe(ready), 0);
    pid_t child = fork();
    CU_ASSERT_FATAL(child >= 0);
    if (child == 0) {
        int fd = open(path, O_RDONLY);
        char c = flock(fd, LOCK_EX) == 0 ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    char c = 'n';
    CU_ASSERT_EQUAL(read(ready[0], &c, 1), 1);
    dt_status st = dt_ckpt_verify(path, NULL);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    close(ready[0]);
    close(ready[1]);
    if (st == DT_OK) {
        printf("SKIPPED (HDF5 file locking is off) ");
        return;
    }
    CU_ASSERT_EQUAL(c, 'y');
    CU_ASSERT_EQUAL(st, DT_ERR_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "cannot open it"));
    CU_ASSERT_PTR_NULL(strstr(dt_last_error(), "damaged"));
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_OK); /* and once the lock is gone */
}

/* ---- the directory ------------------------------------------------------------- */

static void test_list_order(void)
{
    char dir[4096], path[4400], names[8][256];
    int64_t steps[8];
    static struct set s;
    fresh_dir("list", dir, sizeof dir);
    make_set(&s, 6);
    CU_ASSERT_EQUAL(dt_ckpt_list(dir, names, steps, 8), 0);
    int64_t order[] = {5, 100, 20};
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL_FATAL(save_step(dir, order[i], &s, path, sizeof path), DT_OK);
    write_text(dir, ".ckpt-0000000007.h5.tmp", "x");
    write_text(dir, "notes.txt", "x");
    write_text(dir, "ckpt-abc.h5", "x");
    write_text(dir, "ckpt-0000000012.h5.bak", "x");
    write_text(dir, "ckpt-.h5", "x");
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_list(dir, names, steps, 8), 3);
    CU_ASSERT_STRING_EQUAL(names[0], "ckpt-0000000100.h5");
    CU_ASSERT_STRING_EQUAL(names[1], "ckpt-0000000020.h5");
    CU_ASSERT_STRING_EQUAL(names[2], "ckpt-0000000005.h5");
    CU_ASSERT_EQUAL(steps[0], 100);
    CU_ASSERT_EQUAL(steps[1], 20);
    CU_ASSERT_EQUAL(steps[2], 5);
    /* fewer slots than checkpoints: the newest, and the full count */
    memset(names, 0, sizeof names);
    CU_ASSERT_EQUAL(dt_ckpt_list(dir, names, steps, 1), 3);
    CU_ASSERT_STRING_EQUAL(names[0], "ckpt-0000000100.h5");
    CU_ASSERT_EQUAL(names[1][0], '\0');
    CU_ASSERT_EQUAL(dt_ckpt_list(dir, NULL, NULL, 0), 3);
    char missing[4400];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    CU_ASSERT_EQUAL(dt_ckpt_list(missing, names, steps, 8), 0);
}

static void test_latest(void)
{
    char dir[4096], path[4400], name[256] = "junk";
    static struct set s;
    fresh_dir("latest", dir, sizeof dir);
    make_set(&s, 7);
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, name, sizeof name), DT_ERR_NOT_FOUND);
    CU_ASSERT_STRING_EQUAL(name, "");
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 11, &s, path, sizeof path), DT_OK);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 10, &s, path, sizeof path), DT_OK);
    /* latest is the last saved, not the highest step */
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, name, sizeof name), DT_OK);
    CU_ASSERT_STRING_EQUAL(name, "ckpt-0000000010.h5");
    char small[8];
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, small, sizeof small), DT_ERR_BAD_DATA);
    write_text(dir, "latest", "../elsewhere/ckpt-0000000001.h5\n");
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, name, sizeof name), DT_ERR_BAD_DATA);
    write_text(dir, "latest", "");
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, name, sizeof name), DT_ERR_BAD_DATA);
    write_text(dir, "latest", "..\n");
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, name, sizeof name), DT_ERR_BAD_DATA);
    write_text(dir, "latest", "notes.txt\n");
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, name, sizeof name), DT_ERR_BAD_DATA);
    /* a FIFO in its place: an answer, not a hang */
    char p[4400];
    snprintf(p, sizeof p, "%s/latest", dir);
    CU_ASSERT_EQUAL(unlink(p), 0);
    CU_ASSERT_EQUAL_FATAL(mkfifo(p, 0600), 0);
    alarm(60);
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, name, sizeof name), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "FIFO"));
    CU_ASSERT_EQUAL(dt_ckpt_prune(dir, 0, 0), DT_ERR_BAD_DATA);
    alarm(0);
    CU_ASSERT_EQUAL(dt_ckpt_list(dir, NULL, NULL, 0), 2);
}

static void test_prune(void)
{
    char dir[4096], path[4400], names[16][256];
    int64_t steps[16];
    float v[4] = {1, 2, 3, 4};
    struct dt_ckpt_tensor t = {"params/v", {1, {4}}, v, NULL, 0};
    fresh_dir("prune", dir, sizeof dir);
    for (int64_t step = 10; step <= 100; step += 10) {
        struct dt_ckpt_meta m = make_meta(step);
        CU_ASSERT_EQUAL_FATAL(dt_ckpt_save(comm, dir, &m, &t, 1, "", path, sizeof path), DT_OK);
    }
    write_text(dir, "latest", "ckpt-0000000030.h5\n"); /* e.g. after a rollback */
    write_text(dir, ".ckpt-0000000110.h5.tmp", "half a file");
    write_text(dir, ".latest.tmp", "x");
    write_text(dir, "notes.txt", "keep me");
    CU_ASSERT_EQUAL(dt_ckpt_prune(dir, 2, 40), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_list(dir, names, steps, 16), 5);
    int64_t want[] = {100, 90, 80, 40, 30};
    for (int i = 0; i < 5; i++)
        CU_ASSERT_EQUAL(steps[i], want[i]);
    CU_ASSERT_FALSE(exists(dir, ".ckpt-0000000110.h5.tmp"));
    CU_ASSERT_FALSE(exists(dir, ".latest.tmp"));
    CU_ASSERT_TRUE(exists(dir, "notes.txt"));
    CU_ASSERT_TRUE(exists(dir, "latest"));
    /* keep nothing: latest still stays */
    CU_ASSERT_EQUAL(dt_ckpt_prune(dir, 0, 0), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_list(dir, names, steps, 16), 1);
    CU_ASSERT_STRING_EQUAL(names[0], "ckpt-0000000030.h5");
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_ERR_NOT_FOUND); /* step 100 went */
    CU_ASSERT_EQUAL(dt_ckpt_prune(dir, -1, 0), DT_ERR_INVALID_ARG);
    /* an unreadable latest: prune refuses rather than guess */
    write_text(dir, "latest", "../x\n");
    CU_ASSERT_EQUAL(dt_ckpt_prune(dir, 0, 0), DT_ERR_BAD_DATA);
    CU_ASSERT_EQUAL(dt_ckpt_list(dir, NULL, NULL, 0), 1);
}

/* Files named like checkpoints that are not (a foreign file, a file whose
 * header does not open as a checkpoint, a checkpoint whose step differs
 * from its name) take no slot in keep_last, and retention leaves them. */
static void test_prune_foreign(void)
{
    char dir[4096], path[4400], p[4400], names[16][256];
    float v[4] = {1, 2, 3, 4};
    struct dt_ckpt_tensor t = {"params/v", {1, {4}}, v, NULL, 0};
    fresh_dir("prunef", dir, sizeof dir);
    for (int64_t step = 10; step <= 30; step += 10) {
        struct dt_ckpt_meta m = make_meta(step);
        CU_ASSERT_EQUAL_FATAL(dt_ckpt_save(comm, dir, &m, &t, 1, "", path, sizeof path), DT_OK);
    }
    write_text(dir, "ckpt-0000000099.h5", "someone else's file\n");
    snprintf(p, sizeof p, "%s/ckpt-0000000010.h5", dir);
    char moved[4400];
    snprintf(moved, sizeof moved, "%s/ckpt-0000000098.h5", dir); /* holds step 10 */
    copy_file(p, moved);
    snprintf(p, sizeof p, "%s/ckpt-0000000097.h5", dir); /* a model, not a checkpoint */
    struct dt_named_tensor mt = {"w", {1, {4}}, v};
    CU_ASSERT_EQUAL_FATAL(dt_model_file_save(p, &mt, 1), DT_OK);
    CU_ASSERT_EQUAL(dt_ckpt_list(dir, NULL, NULL, 0), 6);
    CU_ASSERT_EQUAL(dt_ckpt_prune(dir, 2, 0), DT_OK);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_list(dir, names, NULL, 16), 5);
    const char *want[] = {"ckpt-0000000099.h5", "ckpt-0000000098.h5", "ckpt-0000000097.h5",
                          "ckpt-0000000030.h5", "ckpt-0000000020.h5"};
    for (int i = 0; i < 5; i++)
        CU_ASSERT_STRING_EQUAL(names[i], want[i]);
    CU_ASSERT_FALSE(exists(dir, "ckpt-0000000010.h5"));
    CU_ASSERT_EQUAL(dt_ckpt_verify(moved, NULL), DT_OK); /* a sound file, only misnamed */
}

/* A name something else holds is never replaced: the checkpoint takes
 * the next free name of its step, which lists as the newer file, and
 * retention removes only dtrain's own files. */
static void test_name_taken(void)
{
    char dir[4096], path[4400], p[4400], names[16][256], latest[256];
    int64_t steps[16];
    static struct set s;
    fresh_dir("taken", dir, sizeof dir);
    make_set(&s, 8);
    write_text(dir, "ckpt-0000000005.h5", "a file of the user's\n");
    snprintf(p, sizeof p, "%s/ckpt-0000000006.h5", dir);
    CU_ASSERT_EQUAL_FATAL(mkfifo(p, 0600), 0);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 5, &s, path, sizeof path), DT_OK);
    snprintf(p, sizeof p, "%s/ckpt-0000000005-2.h5", dir);
    CU_ASSERT_STRING_EQUAL(path, p);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 5, &s, path, sizeof path), DT_OK);
    snprintf(p, sizeof p, "%s/ckpt-0000000005-3.h5", dir);
    CU_ASSERT_STRING_EQUAL(path, p);
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_OK);
    size_t len = 0;
    snprintf(p, sizeof p, "%s/ckpt-0000000005.h5", dir);
    char *text = slurp(p, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT(len == 21 && !memcmp(text, "a file of the user's\n", 21));
    free(text);
    alarm(60); /* the FIFO in the way: a new name, not a hang */
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 6, &s, path, sizeof path), DT_OK);
    alarm(0);
    snprintf(p, sizeof p, "%s/ckpt-0000000006-2.h5", dir);
    CU_ASSERT_STRING_EQUAL(path, p);
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, latest, sizeof latest), DT_OK);
    CU_ASSERT_STRING_EQUAL(latest, "ckpt-0000000006-2.h5");
    /* names that only look like a later file of a step are no checkpoints */
    write_text(dir, "ckpt-0000000005-1.h5", "x");
    write_text(dir, "ckpt-0000000005-02.h5", "x");
    write_text(dir, "ckpt-0000000005-100.h5", "x");
    write_text(dir, "ckpt-0000000005-.h5", "x");
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_list(dir, names, steps, 16), 5);
    const char *want[] = {"ckpt-0000000006-2.h5", "ckpt-0000000006.h5", "ckpt-0000000005-3.h5",
                          "ckpt-0000000005-2.h5", "ckpt-0000000005.h5"};
    for (int i = 0; i < 5; i++)
        CU_ASSERT_STRING_EQUAL(names[i], want[i]);
    alarm(60);
    CU_ASSERT_EQUAL(dt_ckpt_prune(dir, 1, 0), DT_OK);
    alarm(0);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_list(dir, names, steps, 16), 3);
    CU_ASSERT_STRING_EQUAL(names[0], "ckpt-0000000006-2.h5");
    CU_ASSERT_STRING_EQUAL(names[1], "ckpt-0000000006.h5");
    CU_ASSERT_STRING_EQUAL(names[2], "ckpt-0000000005.h5");
    CU_ASSERT_TRUE(exists(dir, "ckpt-0000000005-1.h5"));
}

/* Starting over moves the whole directory aside under a free name and
 * leaves an empty one; a directory without checkpoints stays. */
static void test_set_aside(void)
{
    char dir[4096], path[4600], moved[4400], p[4200];
    static struct set s;
    fresh_dir("aside", dir, sizeof dir);
    make_set(&s, 9);
    for (int k = 1; k <= 4; k++) {
        snprintf(p, sizeof p, "%s.%d", dir, k);
        char cmd[9000];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
        CU_ASSERT_EQUAL(system(cmd), 0);
    }
    write_text(dir, "notes.txt", "mine");
    CU_ASSERT_EQUAL(dt_ckpt_set_aside(dir, moved, sizeof moved), DT_OK);
    CU_ASSERT_STRING_EQUAL(moved, ""); /* nothing a resume would take */
    CU_ASSERT_TRUE(exists(dir, "notes.txt"));
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 3, &s, path, sizeof path), DT_OK);
    CU_ASSERT_EQUAL(dt_ckpt_set_aside(dir, moved, sizeof moved), DT_OK);
    snprintf(p, sizeof p, "%s.1", dir);
    CU_ASSERT_STRING_EQUAL(moved, p);
    CU_ASSERT_EQUAL(dt_ckpt_list(dir, NULL, NULL, 0), 0);
    CU_ASSERT_FALSE(exists(dir, "latest"));
    CU_ASSERT_FALSE(exists(dir, "notes.txt"));
    CU_ASSERT_TRUE(exists(p, "notes.txt"));
    CU_ASSERT_TRUE(exists(p, "latest"));
    snprintf(path, sizeof path, "%s/ckpt-0000000003.h5", p);
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_OK);
    /* a latest pointer alone is moved too; an empty folder by the next
     * name is not replaced */
    write_text(dir, "latest", "ckpt-0000000001.h5\n");
    snprintf(p, sizeof p, "%s.2", dir);
    CU_ASSERT_EQUAL_FATAL(mkdir(p, 0700), 0);
    CU_ASSERT_EQUAL(dt_ckpt_set_aside(dir, moved, sizeof moved), DT_OK);
    snprintf(p, sizeof p, "%s.3", dir);
    CU_ASSERT_STRING_EQUAL(moved, p);
    CU_ASSERT_TRUE(exists(p, "latest"));
    snprintf(p, sizeof p, "%s.2", dir);
    CU_ASSERT_FALSE(exists(p, "latest"));
    CU_ASSERT_FALSE(exists(dir, "latest"));
}

/* ---- failing saves -------------------------------------------------------------- */

struct snapshot {
    char *ckpt, *latest;
    size_t ckpt_len, latest_len;
};

static void take_snapshot(const char *dir, const char *name, struct snapshot *sn)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    sn->ckpt = slurp(p, &sn->ckpt_len);
    snprintf(p, sizeof p, "%s/latest", dir);
    sn->latest = slurp(p, &sn->latest_len);
    CU_ASSERT_PTR_NOT_NULL(sn->ckpt);
    CU_ASSERT_PTR_NOT_NULL(sn->latest);
}

/* The earlier checkpoint and latest are byte-identical; no temp file. */
static void check_untouched(const char *dir, const char *name, const struct snapshot *sn)
{
    struct snapshot now;
    take_snapshot(dir, name, &now);
    CU_ASSERT_EQUAL(now.ckpt_len, sn->ckpt_len);
    CU_ASSERT(now.ckpt && sn->ckpt && now.ckpt_len == sn->ckpt_len &&
              !memcmp(now.ckpt, sn->ckpt, sn->ckpt_len));
    CU_ASSERT(now.latest && sn->latest && now.latest_len == sn->latest_len &&
              !memcmp(now.latest, sn->latest, sn->latest_len));
    DIR *d = opendir(dir);
    struct dirent *de;
    int temps = 0;
    while (d && (de = readdir(d)) != NULL)
        temps += strstr(de->d_name, ".tmp") != NULL;
    if (d) closedir(d);
    CU_ASSERT_EQUAL(temps, 0);
    CU_ASSERT_EQUAL(dt_ckpt_list(dir, NULL, NULL, 0), 1);
    free(now.ckpt);
    free(now.latest);
}

/* Saves step 1 into dir, then step 2 with a 4 MiB tensor (under a 256 KiB
 * file-size limit when fsize, else in whatever room dir has): the second
 * save must fail with DT_ERR_IO naming `needle` and leave step 1 and
 * latest byte-identical, with no temporary file. */
static void failing_save(const char *dir, int fsize, const char *needle)
{
    enum { BIG = 1 << 20 };
    char path[4400];
    static struct set s;
    struct snapshot sn;
    make_set(&s, 8);
    /* no _FATAL before the caller unmounts: return instead */
    dt_status st = save_step(dir, 1, &s, path, sizeof path);
    CU_ASSERT_EQUAL(st, DT_OK);
    float *big = st == DT_OK ? calloc(BIG, sizeof *big) : NULL;
    if (!big) return;
    take_snapshot(dir, "ckpt-0000000001.h5", &sn);
    fill(big, BIG, 70); /* not zeros: a hole left by a lost write must not verify */
    struct dt_ckpt_tensor t = {"params/big", {1, {BIG}}, big, NULL, 0};
    struct dt_ckpt_meta m = make_meta(2);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 256 * 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CU_ASSERT(!fsize || setrlimit(RLIMIT_FSIZE, &lim) == 0);
    st = dt_ckpt_save(comm, dir, &m, &t, 1, "", path, sizeof path);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    CU_ASSERT_EQUAL(st, DT_ERR_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "rank 0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), needle));
    if (!strstr(dt_last_error(), needle))
        fprintf(stderr, "failing save: %s\n", dt_last_error());
    check_untouched(dir, "ckpt-0000000001.h5", &sn);
    CU_ASSERT_FALSE(exists(dir, "ckpt-0000000002.h5"));
    free(big);
    free(sn.ckpt);
    free(sn.latest);
}

/* A file-size limit (ulimit -f) too small for the checkpoint. */
static void test_save_fails_file_size(void)
{
    char dir[4096];
    fresh_dir("efbig", dir, sizeof dir);
    failing_save(dir, 1, "file-size limit");
}

/* A real disk too small for the checkpoint (a 2 MiB tmpfs), caught when
 * the space is reserved before any data is written. Needs the right to
 * mount (root in CI containers); skipped, and said so, without. */
static void test_save_fails_disk_full(void)
{
    char dir[4096];
    fresh_dir("enospc", dir, sizeof dir);
    if (mount("dtrain-test", dir, "tmpfs", 0, "size=2m,mode=0755") != 0) {
        printf("SKIPPED (cannot mount a small tmpfs: %s) ", strerror(errno));
        return;
    }
    failing_save(dir, 0, ".ckpt-0000000002.h5.tmp: cannot reserve");
    CU_ASSERT_EQUAL(umount2(dir, MNT_DETACH), 0);
}

static void test_save_fails_no_dir(void)
{
    char dir[4096], missing[4400], path[4400] = "";
    static struct set s;
    fresh_dir("nodir", dir, sizeof dir);
    make_set(&s, 9);
    snprintf(missing, sizeof missing, "%s/no/such/dir", dir);
    CU_ASSERT_EQUAL(save_step(missing, 1, &s, path, sizeof path), DT_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), missing));
    CU_ASSERT_STRING_EQUAL(path, "");
    /* a file where the directory should be */
    write_text(dir, "plain", "x");
    snprintf(missing, sizeof missing, "%s/plain", dir);
    CU_ASSERT_EQUAL(save_step(missing, 1, &s, path, sizeof path), DT_ERR_NOT_FOUND);
}

static void test_save_bad_args(void)
{
    char dir[4096], path[4400];
    float v[4] = {0};
    struct dt_ckpt_meta m = make_meta(1);
    struct dt_ckpt_tensor t[2] = {{"a", {1, {4}}, v, NULL, 0}, {"b", {1, {4}}, v, NULL, 0}};
    fresh_dir("args", dir, sizeof dir);
    t[1].shape.ndim = DT_MAX_DIMS + 1;
    CU_ASSERT_EQUAL(dt_ckpt_save(comm, dir, &m, t, 2, "", path, sizeof path), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "b has 9 dimensions"));
    t[1].shape.ndim = 0; /* a scalar: refused, with what to do instead */
    CU_ASSERT_EQUAL(dt_ckpt_save(comm, dir, &m, t, 2, "", path, sizeof path), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "b is a scalar"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "give it shape [1]"));
    t[1].shape = (struct dt_shape){3, {2, 1 << 30, 1 << 30}}; /* 2^61 values */
    CU_ASSERT_EQUAL(dt_ckpt_save(comm, dir, &m, t, 2, "", path, sizeof path), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "b is too large"));
    t[1].shape = (struct dt_shape){1, {4}};
    t[1].data = NULL;
    CU_ASSERT_EQUAL(dt_ckpt_save(comm, dir, &m, t, 2, "", path, sizeof path), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "b has no data"));
    t[1].data = v;
    snprintf(t[1].name, DT_CKPT_NAME, "a");
    CU_ASSERT_EQUAL(dt_ckpt_save(comm, dir, &m, t, 2, "", path, sizeof path), DT_ERR_INVALID_ARG);
    snprintf(t[1].name, DT_CKPT_NAME, "b");
    t[1].shape = (struct dt_shape){4, {1, 2, -1, 2}};
    CU_ASSERT_EQUAL(dt_ckpt_save(comm, dir, &m, t, 2, "", path, sizeof path), DT_ERR_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "dimension 2 is -1"));
    t[1].shape = (struct dt_shape){1, {4}};
    m.step = -1;
    CU_ASSERT_EQUAL(dt_ckpt_save(comm, dir, &m, t, 2, "", path, sizeof path), DT_ERR_INVALID_ARG);
    CU_ASSERT_EQUAL(dt_ckpt_list(dir, NULL, NULL, 0), 0);
    m.step = 1;
    CU_ASSERT_EQUAL(dt_ckpt_save(comm, dir, &m, t, 2, "", path, sizeof path), DT_OK);
}

/* Leftovers by the temporary names (a symlink to another file, a FIFO)
 * are replaced, never followed: the other file stays as it was and the
 * save neither blocks nor fails. */
static void test_save_over_stale_temps(void)
{
    char dir[4096], path[4400], victim[4400], p[4400];
    static struct set s;
    fresh_dir("stale", dir, sizeof dir);
    make_set(&s, 16);
    write_text(dir, "victim.txt", "not yours\n");
    snprintf(victim, sizeof victim, "%s/victim.txt", dir);
    snprintf(p, sizeof p, "%s/.ckpt-0000000005.h5.tmp", dir);
    CU_ASSERT_EQUAL_FATAL(symlink(victim, p), 0);
    snprintf(p, sizeof p, "%s/.latest.tmp", dir);
    CU_ASSERT_EQUAL_FATAL(symlink(victim, p), 0);
    snprintf(p, sizeof p, "%s/.ckpt-0000000006.h5.tmp", dir);
    CU_ASSERT_EQUAL_FATAL(mkfifo(p, 0600), 0);
    alarm(60);
    CU_ASSERT_EQUAL(save_step(dir, 5, &s, path, sizeof path), DT_OK);
    CU_ASSERT_EQUAL(save_step(dir, 6, &s, path, sizeof path), DT_OK);
    alarm(0);
    size_t n = 0;
    char *text = slurp(victim, &n);
    CU_ASSERT(text && n == 10 && !memcmp(text, "not yours\n", 10));
    free(text);
    struct stat sb;
    snprintf(p, sizeof p, "%s/ckpt-0000000005.h5", dir);
    CU_ASSERT(lstat(p, &sb) == 0 && S_ISREG(sb.st_mode));
    snprintf(p, sizeof p, "%s/latest", dir);
    CU_ASSERT(lstat(p, &sb) == 0 && S_ISREG(sb.st_mode));
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_OK);
}

/* Saving the same step again writes a second file, listed first and named
 * by latest; the first is left as it was. */
static void test_same_step_again(void)
{
    char dir[4096], path[4400], first[4400], latest[256];
    static struct set a, b, back;
    fresh_dir("again", dir, sizeof dir);
    make_set(&a, 10);
    make_set(&b, 11);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 5, &a, first, sizeof first), DT_OK);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 5, &b, path, sizeof path), DT_OK);
    CU_ASSERT_STRING_NOT_EQUAL(path, first);
    empty_like(&back, &b);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_load(path, NULL, back.t, NT), DT_OK);
    CU_ASSERT_EQUAL(memcmp(back.w, b.w, sizeof b.w), 0);
    empty_like(&back, &a);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_load(first, NULL, back.t, NT), DT_OK);
    CU_ASSERT_EQUAL(memcmp(back.w, a.w, sizeof a.w), 0);
    CU_ASSERT_EQUAL(dt_ckpt_list(dir, NULL, NULL, 0), 2);
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, latest, sizeof latest), DT_OK);
    CU_ASSERT_STRING_EQUAL(latest, "ckpt-0000000005-2.h5");
}

/* Verification reads a tensor larger than one slice in pieces: the
 * checksum of the pieces is the checksum of the whole, and damage in a
 * later slice is still found. */
static void test_verify_in_slices(void)
{
    enum { N1 = (1 << 22) * 2 + 3, R = 3001, C = 2003 };
    /* 3 x 7 x 11 x 13 x 1601 = 4807803 values, more than one slice: read
     * as two slices of whole rows of the first dimension */
    const struct dt_shape five = {5, {3, 7, 11, 13, 1601}};
    char dir[4096], path[4400], copy[4400];
    float *a = malloc(N1 * sizeof *a), *b = malloc((size_t)R * C * sizeof *b);
    float *c = malloc((size_t)dt_shape_numel(&five) * sizeof *c);
    CU_ASSERT_FATAL(a && b && c);
    fill(a, N1, 7);
    fill(b, (size_t)R * C, 8);
    fill(c, (size_t)dt_shape_numel(&five), 9);
    struct dt_ckpt_tensor t[3] = {
        {"params/long", {1, {N1}}, a, NULL, 0},
        {"params/wide", {2, {R, C}}, b, NULL, 0},
        {"params/five", five, c, NULL, 0}};
    struct dt_ckpt_meta m = make_meta(3);
    fresh_dir("slices", dir, sizeof dir);
    CU_ASSERT_EQUAL_FATAL(dt_ckpt_save(comm, dir, &m, t, 3, "model: mlp\n", path, sizeof path),
                          DT_OK);
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_OK);
    const struct {
        const char *name;
        int64_t elem;
    } flips[] = {{"params/long", N1 - 1},
                 {"params/long", (1 << 22) + 5},
                 {"params/wide", (int64_t)R * C - 7},
                 {"params/five", (1 << 22) + 1601 * 13 + 2},
                 {"params/five", 4807803 - 2}};
    for (size_t k = 0; k < sizeof flips / sizeof flips[0]; k++) {
        haddr_t off = data_offset(path, flips[k].name);
        CU_ASSERT_FATAL(off != HADDR_UNDEF);
        snprintf(copy, sizeof copy, "%s/flipped.h5", dir);
        copy_file(path, copy);
        flip_byte(copy, (off_t)off + 4 * flips[k].elem + 1);
        CU_ASSERT_EQUAL(dt_ckpt_verify(copy, NULL), DT_ERR_BAD_DATA);
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), flips[k].name));
        CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "checksum"));
    }
    free(a);
    free(b);
    free(c);
}

/* A tensor whose data is mostly holes of a sparse file (declared, never
 * written) is damaged: refused from the file system's own count of what
 * the file stores, without reading the holes or allocating for them. */
static void test_sparse_tensor(void)
{
    char dir[4096], path[4400], copy[4400];
    static struct set s;
    fresh_dir("sparse", dir, sizeof dir);
    make_set(&s, 21);
    CU_ASSERT_EQUAL_FATAL(save_step(dir, 5, &s, path, sizeof path), DT_OK);
    hid_t f = edit_copy(path, dir, "sparse.h5", copy, sizeof copy);
    hsize_t n = (hsize_t)1 << 24, last = n - 1, one = 1;
    hid_t sp = H5Screate_simple(1, &n, NULL), ms = H5Screate_simple(1, &one, NULL);
    hid_t d =
        H5Dcreate2(f, "params/holes", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    float v = 1.0f;
    CU_ASSERT(d >= 0 && H5Sselect_elements(sp, H5S_SELECT_SET, 1, &last) >= 0 &&
              H5Dwrite(d, H5T_NATIVE_FLOAT, ms, sp, H5P_DEFAULT, &v) >= 0);
    uint64_t sum = 0;
    hid_t as = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(d, "checksum", H5T_STD_U64LE, as, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT(a >= 0 && H5Awrite(a, H5T_NATIVE_UINT64, &sum) >= 0);
    H5Aclose(a), H5Sclose(as), H5Dclose(d), H5Sclose(ms), H5Sclose(sp);
    CU_ASSERT(H5Fclose(f) >= 0);
    struct stat sb;
    CU_ASSERT_FATAL(stat(copy, &sb) == 0);
    if ((int64_t)sb.st_blocks * 512 >= (int64_t)n) {
        printf("\n  (this file system stores no holes; the sparse case is not exercised)\n");
        return;
    }
    CU_ASSERT_EQUAL(dt_ckpt_verify(copy, NULL), DT_ERR_BAD_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "params/holes"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "holes that were never written"));
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    if (dt_comm_create("mpi", &comm) != DT_OK) {
        fprintf(stderr, "test_ckpt: %s\n", dt_last_error());
        MPI_Finalize();
        return 1;
    }
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("checkpoint", NULL, NULL);
    CU_ADD(s, test_checksum);
    CU_ADD(s, test_round_trip);
    CU_ADD(s, test_defaults_and_big_yaml);
    CU_ADD(s, test_tiny_tensors);
    CU_ADD(s, test_load_errors);
    CU_ADD(s, test_not_a_checkpoint);
    CU_ADD(s, test_damaged_not_foreign);
    CU_ADD(s, test_hostile_checkpoints);
    CU_ADD(s, test_locked_not_damaged);
    CU_ADD(s, test_reads_version_1);
    CU_ADD(s, test_nd_round_trip);
    CU_ADD(s, test_nd_damaged);
    CU_ADD(s, test_refuses_newer_version);
    CU_ADD(s, test_reads_old_files);
    CU_ADD(s, test_model_nd);
    CU_ADD(s, test_truncated);
    CU_ADD(s, test_bit_flip);
    CU_ADD(s, test_flip_everywhere);
    CU_ADD(s, test_list_order);
    CU_ADD(s, test_latest);
    CU_ADD(s, test_prune);
    CU_ADD(s, test_prune_foreign);
    CU_ADD(s, test_name_taken);
    CU_ADD(s, test_set_aside);
    CU_ADD(s, test_save_fails_file_size);
    CU_ADD(s, test_save_fails_disk_full);
    CU_ADD(s, test_save_fails_no_dir);
    CU_ADD(s, test_save_bad_args);
    CU_ADD(s, test_same_step_again);
    CU_ADD(s, test_save_over_stale_temps);
    CU_ADD(s, test_verify_in_slices);
    CU_ADD(s, test_sparse_tensor);
    int rc = cu_run_all();
    dt_comm_destroy(comm);
    MPI_Finalize();
    return rc;
}
