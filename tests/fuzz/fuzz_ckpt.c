/*
 * fuzz_ckpt.c - fuzz target: reading checkpoints and their directory
 * (io/checkpoint.h: dt_ckpt_verify, dt_ckpt_load, dt_ckpt_list,
 * dt_ckpt_latest, dt_ckpt_prune), and the job YAML a checkpoint carries
 * (dt_job_load_text, as resuming reads it).
 *
 * Structure-aware: the input drives fz_h5's builder, which writes a valid
 * HDF5 file shaped like a checkpoint (the meta attributes, the job YAML,
 * float32 tensors by name with a checksum each) with hostile content:
 * attributes of other types, sizes and values, tensors of other dtypes,
 * ranks and dimensions (huge ones declared and never written included),
 * names, layouts and checksums, and stray groups, links and named types.
 * Around it the checkpoint directory gets other files: a second checkpoint
 * (empty, garbage, a link to the first), temporary files and a `latest`
 * pointer that may name anything. Besides "no crash, no leak", the target
 * checks what checkpoint.h promises: failures say why; a checkpoint that
 * verifies also loads, tensor by tensor, with the same meta; tensor shapes
 * agree with their sizes; the list is newest first; retention never
 * removes what `latest` names and leaves no temporary file; and every HDF5
 * object dtrain opened is closed.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fz_h5.h"
#include "fz_util.h"
#include "io/checkpoint.h"
#include "runtime/config.h"

#define MAX_TENSORS 5
#define LIST_MAX 8
#define LOAD_CAP ((int64_t)1 << 20) /* floats the target allocates for one tensor */
#define JOB_BLOB_MAX 2048
#define DIR_LEN 512
#define PATH_LEN 1024

struct tensor_plan {
    char name[DT_CKPT_NAME + 64];
    int ndim;
    int64_t shape[2];
};

static const struct tensor_plan default_tensors[MAX_TENSORS] = {
    {"params/fc1.weight", 2, {4, 3}},  {"params/fc1.bias", 1, {4}},
    {"optim/m/fc1.weight", 2, {4, 3}}, {"optim/v/fc1.bias", 1, {4}},
    {"params/fc2.weight", 2, {2, 4}},
};

/* The default job as dt_job_write_yaml prints it. malloc'd. */
static char *default_job(void)
{
    struct dt_job *job = malloc(sizeof *job);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    FZ_REQUIRE(job && f, "out of memory");
    dt_job_defaults(job);
    dt_job_write_yaml(job, f);
    fclose(f);
    free(job);
    return text;
}

/* The job attribute's text: the default job, input bytes, or both. malloc'd. */
static char *job_text(struct fz_in *in)
{
    const uint8_t *raw = NULL;
    unsigned mode = fz_pick(in, 3);
    char *def = mode == 1 ? NULL : default_job();
    size_t rawlen = mode ? fz_blob(in, JOB_BLOB_MAX, &raw) : 0;
    size_t deflen = def ? strlen(def) : 0;
    char *t = malloc(deflen + rawlen + 1);
    FZ_REQUIRE(t, "out of memory");
    if (deflen) memcpy(t, def, deflen);
    if (rawlen) memcpy(t + deflen, raw, rawlen);
    t[deflen + rawlen] = '\0';
    free(def);
    return t;
}

static void meta_attrs(struct fz_in *in, hid_t f)
{
    static const char *const fmt[] = {"checkpoint"}, *const ver[] = {DT_VERSION},
                             *const opt[] = {"adamw"};
    char *job = job_text(in);
    const char *jobs[] = {job};
    struct fz_attr a[] = {
        {.name = "dtrain_format", .kind = FZ_ATTR_STR, .strs = fmt},
        {.name = "format_version", .kind = FZ_ATTR_INT, .type = H5T_STD_I32LE, .i = 1},
        {.name = "dtrain_version", .kind = FZ_ATTR_STR, .strs = ver},
        {.name = "step", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = 100},
        {.name = "epoch", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = 2},
        {.name = "batch", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = 3},
        {.name = "samples", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = 12800},
        {.name = "seed", .kind = FZ_ATTR_UINT, .type = H5T_STD_U64LE, .u = 42},
        {.name = "world", .kind = FZ_ATTR_INT, .type = H5T_STD_I32LE, .i = 2},
        {.name = "loss_scale", .kind = FZ_ATTR_FLOAT, .type = H5T_IEEE_F64LE, .f = 65536},
        {.name = "optim_t", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = 100},
        {.name = "bad_steps", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = 0},
        {.name = "rollbacks", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = 0},
        {.name = "created", .kind = FZ_ATTR_FLOAT, .type = H5T_IEEE_F64LE, .f = 1.7e9},
        {.name = "optimizer", .kind = FZ_ATTR_STR, .strs = opt},
        {.name = "job", .kind = FZ_ATTR_STR, .strs = jobs},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        fz_h5_attr(in, f, &a[i]);
    fz_h5_junk_attrs(in, f);
    free(job);
}

/* The checksum of what the dataset holds, read back as float32 (0 when
 * it cannot be read, or is too big to). */
static uint64_t stored_checksum(hid_t f, const char *name)
{
    uint64_t sum = 0;
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t s = d >= 0 ? H5Dget_space(d) : -1;
    hssize_t n =
        s >= 0 && H5Sget_simple_extent_type(s) == H5S_SIMPLE ? H5Sget_simple_extent_npoints(s) : -1;
    if (n >= 0 && n <= LOAD_CAP) {
        float *v = calloc((size_t)n + 1, sizeof *v);
        FZ_REQUIRE(v, "out of memory");
        if (n == 0 || H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0)
            sum = dt_ckpt_checksum(v, (size_t)n);
        free(v);
    }
    if (s >= 0) H5Sclose(s);
    if (d >= 0) H5Dclose(d);
    return sum;
}

/* One tensor: the plan's dataset (or a hostile one) and its checksum. */
static void tensor(struct fz_in *in, hid_t f, struct tensor_plan *p)
{
    float v[16];
    switch (fz_u8(in) % 8) {
    case 1:
        fz_str(in, p->name, DT_CKPT_NAME);
        break;
    case 2: /* a name too long to keep */
        snprintf(p->name, sizeof p->name, "params/%0*d", DT_CKPT_NAME, 7);
        break;
    case 3:
        snprintf(p->name, sizeof p->name, "params/deep/er/than/usual");
        break;
    }
    if (!p->name[0]) snprintf(p->name, sizeof p->name, "params/empty");
    for (int i = 0; i < 16; i++)
        v[i] = (float)i * 0.25f - 1.0f;
    struct fz_dset d = {.name = p->name,
                        .type = H5T_IEEE_F32LE,
                        .ndims = p->ndim,
                        .dims = {(uint64_t)p->shape[0], (uint64_t)p->shape[1]},
                        .mem_type = H5T_NATIVE_FLOAT,
                        .values = v};
    fz_h5_dataset(in, f, &d, NULL);
    struct fz_attr sum = {.name = "checksum",
                          .kind = FZ_ATTR_UINT,
                          .type = H5T_STD_U64LE,
                          .u = stored_checksum(f, p->name)};
    hid_t ds = H5Dopen2(f, p->name, H5P_DEFAULT);
    if (ds >= 0) {
        fz_h5_attr(in, ds, &sum);
        H5Dclose(ds);
    }
}

/* Objects a checkpoint does not have: a group, a named type, links. */
static void strays(struct fz_in *in, hid_t f, const char *first)
{
    hid_t g, t;
    switch (fz_u8(in) % 8) {
    case 1:
        g = H5Gcreate2(f, "group", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g >= 0) {
            fz_h5_junk_attrs(in, g);
            H5Gclose(g);
        }
        break;
    case 2:
        t = H5Tcopy(H5T_IEEE_F32LE);
        H5Tcommit2(f, "named_type", t, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Tclose(t);
        break;
    case 3:
        H5Lcreate_soft("/params", f, "soft", H5P_DEFAULT, H5P_DEFAULT);
        break;
    case 4:
        H5Lcreate_soft("/nowhere", f, "dangling", H5P_DEFAULT, H5P_DEFAULT);
        break;
    case 5:
        H5Lcreate_external("other.h5", "/x", f, "external", H5P_DEFAULT, H5P_DEFAULT);
        break;
    case 6:
        H5Lcreate_hard(f, first, f, "same_tensor", H5P_DEFAULT, H5P_DEFAULT);
        break;
    }
}

/* Writes the checkpoint file; plans get the tensors as declared. */
static int build_ckpt(struct fz_in *in, const char *path, struct tensor_plan *plans)
{
    unsigned code = fz_u8(in);
    int n = code ? (int)(code % (MAX_TENSORS + 1)) : 3;
    hid_t f = fz_h5_create(in, path);
    meta_attrs(in, f);
    memcpy(plans, default_tensors, sizeof default_tensors);
    for (int i = 0; i < n; i++)
        tensor(in, f, &plans[i]);
    strays(in, f, plans[0].name);
    fz_h5_close(f);
    return n;
}

/* The checkpoint directory around it: another file, temporary files, latest. */
static void build_dir(struct fz_in *in, const char *dir, const char *main_name)
{
    char path[PATH_LEN], latest[PATH_LEN];
    const uint8_t *raw;
    size_t rawlen;
    snprintf(path, sizeof path, "%s/ckpt-%010u.h5", dir, fz_u8(in));
    switch (fz_u8(in) % 6) {
    case 1:
        fz_write_file(path, "", 0);
        break;
    case 2:
        rawlen = fz_blob(in, 512, &raw);
        fz_write_file(path, raw, rawlen);
        break;
    case 3: { /* the same file under another step */
        char src[PATH_LEN];
        snprintf(src, sizeof src, "%s/%s", dir, main_name);
        link(src, path);
        break;
    }
    case 4:
        snprintf(path, sizeof path, "%s/.ckpt-7.h5.tmp", dir);
        fz_write_file(path, "x", 1);
        break;
    case 5:
        snprintf(path, sizeof path, "%s/.latest.tmp", dir);
        fz_write_file(path, "x", 1);
        break;
    }
    snprintf(latest, sizeof latest, "%s/latest", dir);
    switch (fz_u8(in) % 6) {
    case 1:
        break; /* none */
    case 2:
        rawlen = fz_blob(in, 512, &raw);
        fz_write_file(latest, raw, rawlen);
        break;
    case 3:
        fz_write_file(latest, "ckpt-0000000999.h5\n", 19);
        break;
    case 4:
        mkdir(latest, 0700);
        break;
    default:
        fz_write_file(latest, main_name, strlen(main_name));
    }
}

static int same_meta(const struct dt_ckpt_meta *a, const struct dt_ckpt_meta *b)
{
    return a->step == b->step && a->epoch == b->epoch && a->batch == b->batch &&
           a->samples == b->samples && a->seed == b->seed && a->world == b->world &&
           !memcmp(&a->loss_scale, &b->loss_scale, sizeof a->loss_scale) &&
           a->optim_t == b->optim_t && a->bad_steps == b->bad_steps &&
           a->rollbacks == b->rollbacks && !memcmp(&a->created, &b->created, sizeof a->created) &&
           !strcmp(a->version, b->version) && !strcmp(a->optimizer, b->optimizer);
}

/* A checkpoint that verifies loads every tensor it lists, with its meta. */
static void load_verified(const char *path, const struct dt_ckpt_info *info)
{
    struct dt_ckpt_tensor *t = calloc((size_t)info->ntensors + 1, sizeof *t);
    struct dt_ckpt_meta meta;
    int n = 0;
    FZ_REQUIRE(t, "out of memory");
    for (int i = 0; i < info->ntensors; i++) {
        const int64_t *sh = info->shape[i];
        int64_t numel = sh[0];
        FZ_REQUIRE(info->ndim[i] == 1 || info->ndim[i] == 2, "tensor %s: ndim %d", info->names[i],
                   info->ndim[i]);
        FZ_REQUIRE(sh[0] >= 0 && sh[1] >= 0, "tensor %s: shape %lld x %lld", info->names[i],
                   (long long)sh[0], (long long)sh[1]);
        FZ_REQUIRE(info->ndim[i] == 1 || !__builtin_mul_overflow(sh[0], sh[1], &numel),
                   "tensor %s: shape %lld x %lld has more elements than an int64 counts",
                   info->names[i], (long long)sh[0], (long long)sh[1]);
        FZ_REQUIRE(numel == info->numel[i], "tensor %s: numel %lld of shape %lld x %lld",
                   info->names[i], (long long)info->numel[i], (long long)sh[0], (long long)sh[1]);
        if (numel > LOAD_CAP) continue;
        memcpy(t[n].name, info->names[i], DT_CKPT_NAME);
        t[n].ndim = info->ndim[i];
        t[n].shape[0] = info->shape[i][0];
        t[n].shape[1] = info->shape[i][1];
        t[n].data = malloc((size_t)numel * sizeof(float) + 1);
        FZ_REQUIRE(t[n].data, "out of memory");
        n++;
    }
    dt_status st = dt_ckpt_load(path, &meta, t, n);
    FZ_REQUIRE(st == DT_OK, "a checkpoint that verifies does not load: %s", dt_last_error());
    FZ_REQUIRE(same_meta(&meta, &info->meta), "load and verify read different meta");
    if (n > 0) { /* the wrong shape is refused */
        t[0].shape[0] ^= 1;
        st = dt_ckpt_load(path, NULL, t, 1);
        FZ_REQUIRE(st == DT_ERR_BAD_DATA, "a tensor of another shape loaded: %s",
                   dt_status_str(st));
        fz_check_error(st, "dt_ckpt_load");
    }
    for (int i = 0; i < n; i++)
        free(t[i].data);
    free(t);
}

/* Load as a resuming run does: the tensors the model has (the plans). */
static void load_planned(const char *path, const struct tensor_plan *plans, int n)
{
    struct dt_ckpt_tensor t[MAX_TENSORS];
    float data[MAX_TENSORS][16];
    memset(t, 0, sizeof t);
    for (int i = 0; i < n; i++) {
        snprintf(t[i].name, sizeof t[i].name, "%.*s", DT_CKPT_NAME - 1, plans[i].name);
        t[i].ndim = plans[i].ndim;
        t[i].shape[0] = plans[i].shape[0];
        t[i].shape[1] = plans[i].shape[1];
        t[i].data = data[i];
    }
    dt_status st = dt_ckpt_load(path, NULL, t, n);
    if (st != DT_OK) fz_check_error(st, "dt_ckpt_load");
}

static void verify(const char *path, const struct tensor_plan *plans, int n)
{
    struct dt_ckpt_info *info = calloc(1, sizeof *info);
    struct dt_job *job = malloc(sizeof *job);
    FZ_REQUIRE(info && job, "out of memory");
    dt_status st = dt_ckpt_verify(path, info);
    fz_note("dt_ckpt_verify", st);
    if (st == DT_OK) {
        FZ_REQUIRE(info->ntensors >= 0 && info->ntensors <= DT_CKPT_MAX_TENSORS, "%d tensors",
                   info->ntensors);
        FZ_REQUIRE(info->job_yaml, "a verified checkpoint has no job");
        st = dt_job_load_text(path, info->job_yaml, job);
        if (st != DT_OK) fz_check_error(st, "dt_job_load_text");
        load_verified(path, info);
        dt_ckpt_info_free(info);
    } else {
        fz_check_error(st, "dt_ckpt_verify");
        FZ_REQUIRE(!info->job_yaml, "a failed verify kept its job text");
        load_planned(path, plans, n);
    }
    free(job);
    free(info);
}

/* List, latest and retention over the directory. */
static void directory(struct fz_in *in, const char *dir)
{
    char names[LIST_MAX][256], latest[256], path[DIR_LEN + 256];
    int64_t steps[LIST_MAX];
    struct stat sb;
    int n = dt_ckpt_list(dir, names, steps, LIST_MAX);
    for (int i = 1; i < n && i < LIST_MAX; i++)
        FZ_REQUIRE(steps[i - 1] >= steps[i], "the list is not newest first");
    /* latest naming a listed checkpoint: retention must keep that file. */
    dt_status st = dt_ckpt_latest(dir, latest, sizeof latest);
    int keep_latest = 0;
    if (st == DT_OK) {
        snprintf(path, sizeof path, "%s/%s", dir, latest);
        for (int i = 0; i < n && i < LIST_MAX; i++)
            keep_latest |= !strcmp(names[i], latest) && stat(path, &sb) == 0;
    } else {
        fz_check_error(st, "dt_ckpt_latest");
    }
    unsigned keep_code = fz_u8(in);
    int keep_last = keep_code ? (int8_t)keep_code : 2;
    int64_t keep_every = fz_i64(in, 0);
    st = dt_ckpt_prune(dir, keep_last, keep_every);
    if (st != DT_OK) fz_check_error(st, "dt_ckpt_prune");
    if (keep_latest)
        FZ_REQUIRE(stat(path, &sb) == 0, "retention removed %s, which latest names", latest);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_in in = {data, size};
    struct tensor_plan plans[MAX_TENSORS];
    char dir[DIR_LEN], path[PATH_LEN], name[64];
    fz_quiet();
    fz_h5_quiet();
    fz_scratch_path(dir, sizeof dir, "checkpoints");
    FZ_REQUIRE(mkdir(dir, 0700) == 0, "cannot make %s", dir);
    snprintf(name, sizeof name, "ckpt-%010lld.h5", (long long)(fz_u16(&in) + 100));
    snprintf(path, sizeof path, "%s/%s", dir, name);

    int n = build_ckpt(&in, path, plans);
    build_dir(&in, dir, name);
    verify(path, plans, n);
    directory(&in, dir);
    FZ_REQUIRE(fz_h5_open_objects() == 0, "dtrain left %ld HDF5 objects open",
               fz_h5_open_objects());
    fz_scratch_clear();
    return 0;
}
