/*
 * fuzz_ckpt.c - fuzz target: reading checkpoints and their directory
 * (io/checkpoint.h: dt_ckpt_verify, dt_ckpt_load, dt_ckpt_list,
 * dt_ckpt_latest, dt_ckpt_prune), and the job YAML a checkpoint carries
 * (dt_job_load_text, as resuming reads it).
 *
 * Structure-aware: the input drives fz_h5's builder, which writes a valid
 * HDF5 file shaped like a checkpoint of format version 3, 2 or 1, or of a
 * version newer than dtrain reads (the meta attributes, the job YAML as a
 * byte dataset or an attribute, float32 tensors of 1 to 4 dimensions by
 * name with a checksum each, the meta checksum) with hostile
 * content: attributes of other types, sizes and values, tensors of other
 * dtypes, ranks and dimensions (huge ones declared and never written
 * included), names, layouts and checksums, and stray groups, links and
 * named types.
 * Around it the checkpoint directory gets other files: a second checkpoint
 * (empty, garbage, a link to the first), temporary files and a `latest`
 * pointer that may name anything. Besides "no crash, no leak", the target
 * checks what checkpoint.h promises: failures say why; a checkpoint that
 * verifies also loads, tensor by tensor, with the same meta; tensor shapes
 * agree with their sizes; the list is newest first; retention never
 * removes what `latest` names nor a file that is not its own checkpoint,
 * and leaves no temporary file; and every HDF5 object dtrain opened is
 * closed.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fz_h5.h"
#include "fz_util.h"
#include "io/checkpoint.h"
#include "io/hdf5_lock.h"
#include "runtime/config/config.h"

#define MAX_TENSORS 5
#define LIST_MAX 8
#define LOAD_CAP ((int64_t)1 << 20) /* floats the target allocates for one tensor */
#define JOB_BLOB_MAX 2048
#define DIR_LEN 512
#define PATH_LEN 1024

#define PLAN_VALUES 16 /* values of the largest planned tensor */

struct tensor_plan {
    char name[DT_CKPT_NAME + 64];
    struct dt_shape shape;
    uint64_t checksum; /* of the values written */
};

static const struct tensor_plan default_tensors[MAX_TENSORS] = {
    {"params/fc1.weight", {2, {4, 3}}, 0},         {"params/fc1.bias", {1, {4}}, 0},
    {"params/conv1.weight", {4, {2, 1, 2, 2}}, 0}, {"optim/v/seq.weight", {3, {2, 2, 3}}, 0},
    {"params/fc2.weight", {2, {2, 4}}, 0},
};

/* What the builder meant the checkpoint to hold. */
struct ckpt_plan {
    struct dt_ckpt_meta meta;
    int version; /* 3 (N-d tensors); 2 (1-D and 2-D only); 1: the job in an
                    attribute, no meta checksum; or newer than dtrain reads */
    char *job;   /* malloc'd */
    int n;
    struct tensor_plan t[MAX_TENSORS];
};

/* The meta values a well-formed file has, but for its step (the one in
 * its name). */
static const struct dt_ckpt_meta good_meta = {.step = 100,
                                              .epoch = 2,
                                              .batch = 3,
                                              .samples = 12800,
                                              .seed = 42,
                                              .world = 2,
                                              .loss_scale = 65536,
                                              .optim_t = 100,
                                              .created = 1.7e9,
                                              .version = DT_VERSION,
                                              .optimizer = "adamw"};

/* ---- the meta checksum ----------------------------------------------------- */

/* checkpoint.c's meta_checksum, written again so that the builder can make
 * format-2 files that verify. The empty input must verify (checked in
 * LLVMFuzzerTestOneInput), so a change to the format fails the seeds
 * instead of silently leaving the success paths unfuzzed. */
#define FNV_OFFSET UINT64_C(0xcbf29ce484222325)
#define FNV_PRIME UINT64_C(0x100000001b3)

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static uint64_t fnv_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * FNV_PRIME;
    return h;
}

static uint64_t fnv_u64(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        h = (h ^ ((v >> (8 * i)) & 0xff)) * FNV_PRIME;
    return h;
}

static uint64_t meta_checksum(const struct ckpt_plan *p)
{
    const struct dt_ckpt_meta *m = &p->meta;
    uint64_t loss_scale, created, tensors = 0;
    memcpy(&loss_scale, &m->loss_scale, sizeof loss_scale);
    memcpy(&created, &m->created, sizeof created);
    const uint64_t fields[] = {(uint64_t)m->step,
                               (uint64_t)m->epoch,
                               (uint64_t)m->batch,
                               (uint64_t)m->samples,
                               m->seed,
                               (uint64_t)m->world,
                               loss_scale,
                               (uint64_t)m->optim_t,
                               (uint64_t)m->bad_steps,
                               (uint64_t)m->rollbacks,
                               created};
    for (int i = 0; i < p->n; i++) {
        const struct tensor_plan *t = &p->t[i];
        uint64_t h = fnv_bytes(FNV_OFFSET, t->name, strlen(t->name) + 1);
        h = fnv_u64(h, (uint64_t)t->shape.ndim);
        for (int d = 0; d < t->shape.ndim || d < 2; d++) /* at least two, 0 past ndim */
            h = fnv_u64(h, d < t->shape.ndim ? (uint64_t)t->shape.dim[d] : 0);
        tensors += mix64(fnv_u64(h, t->checksum));
    }
    uint64_t h = fnv_u64(FNV_OFFSET, (uint64_t)(int64_t)p->version);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        h = fnv_u64(h, fields[i]);
    h = fnv_bytes(h, m->version, strlen(m->version) + 1);
    h = fnv_bytes(h, m->optimizer, strlen(m->optimizer) + 1);
    h = fnv_bytes(h, p->job, strlen(p->job) + 1);
    return mix64(fnv_u64(h, tensors));
}

/* ---- building the file ----------------------------------------------------- */

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

/* The job's text: the default job, input bytes, or both. malloc'd. */
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

/* The root's attributes, and the job: an attribute in version 1, a byte
 * dataset since version 2. */
static void meta_attrs(struct fz_in *in, hid_t f, const struct ckpt_plan *p)
{
    const struct dt_ckpt_meta *m = &p->meta;
    static const char *const fmt[] = {"checkpoint"};
    const char *ver[] = {m->version}, *opt[] = {m->optimizer}, *jobs[] = {p->job};
    struct fz_attr a[] = {
        {.name = "dtrain_format", .kind = FZ_ATTR_STR, .strs = fmt},
        {.name = "format_version", .kind = FZ_ATTR_INT, .type = H5T_STD_I32LE, .i = p->version},
        {.name = "dtrain_version", .kind = FZ_ATTR_STR, .strs = ver},
        {.name = "step", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = m->step},
        {.name = "epoch", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = m->epoch},
        {.name = "batch", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = m->batch},
        {.name = "samples", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = m->samples},
        {.name = "seed", .kind = FZ_ATTR_UINT, .type = H5T_STD_U64LE, .u = m->seed},
        {.name = "world", .kind = FZ_ATTR_INT, .type = H5T_STD_I32LE, .i = m->world},
        {.name = "loss_scale", .kind = FZ_ATTR_FLOAT, .type = H5T_IEEE_F64LE, .f = m->loss_scale},
        {.name = "optim_t", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = m->optim_t},
        {.name = "bad_steps", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = m->bad_steps},
        {.name = "rollbacks", .kind = FZ_ATTR_INT, .type = H5T_STD_I64LE, .i = m->rollbacks},
        {.name = "created", .kind = FZ_ATTR_FLOAT, .type = H5T_IEEE_F64LE, .f = m->created},
        {.name = "optimizer", .kind = FZ_ATTR_STR, .strs = opt},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        fz_h5_attr(in, f, &a[i]);
    if (p->version == 1) {
        struct fz_attr job = {.name = "job", .kind = FZ_ATTR_STR, .strs = jobs};
        fz_h5_attr(in, f, &job);
    } else {
        struct fz_dset job = {.name = "job",
                              .type = H5T_STD_U8LE,
                              .ndims = 1,
                              .dims = {strlen(p->job)},
                              .mem_type = H5T_NATIVE_UCHAR,
                              .values = p->job};
        fz_h5_dataset(in, f, &job, NULL);
    }
    fz_h5_junk_attrs(in, f);
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
    dt_h5_close(s);
    dt_h5_close(d);
    return sum;
}

/* One tensor: the plan's dataset (or a hostile one) and its checksum. */
static void tensor(struct fz_in *in, hid_t f, struct tensor_plan *p)
{
    float v[PLAN_VALUES];
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
    for (int i = 0; i < PLAN_VALUES; i++)
        v[i] = (float)i * 0.25f - 1.0f;
    struct fz_dset d = {.name = p->name,
                        .type = H5T_IEEE_F32LE,
                        .ndims = p->shape.ndim,
                        .mem_type = H5T_NATIVE_FLOAT,
                        .values = v};
    for (int k = 0; k < p->shape.ndim && k < FZ_MAX_DIMS; k++)
        d.dims[k] = (uint64_t)p->shape.dim[k];
    fz_h5_dataset(in, f, &d, NULL);
    p->checksum = stored_checksum(f, p->name);
    struct fz_attr sum = {
        .name = "checksum", .kind = FZ_ATTR_UINT, .type = H5T_STD_U64LE, .u = p->checksum};
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

/* Writes the checkpoint file as p says (its version, job and tensors
 * chosen here), or a hostile variant of it. */
static void build_ckpt(struct fz_in *in, const char *path, struct ckpt_plan *p)
{
    unsigned code = fz_u8(in);
    static const int versions[4] = {DT_CKPT_FORMAT_VERSION, 1, 2, DT_CKPT_FORMAT_VERSION + 1};
    p->n = code ? (int)(code % (MAX_TENSORS + 1)) : 3;
    p->version = versions[fz_pick(in, 4)];
    p->job = job_text(in);
    memcpy(p->t, default_tensors, sizeof default_tensors);
    for (int i = 0; i < MAX_TENSORS && p->version < 3; i++) {
        /* versions 1 and 2 hold 1-D and 2-D tensors: the same values as
         * first dimension x the rest */
        struct dt_shape *sh = &p->t[i].shape;
        if (sh->ndim > 2)
            *sh = dt_shape_make(2, sh->dim[0], dt_shape_numel(sh) / sh->dim[0], 0, 0);
    }
    hid_t f = fz_h5_create(in, path);
    meta_attrs(in, f, p);
    for (int i = 0; i < p->n; i++)
        tensor(in, f, &p->t[i]);
    if (p->version > 1) {
        struct fz_attr sum = {.name = "meta_checksum",
                              .kind = FZ_ATTR_UINT,
                              .type = H5T_STD_U64LE,
                              .u = meta_checksum(p)};
        fz_h5_attr(in, f, &sum);
    }
    strays(in, f, p->t[0].name);
    fz_h5_close(f);
}

/* The checkpoint directory around it: another file, temporary files,
 * latest. A file named like a checkpoint that is none of ours (empty,
 * garbage, the main file under another step) goes into foreign. */
static void build_dir(struct fz_in *in, const char *dir, const char *main_name, char *foreign,
                      size_t len)
{
    char path[PATH_LEN], latest[PATH_LEN];
    const uint8_t *raw;
    size_t rawlen;
    snprintf(path, sizeof path, "%s/ckpt-%010u.h5", dir, fz_u8(in));
    foreign[0] = '\0';
    switch (fz_u8(in) % 6) {
    case 1:
        fz_write_file(path, "", 0);
        snprintf(foreign, len, "%s", path);
        break;
    case 2:
        rawlen = fz_blob(in, 512, &raw);
        fz_write_file(path, raw, rawlen);
        snprintf(foreign, len, "%s", path);
        break;
    case 3: { /* the same file under another step */
        char src[PATH_LEN];
        snprintf(src, sizeof src, "%s/%s", dir, main_name);
        if (link(src, path) == 0) snprintf(foreign, len, "%s", path);
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
        const struct dt_shape *sh = &info->shape[i];
        char text[DT_MAX_DIMS * 21 + 8];
        int64_t numel = 1;
        FZ_REQUIRE(sh->ndim >= 1 && sh->ndim <= DT_MAX_DIMS, "tensor %s: ndim %d", info->names[i],
                   sh->ndim);
        FZ_REQUIRE(sh->ndim <= 2 || info->format_version >= 3,
                   "tensor %s: %d dimensions in a version %d checkpoint", info->names[i], sh->ndim,
                   info->format_version);
        dt_shape_format(sh, text, sizeof text);
        for (int d = 0; d < sh->ndim; d++) {
            FZ_REQUIRE(sh->dim[d] >= 0, "tensor %s: shape %s", info->names[i], text);
            FZ_REQUIRE(!__builtin_mul_overflow(numel, sh->dim[d], &numel),
                       "tensor %s: shape %s has more elements than an int64 counts", info->names[i],
                       text);
        }
        FZ_REQUIRE(numel == info->numel[i], "tensor %s: numel %lld of shape %s", info->names[i],
                   (long long)info->numel[i], text);
        if (numel > LOAD_CAP) continue;
        memcpy(t[n].name, info->names[i], DT_CKPT_NAME);
        t[n].shape = *sh;
        t[n].data = malloc((size_t)numel * sizeof(float) + 1);
        FZ_REQUIRE(t[n].data, "out of memory");
        n++;
    }
    dt_status st = dt_ckpt_load(path, &meta, t, n);
    FZ_REQUIRE(st == DT_OK, "a checkpoint that verifies does not load: %s", dt_last_error());
    FZ_REQUIRE(same_meta(&meta, &info->meta), "load and verify read different meta");
    if (n > 0) { /* the wrong shape is refused */
        t[0].shape.dim[0] ^= 1;
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
    float data[MAX_TENSORS][PLAN_VALUES];
    memset(t, 0, sizeof t);
    for (int i = 0; i < n; i++) {
        snprintf(t[i].name, sizeof t[i].name, "%.*s", DT_CKPT_NAME - 1, plans[i].name);
        t[i].shape = plans[i].shape;
        t[i].data = data[i];
    }
    dt_status st = dt_ckpt_load(path, NULL, t, n);
    if (st != DT_OK) fz_check_error(st, "dt_ckpt_load");
}

/* Returns what dt_ckpt_verify returned. */
static dt_status verify(const char *path, const struct ckpt_plan *p)
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
        FZ_REQUIRE(info->format_version >= DT_CKPT_OLDEST_VERSION &&
                       info->format_version <= DT_CKPT_FORMAT_VERSION,
                   "a verified checkpoint of format version %d", info->format_version);
        dt_status js = dt_job_load_text(path, info->job_yaml, job);
        if (js != DT_OK) fz_check_error(js, "dt_job_load_text");
        load_verified(path, info);
        dt_ckpt_info_free(info);
    } else {
        fz_check_error(st, "dt_ckpt_verify");
        FZ_REQUIRE(!info->job_yaml, "a failed verify kept its job text");
        load_planned(path, p->t, p->n);
    }
    free(job);
    free(info);
    return st;
}

static int is_temp_name(const char *n)
{
    size_t len = strlen(n);
    return !strcmp(n, ".latest.tmp") ||
           (!strncmp(n, ".ckpt-", 6) && len > 4 && !strcmp(n + len - 4, ".tmp"));
}

/* List, latest and retention over the directory. */
static void directory(struct fz_in *in, const char *dir, const char *foreign)
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
    if (st != DT_OK) {
        fz_check_error(st, "dt_ckpt_prune");
    } else {
        DIR *d = opendir(dir);
        struct dirent *de;
        FZ_REQUIRE(d, "cannot list %s", dir);
        while ((de = readdir(d)) != NULL)
            FZ_REQUIRE(!is_temp_name(de->d_name), "retention left %s behind", de->d_name);
        closedir(d);
    }
    if (keep_latest)
        FZ_REQUIRE(stat(path, &sb) == 0, "retention removed %s, which latest names", latest);
    if (foreign[0])
        FZ_REQUIRE(stat(foreign, &sb) == 0,
                   "retention removed %s, which is not a checkpoint of ours", foreign);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_in in = {data, size};
    struct ckpt_plan plan;
    char dir[DIR_LEN], path[PATH_LEN], name[64], foreign[PATH_LEN];
    fz_quiet();
    fz_h5_quiet();
    fz_scratch_path(dir, sizeof dir, "checkpoints");
    FZ_REQUIRE(mkdir(dir, 0700) == 0, "cannot make %s", dir);
    plan.meta = good_meta;
    plan.meta.step = fz_u16(&in) + good_meta.step;
    snprintf(name, sizeof name, "ckpt-%010lld.h5", (long long)plan.meta.step);
    snprintf(path, sizeof path, "%s/%s", dir, name);

    build_ckpt(&in, path, &plan);
    build_dir(&in, dir, name, foreign, sizeof foreign);
    dt_status st = verify(path, &plan);
    /* The builder's own check: the well-formed checkpoint verifies. */
    FZ_REQUIRE(size || st == DT_OK, "the empty input's checkpoint does not verify: %s",
               dt_last_error());
    directory(&in, dir, foreign);
    FZ_REQUIRE(fz_h5_open_objects() == 0, "dtrain left %ld HDF5 objects open",
               fz_h5_open_objects());
    free(plan.job);
    fz_scratch_clear();
    return 0;
}
