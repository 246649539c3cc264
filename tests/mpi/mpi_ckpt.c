/*
 * mpi_ckpt.c - checkpoints saved by N ranks through parallel HDF5, under
 * real mpirun (ctest runs it with 2 and 4 ranks).
 *
 * Every rank holds the same full tensors (as training does); each writes
 * its own slice. Sizes are chosen so slices split rows (7 x 13 over 4
 * ranks), do not divide evenly (1001), and leave ranks with nothing (3
 * elements, a 1 x 1 tensor); tensors of 3 to 8 dimensions have their
 * slices cut inside rows at every depth (3 x 7 x 11 x 13 x 17 over 3
 * ranks), and one has no values at all. After a save every rank loads the file and
 * must get bit-identical tensors, and every rank verifies it serially.
 * Failures (a missing directory on all ranks; a bad argument, a different
 * tensor list or a file-size limit on one rank; a disk too small for the
 * file) must come back as the same status and the same message on every
 * rank, with no hang and no file left behind.
 *
 * As in mpi_comm.c, assertions next to collectives are never _FATAL, only
 * rank 0 prints CUnit's report, and failures are summed over ranks.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "collectives/comm.h"
#include "io/checkpoint.h"
#include "core/log.h"
#include "mpi_cu.h"

#if defined(__SANITIZE_ADDRESS__)
/* Open MPI's start-up leaks need the slow unwinder for tests/lsan.supp to
 * match them (see mpi_comm.c). */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "fast_unwind_on_malloc=0";
}
#endif

#define NT 13
#define MSG 1024

static dt_comm_t *comm;
static int rank, size;

struct set {
    float *data[NT];
    struct dt_ckpt_tensor t[NT];
};

static void fill(float *x, size_t n, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (float)(1 + (i % 5));
    }
}

static void make_set(struct set *s, uint32_t seed, int with_data)
{
    static const struct {
        const char *name;
        struct dt_shape shape;
    } spec[NT] = {
        {"params/a", {1, {1001}}},
        {"params/b", {2, {7, 13}}},
        {"optim/m/c", {1, {3}}},
        {"optim/v/d", {2, {2, 3}}},
        {"params/e", {2, {1, 1}}},
        {"params/big", {2, {300, 257}}},
        {"params/c3", {3, {3, 5, 7}}},
        {"params/conv.weight", {4, {4, 3, 3, 3}}},
        {"optim/m/conv.weight", {4, {4, 3, 3, 3}}},
        {"params/g5", {5, {3, 7, 11, 13, 17}}},
        {"params/eight", {8, {7, 1, 1, 2, 1, 1, 1, 3}}},
        {"params/cube", {3, {2, 2, 2}}},
        {"params/empty", {3, {3, 0, 2}}},
    };
    for (int i = 0; i < NT; i++) {
        size_t n = (size_t)dt_shape_numel(&spec[i].shape);
        s->data[i] = calloc(n + 1, sizeof(float));
        CU_ASSERT_PTR_NOT_NULL_FATAL(s->data[i]);
        if (with_data) fill(s->data[i], n, seed + (uint32_t)i);
        s->t[i] = (struct dt_ckpt_tensor){"", spec[i].shape, s->data[i], NULL, 0};
        snprintf(s->t[i].name, DT_CKPT_NAME, "%s", spec[i].name);
    }
}

static void free_set(struct set *s)
{
    for (int i = 0; i < NT; i++)
        free(s->data[i]);
}

static size_t numel(const struct dt_ckpt_tensor *t) { return (size_t)dt_shape_numel(&t->shape); }

/* Rank 0 makes (or empties) the directory, named by test and world size
 * so the np2 and np4 runs may overlap; everyone waits for it. */
static void shared_dir(const char *what, char *dir, size_t len)
{
    snprintf(dir, len, "%s/mpi_ckpt_%s_np%d", cu_tmpdir(), what, size);
    if (rank == 0) {
        DIR *d = opendir(dir);
        struct dirent *de;
        char p[4400];
        if (!d) CU_ASSERT_EQUAL(mkdir(dir, 0777), 0);
        while (d && (de = readdir(d)) != NULL)
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
                unlink(p);
            }
        if (d) closedir(d);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static struct dt_ckpt_meta make_meta(int64_t step)
{
    struct dt_ckpt_meta m = {.step = step,
                             .epoch = 1,
                             .samples = step * 8,
                             .seed = 99,
                             .world = size,
                             .loss_scale = 1.0,
                             .optim_t = step};
    snprintf(m.optimizer, sizeof m.optimizer, "sgd");
    return m;
}

/* Every rank got the same status and the same message as rank 0. */
static void check_agreed(dt_status st, dt_status want, const char *needle)
{
    char mine[MSG] = {0}, *all = calloc((size_t)size, MSG);
    int sts[64] = {0}, s = (int)st;
    snprintf(mine, sizeof mine, "%s", dt_last_error());
    CU_ASSERT_PTR_NOT_NULL_FATAL(all);
    MPI_Allgather(mine, MSG, MPI_CHAR, all, MSG, MPI_CHAR, MPI_COMM_WORLD);
    MPI_Allgather(&s, 1, MPI_INT, sts, 1, MPI_INT, MPI_COMM_WORLD);
    CU_ASSERT_EQUAL(st, want);
    for (int r = 0; r < size && r < 64; r++) {
        CU_ASSERT_EQUAL(sts[r], (int)want);
        CU_ASSERT_STRING_EQUAL(all + (size_t)r * MSG, all);
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(mine, needle));
    if (st != want || !strstr(mine, needle))
        fprintf(stderr, "[rank %d] got %s: %s\n", rank, dt_status_str(st), mine);
    free(all);
}

/* Nothing in dir but what `keep` names (NULL: nothing at all). */
static int only_files(const char *dir, const char *keep)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int other = 0;
    while (d && (de = readdir(d)) != NULL)
        other += strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
                 (!keep || !strstr(keep, de->d_name));
    if (d) closedir(d);
    return d && !other;
}

/* ---- save by N ranks, load and verify on each ------------------------------- */

static void test_save_load(void)
{
    char dir[4096], path[4400] = "", want[4400];
    struct set s, back;
    struct dt_ckpt_meta m = make_meta(1234), got;
    shared_dir("rt", dir, sizeof dir);
    make_set(&s, 1, 1);
    make_set(&back, 0, 0);
    dt_status st = dt_ckpt_save(comm, dir, &m, s.t, NT, "job: x\n", path, sizeof path);
    CU_ASSERT_EQUAL(st, DT_OK);
    if (st != DT_OK) fprintf(stderr, "[rank %d] save: %s\n", rank, dt_last_error());
    snprintf(want, sizeof want, "%s/ckpt-0000001234.h5", dir);
    CU_ASSERT_STRING_EQUAL(path, want);
    st = dt_ckpt_load(path, &got, back.t, NT);
    CU_ASSERT_EQUAL(st, DT_OK);
    for (int i = 0; i < NT && st == DT_OK; i++)
        CU_ASSERT_EQUAL(memcmp(back.data[i], s.data[i], numel(&s.t[i]) * sizeof(float)), 0);
    CU_ASSERT_EQUAL(got.step, 1234);
    CU_ASSERT_EQUAL(got.world, size);
    CU_ASSERT_TRUE(only_files(dir, "ckpt-0000001234.h5 latest"));
    free_set(&s);
    free_set(&back);
}

/* Sharded state: rank r holds the runs j with j % size == r of PIECE
 * elements of every tensor (several per tensor, none for some ranks in the
 * small ones), packed one after another. The file holds every tensor
 * whole, as if one rank had given it, and loads back on every rank. */
#define PIECE 37
struct pieces {
    struct dt_ckpt_piece *p[NT];
    float *data[NT];
};

static void hold_pieces(const struct set *s, struct pieces *h, struct dt_ckpt_tensor *t, int extra)
{
    for (int i = 0; i < NT; i++) {
        size_t n = numel(&s->t[i]), runs = n / PIECE + 2, held = 0;
        int k = 0;
        h->p[i] = calloc(runs, sizeof *h->p[i]);
        h->data[i] = calloc(n + PIECE, sizeof(float));
        CU_ASSERT_FATAL(h->p[i] && h->data[i]);
        for (size_t j = 0, lo = 0; lo < n; j++, lo += PIECE) {
            size_t hi = lo + PIECE < n ? lo + PIECE : n;
            /* extra: rank 0 also claims the second run (rank 1's) */
            if ((int)(j % (size_t)size) != rank && !(extra && rank == 0 && j == 1))
                continue;
            h->p[i][k++] = (struct dt_ckpt_piece){lo, hi};
            memcpy(h->data[i] + held, s->data[i] + lo, (hi - lo) * sizeof(float));
            held += hi - lo;
        }
        t[i] = s->t[i];
        t[i].data = h->data[i];
        t[i].pieces = h->p[i];
        t[i].npieces = k;
    }
}

static void free_pieces(struct pieces *h)
{
    for (int i = 0; i < NT; i++) {
        free(h->p[i]);
        free(h->data[i]);
    }
}

static void test_save_pieces(void)
{
    char dir[4096], path[4400] = "";
    struct set s, back;
    struct pieces h;
    struct dt_ckpt_tensor t[NT];
    struct dt_ckpt_meta m = make_meta(55), got;
    shared_dir("pieces", dir, sizeof dir);
    make_set(&s, 11, 1);
    make_set(&back, 0, 0);
    hold_pieces(&s, &h, t, 0);
    dt_status st = dt_ckpt_save(comm, dir, &m, t, NT, "job: p\n", path, sizeof path);
    CU_ASSERT_EQUAL(st, DT_OK);
    if (st != DT_OK) fprintf(stderr, "[rank %d] save: %s\n", rank, dt_last_error());
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_OK);
    st = dt_ckpt_load(path, &got, back.t, NT);
    CU_ASSERT_EQUAL(st, DT_OK);
    for (int i = 0; i < NT && st == DT_OK; i++) {
        int same = memcmp(back.data[i], s.data[i], numel(&s.t[i]) * sizeof(float)) == 0;
        if (!same) fprintf(stderr, "[rank %d] %s differs\n", rank, s.t[i].name);
        CU_ASSERT(same);
    }
    /* and each rank reads back its own pieces only (another rank's layout
     * than the one that saved: the next rank's) */
    struct pieces mine;
    struct dt_ckpt_tensor lt[NT];
    int saved_rank = rank;
    free_pieces(&h);
    rank = (rank + 1) % size;
    hold_pieces(&s, &h, t, 0); /* what rank+1 holds, packed */
    hold_pieces(&back, &mine, lt, 0);
    rank = saved_rank;
    for (int i = 0; i < NT; i++) /* nothing read yet */
        memset(mine.data[i], 0xff, (numel(&s.t[i]) + PIECE) * sizeof(float));
    st = dt_ckpt_load(path, &got, lt, NT);
    CU_ASSERT_EQUAL(st, DT_OK);
    for (int i = 0; i < NT && st == DT_OK; i++) {
        size_t held = 0;
        for (int j = 0; j < lt[i].npieces; j++)
            held += lt[i].pieces[j].hi - lt[i].pieces[j].lo;
        int same = memcmp(mine.data[i], h.data[i], held * sizeof(float)) == 0;
        if (!same) fprintf(stderr, "[rank %d] %s: its pieces read back differ\n", rank, s.t[i].name);
        CU_ASSERT(same);
    }
    free_pieces(&mine);
    free_pieces(&h);
    /* a run held twice (and, on two ranks, so the sums do not add up) */
    shared_dir("pieces2", dir, sizeof dir);
    hold_pieces(&s, &h, t, 1);
    st = dt_ckpt_save(comm, dir, &m, t, NT, "", path, sizeof path);
    if (size > 1) {
        check_agreed(st, DT_ERR_INVALID_ARG, "each must be held once");
        MPI_Barrier(MPI_COMM_WORLD);
        CU_ASSERT_TRUE(only_files(dir, NULL));
    }
    free_pieces(&h);
    /* runs out of order on one rank */
    shared_dir("pieces3", dir, sizeof dir);
    hold_pieces(&s, &h, t, 0);
    if (rank == size - 1 && t[0].npieces >= 2) {
        struct dt_ckpt_piece *p = (struct dt_ckpt_piece *)t[0].pieces, q = p[0];
        p[0] = p[1];
        p[1] = q;
    }
    st = dt_ckpt_save(comm, dir, &m, t, NT, "", path, sizeof path);
    check_agreed(st, DT_ERR_INVALID_ARG, "is not after the one before it");
    free_pieces(&h);
    free_set(&s);
    free_set(&back);
}

static void test_verify_serial(void)
{
    char dir[4096], path[4400] = "", latest[256] = "";
    struct set s;
    struct dt_ckpt_info *info = calloc(1, sizeof *info);
    struct dt_ckpt_meta m = make_meta(7);
    shared_dir("verify", dir, sizeof dir);
    make_set(&s, 2, 1);
    CU_ASSERT_EQUAL(dt_ckpt_save(comm, dir, &m, s.t, NT, "job: y\n", path, sizeof path), DT_OK);
    /* every rank, alone, with the serial driver */
    dt_status st = dt_ckpt_verify(path, info);
    CU_ASSERT_EQUAL(st, DT_OK);
    if (st != DT_OK) fprintf(stderr, "[rank %d] verify: %s\n", rank, dt_last_error());
    CU_ASSERT_EQUAL(info->ntensors, NT);
    CU_ASSERT_EQUAL(info->format_version, DT_CKPT_FORMAT_VERSION);
    for (int i = 0; i < NT; i++) { /* each listed once, in its shape */
        int found = 0;
        for (int k = 0; k < info->ntensors; k++)
            found += !strcmp(info->names[k], s.t[i].name) &&
                     dt_shape_equal(&info->shape[k], &s.t[i].shape) &&
                     info->numel[k] == dt_shape_numel(&s.t[i].shape);
        CU_ASSERT_EQUAL(found, 1);
    }
    CU_ASSERT_EQUAL(info->meta.world, size);
    CU_ASSERT_PTR_NOT_NULL(info->job_yaml);
    if (info->job_yaml) CU_ASSERT_STRING_EQUAL(info->job_yaml, "job: y\n");
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, latest, sizeof latest), DT_OK);
    CU_ASSERT_STRING_EQUAL(latest, "ckpt-0000000007.h5");
    dt_ckpt_info_free(info);
    free(info);
    free_set(&s);
}

/* Each rank passes its own meta and YAML: the file holds rank 0's. */
static void test_rank0_meta_wins(void)
{
    char dir[4096], path[4400] = "", yaml[64];
    struct set s;
    struct dt_ckpt_info *info = calloc(1, sizeof *info);
    struct dt_ckpt_meta m = make_meta(3);
    m.created = 1000.0 + rank;
    m.seed = 500 + (uint64_t)rank;
    snprintf(yaml, sizeof yaml, "written-by: %d\n", rank);
    shared_dir("meta", dir, sizeof dir);
    make_set(&s, 3, 1);
    CU_ASSERT_EQUAL(dt_ckpt_save(comm, dir, &m, s.t, NT, yaml, path, sizeof path), DT_OK);
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, info), DT_OK);
    CU_ASSERT_EQUAL(info->meta.created, 1000.0);
    CU_ASSERT_EQUAL(info->meta.seed, 500);
    if (info->job_yaml) CU_ASSERT_STRING_EQUAL(info->job_yaml, "written-by: 0\n");
    dt_ckpt_info_free(info);
    free(info);
    free_set(&s);
}

/* ---- agreed failures --------------------------------------------------------------- */

static void test_bad_dir_agreed(void)
{
    char dir[4096], missing[4400], path[4400] = "";
    struct set s;
    struct dt_ckpt_meta m = make_meta(1);
    shared_dir("baddir", dir, sizeof dir);
    snprintf(missing, sizeof missing, "%s/does/not/exist", dir);
    make_set(&s, 4, 1);
    dt_status st = dt_ckpt_save(comm, missing, &m, s.t, NT, "", path, sizeof path);
    check_agreed(st, DT_ERR_NOT_FOUND, "rank 0: checkpoint directory");
    CU_ASSERT_STRING_EQUAL(path, "");
    MPI_Barrier(MPI_COMM_WORLD);
    CU_ASSERT_TRUE(only_files(dir, NULL));
    free_set(&s);
}

static void test_one_rank_bad_arg(void)
{
    char dir[4096], path[4400] = "", who[32];
    struct set s;
    struct dt_ckpt_meta m = make_meta(2);
    shared_dir("badarg", dir, sizeof dir);
    make_set(&s, 5, 1);
    if (rank == size - 1) s.t[2].data = NULL;
    dt_status st = dt_ckpt_save(comm, dir, &m, s.t, NT, "", path, sizeof path);
    snprintf(who, sizeof who, "rank %d:", size - 1);
    check_agreed(st, DT_ERR_INVALID_ARG, who);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "optim/m/c"));
    MPI_Barrier(MPI_COMM_WORLD);
    CU_ASSERT_TRUE(only_files(dir, NULL));
    free_set(&s);
}

static void test_different_tensor_lists(void)
{
    char dir[4096], path[4400] = "";
    struct set s;
    struct dt_ckpt_meta m = make_meta(3);
    shared_dir("layout", dir, sizeof dir);
    make_set(&s, 6, 1);
    if (rank == 1) { /* same element count, other shape */
        s.t[1].shape.dim[0] = 13;
        s.t[1].shape.dim[1] = 7;
    }
    dt_status st = dt_ckpt_save(comm, dir, &m, s.t, NT, "", path, sizeof path);
    check_agreed(st, DT_ERR_INVALID_ARG, "ranks 0 and 1 pass different tensor lists");
    MPI_Barrier(MPI_COMM_WORLD);
    CU_ASSERT_TRUE(only_files(dir, NULL));
    free_set(&s);
    /* same element count, another number of dimensions: 4 x 27, not 4 x 3 x 3 x 3 */
    make_set(&s, 6, 1);
    if (rank == 1)
        s.t[7].shape = (struct dt_shape){2, {4, 27}};
    st = dt_ckpt_save(comm, dir, &m, s.t, NT, "", path, sizeof path);
    check_agreed(st, DT_ERR_INVALID_ARG, "ranks 0 and 1 pass different tensor lists");
    MPI_Barrier(MPI_COMM_WORLD);
    CU_ASSERT_TRUE(only_files(dir, NULL));
    free_set(&s);
}

/* Saves step 10 of the usual set, then step 11 of one 4 MiB tensor,
 * which must fail with DT_ERR_IO and `needle` on every rank, leaving step 10
 * and latest in place and nothing else. */
static void failing_save(const char *dir, int limit_last_rank, const char *needle)
{
    enum { BIG = 1 << 20 };
    char path[4400] = "", latest[256] = "";
    struct set s;
    struct dt_ckpt_meta m = make_meta(10);
    make_set(&s, 7, 1);
    CU_ASSERT_EQUAL(dt_ckpt_save(comm, dir, &m, s.t, NT, "", path, sizeof path), DT_OK);
    float *big = calloc(BIG, sizeof *big);
    CU_ASSERT_PTR_NOT_NULL(big); /* never _FATAL around collectives */
    if (!big) MPI_Abort(MPI_COMM_WORLD, 1);
    fill(big, BIG, 70); /* not zeros: a hole left by a lost write must not verify */
    struct dt_ckpt_tensor t = {"params/big", {1, {BIG}}, big, NULL, 0};
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 512 * 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    if (limit_last_rank && rank == size - 1) CU_ASSERT_EQUAL(setrlimit(RLIMIT_FSIZE, &lim), 0);
    m.step = 11;
    dt_status st = dt_ckpt_save(comm, dir, &m, &t, 1, "", path, sizeof path);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    check_agreed(st, DT_ERR_IO, needle);
    MPI_Barrier(MPI_COMM_WORLD);
    CU_ASSERT_TRUE(only_files(dir, "ckpt-0000000010.h5 latest"));
    CU_ASSERT_EQUAL(dt_ckpt_latest(dir, latest, sizeof latest), DT_OK);
    CU_ASSERT_STRING_EQUAL(latest, "ckpt-0000000010.h5");
    CU_ASSERT_EQUAL(dt_ckpt_verify(path, NULL), DT_OK);
    free(big);
    free_set(&s);
}

/* One rank under a file-size limit too small for the checkpoint. */
static void test_one_rank_file_limit(void)
{
    char dir[4096], needle[64];
    shared_dir("efbig", dir, sizeof dir);
    snprintf(needle, sizeof needle, "rank %d: checkpoint", size - 1);
    failing_save(dir, 1, needle);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "file-size limit"));
}

/* A disk too small for the checkpoint (a 2 MiB tmpfs that rank 0 mounts;
 * every rank of this one-node job sees it): caught when rank 0 reserves
 * the space, before any rank writes. Skipped, and said so, where mounting
 * is not allowed. */
static void test_disk_full_agreed(void)
{
    char dir[4096];
    int mounted = 0;
    shared_dir("enospc", dir, sizeof dir);
    if (rank == 0) mounted = mount("dtrain-test", dir, "tmpfs", 0, "size=2m,mode=0755") == 0;
    MPI_Bcast(&mounted, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!mounted) {
        if (rank == 0) printf("SKIPPED (cannot mount a small tmpfs) ");
        return;
    }
    failing_save(dir, 0, ".ckpt-0000000011.h5.tmp: cannot reserve");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) CU_ASSERT_EQUAL(umount2(dir, MNT_DETACH), 0);
}

static void add_suites(void)
{
    CU_pSuite s = CU_add_suite("mpi_ckpt", NULL, NULL);
    CU_ADD(s, test_save_load);
    CU_ADD(s, test_save_pieces);
    CU_ADD(s, test_verify_serial);
    CU_ADD(s, test_rank0_meta_wins);
    CU_ADD(s, test_bad_dir_agreed);
    CU_ADD(s, test_one_rank_bad_arg);
    CU_ADD(s, test_different_tensor_lists);
    CU_ADD(s, test_one_rank_file_limit);
    CU_ADD(s, test_disk_full_agreed);
}

int main(int argc, char **argv)
{
    return mpi_cu_main(argc, argv, "mpi_ckpt", &comm, &rank, &size, add_suites);
}
