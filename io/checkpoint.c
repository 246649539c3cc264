/*
 * checkpoint.c - checkpoint files (see checkpoint.h for the layout and the
 * commit protocol).
 *
 * Saving is collective. Every tensor is stored in its true shape (1 to
 * DT_MAX_DIMS dimensions); rank r of W writes the flat (row-major) elements
 * [r*n/W, (r+1)*n/W) of each tensor with one collective H5Dwrite. In the
 * tensor's N-d dataspace that range is a union of at most 2N - 1
 * hyperslab blocks (select_flat: at each dimension a partial first row,
 * whole rows, a partial last row, the partial rows split the same way one
 * dimension down), which HDF5 walks in row-major order, so the memory side
 * is a plain 1-D slice and no point list is ever built. Each rank hashes
 * only the slice it writes: the checksum is a sum of per-element terms, so
 * the partial sums are gathered and added and every rank writes the same
 * attribute without hashing the whole tensor. Rank 0's meta and job YAML
 * are broadcast first, so attribute values are identical on every rank as
 * parallel HDF5 requires.
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
 * needs no MPI. A reader trusts nothing a file declares: attributes must
 * be single values of the right type, a tensor's shape must fit in the
 * file before anything is allocated for it, links that lead out of the
 * file are refused, and meta_checksum covers the metadata HDF5's own
 * checksums leave out. A file that fails and shows any sign of having been
 * a checkpoint is reported as damaged, never as foreign. Every HDF5 call
 * holds the io/ lock, taken once per public function.
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
#include <math.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fault.h"
#include "core/log.h"
#include "core/alloc.h"
#include "core/files.h"
#include "hdf5_lock.h"
#include "outfile.h"

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
/* Files one step may have: ckpt-<step>.h5, then ckpt-<step>-2.h5 ... when
 * the names before are taken (checkpoint.h). */
#define MAX_VARIANTS 99
/* Earlier runs' checkpoint directories kept beside a run's: <dir>.1 ... */
#define MAX_SET_ASIDE 999
#define MAX_NUMEL (INT64_C(1) << 40)
#define GOLDEN UINT64_C(0x9E3779B97F4A7C15)
#define FNV_OFFSET UINT64_C(0xcbf29ce484222325)
#define FNV_PRIME UINT64_C(0x100000001b3)
#define MAX_SHORT_STR 1024 /* dtrain_format, dtrain_version, optimizer */
#define JOB_NAME "job"     /* the job YAML: a root attribute in version 1, a dataset since 2 */
/* Verification reads a tensor in slices of at most this many values, so a
 * tensor of any size is checked in bounded memory. */
#define VERIFY_SLICE ((int64_t)1 << 22)
/* A tensor that declares more bytes than HOLES_FACTOR times what the file
 * really stores (plus HOLES_SLACK) is mostly holes of a sparse file:
 * damaged, and not worth reading terabytes of zeros to find out. */
#define HOLES_FACTOR 4
#define HOLES_SLACK ((int64_t)1 << 20)

/* ---- checksum ------------------------------------------------------------ */

/* splitmix64's finaliser: every input bit affects every output bit. */
static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Sum over the n elements x[0..n) of mix64(bits(x[j]) ^ (first + j) *
 * GOLDEN), x being element `first` of its tensor: a sum, so slices hashed
 * by different ranks, or read one after another, add up to the whole. */
static uint64_t checksum_slice(const float *x, size_t first, size_t n)
{
    const uint32_t *b = (const uint32_t *)(const void *)x;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        uint64_t k = (uint64_t)(first + j) * GOLDEN;
        a0 += mix64(b[j] ^ k);
        a1 += mix64(b[j + 1] ^ (k + GOLDEN));
        a2 += mix64(b[j + 2] ^ (k + 2 * GOLDEN));
        a3 += mix64(b[j + 3] ^ (k + 3 * GOLDEN));
    }
    for (; j < n; j++)
        a0 += mix64(b[j] ^ ((uint64_t)(first + j) * GOLDEN));
    return a0 + a1 + a2 + a3;
}

/* The same over elements [begin, end) of x (x is element 0). */
static uint64_t checksum_part(const float *x, size_t begin, size_t end)
{
    return checksum_slice(x + begin, begin, end - begin);
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

/* Digits [p, end) as a number of at most MAX_STEP_DIGITS digits; 0 when
 * they are not that. */
static int parse_digits(const char *p, const char *end, int64_t *v)
{
    if (end <= p || end - p > MAX_STEP_DIGITS) return 0;
    *v = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9' || *v > (INT64_MAX - 9) / 10) return 0;
        *v = *v * 10 + (*p - '0');
    }
    return 1;
}

/* Parses "ckpt-<digits>.h5" and "ckpt-<digits>-<k>.h5" (the k-th file
 * written for that step, k >= 2, when the plain name was taken by a file
 * dtrain must not replace) and nothing else: the step, and k (1 for the
 * plain name) when variant is not NULL. */
static int parse_name_variant(const char *name, int64_t *step, int64_t *variant)
{
    size_t pl = strlen(CKPT_PREFIX), sl = strlen(CKPT_SUFFIX), len = strlen(name);
    int64_t k = 1;
    if (len <= pl + sl || strncmp(name, CKPT_PREFIX, pl) != 0 ||
        strcmp(name + len - sl, CKPT_SUFFIX) != 0)
        return 0;
    const char *digits = name + pl, *end = name + len - sl;
    const char *dash = memchr(digits, '-', (size_t)(end - digits));
    if (dash && (!parse_digits(dash + 1, end, &k) || k < 2 || k > MAX_VARIANTS || dash[1] == '0'))
        return 0;
    if (!parse_digits(digits, dash ? dash : end, step)) return 0;
    if (variant) *variant = k;
    return 1;
}

static int parse_name(const char *name, int64_t *step)
{
    return parse_name_variant(name, step, NULL);
}

static int is_temp_name(const char *name)
{
    size_t len = strlen(name), tl = strlen(TMP_SUFFIX);
    if (!strcmp(name, LATEST_TMP)) return 1;
    return !strncmp(name, TMP_PREFIX, strlen(TMP_PREFIX)) && len > tl &&
           !strcmp(name + len - tl, TMP_SUFFIX);
}

/* Elements of a tensor whose shape save_check (or open_tensor) accepted. */
static int64_t numel_of(const struct dt_shape *shape) { return dt_shape_numel(shape); }

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
    uint64_t meta_sum;
    hid_t *dsets;   /* n datasets of the open file */
    hid_t job;      /* the job YAML's dataset */
    hid_t file;
    int independent; /* data written without collective I/O (dt_ckpt_save_ex) */
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

/* A name HDF5 stores as given: components separated by single '/', none
 * empty, "." or "..", so a reader lists exactly the names that were saved. */
static int valid_tensor_name(const char *name)
{
    if (!name[0] || memchr(name, '\0', DT_CKPT_NAME) == NULL) return 0;
    for (const char *p = name;;) {
        size_t len = strcspn(p, "/");
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && !strncmp(p, "..", 2))) return 0;
        if (!p[len]) return 1;
        p += len + 1;
    }
}

static dt_status check_tensor_arg(const struct dt_ckpt_tensor *t, int i)
{
    if (!valid_tensor_name(t->name))
        return dt_set_error(DT_ERR_INVALID_ARG, "checkpoint tensor %d has no valid name", i);
    if (!strcmp(t->name, JOB_NAME))
        return dt_set_error(DT_ERR_INVALID_ARG, "checkpoint tensor name '%s' is reserved",
                            JOB_NAME);
    if (t->shape.ndim == 0)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "checkpoint tensor %s is a scalar (0 dimensions); a checkpoint holds "
                            "tensors of 1 to %d dimensions: give it shape [1]",
                            t->name, DT_MAX_DIMS);
    if (t->shape.ndim < 0 || t->shape.ndim > DT_MAX_DIMS)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "checkpoint tensor %s has %d dimensions; a checkpoint holds tensors "
                            "of 1 to %d",
                            t->name, t->shape.ndim, DT_MAX_DIMS);
    for (int d = 0; d < t->shape.ndim; d++)
        if (t->shape.dim[d] < 0)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "checkpoint tensor %s: dimension %d is %lld (never negative)",
                                t->name, d, (long long)t->shape.dim[d]);
    int64_t numel = dt_shape_numel(&t->shape);
    if (numel < 0 || numel > MAX_NUMEL)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "checkpoint tensor %s is too large (more than %lld values)", t->name,
                            (long long)MAX_NUMEL);
    if (!t->pieces) {
        if (!t->data && numel > 0)
            return dt_set_error(DT_ERR_INVALID_ARG, "checkpoint tensor %s has no data", t->name);
        return DT_OK;
    }
    uint64_t at = 0, held = 0;
    for (int j = 0; j < t->npieces; j++) {
        const struct dt_ckpt_piece *q = &t->pieces[j];
        if (q->lo < at || q->hi < q->lo || q->hi > (uint64_t)numel)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "checkpoint tensor %s: piece %d [%llu, %llu) is not after the "
                                "one before it or leaves its %lld elements",
                                t->name, j, (unsigned long long)q->lo, (unsigned long long)q->hi,
                                (long long)numel);
        at = q->hi;
        held += q->hi - q->lo;
    }
    if (t->npieces < 0 || (held > 0 && !t->data))
        return dt_set_error(DT_ERR_INVALID_ARG, "checkpoint tensor %s has no data", t->name);
    return DT_OK;
}

/* Elements of tensor t this rank writes: [lo, hi) of a whole tensor (its
 * slice), or its pieces. */
static uint64_t held_elems(const struct dt_ckpt_tensor *t)
{
    uint64_t held = 0;
    for (int j = 0; t->pieces && j < t->npieces; j++)
        held += t->pieces[j].hi - t->pieces[j].lo;
    return held;
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
        const struct dt_shape *sh = &s->t[i].shape;
        const unsigned char *p = (const unsigned char *)s->t[i].name;
        for (size_t k = 0; k <= strlen(s->t[i].name); k++)
            h = (h ^ p[k]) * UINT64_C(0x100000001b3);
        for (int d = -1; d < sh->ndim; d++) {
            int64_t v = d < 0 ? sh->ndim : sh->dim[d];
            p = (const unsigned char *)&v;
            for (size_t k = 0; k < sizeof v; k++)
                h = (h ^ p[k]) * UINT64_C(0x100000001b3);
        }
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
    uint64_t data = 0;
    for (int i = 0; i < s->n; i++)
        data += (uint64_t)numel_of(&s->t[i].shape) * sizeof(float);
    return dt_outfile_hdf5_estimate(data, (uint64_t)s->n, s->yaml ? strlen(s->yaml) : 0);
}

/* A file-size limit (ulimit -f) below the checkpoint's size fails the save
 * up front. Met inside HDF5 1.10 instead, it makes H5Fclose fail (the
 * close extends the file to its allocated size), which leaves a half-closed
 * file that crashes the process in MPI_Finalize. */
static dt_status check_fsize_limit(const struct save *s)
{
    return dt_outfile_check_limit("checkpoint", s->final, file_estimate(s));
}

/* This rank's flat slice [lo, hi) of an n-element tensor. */
static void my_slice(const struct save *s, int64_t n, uint64_t *lo, uint64_t *hi)
{
    *lo = (uint64_t)n * (uint64_t)s->rank / (uint64_t)s->world;
    *hi = (uint64_t)n * (uint64_t)(s->rank + 1) / (uint64_t)s->world;
}

/* This rank's part of tensor t's checksum sum: its slice, or its pieces. */
static uint64_t my_checksum(const struct save *s, const struct dt_ckpt_tensor *t)
{
    if (!t->pieces) {
        uint64_t lo, hi;
        my_slice(s, numel_of(&t->shape), &lo, &hi);
        return hi > lo ? checksum_part(t->data, lo, hi) : 0;
    }
    uint64_t sum = 0;
    const float *x = t->data;
    for (int j = 0; j < t->npieces; j++) {
        size_t n = (size_t)(t->pieces[j].hi - t->pieces[j].lo);
        sum += checksum_slice(x, (size_t)t->pieces[j].lo, n);
        x += n;
    }
    return sum;
}

/* Each rank hashes its slices (or pieces); the partial sums are gathered
 * and added. A tensor given in pieces must have every element held once:
 * the counts the ranks hold are gathered with the sums and must add up. */
static dt_status compute_checksums(struct save *s)
{
    size_t cnt = (size_t)s->n;
    uint64_t *mine = calloc(2 * cnt + 1, sizeof *mine);
    uint64_t *all = calloc(2 * cnt * (size_t)s->world + 1, sizeof *all);
    DT_ASSERT(mine && all);
    for (int i = 0; i < s->n; i++) {
        mine[2 * i] = my_checksum(s, &s->t[i]);
        mine[2 * i + 1] = held_elems(&s->t[i]);
    }
    dt_status st = DT_OK;
    int rc = cnt ? MPI_Allgather(mine, (int)(2 * cnt), MPI_UINT64_T, all, (int)(2 * cnt),
                                 MPI_UINT64_T, s->comm)
                 : MPI_SUCCESS;
    if (rc != MPI_SUCCESS) st = mpi_fail(s, rc, "gathering checksums");
    for (int i = 0; i < s->n && st == DT_OK; i++) {
        uint64_t sum = 0, held = 0, numel = (uint64_t)numel_of(&s->t[i].shape);
        for (int r = 0; r < s->world; r++) {
            sum += all[(size_t)r * 2 * cnt + 2 * (size_t)i];
            held += all[(size_t)r * 2 * cnt + 2 * (size_t)i + 1];
        }
        if (s->t[i].pieces && held != numel)
            st = dt_set_error(DT_ERR_INVALID_ARG,
                              "checkpoint tensor %s: the ranks hold %llu of its %llu elements "
                              "between them (each must be held once)",
                              s->t[i].name, (unsigned long long)held, (unsigned long long)numel);
        s->sums[i] = checksum_finish(sum, (size_t)numel);
    }
    free(all);
    free(mine);
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

/* ---- the meta checksum -------------------------------------------------- */

/* HDF5 checksums most of a file's metadata, but not every part of it: a
 * large attribute (a job YAML over 4 KiB) is stored unchecked, and so are
 * link names in a big group. meta_checksum covers what the tensor checksums
 * do not: the format version, every meta attribute, the strings, the job
 * YAML, and every tensor's name, shape and checksum. Tensors enter as a sum
 * of per-tensor terms, so the writer and the reader need not list them in
 * the same order. Files written before it existed have no meta_checksum
 * and are read without it. */

static uint64_t fnv_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * FNV_PRIME;
    return h;
}

/* Eight bytes, least significant first, whatever the host's byte order. */
static uint64_t fnv_u64(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        h = (h ^ ((v >> (8 * i)) & 0xff)) * FNV_PRIME;
    return h;
}

/* A tensor's term: its name, its number of dimensions, its dimensions
 * (at least two: a 1-D tensor's second is 0) and its checksum. At least
 * two because versions 1 and 2 hashed exactly that for their 1-D and 2-D
 * tensors, so their files still verify; the leading ndim keeps shapes of
 * different ranks apart. */
static uint64_t tensor_term(const char *name, const struct dt_shape *shape, uint64_t sum)
{
    uint64_t h = fnv_bytes(FNV_OFFSET, name, strlen(name) + 1);
    h = fnv_u64(h, (uint64_t)shape->ndim);
    for (int d = 0; d < shape->ndim || d < 2; d++)
        h = fnv_u64(h, d < shape->ndim ? (uint64_t)shape->dim[d] : 0);
    return mix64(fnv_u64(h, sum));
}

struct meta_text {
    const char *version, *optimizer, *job; /* as stored */
};

static uint64_t meta_checksum(const struct dt_ckpt_meta *m, int format_version,
                              const struct meta_text *txt, uint64_t tensors)
{
    struct dt_ckpt_meta copy = *m;
    struct num_attr a[NUM_META_ATTRS];
    meta_attrs(&copy, a);
    uint64_t h = fnv_u64(FNV_OFFSET, (uint64_t)(int64_t)format_version);
    for (int i = 0; i < NUM_META_ATTRS; i++) {
        uint64_t v = 0;
        if (a[i].kind == A_INT) {
            int iv;
            memcpy(&iv, a[i].v, sizeof iv);
            v = (uint64_t)(int64_t)iv;
        } else
            memcpy(&v, a[i].v, sizeof v); /* int64, uint64 or the bits of a double */
        h = fnv_u64(h, v);
    }
    if (m->has_time) { /* optional attributes: part of the sum when present */
        uint64_t bits;
        memcpy(&bits, &m->train_seconds, sizeof bits);
        h = fnv_u64(fnv_u64(h, bits), (uint64_t)m->segments);
    }
    h = fnv_bytes(h, txt->version, strlen(txt->version) + 1);
    h = fnv_bytes(h, txt->optimizer, strlen(txt->optimizer) + 1);
    h = fnv_bytes(h, txt->job, strlen(txt->job) + 1);
    return mix64(fnv_u64(h, tensors));
}

/* After compute_checksums: every rank holds the same meta, YAML and sums. */
static void compute_meta_sum(struct save *s)
{
    uint64_t tensors = 0;
    for (int i = 0; i < s->n; i++)
        tensors += tensor_term(s->t[i].name, &s->t[i].shape, s->sums[i]);
    struct meta_text txt = {s->meta.version, s->meta.optimizer, s->yaml ? s->yaml : ""};
    s->meta_sum = meta_checksum(&s->meta, DT_CKPT_FORMAT_VERSION, &txt, tensors);
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
    dt_h5_close(a);
    dt_h5_close(sp);
    return e;
}

static herr_t put_str(hid_t loc, const char *name, const char *value)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    hid_t sp = H5Screate(H5S_SCALAR);
    herr_t e = t < 0 || sp < 0 ? -1 : H5Tset_size(t, strlen(value) + 1);
    hid_t a = e < 0 ? -1 : H5Acreate2(loc, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    e = a < 0 ? -1 : H5Awrite(a, t, value);
    dt_h5_close(a);
    dt_h5_close(sp);
    dt_h5_close(t);
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
    dt_h5_close(fapl);
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
    if (e >= 0) e = put_num(s->file, "train_seconds", A_F64, &s->meta.train_seconds);
    if (e >= 0) e = put_num(s->file, "segments", A_I64, &s->meta.segments);
    if (e >= 0) e = put_str(s->file, "dtrain_version", s->meta.version);
    if (e >= 0) e = put_str(s->file, "optimizer", s->meta.optimizer);
    if (e >= 0) e = put_num(s->file, "meta_checksum", A_U64, &s->meta_sum);
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
    /* the job YAML as raw bytes: an attribute this large would be stored
     * where HDF5 keeps no checksum, and a damaged one is read out of
     * bounds by HDF5 1.10 */
    hsize_t ylen = s->yaml ? strlen(s->yaml) : 0;
    hid_t ysp = H5Screate_simple(1, &ylen, NULL);
    s->job =
        ysp < 0 ? -1 : H5Dcreate2(s->file, JOB_NAME, H5T_STD_U8LE, ysp, lcpl, dcpl, H5P_DEFAULT);
    dt_h5_close(ysp);
    if (s->job < 0) {
        st = dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot create its job", s->tmp);
        goto out;
    }
    for (int i = 0; i < s->n; i++) {
        const struct dt_ckpt_tensor *t = &s->t[i];
        hsize_t dims[DT_MAX_DIMS];
        for (int d = 0; d < t->shape.ndim; d++)
            dims[d] = (hsize_t)t->shape.dim[d];
        hid_t sp = H5Screate_simple(t->shape.ndim, dims, NULL);
        s->dsets[i] =
            sp < 0 ? -1 : H5Dcreate2(s->file, t->name, H5T_IEEE_F32LE, sp, lcpl, dcpl, H5P_DEFAULT);
        dt_h5_close(sp);
        if (s->dsets[i] < 0 || put_num(s->dsets[i], "checksum", A_U64, &s->sums[i]) < 0) {
            st = dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot create tensor %s", s->tmp, t->name);
            goto out;
        }
    }
out:
    dt_h5_close(lcpl);
    dt_h5_close(dcpl);
    return st;
}

/* A selection being built from blocks: the dimensions of the space, the
 * coordinates fixed so far (start[0..k) at depth k), and whether a block
 * has been selected yet (the first one SETs, the others OR). */
struct flat_sel {
    hid_t space;
    int ndim;
    hsize_t dims[DT_MAX_DIMS];
    hsize_t rows[DT_MAX_DIMS]; /* rows[k]: elements of one index of dimension k */
    hsize_t start[DT_MAX_DIMS];
    int any;
};

/* Adds the block that fixes start[0..k), spans `count` indices of
 * dimension k from start[k], and all of the dimensions after k. */
static herr_t add_block(struct flat_sel *f, int k, hsize_t count)
{
    hsize_t start[DT_MAX_DIMS], cnt[DT_MAX_DIMS];
    for (int d = 0; d < f->ndim; d++) {
        start[d] = d <= k ? f->start[d] : 0;
        cnt[d] = d < k ? 1 : d == k ? count : f->dims[d];
    }
    herr_t e = H5Sselect_hyperslab(f->space, f->any ? H5S_SELECT_OR : H5S_SELECT_SET, start, NULL,
                                   cnt, NULL);
    f->any = 1;
    return e;
}

/* Adds the flat elements [lo, hi) of the sub-array at depth k (the one
 * whose first k coordinates are start[0..k)): a partial first index of
 * dimension k (split one dimension down), whole indices, a partial last
 * one. At most two partial pieces per depth and one block of whole rows:
 * 2N - 1 blocks in all for an N-d space. */
static herr_t add_flat(struct flat_sel *f, int k, hsize_t lo, hsize_t hi)
{
    if (hi <= lo)
        return 0;
    hsize_t row = f->rows[k]; /* 1 at the last dimension: c0 = c1 = 0 there */
    hsize_t r0 = lo / row, c0 = lo % row, r1 = hi / row, c1 = hi % row;
    herr_t e = 0;
    if (r0 == r1) { /* within one index of dimension k (never the last) */
        f->start[k] = r0;
        return add_flat(f, k + 1, c0, c1);
    }
    if (c0) {
        f->start[k] = r0;
        e = add_flat(f, k + 1, c0, row);
        r0++;
    }
    if (e >= 0 && r1 > r0) {
        f->start[k] = r0;
        e = add_block(f, k, r1 - r0);
    }
    if (e >= 0 && c1) {
        f->start[k] = r1;
        e = add_flat(f, k + 1, 0, c1);
    }
    return e;
}

/* Selects the flat (row-major) elements of the n runs q[j] (increasing,
 * disjoint) of a space of the given shape as a union of hyperslab blocks
 * (see add_flat); nothing when they hold no element. In row-major order,
 * HDF5's order for a selection, the elements are those of the runs one
 * after another. */
static herr_t select_flat(hid_t space, const struct dt_shape *shape, const struct dt_ckpt_piece *q,
                          int n)
{
    struct flat_sel f = {.space = space, .ndim = shape->ndim};
    hsize_t row = 1;
    for (int d = f.ndim - 1; d >= 0; d--) {
        f.dims[d] = (hsize_t)shape->dim[d];
        f.rows[d] = row;
        row *= f.dims[d];
    }
    herr_t e = 0;
    for (int j = 0; j < n && e >= 0; j++)
        e = add_flat(&f, 0, (hsize_t)q[j].lo, (hsize_t)q[j].hi);
    return e >= 0 && !f.any ? H5Sselect_none(space) : e;
}

/* One collective write of this rank's slice (or pieces) of tensor i. A
 * rank whose selection fails still joins the collective call with nothing
 * selected. */
static dt_status write_slice(struct save *s, int i, hid_t dxpl)
{
    static const float nothing;
    const struct dt_ckpt_tensor *t = &s->t[i];
    struct dt_ckpt_piece slice;
    const struct dt_ckpt_piece *runs = t->pieces;
    int nruns = t->npieces;
    const float *data = t->data;
    if (!runs) {
        my_slice(s, numel_of(&t->shape), &slice.lo, &slice.hi);
        runs = &slice;
        nruns = 1;
        data = t->data + slice.lo;
    }
    uint64_t held = 0;
    for (int j = 0; j < nruns; j++)
        held += runs[j].hi - runs[j].lo;
    hsize_t mdim = held ? held : 1;
    hid_t fs = H5Dget_space(s->dsets[i]);
    hid_t ms = H5Screate_simple(1, &mdim, NULL);
    herr_t sel = fs < 0 || ms < 0 ? -1 : select_flat(fs, &t->shape, runs, nruns);
    if (sel >= 0 && !held) sel = H5Sselect_none(ms);
    if (sel < 0 && fs >= 0 && ms >= 0) {
        H5Sselect_none(fs);
        H5Sselect_none(ms);
    }
    const float *buf = held ? data : &nothing;
    herr_t e = fs < 0 || ms < 0 ? -1 : H5Dwrite(s->dsets[i], H5T_NATIVE_FLOAT, ms, fs, dxpl, buf);
    dt_status st = DT_OK;
    if (sel < 0 || e < 0) {
        /* HDF5 1.10's MPI-IO driver reports a short write without the
         * system's reason, so say whether space ran out */
        char hint[128];
        dt_outfile_free_text(s->tmp, hint, sizeof hint);
        st = dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot write tensor %s%s", s->tmp, t->name,
                         hint);
    }
    dt_h5_close(ms);
    dt_h5_close(fs);
    return st;
}

/* Rank 0 writes the job YAML; the others join the collective call with
 * nothing selected. */
static dt_status write_job(struct save *s, hid_t dxpl)
{
    hsize_t len = s->yaml ? strlen(s->yaml) : 0;
    if (len == 0) return DT_OK; /* no storage (the same on every rank) */
    hid_t fs = H5Dget_space(s->job), ms = H5Screate_simple(1, &len, NULL);
    herr_t e = fs < 0 || ms < 0 ? -1 : 0;
    if (e >= 0 && s->rank != 0) e = H5Sselect_none(fs) < 0 || H5Sselect_none(ms) < 0 ? -1 : 0;
    if (e >= 0) e = H5Dwrite(s->job, H5T_NATIVE_UCHAR, ms, fs, dxpl, s->yaml);
    dt_status st = DT_OK;
    if (e < 0) {
        char hint[128];
        dt_outfile_free_text(s->tmp, hint, sizeof hint);
        st = dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot write its job%s", s->tmp, hint);
    }
    dt_h5_close(ms);
    dt_h5_close(fs);
    return st;
}

/* Every rank writes every tensor's slice, even after a local failure, so
 * that the collective calls line up; the first failure is returned. The
 * lock is taken for each tensor. */
static dt_status write_tensors(struct save *s)
{
    dt_status st = DT_OK;
    dt_h5_lock();
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    if (dxpl < 0 ||
        H5Pset_dxpl_mpio(dxpl, s->independent ? H5FD_MPIO_INDEPENDENT : H5FD_MPIO_COLLECTIVE) < 0)
        st = dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot set up collective writes", s->tmp);
    dt_h5_unlock();
    /* a failure here is the same on every rank (no I/O yet) */
    for (int i = 0; i < s->n && dxpl >= 0; i++) {
        if (numel_of(&s->t[i].shape) == 0)
            continue; /* no storage to write (the same on every rank) */
        dt_h5_lock();
        dt_status w = write_slice(s, i, dxpl);
        dt_h5_unlock();
        if (st == DT_OK) st = w;
    }
    dt_h5_lock();
    dt_status w = dxpl >= 0 ? write_job(s, dxpl) : DT_OK;
    if (st == DT_OK) st = w;
    dt_h5_close(dxpl);
    dt_h5_unlock();
    return st;
}

/* Collective: flushes (MPI_File_sync on every rank, so each rank's data is
 * durable even across nodes) and closes the datasets and the file. */
static dt_status close_file(struct save *s, int flush)
{
    dt_status st = DT_OK;
    if (dt_h5_close(s->job) < 0)
        st = dt_h5_error(DT_ERR_IO, "checkpoint %s: cannot close its job", s->tmp);
    s->job = -1;
    for (int i = 0; i < s->n; i++)
        if (dt_h5_close(s->dsets[i]) < 0 && st == DT_OK)
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
 * fails here, cleanly (outfile.c says why that matters). */
static dt_status reserve_space(const struct save *s)
{
    return dt_outfile_reserve("checkpoint", s->tmp, file_estimate(s));
}

/* Closes the file, the lock taken for it. */
static dt_status close_locked(struct save *s, int flush)
{
    dt_h5_lock();
    dt_status st = close_file(s, flush);
    dt_h5_unlock();
    return st;
}

/* The HDF5 part: create, reserve, write, close, each stage agreed. The
 * lock is held for one stage (one tensor's write) at a time and never
 * across an agreement, so that a checkpoint written by a background
 * thread lets the loader's reads in between its calls. */
static dt_status write_file(struct save *s)
{
    dt_h5_lock();
    dt_status made = create_file(s);
    dt_h5_unlock();
    dt_status st = agree(s, made);
    if (st != DT_OK) return st;
    st = agree(s, s->rank == 0 ? reserve_space(s) : DT_OK);
    if (st != DT_OK) {
        close_locked(s, 0);
        return st;
    }
    dt_h5_lock();
    made = write_header(s);
    if (made == DT_OK) made = create_datasets(s);
    dt_h5_unlock();
    st = agree(s, made);
    if (st != DT_OK) {
        close_locked(s, 0);
        return st;
    }
    dt_status w = write_tensors(s);
    dt_status cl = close_locked(s, w == DT_OK);
    return agree(s, w != DT_OK ? w : cl);
}

/* ---- saving: the commit (rank 0) ------------------------------------------ */

/* Writes "<name>\n" to .latest.tmp, syncs it and renames it to latest. */
static dt_status write_latest(const struct save *s)
{
    char tmp[CKPT_PATH], dst[CKPT_PATH], line[80];
    snprintf(tmp, sizeof tmp, "%s/%s", s->dir, LATEST_TMP);
    snprintf(dst, sizeof dst, "%s/%s", s->dir, LATEST_FILE);
    int len = snprintf(line, sizeof line, "%s\n", s->name);
    return dt_outfile_write_small("checkpoint pointer", tmp, dst, line, (size_t)len);
}

static dt_status commit(const struct save *s)
{
    dt_outfile_release(s->tmp, file_estimate(s));
    dt_status st = dt_outfile_commit_new("checkpoint", s->tmp, s->final);
    if (st == DT_OK) st = write_latest(s);
    return st;
}

/* Rank 0's meta, with the time and version filled in when left empty. */
static void own_meta(struct save *s, const struct dt_ckpt_meta *meta)
{
    struct timespec ts;
    s->meta = *meta;
    s->meta.has_time = 1;
    if (s->meta.created <= 0 && clock_gettime(CLOCK_REALTIME, &ts) == 0)
        s->meta.created = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    if (!s->meta.version[0]) snprintf(s->meta.version, sizeof s->meta.version, "%s", DT_VERSION);
    s->meta.version[sizeof s->meta.version - 1] = '\0';
    s->meta.optimizer[sizeof s->meta.optimizer - 1] = '\0';
}

static void name_files(struct save *s, int64_t variant)
{
    long long step = (long long)s->meta.step;
    if (variant > 1)
        snprintf(s->name, sizeof s->name, CKPT_PREFIX "%010lld-%lld" CKPT_SUFFIX, step,
                 (long long)variant);
    else
        snprintf(s->name, sizeof s->name, CKPT_PREFIX "%010lld" CKPT_SUFFIX, step);
    snprintf(s->final, sizeof s->final, "%s/%s", s->dir, s->name);
    snprintf(s->tmp, sizeof s->tmp, "%s/" TMP_PREFIX "%010lld" CKPT_SUFFIX TMP_SUFFIX, s->dir,
             step);
}

/* Rank 0 picks the first of ckpt-<step>.h5, ckpt-<step>-2.h5, ... that
 * nothing occupies (a file of the user's, a FIFO, a checkpoint written
 * before: none is ever replaced), and every rank takes that name. */
static dt_status choose_name(struct save *s)
{
    int64_t variant = 1;
    dt_status st = DT_OK;
    struct stat sb;
    if (s->rank == 0) {
        for (; variant <= MAX_VARIANTS; variant++) {
            name_files(s, variant);
            if (lstat(s->final, &sb) != 0) break;
        }
        if (variant > MAX_VARIANTS) {
            name_files(s, 1);
            st = dt_set_error(DT_ERR_IO,
                              "checkpoint of step %lld: %s and the %d names after it "
                              "(ckpt-%010lld-2.h5 ...) are all taken by other files; move them "
                              "out of %s",
                              (long long)s->meta.step, s->final, MAX_VARIANTS - 1,
                              (long long)s->meta.step, s->dir);
        }
    }
    int rc = MPI_Bcast(&variant, 1, MPI_INT64_T, 0, s->comm);
    if (rc != MPI_SUCCESS) return mpi_fail(s, rc, "sharing the file name");
    name_files(s, variant > MAX_VARIANTS ? 1 : variant);
    return st;
}

dt_status dt_ckpt_save(dt_comm_t *c, const char *dir, const struct dt_ckpt_meta *meta,
                       const struct dt_ckpt_tensor *t, int n, const char *job_yaml, char *path,
                       size_t len)
{
    return dt_ckpt_save_ex(c, dir, meta, t, n, job_yaml, path, len, DT_CKPT_IO_COLLECTIVE);
}

dt_status dt_ckpt_save_ex(dt_comm_t *c, const char *dir, const struct dt_ckpt_meta *meta,
                          const struct dt_ckpt_tensor *t, int n, const char *job_yaml, char *path,
                          size_t len, enum dt_ckpt_io io)
{
    struct save s = {.dir = dir ? dir : "",
                     .t = t,
                     .n = n,
                     .yaml = job_yaml,
                     .file = -1,
                     .job = -1,
                     .independent = io == DT_CKPT_IO_INDEPENDENT};
    DT_ASSERT(c);
    s.comm = *(const MPI_Comm *)dt_comm_mpi_handle(c);
    MPI_Comm_rank(s.comm, &s.rank);
    MPI_Comm_size(s.comm, &s.world);
    snprintf(s.final, sizeof s.final, "in %s", s.dir);
    dt_status st = save_check(&s, meta);
    if (st == DT_OK && s.rank == 0) own_meta(&s, meta);
    DT_CHECK(agree(&s, st));
    DT_CHECK(share_meta(&s));
    DT_CHECK(agree(&s, choose_name(&s)));
    /* a leftover by the temporary name is stale, and whatever it is (a
     * symlink the create would follow, a FIFO it would block on) goes */
    if (s.rank == 0) unlink(s.tmp);
    st = check_same_layout(&s); /* collective: every rank runs it */
    if (st == DT_OK) st = check_fsize_limit(&s);
    DT_CHECK(agree(&s, st));
    DT_CHECK(compute_checksums(&s));
    compute_meta_sum(&s);
    st = write_file(&s);
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

/* A checkpoint open for reading (serial, sec2 driver). Lock held while it
 * is used. */
struct reader {
    const char *path;
    hid_t f;
    int64_t file_bytes;
    int64_t stored_bytes; /* the blocks the file system holds; 0: not known */
    int version;          /* format_version, once read_header has read it */
};

/* "checkpoint X is damaged: <what>", for a file that shows it was a
 * checkpoint but cannot be read as one. */
static dt_status damaged(const struct reader *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static dt_status damaged(const struct reader *r, const char *fmt, ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return dt_set_error(DT_ERR_BAD_DATA, "checkpoint %s is damaged: %s", r->path, what);
}

/* The same, with HDF5's own reason: call right after the failing call. A
 * system call that failed inside HDF5 (EIO) is an I/O error, not damage. */
static dt_status damaged_h5(const struct reader *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static dt_status damaged_h5(const struct reader *r, const char *fmt, ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (dt_h5_errno()) return dt_h5_error(DT_ERR_IO, "checkpoint %s: %s", r->path, what);
    return dt_h5_error(DT_ERR_BAD_DATA, "checkpoint %s is damaged: %s", r->path, what);
}

static dt_status open_file(struct reader *r, const char *path)
{
    r->path = path;
    r->f = -1;
    struct stat sb;
    dt_status st = dt_input_check(path, "checkpoint", &r->file_bytes);
    if (st != DT_OK)
        return st;
    r->stored_bytes = stat(path, &sb) == 0 && sb.st_blocks > 0 ? (int64_t)sb.st_blocks * 512 : 0;
    r->f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (r->f < 0) return dt_h5_open_error("checkpoint", path, " is damaged or is not an HDF5 file");
    return DT_OK;
}

static void reader_close(struct reader *r)
{
    dt_h5_close(r->f);
    r->f = -1;
}

/* "attribute 'step'" or "attribute 'checksum' of tensor T", for messages. */
static void attr_name(const char *tensor, const char *name, char *buf, size_t len)
{
    if (tensor)
        snprintf(buf, len, "attribute '%s' of tensor %s", name, tensor);
    else
        snprintf(buf, len, "attribute '%s'", name);
}

/* Opens attribute name of loc (of tensor `tensor`, NULL for the root) with
 * its type and its number of elements; a missing or unreadable one is
 * damage. */
static dt_status open_attr(const struct reader *r, hid_t loc, const char *tensor, const char *name,
                           hid_t *a, hid_t *t, hssize_t *n)
{
    char who[DT_CKPT_NAME + 64];
    attr_name(tensor, name, who, sizeof who);
    *a = *t = -1;
    htri_t e = H5Aexists(loc, name);
    if (e <= 0)
        return e < 0 ? damaged_h5(r, "cannot look up %s", who) : damaged(r, "%s is missing", who);
    hid_t sp = -1;
    *a = H5Aopen(loc, name, H5P_DEFAULT);
    if (*a < 0 || (*t = H5Aget_type(*a)) < 0 || (sp = H5Aget_space(*a)) < 0 ||
        (*n = H5Sget_simple_extent_npoints(sp)) < 0) {
        dt_status st = damaged_h5(r, "cannot read %s", who);
        dt_h5_close(sp);
        return st;
    }
    H5Sclose(sp);
    return DT_OK;
}

static void close_attr(hid_t a, hid_t t)
{
    dt_h5_close(t);
    dt_h5_close(a);
}

/* One number (of the kind's type: integers for integer kinds, integers or
 * floats for A_F64). */
static dt_status get_num(const struct reader *r, hid_t loc, const char *tensor, const char *name,
                         enum attr_kind k, void *v)
{
    char who[DT_CKPT_NAME + 64];
    hid_t a, t;
    hssize_t n = 0;
    dt_status st = open_attr(r, loc, tensor, name, &a, &t, &n);
    if (st != DT_OK) return st;
    attr_name(tensor, name, who, sizeof who);
    H5T_class_t cls = H5Tget_class(t);
    if (!(cls == H5T_INTEGER || (cls == H5T_FLOAT && k == A_F64)) || n != 1)
        st = damaged(r, "%s is not a single %s", who, k == A_F64 ? "number" : "integer");
    else if (H5Aread(a, mem_type(k), v) < 0)
        st = damaged_h5(r, "cannot read %s", who);
    close_attr(a, t);
    return st;
}

/* One fixed-length string of at most max bytes, malloc'd into *out. */
static dt_status get_str(const struct reader *r, hid_t loc, const char *name, size_t max,
                         char **out)
{
    char who[DT_CKPT_NAME + 64];
    hid_t a, t;
    hssize_t n = 0;
    *out = NULL;
    dt_status st = open_attr(r, loc, NULL, name, &a, &t, &n);
    if (st != DT_OK) return st;
    attr_name(NULL, name, who, sizeof who);
    size_t size = H5Tget_size(t);
    if (H5Tget_class(t) != H5T_STRING || H5Tis_variable_str(t) != 0 || n != 1 || size == 0)
        st = damaged(r, "%s is not a single fixed-length string", who);
    else if (size > max)
        st = damaged(r, "%s declares %zu bytes, more than %zu", who, size, max);
    else if (!(*out = calloc(size + 1, 1)))
        st = dt_set_error(DT_ERR_NOMEM, "checkpoint %s: out of memory reading %s", r->path, who);
    else if (H5Aread(a, t, *out) < 0)
        st = damaged_h5(r, "cannot read %s", who);
    if (st != DT_OK) {
        free(*out);
        *out = NULL;
    }
    close_attr(a, t);
    return st;
}

/* ---- is it a checkpoint at all? ------------------------------------------ */

/* Root attributes only a checkpoint carries (models and datasets have a
 * format_version too). */
static const char *const ckpt_attr_names[] = {
    "step",    "epoch",     "batch",     "samples", "seed",          "world",
    "optim_t", "bad_steps", "rollbacks", "job",     "meta_checksum",
};

/* H5Lvisit: stops (1) at the first dataset that has a checksum attribute. */
static herr_t find_tensor(hid_t g, const char *name, const H5L_info_t *li, void *op)
{
    (void)op;
    if (li->type != H5L_TYPE_HARD) return 0;
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    if (o < 0) return -1;
    htri_t yes = H5Iget_type(o) == H5I_DATASET ? H5Aexists(o, "checksum") : 0;
    H5Oclose(o);
    return yes < 0 ? -1 : yes > 0;
}

/* Whether the open file shows it was written as a checkpoint: a checkpoint
 * attribute on the root or a tensor with a checksum. 1 yes, 0 no, or a
 * damage status (set) when HDF5 cannot even tell. */
static int checkpoint_signs(const struct reader *r, dt_status *st)
{
    for (size_t i = 0; i < sizeof ckpt_attr_names / sizeof ckpt_attr_names[0]; i++) {
        htri_t e = H5Aexists(r->f, ckpt_attr_names[i]);
        if (e < 0) {
            *st = damaged_h5(r, "cannot look up its attributes");
            return -1;
        }
        if (e > 0) return 1;
    }
    herr_t v = H5Lvisit(r->f, H5_INDEX_NAME, H5_ITER_INC, find_tensor, NULL);
    if (v < 0) {
        *st = damaged_h5(r, "cannot list its objects");
        return -1;
    }
    return v > 0;
}

/* dtrain_format must say "checkpoint". A file that lacks it or says
 * something else is "not a dtrain checkpoint" only when nothing else in it
 * looks like one; otherwise it is a damaged checkpoint. */
static dt_status check_format(const struct reader *r)
{
    char format[MAX_SHORT_STR] = "";
    dt_status st = DT_OK;
    int has = dt_h5_read_format(r->f, format, sizeof format);
    if (has > 0 && !strcmp(format, CKPT_FORMAT)) return DT_OK;
    int signs = checkpoint_signs(r, &st);
    if (signs < 0) return st;
    const char *kind = has > 0 ? dt_h5_format_kind(format) : NULL;
    if (signs && has < 0) return damaged(r, "its dtrain_format attribute is not a string");
    if (signs && has > 0)
        return damaged(r, "its dtrain_format is '%s' but it holds checkpoint attributes", format);
    if (signs)
        return damaged(r, "its dtrain_format attribute is missing but it holds checkpoint "
                          "attributes or tensors");
    if (kind)
        return dt_set_error(DT_ERR_BAD_DATA, "checkpoint %s is not a dtrain checkpoint (it is %s)",
                            r->path, kind);
    if (has > 0)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "checkpoint %s is not a dtrain checkpoint (its dtrain_format is '%s')",
                            r->path, format);
    return dt_set_error(DT_ERR_BAD_DATA,
                        "checkpoint %s is not a dtrain checkpoint (an HDF5 file without a%s "
                        "dtrain_format attribute)",
                        r->path, has < 0 ? " readable" : "");
}

/* ---- the header: meta, job, tensor list ---------------------------------- */

/* Values no checkpoint holds are damage too. */
static dt_status check_meta_values(const struct reader *r, const struct dt_ckpt_meta *m)
{
    const char *neg = NULL;
    int64_t v = 0;
    const struct {
        const char *name;
        int64_t v;
    } counts[] = {{"step", m->step},          {"epoch", m->epoch},     {"batch", m->batch},
                  {"samples", m->samples},    {"optim_t", m->optim_t}, {"bad_steps", m->bad_steps},
                  {"rollbacks", m->rollbacks}};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0] && !neg; i++)
        if (counts[i].v < 0) {
            neg = counts[i].name;
            v = counts[i].v;
        }
    if (neg)
        return damaged(r, "attribute '%s' is %lld (it counts, so it is never negative)", neg,
                       (long long)v);
    if (m->world < 1)
        return damaged(r, "attribute 'world' is %d (a checkpoint is written by 1 or more ranks)",
                       m->world);
    if (!isfinite(m->loss_scale) || !(m->loss_scale > 0))
        return damaged(r, "attribute 'loss_scale' is %g (it must be a positive number)",
                       m->loss_scale);
    if (!isfinite(m->created))
        return damaged(r, "attribute 'created' is %g (not a time)", m->created);
    return DT_OK;
}

/* What the header holds beyond the meta. */
struct header {
    int version;          /* format_version */
    struct meta_text txt; /* malloc'd strings, as stored */
    int has_sum;
    uint64_t meta_sum;
};

static void header_free(struct header *h)
{
    free((char *)h->txt.version);
    free((char *)h->txt.optimizer);
    free((char *)h->txt.job);
    memset(h, 0, sizeof *h);
}

/* The job YAML of a version 2 or 3 file: /job, bytes the file must hold. */
static dt_status read_job(const struct reader *r, char **out)
{
    dt_status st = DT_OK;
    hsize_t len = 0;
    hid_t d = -1, sp = -1, t = -1;
    char what[CKPT_PATH + 32];
    *out = NULL;
    enum dt_h5_path p = dt_h5_hard_path(r->f, JOB_NAME);
    if (p == DT_H5_PATH_ERROR) return damaged_h5(r, "cannot look up its job");
    if (p != DT_H5_PATH_HARD)
        return damaged(r, "its job (/" JOB_NAME ") is %s",
                       p == DT_H5_PATH_LINK ? "a link to elsewhere" : "missing");
    d = H5Dopen2(r->f, JOB_NAME, H5P_DEFAULT);
    sp = d < 0 ? -1 : H5Dget_space(d);
    t = d < 0 ? -1 : H5Dget_type(d);
    if (sp < 0 || t < 0) {
        st = damaged_h5(r, "cannot open its job");
        goto out;
    }
    if (H5Tget_class(t) != H5T_INTEGER || H5Tget_size(t) != 1 ||
        H5Sget_simple_extent_ndims(sp) != 1 || H5Sget_simple_extent_dims(sp, &len, NULL) < 0 ||
        len > (hsize_t)r->file_bytes) {
        st = damaged(r, "its job is not a run of bytes the file holds");
        goto out;
    }
    snprintf(what, sizeof what, "checkpoint %s is damaged", r->path);
    struct dt_h5_storage stor = {.what = what,
                                 .file = r->path,
                                 .obj = JOB_NAME,
                                 .declared = "the job",
                                 .bytes = len,
                                 .file_bytes = r->file_bytes};
    DT_CHECK(dt_h5_check_storage(d, &stor));
    DT_CHECK(dt_malloc((size_t)len + 1, "a checkpoint's job", (void **)out));
    (*out)[len] = '\0';
    if (len > 0 && H5Dread(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out) < 0)
        st = damaged_h5(r, "cannot read its job");
out:
    if (st != DT_OK) {
        free(*out);
        *out = NULL;
    }
    dt_h5_close(t);
    dt_h5_close(sp);
    dt_h5_close(d);
    return st;
}

/* The optional train_seconds and segments (written together). */
static dt_status read_time(const struct reader *r, struct dt_ckpt_meta *m)
{
    dt_status st;
    htri_t e = H5Aexists(r->f, "train_seconds");
    if (e < 0) return damaged_h5(r, "cannot look up attribute 'train_seconds'");
    if (e == 0) return DT_OK;
    DT_CHECK(get_num(r, r->f, NULL, "train_seconds", A_F64, &m->train_seconds));
    DT_CHECK(get_num(r, r->f, NULL, "segments", A_I64, &m->segments));
    if (!isfinite(m->train_seconds) || m->train_seconds < 0 || m->segments < 0)
        return damaged(r, "attributes 'train_seconds' %g and 'segments' %lld are not a time and "
                          "a count", m->train_seconds, (long long)m->segments);
    m->has_time = 1;
out:
    return st;
}

/* Format, version and every attribute of the root. Version 1 keeps the job
 * in an attribute and may lack meta_checksum; versions 2 and 3 keep the job
 * in /job and always have it. */
static dt_status read_meta(const struct reader *r, struct dt_ckpt_meta *m, struct header *h)
{
    int version = 0;
    dt_status st;
    memset(h, 0, sizeof *h);
    DT_CHECK(check_format(r));
    DT_CHECK(get_num(r, r->f, NULL, "format_version", A_INT, &version));
    if (version < DT_CKPT_OLDEST_VERSION)
        return damaged(r, "its format version is %d, which no dtrain writes", version);
    if (version > DT_CKPT_FORMAT_VERSION)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "checkpoint %s has format version %d; this dtrain reads versions %d "
                            "to %d: use a newer dtrain",
                            r->path, version, DT_CKPT_OLDEST_VERSION, DT_CKPT_FORMAT_VERSION);
    h->version = version;
    struct num_attr a[NUM_META_ATTRS];
    memset(m, 0, sizeof *m);
    meta_attrs(m, a);
    for (int i = 0; i < NUM_META_ATTRS; i++)
        DT_CHECK(get_num(r, r->f, NULL, a[i].name, a[i].kind, a[i].v));
    DT_CHECK(get_str(r, r->f, "dtrain_version", MAX_SHORT_STR, (char **)&h->txt.version));
    DT_CHECK(get_str(r, r->f, "optimizer", MAX_SHORT_STR, (char **)&h->txt.optimizer));
    if (version == 1)
        DT_CHECK(get_str(r, r->f, JOB_NAME, (size_t)r->file_bytes, (char **)&h->txt.job));
    else
        DT_CHECK(read_job(r, (char **)&h->txt.job));
    snprintf(m->version, sizeof m->version, "%s", h->txt.version);
    snprintf(m->optimizer, sizeof m->optimizer, "%s", h->txt.optimizer);
    htri_t e = H5Aexists(r->f, "meta_checksum");
    if (e < 0) DT_CHECK(damaged_h5(r, "cannot look up attribute 'meta_checksum'"));
    h->has_sum = e > 0;
    if (!h->has_sum && version > 1) DT_CHECK(damaged(r, "attribute 'meta_checksum' is missing"));
    if (h->has_sum) DT_CHECK(get_num(r, r->f, NULL, "meta_checksum", A_U64, &h->meta_sum));
    DT_CHECK(check_meta_values(r, m));
    DT_CHECK(read_time(r, m));
out:
    if (st != DT_OK) header_free(h);
    return st;
}

/* An open tensor and what its header says. */
struct tensor_hdr {
    hid_t d;
    struct dt_shape shape;
    int64_t numel;
    uint64_t checksum;
};

/* The most dimensions a tensor of this file may have: versions 1 and 2
 * were written only with 1-D and 2-D tensors. */
static int max_dims(const struct reader *r) { return r->version >= 3 ? DT_MAX_DIMS : 2; }

/* Type, shape and checksum of tensor `name`, and that its data can be in
 * the file, all before anything is allocated for it. */
static dt_status open_tensor(const struct reader *r, const char *name, struct tensor_hdr *h)
{
    dt_status st = DT_OK;
    hsize_t dims[DT_MAX_DIMS] = {0};
    hid_t sp = -1, ty = -1;
    char shape[DT_MAX_DIMS * 21 + 8], declared[sizeof shape + 32], what[CKPT_PATH + 32];
    memset(h, 0, sizeof *h);
    h->d = -1;
    enum dt_h5_path p = dt_h5_hard_path(r->f, name);
    if (p != DT_H5_PATH_HARD) {
        if (p == DT_H5_PATH_ERROR) return damaged_h5(r, "cannot look up tensor %s", name);
        return dt_set_error(DT_ERR_BAD_DATA, "checkpoint %s: tensor %s is %s", r->path, name,
                            p == DT_H5_PATH_LINK ? "a link to elsewhere, not stored in the file"
                                                 : "missing");
    }
    h->d = H5Dopen2(r->f, name, H5P_DEFAULT);
    if (h->d < 0) {
        st = damaged_h5(r, "cannot open tensor %s", name);
        goto out;
    }
    sp = H5Dget_space(h->d);
    ty = H5Dget_type(h->d);
    int nd = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp);
    /* the number of dimensions is checked before the dimensions are read
     * into dims[DT_MAX_DIMS] */
    if (ty < 0 || H5Tget_class(ty) != H5T_FLOAT || H5Tget_size(ty) != sizeof(float) || nd < 1 ||
        nd > DT_MAX_DIMS || H5Sget_simple_extent_dims(sp, dims, NULL) < 0) {
        st = damaged_h5(r, "tensor %s is not a float32 array of 1 to %d dimensions", name,
                        DT_MAX_DIMS);
        goto out;
    }
    if (nd > max_dims(r)) {
        st = damaged(r,
                     "tensor %s has %d dimensions; a checkpoint of format version %d holds "
                     "only 1-D and 2-D tensors",
                     name, nd, r->version);
        goto out;
    }
    h->shape.ndim = nd;
    for (int d = 0; d < nd; d++)
        h->shape.dim[d] = dims[d] > INT64_MAX ? -1 : (int64_t)dims[d];
    int64_t bytes = 0;
    dt_shape_format(&h->shape, shape, sizeof shape);
    h->numel = dt_shape_numel(&h->shape);
    if (h->numel < 0 || !dt_mul_i64(h->numel, (int64_t)sizeof(float), &bytes) ||
        bytes > r->file_bytes) {
        st = damaged(r,
                     "tensor %s declares shape %s, more float32 values than the file's %lld "
                     "bytes hold",
                     name, shape, (long long)r->file_bytes);
        goto out;
    }
    if (r->stored_bytes > 0 && bytes / HOLES_FACTOR > r->stored_bytes + HOLES_SLACK) {
        st = damaged(r,
                     "tensor %s declares shape %s (%lld bytes), but the file stores only %lld "
                     "bytes: the rest are holes that were never written",
                     name, shape, (long long)bytes, (long long)r->stored_bytes);
        goto out;
    }
    snprintf(declared, sizeof declared, "shape %s", shape);
    snprintf(what, sizeof what, "checkpoint %s is damaged", r->path);
    struct dt_h5_storage stor = {.what = what,
                                 .file = r->path,
                                 .obj = name,
                                 .declared = declared,
                                 .bytes = (uint64_t)bytes,
                                 .file_bytes = r->file_bytes};
    DT_CHECK(dt_h5_check_storage(h->d, &stor));
    st = get_num(r, h->d, name, "checksum", A_U64, &h->checksum);
out:
    dt_h5_close(ty);
    dt_h5_close(sp);
    if (st != DT_OK && h->d >= 0) {
        H5Dclose(h->d);
        h->d = -1;
    }
    return st;
}

/* Reads the whole tensor into dst and checks its checksum; closes it. */
static dt_status read_tensor(const struct reader *r, struct tensor_hdr *h, const char *name,
                             float *dst)
{
    static float nothing;
    dt_status st = DT_OK;
    if (h->numel > 0 && H5Dread(h->d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
        st = damaged_h5(r, "cannot read tensor %s", name);
    else if (dt_ckpt_checksum(h->numel > 0 ? dst : &nothing, (size_t)h->numel) != h->checksum)
        st = damaged(r, "tensor %s fails its checksum", name);
    H5Dclose(h->d);
    h->d = -1;
    return st;
}

struct visit {
    const struct reader *r;
    struct dt_ckpt_info *info;
    dt_status st;
};

/* H5Lvisit callback: records every dataset's name, in name order. */
static herr_t visit_link(hid_t g, const char *name, const H5L_info_t *li, void *op)
{
    struct visit *v = op;
    if (li->type != H5L_TYPE_HARD) {
        v->st = dt_set_error(DT_ERR_BAD_DATA,
                             "checkpoint %s: %s is a link to elsewhere; a checkpoint holds "
                             "only its own tensors",
                             v->r->path, name);
        return -1;
    }
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    if (o < 0) {
        v->st = damaged_h5(v->r, "cannot open %s", name);
        return -1;
    }
    int is_dataset = H5Iget_type(o) == H5I_DATASET;
    H5Oclose(o);
    if (!is_dataset || !strcmp(name, JOB_NAME)) return 0;
    if (v->info->ntensors >= DT_CKPT_MAX_TENSORS || strlen(name) >= DT_CKPT_NAME) {
        v->st = dt_set_error(DT_ERR_BAD_DATA,
                             "checkpoint %s: more than %d tensors or a name "
                             "longer than %d (%s)",
                             v->r->path, DT_CKPT_MAX_TENSORS, DT_CKPT_NAME - 1, name);
        return -1;
    }
    snprintf(v->info->names[v->info->ntensors++], DT_CKPT_NAME, "%s", name);
    return 0;
}

/* Meta, job YAML and every tensor's name and shape into info, checked
 * against meta_checksum when the file has one. No tensor data is read. */
static dt_status read_header(struct reader *r, struct dt_ckpt_info *info)
{
    struct header h;
    dt_status st = read_meta(r, &info->meta, &h);
    if (st != DT_OK) return st;
    r->version = info->format_version = h.version;
    struct visit v = {.r = r, .info = info};
    if (H5Lvisit(r->f, H5_INDEX_NAME, H5_ITER_INC, visit_link, &v) < 0)
        DT_CHECK(v.st != DT_OK ? v.st : damaged_h5(r, "cannot list its tensors"));
    uint64_t tensors = 0;
    for (int i = 0; i < info->ntensors; i++) {
        struct tensor_hdr th;
        DT_CHECK(open_tensor(r, info->names[i], &th));
        H5Dclose(th.d);
        info->shape[i] = th.shape;
        info->numel[i] = th.numel;
        tensors += tensor_term(info->names[i], &th.shape, th.checksum);
    }
    if (h.has_sum && meta_checksum(&info->meta, h.version, &h.txt, tensors) != h.meta_sum)
        DT_CHECK(damaged(r, "its attributes or its list of tensors fail their checksum"));
    info->job_yaml = (char *)h.txt.job;
    h.txt.job = NULL;
out:
    header_free(&h);
    return st;
}

/* ---- verify ------------------------------------------------------------------- */

/* Values per slice of a tensor of this shape read in slices of at most
 * cap values: whole rows of the outermost dimension whose rows fit, so
 * that a slice is one or two hyperslab blocks that HDF5 reads as long
 * runs, not a partial row at every depth. */
static int64_t slice_step(const struct dt_shape *shape, int64_t cap)
{
    int64_t row = 1;
    for (int d = shape->ndim - 1; d > 0 && shape->dim[d] > 0 && row <= cap / shape->dim[d]; d--)
        row *= shape->dim[d];
    return cap / row * row;
}

/* Reads tensor h slice by slice into buf (cap values) and checks its
 * checksum; closes it. */
static dt_status verify_tensor(const struct reader *r, struct tensor_hdr *h, const char *name,
                               float *buf, int64_t cap)
{
    dt_status st = DT_OK;
    uint64_t sum = 0;
    int64_t step = slice_step(&h->shape, cap);
    hid_t fs = H5Dget_space(h->d);
    if (fs < 0)
        st = damaged_h5(r, "cannot read tensor %s", name);
    for (int64_t lo = 0; st == DT_OK && lo < h->numel; lo += step) {
        int64_t hi = h->numel - lo < step ? h->numel : lo + step;
        hsize_t n = (hsize_t)(hi - lo);
        hid_t ms = H5Screate_simple(1, &n, NULL);
        const struct dt_ckpt_piece run = {(uint64_t)lo, (uint64_t)hi};
        if (ms < 0 || select_flat(fs, &h->shape, &run, 1) < 0 ||
            H5Dread(h->d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, buf) < 0)
            st = damaged_h5(r, "cannot read tensor %s", name);
        else
            sum += checksum_slice(buf, (size_t)lo, (size_t)(hi - lo));
        dt_h5_close(ms);
    }
    if (st == DT_OK && checksum_finish(h->numel ? sum : 0, (size_t)h->numel) != h->checksum)
        st = damaged(r, "tensor %s fails its checksum", name);
    dt_h5_close(fs);
    H5Dclose(h->d);
    h->d = -1;
    return st;
}

/* Reads and checks every tensor listed in info. */
static dt_status verify_tensors(const struct reader *r, struct dt_ckpt_info *info)
{
    dt_status st = DT_OK;
    float *buf = NULL;
    int64_t cap = 0;
    for (int i = 0; i < info->ntensors; i++) {
        struct tensor_hdr h;
        DT_CHECK(open_tensor(r, info->names[i], &h));
        int64_t want = h.numel < VERIFY_SLICE ? h.numel : VERIFY_SLICE;
        if (want > cap) {
            free(buf);
            cap = want;
            buf = malloc((size_t)cap * sizeof *buf);
        }
        if (!buf && h.numel > 0) {
            H5Dclose(h.d);
            st = dt_set_error(DT_ERR_NOMEM, "checkpoint %s: out of memory reading tensor %s",
                              r->path, info->names[i]);
            goto out;
        }
        DT_CHECK(verify_tensor(r, &h, info->names[i], buf, cap));
    }
out:
    free(buf);
    return st;
}

static dt_status verify_locked(const char *path, struct dt_ckpt_info *info)
{
    struct reader r;
    dt_status st;
    DT_CHECK(open_file(&r, path));
    DT_CHECK(read_header(&r, info));
    DT_CHECK(verify_tensors(&r, info));
    info->file_bytes = r.file_bytes;
out:
    if (r.f >= 0 && H5Fclose(r.f) < 0 && st == DT_OK) st = damaged_h5(&r, "it cannot be closed");
    return st;
}

dt_status dt_ckpt_verify(const char *path, struct dt_ckpt_info *info)
{
    struct dt_ckpt_info *own = info ? info : malloc(sizeof *own);
    if (!own) return dt_set_error(DT_ERR_NOMEM, "checkpoint %s: out of memory", path);
    memset(own, 0, sizeof *own);
    dt_h5_lock();
    dt_status st = verify_locked(path, own);
    dt_h5_unlock();
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

/* Reads the pieces of tensor h that t holds into t->data, one after
 * another (a union of hyperslabs, so HDF5 reads only those). Their
 * checksum covers the whole tensor and is not checked here. */
static dt_status read_pieces(const struct reader *r, struct tensor_hdr *h,
                             const struct dt_ckpt_tensor *t)
{
    hsize_t held = held_elems(t);
    dt_status st = DT_OK;
    hid_t fs = held ? H5Dget_space(h->d) : H5I_INVALID_HID;
    hid_t ms = held ? H5Screate_simple(1, &held, NULL) : H5I_INVALID_HID;
    if (held && (fs < 0 || ms < 0 || select_flat(fs, &h->shape, t->pieces, t->npieces) < 0 ||
                 H5Dread(h->d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, t->data) < 0))
        st = damaged_h5(r, "cannot read tensor %s", t->name);
    dt_h5_close(ms);
    dt_h5_close(fs);
    H5Dclose(h->d);
    h->d = -1;
    return st;
}

static dt_status load_tensor(const struct reader *r, struct dt_ckpt_tensor *t)
{
    struct tensor_hdr h;
    dt_status st = t->pieces ? check_tensor_arg(t, 0) : DT_OK;
    if (st == DT_OK) st = open_tensor(r, t->name, &h);
    if (st != DT_OK) return st;
    if (!dt_shape_equal(&h.shape, &t->shape) || (!t->data && h.numel > 0)) {
        char want[DT_MAX_DIMS * 21 + 8], got[DT_MAX_DIMS * 21 + 8];
        dt_shape_format(&t->shape, want, sizeof want);
        dt_shape_format(&h.shape, got, sizeof got);
        H5Dclose(h.d);
        return dt_set_error(DT_ERR_BAD_DATA,
                            "checkpoint %s: tensor %s has shape %s, the model "
                            "expects %s",
                            r->path, t->name, got, want);
    }
    return t->pieces ? read_pieces(r, &h, t) : read_tensor(r, &h, t->name, t->data);
}

dt_status dt_ckpt_load(const char *path, struct dt_ckpt_meta *meta, struct dt_ckpt_tensor *t, int n)
{
    struct reader r = {.f = -1};
    struct dt_ckpt_info *info = calloc(1, sizeof *info);
    dt_status st = info ? DT_OK : dt_set_error(DT_ERR_NOMEM, "checkpoint %s: out of memory", path);
    if (st != DT_OK) return st;
    dt_h5_lock();
    DT_CHECK(open_file(&r, path));
    DT_CHECK(read_header(&r, info));
    for (int i = 0; i < n; i++)
        DT_CHECK(load_tensor(&r, &t[i]));
    if (meta) *meta = info->meta;
out:
    reader_close(&r);
    dt_h5_unlock();
    dt_ckpt_info_free(info);
    free(info);
    return st;
}

/* ---- the directory ------------------------------------------------------------- */

struct entry {
    int64_t step, variant;
    char name[256];
};

/* Newest first: the higher step, then the later file of one step. */
static int by_step_desc(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? 1 : -1;
    if (x->variant != y->variant) return x->variant < y->variant ? 1 : -1;
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
        int64_t step, variant;
        if (!parse_name_variant(de->d_name, &step, &variant)) continue;
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
        e[n].variant = variant;
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
    struct stat sb;
    int fd = -1;
    int64_t step = 0;
    if (len) name[0] = '\0';
    snprintf(path, sizeof path, "%s/%s", dir, LATEST_FILE);
    if (lstat(path, &sb) != 0 && (errno == ENOENT || errno == ENOTDIR))
        return dt_set_error(DT_ERR_NOT_FOUND, "checkpoint pointer %s: no such file", path);
    /* there, but a FIFO, a directory, unreadable: a pointer that says nothing */
    dt_status st = dt_input_open(path, "checkpoint pointer", &fd, NULL);
    if (st != DT_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dt_last_error());
        return dt_set_error(st == DT_ERR_IO ? st : DT_ERR_BAD_DATA, "%s", why);
    }
    ssize_t got = read(fd, line, sizeof line - 1);
    int err = errno;
    close(fd);
    if (got < 0)
        return dt_set_error(DT_ERR_IO, "checkpoint pointer %s: cannot read: %s", path,
                            strerror(err));
    line[got] = '\0';
    line[strcspn(line, "\r\n")] = '\0';
    if (!parse_name(line, &step) || strlen(line) >= len)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "checkpoint pointer %s does not name a checkpoint file in %s", path,
                            dir);
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

/* Whether dir/name opens as a dtrain checkpoint whose step attribute is
 * `step` (the one its name gives): the format and one attribute, no
 * tensor data, so retention stays cheap. When not, the reason is set. */
static int is_own_checkpoint(const char *dir, const char *name, int64_t step)
{
    char path[CKPT_PATH];
    struct reader r = {.f = -1};
    int64_t got = -1;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    dt_h5_lock();
    dt_status st = open_file(&r, path);
    if (st == DT_OK) st = check_format(&r);
    if (st == DT_OK) st = get_num(&r, r.f, NULL, "step", A_I64, &got);
    if (st == DT_OK && got != step)
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "checkpoint %s holds step %lld, not the %lld its name says", path,
                          (long long)got, (long long)step);
    reader_close(&r);
    dt_h5_unlock();
    return st == DT_OK;
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
    /* a file that only looks like one by its name takes no slot, and it is
     * not ours to remove */
    for (int i = 0, valid = 0; i < n; i++) {
        if (!is_own_checkpoint(dir, e[i].name, e[i].step)) {
            DT_LOG_WARN("ckpt",
                        "retention: leaving %s/%s alone, it is no checkpoint of step %lld: %s", dir,
                        e[i].name, (long long)e[i].step, dt_last_error());
            continue;
        }
        int keep = valid < keep_last || (keep_every > 0 && e[i].step % keep_every == 0) ||
                   !strcmp(e[i].name, latest);
        valid++;
        dt_status r = keep ? DT_OK : remove_file(dir, e[i].name, "retention");
        if (st == DT_OK) st = r;
    }
    free(e);
    return st;
}

/* ---- starting over -------------------------------------------------------- */

dt_status dt_ckpt_set_aside(const char *dir, char *moved, size_t len)
{
    char latest[CKPT_PATH], to[CKPT_PATH];
    struct stat sb;
    if (len) moved[0] = '\0';
    snprintf(latest, sizeof latest, "%s/%s", dir, LATEST_FILE);
    if (dt_ckpt_list(dir, NULL, NULL, 0) == 0 && lstat(latest, &sb) != 0)
        return DT_OK; /* nothing a resume or retention would take */
    for (int k = 1; k <= MAX_SET_ASIDE; k++) {
        snprintf(to, sizeof to, "%s.%d", dir, k);
        if (dt_outfile_rename_new(dir, to) != 0) {
            if (errno == EEXIST || errno == ENOTEMPTY) continue;
            return dt_set_error(DT_ERR_IO,
                                "cannot move the earlier run's checkpoints aside (%s to %s): %s",
                                dir, to, strerror(errno));
        }
        if (mkdir(dir, 0777) != 0)
            return dt_set_error(DT_ERR_IO,
                                "moved the earlier run's checkpoints to %s, but cannot create %s "
                                "again: %s",
                                to, dir, strerror(errno));
        snprintf(moved, len, "%s", to);
        return dt_outfile_sync_dir("checkpoint directory", dir);
    }
    return dt_set_error(DT_ERR_IO,
                        "cannot move the earlier run's checkpoints aside: %s.1 to %s.%d all exist; "
                        "remove the ones no longer needed",
                        dir, dir, MAX_SET_ASIDE);
}
