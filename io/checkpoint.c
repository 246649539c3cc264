/*
 * checkpoint.c - checkpoint files (see checkpoint.h for the layout and the
 * commit protocol).
 *
 * Saving is collective. Every tensor is stored in its true shape; rank r of
 * W writes the flat (row-major) elements [r*n/W, (r+1)*n/W) of each tensor
 * with one collective H5Dwrite. For a 2-D tensor that range becomes a union
 * of at most three hyperslabs (a partial first row, whole rows, a partial
 * last row), which HDF5 walks in row-major order, so the memory side is a
 * plain 1-D slice. Each rank hashes only the slice it writes: the checksum
 * is a sum of per-element terms, so the partial sums are gathered and added
 * and every rank writes the same attribute without hashing the whole
 * tensor. Rank 0's meta and job YAML are broadcast first, so attribute
 * values are identical on every rank as parallel HDF5 requires.
 *
 * Failures are agreed at each stage: one allreduce finds the lowest failing
 * rank, which broadcasts its status and message, so every rank returns the
 * same status and a message naming that rank and the file. The stages are
 * ordered so that every rank makes the same collective HDF5 calls whatever
 * happened locally (a failed write still reaches the collective close).
 * These exchanges use MPI directly on the communicator's MPI handle, so
 * they work on host memory whichever backend (mpi or nccl) the
 * communicator serves. Known gap: if the collective H5Fcreate succeeds on
 * some ranks and fails on others, the ranks that opened the file cannot
 * close it alone; MPI-IO reports open errors on every rank in practice.
 *
 * Reading (verify, load) is serial with HDF5's default sec2 driver and
 * needs no MPI. Every HDF5 call holds the io/ lock, taken once per public
 * function.
 */
#define _GNU_SOURCE
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <limits.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/log.h"
#include "../runtime/fault.h"
#include "hdf5_lock.h"

#define CKPT_FORMAT "checkpoint"
#define CKPT_PREFIX "ckpt-"
#define CKPT_SUFFIX ".h5"
#define TMP_PREFIX ".ckpt-"
#define TMP_SUFFIX ".tmp"
#define LATEST_FILE "latest"
#define LATEST_TMP ".latest.tmp"
#define CKPT_PATH 4352     /* a directory (PATH_MAX) plus a file name */
#define AGREE_MSG 1024     /* bytes of the failing rank's message shared */
#define MAX_STEP_DIGITS 19 /* an int64 step */
#define MAX_NUMEL (INT64_C(1) << 40)
#define GOLDEN UINT64_C(0x9E3779B97F4A7C15)
/* The file's size beyond its data (measured: ~4 KiB plus ~0.4 KiB per
 * tensor with its groups and checksum), estimated with room to spare. */
#define HEADER_BYTES 8192
#define PER_TENSOR_BYTES 1024

/* ---- checksum ------------------------------------------------------------ */

/* splitmix64's finaliser: every input bit affects every output bit. */
static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Sum over i in [begin, end) of mix64(bits(x[i]) ^ i * GOLDEN): a sum, so
 * slices hashed by different ranks add up to the whole. x is element 0. */
static uint64_t checksum_part(const float *x, size_t begin, size_t end)
{
    const uint32_t *b = (const uint32_t *)(const void *)x;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t i = begin;
    for (; i + 4 <= end; i += 4) {
        uint64_t k = (uint64_t)i * GOLDEN;
        a0 += mix64(b[i] ^ k);
        a1 += mix64(b[i + 1] ^ (k + GOLDEN));
        a2 += mix64(b[i + 2] ^ (k + 2 * GOLDEN));
        a3 += mix64(b[i + 3] ^ (k + 3 * GOLDEN));
    }
    for (; i < end; i++)
        a0 += mix64(b[i] ^ ((uint64_t)i * GOLDEN));
    return a0 + a1 + a2 + a3;
}

static uint64_t checksum_finish(uint64_t sum, size_t n)
{
    return mix64(sum ^ mix64((uint64_t)n + GOLDEN));
}

uint64_t dt_ckpt_checksum(const float *x, size_t n)
{
    return checksum_finish(n ? checksum_part(x, 0, n) : 0, n);
}

/* ---- names --------------------------------------------------------------- */

/* Parses "ckpt-<digits>.h5" (and nothing else) into its step. */
static int parse_name(const char *name, int64_t *step)
{
    size_t pl = strlen(CKPT_PREFIX), sl = strlen(CKPT_SUFFIX), len = strlen(name);
    if (len <= pl + sl || len - pl - sl > MAX_STEP_DIGITS || strncmp(name, CKPT_PREFIX, pl) != 0 ||
        strcmp(name + len - sl, CKPT_SUFFIX) != 0)
        return 0;
    int64_t v = 0;
    for (size_t i = pl; i < len - sl; i++) {
        if (name[i] < '0' || name[i] > '9' || v > (INT64_MAX - 9) / 10) return 0;
        v = v * 10 + (name[i] - '0');
    }
    *step = v;
    return 1;
}

static int is_temp_name(const char *name)
{
    size_t len = strlen(name), tl = strlen(TMP_SUFFIX);
    if (!strcmp(name, LATEST_TMP)) return 1;
    return !strncmp(name, TMP_PREFIX, strlen(TMP_PREFIX)) && len > tl &&
           !strcmp(name + len - tl, TMP_SUFFIX);
}

static int64_t numel_of(int ndim, const int64_t *shape)
{
    return ndim == 2 ? shape[0] * shape[1] : shape[0];
}

/* ---- agreement between ranks ------------------------------------------- */

struct save {
    MPI_Comm comm;
    int rank, world;
    const char *dir;
    char name[64];
    char tmp[CKPT_PATH], final[CKPT_PATH];
    struct dt_ckpt_meta meta; /* rank 0's */
    const char *yaml;         /* rank 0's (points at job_yaml there) */
    char *yaml_copy;          /* what other ranks received */
    const struct dt_ckpt_tensor *t;
    int n;
    uint64_t *sums; /* n checksums */
    hid_t *dsets;   /* n datasets of the open file */
    hid_t file;
};

struct agree_rec {
    int32_t st;
    char msg[AGREE_MSG];
};

static dt_status mpi_fail(const struct save *s, int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error code %d", rc);
    return dt_set_error(DT_ERR_COMM, "checkpoint %s: %s failed on rank %d: %s", s->final, what,
                        s->rank, text);
}

/* Every rank passes its own status; every rank gets the lowest failing
 * rank's status and message ("rank R: ..."), or DT_OK when none failed. */
static dt_status agree(const struct save *s, dt_status st)
{
    int32_t who = st != DT_OK ? s->rank : INT32_MAX;
    int rc = MPI_Allreduce(MPI_IN_PLACE, &who, 1, MPI_INT32_T, MPI_MIN, s->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(s, rc, "agreeing on the outcome");
    if (who == INT32_MAX) return DT_OK;
    struct agree_rec r = {.st = (int32_t)st};
    if (s->rank == who) snprintf(r.msg, sizeof r.msg, "%s", dt_last_error());
    rc = MPI_Bcast(&r, (int)sizeof r, MPI_BYTE, (int)who, s->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(s, rc, "sharing an error");
    r.msg[AGREE_MSG - 1] = '\0';
    if (r.st <= DT_OK || r.st >= DT_STATUS_COUNT) r.st = DT_ERR_INTERNAL;
    return dt_set_error((dt_status)r.st, "rank %d: %s", (int)who, r.msg);
}

/* ---- saving: checks and shared values --------------------------------- */

static dt_status check_tensor_arg(const struct dt_ckpt_tensor *t, int i)
{
    if (!t->name[0] || memchr(t->name, '\0', DT_CKPT_NAME) == NULL || t->name[0] == '/')
        return dt_set_error(DT_ERR_INVALID_ARG, "checkpoint tensor %d has no valid name", i);
    if (t->ndim < 1 || t->ndim > 2 || t->shape[0] < 0 || (t->ndim == 2 && t->shape[1] < 0))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "checkpoint tensor %s: ndim %d / shape not 1-D or 2-D and non-negative",
                            t->name, t->ndim);
    int64_t cols = t->ndim == 2 ? t->shape[1] : 1;
    if (cols && t->shape[0] > MAX_NUMEL / cols)
        return dt_set_error(DT_ERR_INVALID_ARG, "checkpoint tensor %s is too large", t->name);
    if (!t->data && numel_of(t->ndim, t->shape) > 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "checkpoint tensor %s has no data", t->name);
    return DT_OK;
}

/* Local checks of the arguments, and the buffers a save needs. */
static dt_status save_check(struct save *s, const struct dt_ckpt_meta *meta)
{
    struct stat sb;
    if (!meta || (!s->t && s->n > 0) || s->n < 0 || s->n > DT_CKPT_MAX_TENSORS)
        return dt_set_error(DT_ERR_INVALID_ARG, "checkpoint: bad arguments (%d tensors)", s->n);
    if (meta->step < 0)
        return dt_set_error(DT_ERR_INVALID_ARG, "checkpoint: negative step %lld",
                            (long long)meta->step);
    if (stat(s->dir, &sb) != 0)
        return dt_set_error(errno == ENOENT || errno == ENOTDIR ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                            "checkpoint directory %s: %s", s->dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return dt_set_error(DT_ERR_NOT_FOUND, "checkpoint directory %s is not a directory", s->dir);
    for (int i = 0; i < s->n; i++) {
        dt_status st = check_tensor_arg(&s->t[i], i);
        if (st != DT_OK) return st;
        for (int j = 0; j < i; j++)
            if (!strcmp(s->t[i].name, s->t[j].name))
                return dt_set_error(DT_ERR_INVALID_ARG, "checkpoint: tensor %s given twice",
                                    s->t[i].name);
    }
    s->sums = calloc((size_t)s->n + 1, sizeof *s->sums);
    s->dsets = malloc(((size_t)s->n + 1) * sizeof *s->dsets);
    if (!s->sums || !s->dsets) return dt_set_error(DT_ERR_NOMEM, "checkpoint: out of memory");
    for (int i = 0; i < s->n; i++)
        s->dsets[i] = H5I_INVALID_HID;
    return DT_OK;
}

/* Rank 0's meta and job YAML become everyone's. */
static dt_status share_meta(struct save *s)
{
    uint64_t ylen = s->rank == 0 && s->yaml ? strlen(s->yaml) : 0;
    int rc = MPI_Bcast(&s->meta, (int)sizeof s->meta, MPI_BYTE, 0, s->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Bcast(&ylen, 1, MPI_UINT64_T, 0, s->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(s, rc, "sharing the meta data");
    if (ylen > (uint64_t)INT_MAX) /* every rank sees the same length */
        return dt_set_error(DT_ERR_INVALID_ARG, "checkpoint: job YAML too large");
    if (s->rank != 0) {
        s->yaml_copy = malloc(ylen + 1);
        DT_ASSERT(s->yaml_copy); /* a few KB; failing here would strand the other ranks */
        s->yaml_copy[ylen] = '\0';
        s->yaml = s->yaml_copy;
    }
    rc = ylen ? MPI_Bcast((void *)s->yaml, (int)ylen, MPI_CHAR, 0, s->comm) : MPI_SUCCESS;
    return rc == MPI_SUCCESS ? DT_OK : mpi_fail(s, rc, "sharing the job YAML");
}

/* FNV-1a over the tensor list (names and shapes). */
static uint64_t layout_hash(const struct save *s)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (int i = 0; i < s->n; i++) {
        int64_t v[3] = {s->t[i].ndim, s->t[i].shape[0], s->t[i].ndim == 2 ? s->t[i].shape[1] : 0};
        const unsigned char *p = (const unsigned char *)s->t[i].name;
        for (size_t k = 0; k <= strlen(s->t[i].name); k++)
            h = (h ^ p[k]) * UINT64_C(0x100000001b3);
        p = (const unsigned char *)v;
        for (size_t k = 0; k < sizeof v; k++)
            h = (h ^ p[k]) * UINT64_C(0x100000001b3);
    }
    return h;
}

/* Every rank must pass the same tensors (names, shapes): checked with one
 * allgather so that a mismatch is an error, not a hang inside HDF5. */
static dt_status check_same_layout(struct save *s)
{
    uint64_t mine = layout_hash(s), *all = calloc((size_t)s->world, sizeof *all);
    DT_ASSERT(all);
    dt_status st = DT_OK;
    int rc = MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, s->comm);
    if (rc != MPI_SUCCESS) st = mpi_fail(s, rc, "comparing tensor lists");
    for (int r = 1; r < s->world && st == DT_OK; r++)
        if (all[r] != all[0])
            st = dt_set_error(DT_ERR_INVALID_ARG,
                              "checkpoint: ranks 0 and %d pass different tensor lists "
                              "(names or shapes)",
                              r);
    free(all);
    return st;
}

/* An upper estimate of the file's size: data, job YAML, metadata. */
static uint64_t file_estimate(const struct save *s)
{
    uint64_t need = HEADER_BYTES + (s->yaml ? strlen(s->yaml) : 0);
    for (int i = 0; i < s->n; i++)
        need += PER_TENSOR_BYTES + (uint64_t)numel_of(s->t[i].ndim, s->t[i].shape) * sizeof(float);
    return need;
}

/* A file-size limit (ulimit -f) below the checkpoint's size fails the save
 * up front. Met inside HDF5 1.10 instead, it makes H5Fclose fail (the
 * close extends the file to its allocated size), which leaves a half-closed
 * file that crashes the process in MPI_Finalize. */
static dt_status check_fsize_limit(const struct save *s)
{
    struct rlimit rl;
    uint64_t need = file_estimate(s);
    if (getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
        return DT_OK;
    return dt_set_error(DT_ERR_IO,
                        "checkpoint %s: the file-size limit (ulimit -f) is %llu bytes "
                        "but the checkpoint needs about %llu",
                        s->final, (unsigned long long)rl.rlim_cur, (unsigned long long)need);
}

/* This rank's flat slice [lo, hi) of an n-element tensor. */
static void my_slice(const struct save *s, int64_t n, uint64_t *lo, uint64_t *hi)
{
    *lo = (uint64_t)n * (uint64_t)s->rank / (uint64_t)s->world;
    *hi = (uint64_t)n * (uint64_t)(s->rank + 1) / (uint64_t)s->world;
}

/* Each rank hashes its slices; the partial sums are gathered and added. */
static dt_status compute_checksums(struct save *s)
{
    size_t cnt = (size_t)s->n;
    uint64_t *all = calloc(cnt * (size_t)s->world + 1, sizeof *all);
    DT_ASSERT(all);
    for (int i = 0; i < s->n; i++) {
        uint64_t lo, hi;
        my_slice(s, numel_of(s->t[i].ndim, s->t[i].shape), &lo, &hi);
        s->sums[i] = hi > lo ? checksum_part(s->t[i].data, lo, hi) : 0;
    }
    dt_status st = DT_OK;
    int rc =
        cnt ? MPI_Allgather(s->sums, (int)cnt, MPI_UINT64_T, all, (int)cnt, MPI_UINT64_T, s->comm)
            : MPI_SUCCESS;
    if (rc != MPI_SUCCESS) st = mpi_fail(s, rc, "gathering checksums");
    for (int i = 0; i < s->n && st == DT_OK; i++) {
        uint64_t sum = 0;
        for (int r = 0; r < s->world; r++)
            sum += all[(size_t)r * cnt + (size_t)i];
        s->sums[i] = checksum_finish(sum, (size_t)numel_of(s->t[i].ndim, s->t[i].shape));
    }
    free(all);
    return st;
}

/* ---- attributes ---------------------------------------------------------- */

enum attr_kind { A_I64, A_U64, A_INT, A_F64 };

struct num_attr {
    const char *name;
    enum attr_kind kind;
    void *v;
};

#define NUM_META_ATTRS 11

static void meta_attrs(struct dt_ckpt_meta *m, struct num_attr a[NUM_META_ATTRS])
{
    struct num_attr tab[NUM_META_ATTRS] = {
        {"step", A_I64, &m->step},
        {"epoch", A_I64, &m->epoch},
        {"batch", A_I64, &m->batch},
        {"samples", A_I64, &m->samples},
        {"seed", A_U64, &m->seed},
        {"world", A_INT, &m->world},
        {"loss_scale", A_F64, &m->loss_scale},
        {"optim_t", A_I64, &m->optim_t},
        {"bad_steps", A_I64, &m->bad_steps},
        {"rollbacks", A_I64, &m->rollbacks},
        {"created", A_F64, &m->created},
    };
    memcpy(a, tab, sizeof tab);
}

static hid_t mem_type(enum attr_kind k)
{
    return k == A_I64   ? H5T_NATIVE_INT64
           : k == A_U64 ? H5T_NATIVE_UINT64
           : k == A_INT ? H5T_NATIVE_INT
                        : H5T_NATIVE_DOUBLE;
}

static hid_t file_type(enum attr_kind k)
{
    return k == A_I64   ? H5T_STD_I64LE
           : k == A_U64 ? H5T_STD_U64LE
           : k == A_INT ? H5T_STD_I32LE
                        : H5T_IEEE_F64LE;
}

static herr_t put_num(hid_t loc, const char *name, enum attr_kind k, const void *v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = sp < 0 ? -1 : H5Acreate2(loc, name, file_type(k), sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = a < 0 ? -1 : H5Awrite(a, mem_type(k), v);
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    return e;
}

static herr_t put_str(hid_t loc, const char *name, const char *value)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    hid_t sp = H5Screate(H5S_SCALAR);
    herr_t e = t < 0 || sp < 0 ? -1 : H5Tset_size(t, strlen(value) + 1);
    hid_t a = e < 0 ? -1 : H5Acreate2(loc, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    e = a < 0 ? -1 : H5Awrite(a, t, value);
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    return e;
}

/* Reads a scalar fixed-length string attribute into a malloc'd string. */
static herr_t get_str(hid_t loc, const char *name, char **out)
{
    char *buf = NULL;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t t = a < 0 ? -1 : H5Aget_type(a);
    size_t size = t < 0 ? 0 : H5Tget_size(t);
    if (t >= 0 && H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) == 0 && size > 0)
        buf = calloc(size + 1, 1);
    herr_t e = buf ? H5Aread(a, t, buf) : -1;
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    if (e < 0) free(buf);
    *out = e < 0 ? NULL : buf;
    return e;
}

/* A numeric scalar attribute, converted to the kind's native type. */
static herr_t get_num(hid_t loc, const char *name, enum attr_kind k, void *v)
{
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t t = a < 0 ? -1 : H5Aget_type(a);
    H5T_class_t cls = t < 0 ? H5T_NO_CLASS : H5Tget_class(t);
    herr_t e = -1;
    if (cls == H5T_INTEGER || (cls == H5T_FLOAT && k == A_F64)) e = H5Aread(a, mem_type(k), v);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    return e;
}

/* ---- saving: the file ----------------------------------------------------- */

static dt_status create_file(struct save *s)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    herr_t e = fapl < 0 ? -1 : H5Pset_fapl_mpio(fapl, s->comm, MPI_INFO_NULL);
    /* 1.8 file format: checksummed metadata, large (dense) attributes. */
    if (e >= 0) e = H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
    s->file = e < 0 ? -1 : H5Fcreate(s->tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    dt_status st = s->file < 0
                       ? dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot create %s", s->final, s->tmp)
                       : DT_OK;
    if (fapl >= 0) H5Pclose(fapl);
    return st;
}

static dt_status write_header(struct save *s)
{
    struct num_attr a[NUM_META_ATTRS];
    meta_attrs(&s->meta, a);
    int format_version = DT_CKPT_FORMAT_VERSION;
    herr_t e = put_str(s->file, "dtrain_format", CKPT_FORMAT);
    if (e >= 0) e = put_num(s->file, "format_version", A_INT, &format_version);
    for (int i = 0; i < NUM_META_ATTRS && e >= 0; i++)
        e = put_num(s->file, a[i].name, a[i].kind, a[i].v);
    if (e >= 0) e = put_str(s->file, "dtrain_version", s->meta.version);
    if (e >= 0) e = put_str(s->file, "optimizer", s->meta.optimizer);
    if (e >= 0) e = put_str(s->file, "job", s->yaml ? s->yaml : "");
    return e < 0 ? dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot write its attributes", s->tmp)
                 : DT_OK;
}

/* Creates every dataset (collective metadata: same order on every rank),
 * with its checksum attribute. Space is allocated at creation, unfilled. */
static dt_status create_datasets(struct save *s)
{
    dt_status st = DT_OK;
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (lcpl < 0 || dcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0 ||
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0 ||
        H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) < 0) {
        st = dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot set up datasets", s->tmp);
        goto out;
    }
    for (int i = 0; i < s->n; i++) {
        const struct dt_ckpt_tensor *t = &s->t[i];
        hsize_t dims[2] = {(hsize_t)t->shape[0], t->ndim == 2 ? (hsize_t)t->shape[1] : 1};
        hid_t sp = H5Screate_simple(t->ndim, dims, NULL);
        s->dsets[i] =
            sp < 0 ? -1 : H5Dcreate2(s->file, t->name, H5T_IEEE_F32LE, sp, lcpl, dcpl, H5P_DEFAULT);
        if (sp >= 0) H5Sclose(sp);
        if (s->dsets[i] < 0 || put_num(s->dsets[i], "checksum", A_U64, &s->sums[i]) < 0) {
            st = dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot create tensor %s", s->tmp, t->name);
            goto out;
        }
    }
out:
    if (lcpl >= 0) H5Pclose(lcpl);
    if (dcpl >= 0) H5Pclose(dcpl);
    return st;
}

struct block {
    hsize_t start[2], count[2]; /* (row, col), (rows, cols) */
};

/* Selects the flat elements [lo, hi) of a row-major 1-D or 2-D space: for
 * 2-D, a partial first row, whole rows, and a partial last row. */
static herr_t select_flat(hid_t space, const struct dt_ckpt_tensor *t, uint64_t lo, uint64_t hi)
{
    if (hi <= lo) return H5Sselect_none(space);
    if (t->ndim == 1) {
        hsize_t start = lo, count = hi - lo;
        return H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, NULL, &count, NULL);
    }
    uint64_t cols = (uint64_t)t->shape[1];
    uint64_t r0 = lo / cols, c0 = lo % cols, r1 = hi / cols, c1 = hi % cols;
    struct block b[3];
    int nb = 0;
    if (r0 == r1) {
        b[nb++] = (struct block){{r0, c0}, {1, c1 - c0}};
    } else {
        if (c0) {
            b[nb++] = (struct block){{r0, c0}, {1, cols - c0}};
            r0++;
        }
        if (r1 > r0) b[nb++] = (struct block){{r0, 0}, {r1 - r0, cols}};
        if (c1) b[nb++] = (struct block){{r1, 0}, {1, c1}};
    }
    herr_t e = 0;
    for (int k = 0; k < nb && e >= 0; k++)
        e = H5Sselect_hyperslab(space, k ? H5S_SELECT_OR : H5S_SELECT_SET, b[k].start, NULL,
                                b[k].count, NULL);
    return e;
}

/* "12 KiB", "4.1 MiB", "2.0 GiB". */
static void format_bytes(double b, char *buf, size_t len)
{
    if (b < 1024.0 * 1024.0)
        snprintf(buf, len, "%.0f KiB", b / 1024.0);
    else if (b < 1024.0 * 1024.0 * 1024.0)
        snprintf(buf, len, "%.1f MiB", b / (1024.0 * 1024.0));
    else
        snprintf(buf, len, "%.1f GiB", b / (1024.0 * 1024.0 * 1024.0));
}

/* "; <n> free on its file system": HDF5 1.10's MPI-IO driver reports a
 * short write without the system's reason, so say whether space ran out. */
static void space_hint(const char *dir, char *buf, size_t len)
{
    struct statvfs v;
    char free_[32];
    buf[0] = '\0';
    if (statvfs(dir, &v) != 0) return;
    format_bytes((double)v.f_bavail * (double)v.f_frsize, free_, sizeof free_);
    snprintf(buf, len, "; %s free on its file system", free_);
}

/* One collective write of this rank's slice of tensor i. A rank whose
 * selection fails still joins the collective call with nothing selected. */
static dt_status write_slice(struct save *s, int i, hid_t dxpl)
{
    static const float nothing;
    const struct dt_ckpt_tensor *t = &s->t[i];
    uint64_t lo, hi;
    my_slice(s, numel_of(t->ndim, t->shape), &lo, &hi);
    hsize_t mdim = hi > lo ? hi - lo : 1;
    hid_t fs = H5Dget_space(s->dsets[i]);
    hid_t ms = H5Screate_simple(1, &mdim, NULL);
    herr_t sel = fs < 0 || ms < 0 ? -1 : select_flat(fs, t, lo, hi);
    if (sel >= 0 && hi <= lo) sel = H5Sselect_none(ms);
    if (sel < 0 && fs >= 0 && ms >= 0) {
        H5Sselect_none(fs);
        H5Sselect_none(ms);
    }
    const float *buf = hi > lo ? t->data + lo : &nothing;
    herr_t e = fs < 0 || ms < 0 ? -1 : H5Dwrite(s->dsets[i], H5T_NATIVE_FLOAT, ms, fs, dxpl, buf);
    dt_status st = DT_OK;
    if (sel < 0 || e < 0) {
        char hint[128];
        space_hint(s->dir, hint, sizeof hint);
        st = dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot write tensor %s%s", s->tmp, t->name,
                         hint);
    }
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    return st;
}

/* Every rank writes every tensor's slice, even after a local failure, so
 * that the collective calls line up; the first failure is returned. */
static dt_status write_tensors(struct save *s)
{
    dt_status st = DT_OK;
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    if (dxpl < 0 || H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) < 0)
        return dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot set up collective writes", s->tmp);
    for (int i = 0; i < s->n; i++) {
        if (numel_of(s->t[i].ndim, s->t[i].shape) == 0)
            continue; /* no storage to write (the same on every rank) */
        dt_status w = write_slice(s, i, dxpl);
        if (st == DT_OK) st = w;
    }
    H5Pclose(dxpl);
    return st;
}

/* Collective: flushes (MPI_File_sync on every rank, so each rank's data is
 * durable even across nodes) and closes the datasets and the file. */
static dt_status close_file(struct save *s, int flush)
{
    dt_status st = DT_OK;
    for (int i = 0; i < s->n; i++)
        if (s->dsets[i] >= 0 && H5Dclose(s->dsets[i]) < 0 && st == DT_OK)
            st = dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot close tensor %s", s->tmp,
                             s->t[i].name);
    if (flush && st == DT_OK && H5Fflush(s->file, H5F_SCOPE_GLOBAL) < 0)
        st = dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot flush", s->tmp);
    if (H5Fclose(s->file) < 0 && st == DT_OK)
        st = dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot close", s->tmp);
    s->file = -1;
    return st;
}

/* Rank 0 reserves the whole file's space right after the (still empty)
 * file is created, before any data is written: a full disk or quota then
 * fails here, cleanly. Met in the middle of a collective write instead,
 * HDF5 1.10 cannot recover: with ROMIO the ranks hang in H5Fclose, with
 * OMPIO the close fails and the process crashes in MPI_Finalize, and OMPIO
 * may even report the lost data writes as done. Blocks are reserved past
 * the end of the file (the size stays 0), so HDF5 sees the file it
 * expects; file systems without fallocate get a free-space check. */
static dt_status reserve_space(const struct save *s)
{
    uint64_t need = file_estimate(s);
    int fd = open(s->tmp, O_WRONLY | O_CLOEXEC);
    int rc = fd < 0 ? -1 : fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)need);
    int err = errno;
    char hint[128] = "";
    if (rc != 0 && fd >= 0 && (err == EOPNOTSUPP || err == ENOSYS)) {
        struct statvfs v;
        rc = statvfs(s->dir, &v) != 0 || (uint64_t)v.f_bavail * v.f_frsize >= need ? 0 : -1;
        err = ENOSPC;
    }
    if (rc != 0 && fd >= 0) /* give back what a failed fallocate kept */
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)need);
    if (fd >= 0) close(fd);
    if (rc == 0) return DT_OK;
    char size[32];
    format_bytes((double)need, size, sizeof size);
    space_hint(s->dir, hint, sizeof hint);
    return dt_set_error(DT_ERR_IO, "checkpoint %s: cannot reserve %s for it: %s%s", s->tmp, size,
                        strerror(err), hint);
}

/* The HDF5 part, lock held: create, reserve, write, close, each stage
 * agreed. */
static dt_status write_file(struct save *s)
{
    dt_status st = agree(s, create_file(s));
    if (st != DT_OK) return st;
    st = agree(s, s->rank == 0 ? reserve_space(s) : DT_OK);
    if (st != DT_OK) {
        close_file(s, 0);
        return st;
    }
    dt_status made = write_header(s);
    if (made == DT_OK) made = create_datasets(s);
    st = agree(s, made);
    if (st != DT_OK) {
        close_file(s, 0);
        return st;
    }
    dt_status w = write_tensors(s);
    dt_status cl = close_file(s, w == DT_OK);
    return agree(s, w != DT_OK ? w : cl);
}

/* ---- saving: the commit (rank 0) ------------------------------------------ */

static dt_status fsync_path(const char *path, int is_dir)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | (is_dir ? O_DIRECTORY : 0));
    int ok = fd >= 0 && (fsync(fd) == 0 || (is_dir && (errno == EINVAL || errno == EROFS)));
    int err = errno;
    if (fd >= 0) close(fd);
    return ok ? DT_OK
              : dt_set_error(DT_ERR_IO, "checkpoint: cannot sync %s: %s", path, strerror(err));
}

/* Writes "<name>\n" to .latest.tmp, syncs it and renames it to latest. */
static dt_status write_latest(const struct save *s)
{
    char tmp[CKPT_PATH], dst[CKPT_PATH], line[80];
    snprintf(tmp, sizeof tmp, "%s/%s", s->dir, LATEST_TMP);
    snprintf(dst, sizeof dst, "%s/%s", s->dir, LATEST_FILE);
    int len = snprintf(line, sizeof line, "%s\n", s->name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    int ok = fd >= 0 && write(fd, line, (size_t)len) == len && fsync(fd) == 0;
    int err = errno;
    if (fd >= 0 && close(fd) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    if (ok && rename(tmp, dst) != 0) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        unlink(tmp);
        return dt_set_error(DT_ERR_IO, "checkpoint %s: cannot update %s: %s", s->final, dst,
                            strerror(err));
    }
    return fsync_path(s->dir, 1);
}

/* Gives back reserved blocks past the end of the finished file. */
static void release_reserve(const struct save *s)
{
    struct stat sb;
    uint64_t need = file_estimate(s);
    int fd = open(s->tmp, O_WRONLY | O_CLOEXEC);
    if (fd >= 0 && fstat(fd, &sb) == 0 && (uint64_t)sb.st_size < need)
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, sb.st_size,
                  (off_t)need - sb.st_size);
    if (fd >= 0) close(fd);
}

static dt_status commit(const struct save *s)
{
    release_reserve(s);
    dt_status st = fsync_path(s->tmp, 0);
    if (st == DT_OK && rename(s->tmp, s->final) != 0)
        st = dt_set_error(DT_ERR_IO, "checkpoint %s: cannot rename %s into place: %s", s->final,
                          s->tmp, strerror(errno));
    if (st == DT_OK) st = fsync_path(s->dir, 1);
    if (st == DT_OK) st = write_latest(s);
    return st;
}

/* Rank 0's meta, with the time and version filled in when left empty. */
static void own_meta(struct save *s, const struct dt_ckpt_meta *meta)
{
    struct timespec ts;
    s->meta = *meta;
    if (s->meta.created <= 0 && clock_gettime(CLOCK_REALTIME, &ts) == 0)
        s->meta.created = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    if (!s->meta.version[0]) snprintf(s->meta.version, sizeof s->meta.version, "%s", DT_VERSION);
    s->meta.version[sizeof s->meta.version - 1] = '\0';
    s->meta.optimizer[sizeof s->meta.optimizer - 1] = '\0';
}

static void name_files(struct save *s)
{
    long long step = (long long)s->meta.step;
    snprintf(s->name, sizeof s->name, CKPT_PREFIX "%010lld" CKPT_SUFFIX, step);
    snprintf(s->final, sizeof s->final, "%s/%s", s->dir, s->name);
    snprintf(s->tmp, sizeof s->tmp, "%s/" TMP_PREFIX "%010lld" CKPT_SUFFIX TMP_SUFFIX, s->dir,
             step);
}

dt_status dt_ckpt_save(dt_comm_t *c, const char *dir, const struct dt_ckpt_meta *meta,
                       const struct dt_ckpt_tensor *t, int n, const char *job_yaml, char *path,
                       size_t len)
{
    struct save s = {.dir = dir ? dir : "", .t = t, .n = n, .yaml = job_yaml, .file = -1};
    DT_ASSERT(c);
    s.comm = *(const MPI_Comm *)dt_comm_mpi_handle(c);
    MPI_Comm_rank(s.comm, &s.rank);
    MPI_Comm_size(s.comm, &s.world);
    snprintf(s.final, sizeof s.final, "in %s", s.dir);
    dt_status st = save_check(&s, meta);
    if (st == DT_OK && s.rank == 0) own_meta(&s, meta);
    DT_CHECK(agree(&s, st));
    DT_CHECK(share_meta(&s));
    name_files(&s);
    st = check_same_layout(&s); /* collective: every rank runs it */
    if (st == DT_OK) st = check_fsize_limit(&s);
    DT_CHECK(agree(&s, st));
    DT_CHECK(compute_checksums(&s));
    dt_h5_lock();
    st = write_file(&s);
    dt_h5_unlock();
    if (st == DT_OK && dt_fault_armed("ckptkill", s.rank, s.meta.step)) {
        /* testing aid: die with the temporary file written, not committed */
        fprintf(stderr, "dtrain: rank %d: killing itself while writing %s (DTRAIN_FAULT)\n", s.rank,
                s.tmp);
        raise(SIGKILL);
    }
    if (st == DT_OK) st = agree(&s, s.rank == 0 ? commit(&s) : DT_OK);
    if (st == DT_OK && path) snprintf(path, len, "%s", s.final);
out:
    if (st != DT_OK && s.rank == 0 && s.tmp[0]) unlink(s.tmp);
    free(s.sums);
    free(s.dsets);
    free(s.yaml_copy);
    return st;
}

/* ---- reading ----------------------------------------------------------------- */

/* Opens a checkpoint read-only (sec2 driver). Lock held. */
static dt_status open_file(const char *path, hid_t *f)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return dt_set_error(errno == ENOENT || errno == ENOTDIR ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                            "checkpoint %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return dt_set_error(DT_ERR_BAD_DATA, "checkpoint %s: not a regular file", path);
    *f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (*f < 0)
        return dt_h5_error(DT_ERR_BAD_DATA,
                           "checkpoint %s: not a readable HDF5 file "
                           "(truncated or corrupt?)",
                           path);
    return DT_OK;
}

static dt_status bad_attr(const char *path, const char *name)
{
    return dt_h5_error(DT_ERR_BAD_DATA, "checkpoint %s: attribute '%s' missing or unreadable", path,
                       name);
}

/* Copies a string attribute into a fixed buffer. */
static dt_status get_fixed_str(hid_t f, const char *path, const char *name, char *dst, size_t len)
{
    char *v = NULL;
    if (get_str(f, name, &v) < 0) return bad_attr(path, name);
    snprintf(dst, len, "%s", v);
    free(v);
    return DT_OK;
}

/* Format check and every field of the meta. Lock held. */
static dt_status read_meta(hid_t f, const char *path, struct dt_ckpt_meta *m)
{
    char *format = NULL;
    int version = 0;
    dt_status st = DT_OK;
    if (get_str(f, "dtrain_format", &format) < 0 || strcmp(format, CKPT_FORMAT) != 0) {
        st = dt_set_error(DT_ERR_BAD_DATA, "checkpoint %s: not a dtrain checkpoint (format %s)",
                          path, format ? format : "missing");
        goto out;
    }
    if (get_num(f, "format_version", A_INT, &version) < 0 || version != DT_CKPT_FORMAT_VERSION) {
        st = dt_set_error(DT_ERR_BAD_DATA, "checkpoint %s: format version %d, this dtrain reads %d",
                          path, version, DT_CKPT_FORMAT_VERSION);
        goto out;
    }
    struct num_attr a[NUM_META_ATTRS];
    memset(m, 0, sizeof *m);
    meta_attrs(m, a);
    for (int i = 0; i < NUM_META_ATTRS; i++)
        if (get_num(f, a[i].name, a[i].kind, a[i].v) < 0) DT_CHECK(bad_attr(path, a[i].name));
    DT_CHECK(get_fixed_str(f, path, "dtrain_version", m->version, sizeof m->version));
    DT_CHECK(get_fixed_str(f, path, "optimizer", m->optimizer, sizeof m->optimizer));
out:
    free(format);
    return st;
}

/* An open tensor and what its header says. */
struct tensor_hdr {
    hid_t d;
    int ndim;
    int64_t shape[2];
    int64_t numel;
    uint64_t checksum;
};

static dt_status open_tensor(hid_t f, const char *path, const char *name, struct tensor_hdr *h)
{
    dt_status st = DT_OK;
    hsize_t dims[2] = {0, 1};
    hid_t sp = -1, ty = -1;
    memset(h, 0, sizeof *h);
    h->d = H5Dopen2(f, name, H5P_DEFAULT);
    if (h->d < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA, "checkpoint %s: tensor %s is missing", path, name);
        goto out;
    }
    sp = H5Dget_space(h->d);
    ty = H5Dget_type(h->d);
    h->ndim = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp);
    if (ty < 0 || H5Tget_class(ty) != H5T_FLOAT || H5Tget_size(ty) != sizeof(float) ||
        (h->ndim != 1 && h->ndim != 2) || H5Sget_simple_extent_dims(sp, dims, NULL) < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA,
                         "checkpoint %s: tensor %s is not a 1-D or 2-D float32 "
                         "array",
                         path, name);
        goto out;
    }
    h->shape[0] = (int64_t)dims[0];
    h->shape[1] = h->ndim == 2 ? (int64_t)dims[1] : 0;
    h->numel = (int64_t)(dims[0] * (h->ndim == 2 ? dims[1] : 1));
    if (get_num(h->d, "checksum", A_U64, &h->checksum) < 0)
        st = dt_h5_error(DT_ERR_BAD_DATA, "checkpoint %s: tensor %s has no checksum", path, name);
out:
    if (ty >= 0) H5Tclose(ty);
    if (sp >= 0) H5Sclose(sp);
    if (st != DT_OK && h->d >= 0) {
        H5Dclose(h->d);
        h->d = -1;
    }
    return st;
}

/* Reads the whole tensor into dst and checks its checksum; closes it. */
static dt_status read_tensor(struct tensor_hdr *h, const char *path, const char *name, float *dst)
{
    static float nothing;
    dt_status st = DT_OK;
    if (h->numel > 0 && H5Dread(h->d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
        st = dt_h5_error(DT_ERR_BAD_DATA, "checkpoint %s: cannot read tensor %s", path, name);
    else if (dt_ckpt_checksum(h->numel > 0 ? dst : &nothing, (size_t)h->numel) != h->checksum)
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "checkpoint %s: tensor %s fails its checksum (the file "
                          "is corrupt)",
                          path, name);
    H5Dclose(h->d);
    h->d = -1;
    return st;
}

/* ---- verify ------------------------------------------------------------------- */

struct visit {
    struct dt_ckpt_info *info;
    const char *path;
    dt_status st;
};

/* H5Lvisit callback: records every dataset's name, in name order. */
static herr_t visit_link(hid_t g, const char *name, const H5L_info_t *li, void *op)
{
    struct visit *v = op;
    if (li->type != H5L_TYPE_HARD) return 0;
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    if (o < 0) {
        v->st = dt_h5_error(DT_ERR_BAD_DATA, "checkpoint %s: cannot open %s", v->path, name);
        return -1;
    }
    int is_dataset = H5Iget_type(o) == H5I_DATASET;
    H5Oclose(o);
    if (!is_dataset) return 0;
    if (v->info->ntensors >= DT_CKPT_MAX_TENSORS || strlen(name) >= DT_CKPT_NAME) {
        v->st = dt_set_error(DT_ERR_BAD_DATA,
                             "checkpoint %s: more than %d tensors or a name "
                             "longer than %d (%s)",
                             v->path, DT_CKPT_MAX_TENSORS, DT_CKPT_NAME - 1, name);
        return -1;
    }
    snprintf(v->info->names[v->info->ntensors++], DT_CKPT_NAME, "%s", name);
    return 0;
}

/* Reads and checks every tensor listed in info, keeping their shapes. */
static dt_status verify_tensors(hid_t f, const char *path, struct dt_ckpt_info *info)
{
    dt_status st = DT_OK;
    float *buf = NULL;
    size_t cap = 0;
    for (int i = 0; i < info->ntensors; i++) {
        struct tensor_hdr h;
        DT_CHECK(open_tensor(f, path, info->names[i], &h));
        info->ndim[i] = h.ndim;
        info->shape[i][0] = h.shape[0];
        info->shape[i][1] = h.shape[1];
        info->numel[i] = h.numel;
        if ((size_t)h.numel > cap) {
            free(buf);
            cap = (size_t)h.numel;
            buf = malloc(cap * sizeof *buf);
        }
        if (!buf && h.numel > 0) {
            H5Dclose(h.d);
            st = dt_set_error(DT_ERR_NOMEM, "checkpoint %s: out of memory reading tensor %s", path,
                              info->names[i]);
            goto out;
        }
        DT_CHECK(read_tensor(&h, path, info->names[i], buf));
    }
out:
    free(buf);
    return st;
}

static dt_status verify_locked(const char *path, struct dt_ckpt_info *info)
{
    hid_t f = -1;
    dt_status st = DT_OK;
    DT_CHECK(open_file(path, &f));
    DT_CHECK(read_meta(f, path, &info->meta));
    if (get_str(f, "job", &info->job_yaml) < 0) DT_CHECK(bad_attr(path, "job"));
    struct visit v = {.info = info, .path = path};
    if (H5Lvisit(f, H5_INDEX_NAME, H5_ITER_INC, visit_link, &v) < 0)
        DT_CHECK(v.st != DT_OK ? v.st
                               : dt_h5_error(DT_ERR_BAD_DATA,
                                             "checkpoint %s: cannot list its "
                                             "tensors",
                                             path));
    DT_CHECK(verify_tensors(f, path, info));
out:
    if (f >= 0 && H5Fclose(f) < 0 && st == DT_OK)
        st = dt_h5_error(DT_ERR_BAD_DATA, "checkpoint %s: cannot close", path);
    return st;
}

dt_status dt_ckpt_verify(const char *path, struct dt_ckpt_info *info)
{
    struct stat sb;
    struct dt_ckpt_info *own = info ? info : malloc(sizeof *own);
    if (!own) return dt_set_error(DT_ERR_NOMEM, "checkpoint %s: out of memory", path);
    memset(own, 0, sizeof *own);
    dt_h5_lock();
    dt_status st = verify_locked(path, own);
    dt_h5_unlock();
    if (st == DT_OK && stat(path, &sb) == 0) own->file_bytes = (int64_t)sb.st_size;
    if (st != DT_OK || !info) {
        dt_ckpt_info_free(own);
        if (!info) free(own);
    }
    return st;
}

void dt_ckpt_info_free(struct dt_ckpt_info *info)
{
    if (!info) return;
    free(info->job_yaml);
    info->job_yaml = NULL;
}

/* ---- load ---------------------------------------------------------------------- */

static void shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    if (ndim == 2)
        snprintf(buf, len, "[%lld, %lld]", (long long)shape[0], (long long)shape[1]);
    else
        snprintf(buf, len, "[%lld]", (long long)shape[0]);
}

static dt_status load_tensor(hid_t f, const char *path, struct dt_ckpt_tensor *t)
{
    struct tensor_hdr h;
    dt_status st = open_tensor(f, path, t->name, &h);
    if (st != DT_OK) return st;
    int same = h.ndim == t->ndim && h.shape[0] == t->shape[0] &&
               (h.ndim == 1 || h.shape[1] == t->shape[1]);
    if (!same || (!t->data && h.numel > 0)) {
        char want[64], got[64];
        shape_str(t->ndim, t->shape, want, sizeof want);
        shape_str(h.ndim, h.shape, got, sizeof got);
        H5Dclose(h.d);
        return dt_set_error(DT_ERR_BAD_DATA,
                            "checkpoint %s: tensor %s has shape %s, the model "
                            "expects %s",
                            path, t->name, got, want);
    }
    return read_tensor(&h, path, t->name, t->data);
}

dt_status dt_ckpt_load(const char *path, struct dt_ckpt_meta *meta, struct dt_ckpt_tensor *t, int n)
{
    struct dt_ckpt_meta m;
    hid_t f = -1;
    dt_status st = DT_OK;
    dt_h5_lock();
    DT_CHECK(open_file(path, &f));
    DT_CHECK(read_meta(f, path, &m));
    for (int i = 0; i < n; i++)
        DT_CHECK(load_tensor(f, path, &t[i]));
    if (meta) *meta = m;
out:
    if (f >= 0) H5Fclose(f);
    dt_h5_unlock();
    return st;
}

/* ---- the directory ------------------------------------------------------------- */

struct entry {
    int64_t step;
    char name[256];
};

static int by_step_desc(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? 1 : -1;
    return strcmp(y->name, x->name);
}

/* Every committed checkpoint in dir, newest first, malloc'd; -1 on error. */
static int scan_dir(const char *dir, struct entry **out)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    struct entry *e = NULL;
    int n = 0, cap = 0;
    *out = NULL;
    if (!d) return 0;
    while ((de = readdir(d)) != NULL) {
        int64_t step;
        if (!parse_name(de->d_name, &step)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            struct entry *grown = realloc(e, (size_t)cap * sizeof *e);
            if (!grown) {
                n = -1;
                break;
            }
            e = grown;
        }
        e[n].step = step;
        snprintf(e[n].name, sizeof e[n].name, "%s", de->d_name);
        n++;
    }
    closedir(d);
    if (n > 0) qsort(e, (size_t)n, sizeof *e, by_step_desc);
    if (n < 0)
        free(e);
    else
        *out = e;
    return n;
}

int dt_ckpt_list(const char *dir, char (*names)[256], int64_t *steps, int max)
{
    struct entry *e;
    int n = scan_dir(dir, &e);
    for (int i = 0; i < n && i < max; i++) {
        if (names) snprintf(names[i], 256, "%s", e[i].name);
        if (steps) steps[i] = e[i].step;
    }
    free(e);
    return n < 0 ? 0 : n;
}

dt_status dt_ckpt_latest(const char *dir, char *name, size_t len)
{
    char path[CKPT_PATH], line[512] = "";
    if (len) name[0] = '\0';
    snprintf(path, sizeof path, "%s/%s", dir, LATEST_FILE);
    FILE *fp = fopen(path, "r");
    if (!fp)
        return dt_set_error(errno == ENOENT || errno == ENOTDIR ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                            "checkpoint pointer %s: %s", path, strerror(errno));
    int ok = fgets(line, sizeof line, fp) != NULL;
    fclose(fp);
    line[strcspn(line, "\r\n")] = '\0';
    if (!ok || !line[0] || strchr(line, '/') || strlen(line) >= len)
        return dt_set_error(DT_ERR_BAD_DATA, "checkpoint pointer %s does not name a file in %s",
                            path, dir);
    snprintf(name, len, "%s", line);
    return DT_OK;
}

static dt_status remove_file(const char *dir, const char *name, const char *why)
{
    char path[CKPT_PATH];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (unlink(path) != 0 && errno != ENOENT)
        return dt_set_error(DT_ERR_IO, "checkpoint retention: cannot remove %s: %s", path,
                            strerror(errno));
    DT_LOG_INFO("ckpt", "removed %s (%s)", path, why);
    return DT_OK;
}

static dt_status remove_temps(const char *dir)
{
    dt_status st = DT_OK;
    DIR *d = opendir(dir);
    struct dirent *de;
    if (!d)
        return dt_set_error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                            "checkpoint directory %s: %s", dir, strerror(errno));
    while ((de = readdir(d)) != NULL) {
        if (!is_temp_name(de->d_name)) continue;
        dt_status r = remove_file(dir, de->d_name, "stale temporary file");
        if (st == DT_OK) st = r;
    }
    closedir(d);
    return st;
}

dt_status dt_ckpt_prune(const char *dir, int keep_last, int64_t keep_every)
{
    char latest[256] = "";
    struct entry *e = NULL;
    if (keep_last < 0 || keep_every < 0)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "checkpoint retention: keep_last %d and "
                            "keep_every %lld must not be negative",
                            keep_last, (long long)keep_every);
    dt_status st = dt_ckpt_latest(dir, latest, sizeof latest);
    if (st != DT_OK && st != DT_ERR_NOT_FOUND) return st;
    st = remove_temps(dir);
    int n = scan_dir(dir, &e);
    if (n < 0 && st == DT_OK)
        st = dt_set_error(DT_ERR_NOMEM, "checkpoint retention: out of memory listing %s", dir);
    for (int i = 0; i < n; i++) {
        int keep = i < keep_last || (keep_every > 0 && e[i].step % keep_every == 0) ||
                   !strcmp(e[i].name, latest);
        dt_status r = keep ? DT_OK : remove_file(dir, e[i].name, "retention");
        if (st == DT_OK) st = r;
    }
    free(e);
    return st;
}
