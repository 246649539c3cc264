/*
 * cmd_findbatch.c - `dtrain find-batch JOB [--set k=v ...] [-n RANKS]
 * [--margin F] [--max MICRO]`: the largest train.micro_batch that fits.
 *
 * Each size is tried with real training steps in a child process (this
 * dtrain, re-executed as the hidden `find-batch --trial`), because a
 * process is the only unit whose peak memory can be measured afterwards
 * and whose running out of memory, even to the kernel's out-of-memory
 * killer, leaves the search standing. The child trains a few steps of the
 * job on one rank with global batch = micro-batch = the size tried (the
 * memory of one rank depends on its micro-batch, not on the accumulation
 * or the number of ranks, except for the state comm.shard splits: the
 * trial reports what one of the job's ranks would hold less, which is
 * taken off its peak), its run directory in a private temporary
 * folder that is removed afterwards, so nothing is written into the job's
 * own run directory. The child reports its backend's memory figures; the
 * parent takes the host peak from wait4's rusage.
 *
 * A size fits when the steps succeed and the peak is within (1 - margin)
 * of the limit: on a GPU the device's memory (peak device memory in use),
 * on the CPU runtime.memory_limit or else this rank's share of the node
 * (peak resident set). Sizes double from 1 until one does not fit or the
 * per-rank batch (or --max) is reached; then the micro-batches that the
 * job can use (divisors of the per-rank batch) between the last size that
 * fitted and the first that did not are bisected.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "collectives/comm.h"
#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "core/log.h"
#include "runtime/monitor/memory.h"
#include "runtime/train/train.h"
#include "core/text.h"
#include "cli.h"

#define FB_DEFAULT_MARGIN 0.10
#define FB_TRIAL_STEPS 3
#define FB_MAX_SETS 64  /* the user's --set options */
#define FB_TRIAL_SETS 8 /* those find-batch adds for a trial */
#define FB_EXIT_NOTHING_FITS 75
#define GIB (1024.0 * 1024.0 * 1024.0)

struct search {
    const char *job_path;
    const char *sets[FB_MAX_SETS];
    int nsets;
    int64_t ranks, max, per_rank, cap, eval_rows;
    double margin;
    double limit_gib; /* host limit per rank passed to the trials */
    char tmp[4096];
    char self[4096];
};

struct trial {
    int64_t micro;
    int fits, ran_ok;
    int device;           /* the peak is device memory */
    uint64_t peak, limit; /* bytes */
    uint64_t saving;      /* taken off the one-rank trial's peak: comm.shard's split */
    char why[768];
};

/* SIGINT or SIGTERM: the running trial is ended, the temporary folder
 * removed, and find-batch exits 75. */
static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: wait4 returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* ---- the trial child ----------------------------------------------------- */

static int load_job(const char *path, const char *const *sets, int nsets, struct dt_job *job)
{
    dt_status st = dt_job_load(path, job);
    for (int i = 0; st == DT_OK && i < nsets; i++)
        st = dt_job_set(job, sets[i]);
    if (st == DT_OK)
        st = dt_job_validate(job);
    return st == DT_OK ? 0 : dt_cli_fail(st);
}

/* `find-batch --trial RESULT JOB --set ...`: one rank trains the job and
 * writes its status, message and memory figures to RESULT. */
static int run_trial(int argc, char **argv)
{
    static struct dt_job job;
    const char *sets[FB_MAX_SETS + FB_TRIAL_SETS];
    int nsets = 0;
    int64_t ranks = 1;
    uint64_t saving = 0;
    if (argc < 4)
        return dt_cli_usage("find-batch --trial RESULT JOB [--set k=v ...] [--ranks N]");
    for (int i = 4; i < argc && nsets < FB_MAX_SETS + FB_TRIAL_SETS; i++)
        if (!strcmp(argv[i], "--set") && i + 1 < argc)
            sets[nsets++] = argv[++i];
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc)
            ranks = strtoll(argv[++i], NULL, 10);
    int rc = load_job(argv[3], sets, nsets, &job);
    if (rc != 0)
        return rc;
    if (getenv("DTRAIN_LOG") == NULL) dt_log_set_level(DT_LOG_LEVEL_WARN);
    dt_comm_t *comm = NULL;
    struct dt_backend_mem mem = {0};
    struct dt_train_result res;
    struct dt_train_opts opts = {.resume = "never",
                                 .fixed_micro_batch = 1,
                                 .mem = &mem,
                                 .plan_world = ranks,
                                 .plan_saving = &saving};
    rc = dt_cli_ranks_start(&argc, &argv, "'dtrain find-batch --trial'", &job, &comm);
    if (rc != 0) return rc;
    dt_status st = dt_train_run(&job, comm, &opts, &res);
    FILE *f = fopen(argv[2], "w");
    if (f) {
        fprintf(f, "%d %d %llu %llu %llu %llu\n%s\n", (int)st, mem.device,
                (unsigned long long)mem.used, (unsigned long long)mem.peak,
                (unsigned long long)mem.total, (unsigned long long)saving,
                st == DT_OK ? "" : dt_last_error());
        fclose(f);
    }
    dt_cli_ranks_end(comm);
    return dt_status_exit_code(st);
}

/* ---- the parent ------------------------------------------------------------ */

static int64_t env_int(const char *const *names)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v)
            return strtoll(v, NULL, 10);
    }
    return -1;
}

static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", NULL};
static const char *const size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
static const char *const local_vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                         "SLURM_NTASKS_PER_NODE", NULL};

static const char findbatch_usage[] =
    "usage: dtrain find-batch JOB.yaml [--set key=value ...] [-n RANKS] [--margin F] [--max MICRO]\n"
    "\n"
    "Finds the largest train.micro_batch that fits in memory by running real training\n"
    "steps, each size in a child process with a private temporary run directory\n"
    "(nothing is written into the job's): sizes double from 1, then the usable sizes\n"
    "in between are bisected. Prints the peak memory of every size, the answer with\n"
    "its accumulation for the job's global batch, and the --set line to paste.\n"
    "\n"
    "  -n RANKS       ranks the job will run on (default: the launcher's world size,\n"
    "                 else SLURM_NTASKS, else 1)\n"
    "  --margin F     memory kept free, as a fraction of the limit (default 0.1)\n"
    "  --max MICRO    largest micro-batch to try (default: the per-rank batch)\n"
    "\n"
    "The limit: device memory on a GPU; on the CPU runtime.memory_limit, else the\n"
    "rank's share of the node. Exit 0 found, 64 bad arguments or job, 66 job file\n"
    "missing, 75 not even one row fits.\n";

static int parse_args(int argc, char **argv, struct search *s)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return fputs(findbatch_usage, stdout), -1;
        if (!strcmp(a, "--set")) {
            if (!v)
                return dt_cli_usage("--set needs key=value");
            if (s->nsets == FB_MAX_SETS)
                return dt_cli_usage("find-batch: more than %d --set options", FB_MAX_SETS);
            s->sets[s->nsets++] = v;
            i++;
        } else if ((!strcmp(a, "-n") || !strcmp(a, "--ranks") || !strcmp(a, "--max") ||
                    !strcmp(a, "--margin")) &&
                   !v) {
            return dt_cli_usage("find-batch: %s needs a value", a);
        } else if (!strcmp(a, "-n") || !strcmp(a, "--ranks")) {
            /* a rank gets at least one row of the global batch */
            rc = dt_cli_opt_int("find-batch", a, v, 1, DT_JOB_MAX_BATCH, NULL, &s->ranks), i++;
        } else if (!strcmp(a, "--max")) {
            rc = dt_cli_opt_int("find-batch", a, v, 1, DT_JOB_MAX_BATCH, NULL, &s->max), i++;
        } else if (!strcmp(a, "--margin")) {
            rc = dt_cli_opt_real("find-batch", a, v, 0, 1, 1, " (0.1 keeps 10% free)", &s->margin);
            i++;
        } else if (a[0] == '-')
            return dt_cli_usage("find-batch: unknown option '%s'", a);
        else if (s->job_path)
            return dt_cli_usage("find-batch: more than one job file ('%s' and '%s')", s->job_path,
                                a);
        else
            s->job_path = a;
        if (rc)
            return rc;
    }
    if (!s->job_path)
        return dt_cli_usage("find-batch: no job file given (e.g. configs/fashion-mnist-mlp.yaml)");
    return 0;
}

/* The per-rank batch, the largest size to try and the host limit. */
static int plan(struct search *s, const struct dt_job *job)
{
    int64_t g = job->train.global_batch, n = s->ranks;
    if (g < n || g % n)
        return dt_cli_usage("find-batch: train.global_batch=%lld does not split evenly over %lld "
                            "ranks (-n); use a multiple of %lld",
                            (long long)g, (long long)n, (long long)n);
    s->per_rank = g / n;
    s->cap = s->max > 0 && s->max < s->per_rank ? s->max : s->per_rank;
    s->eval_rows = job->train.eval_batch / n > 0 ? job->train.eval_batch / n : 1;
    if (job->runtime.memory_limit > 0) {
        s->limit_gib = job->runtime.memory_limit;
    } else {
        struct dt_mem_avail avail;
        int64_t local = env_int(local_vars);
        dt_mem_probe(local > 0 ? (int)local : (int)n, &avail);
        s->limit_gib = avail.node_total == UINT64_MAX
                           ? 0
                           : (double)(avail.node_total / (uint64_t)avail.local_ranks) / GIB;
    }
    return 0;
}

/* In the child: no launcher's variables, so the trial is a rank of its own. */
static void drop_launcher_env(void)
{
    static const char *const prefixes[] = {"OMPI_", "PMIX_", "PMI_", "MPI_LOCAL"};
    extern char **environ;
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e && !again; e++)
            for (size_t k = 0; k < sizeof prefixes / sizeof prefixes[0]; k++)
                if (!strncmp(*e, prefixes[k], strlen(prefixes[k]))) {
                    char name[256];
                    size_t len = strcspn(*e, "=");
                    snprintf(name, sizeof name, "%.*s", (int)len, *e);
                    unsetenv(name);
                    again = 1;
                    break;
                }
    }
}

/* In the forked child: becomes `dtrain find-batch --trial` for size m, the
 * job's own --set options first, then the trial's (the last one wins). */
static void exec_trial(const struct search *s, int64_t m, const char *result, const char *log)
{
    char sv[FB_TRIAL_SETS - 1][128];
    char *argv[10 + 2 * (FB_MAX_SETS + FB_TRIAL_SETS)];
    int a = 0;
    snprintf(sv[0], sizeof sv[0], "train.global_batch=%lld", (long long)m);
    snprintf(sv[1], sizeof sv[1], "train.micro_batch=%lld", (long long)m);
    snprintf(sv[2], sizeof sv[2], "train.steps=%d", FB_TRIAL_STEPS);
    snprintf(sv[3], sizeof sv[3], "train.schedule.warmup_steps=0");
    snprintf(sv[4], sizeof sv[4], "train.eval_batch=%lld", (long long)s->eval_rows);
    snprintf(sv[5], sizeof sv[5], "runtime.progress=off");
    snprintf(sv[6], sizeof sv[6], "runtime.memory_limit=%.9g", s->limit_gib);
    static char dir[4200];
    snprintf(dir, sizeof dir, "output.dir=%s/run-%lld", s->tmp, (long long)m);
    argv[a++] = (char *)s->self;
    argv[a++] = (char *)"find-batch";
    argv[a++] = (char *)"--trial";
    argv[a++] = (char *)result;
    argv[a++] = (char *)s->job_path;
    for (int i = 0; i < s->nsets; i++) {
        argv[a++] = (char *)"--set";
        argv[a++] = (char *)s->sets[i];
    }
    int nsv = s->limit_gib > 0 ? 7 : 6; /* no memory limit where none is known */
    for (int i = 0; i < nsv; i++) {
        argv[a++] = (char *)"--set";
        argv[a++] = sv[i];
    }
    argv[a++] = (char *)"--set";
    argv[a++] = dir;
    static char ranks[32];
    snprintf(ranks, sizeof ranks, "%lld", (long long)s->ranks);
    argv[a++] = (char *)"--ranks";
    argv[a++] = ranks;
    argv[a] = NULL;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    drop_launcher_env();
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
    }
    execv(s->self, argv);
    _exit(127);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* The last "dtrain: ..." line of a trial's output, for a failure with no
 * result file. */
static void last_error_line(const char *log, char *out, size_t len)
{
    char line[1024];
    FILE *f = fopen(log, "r");
    snprintf(out, len, "it printed no error message");
    if (!f)
        return;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "dtrain: ", 8)) {
            line[strcspn(line, "\n")] = '\0';
            size_t n = strlen(line + 8) < len ? strlen(line + 8) : len - 1;
            memcpy(out, line + 8, n);
            out[n] = '\0';
        }
    fclose(f);
}

/* Runs one size; returns 0, or the exit code that ends the search (a
 * failure that is not a shortage of memory: the job itself is wrong). */
static int try_size(const struct search *s, int64_t m, struct trial *t)
{
    char result[4200], log[4200], run[4200];
    snprintf(result, sizeof result, "%s/result-%lld", s->tmp, (long long)m);
    snprintf(log, sizeof log, "%s/trial-%lld.log", s->tmp, (long long)m);
    snprintf(run, sizeof run, "%s/run-%lld", s->tmp, (long long)m);
    memset(t, 0, sizeof *t);
    t->micro = m;
    if (interrupted)
        return fprintf(stderr, "dtrain: find-batch: interrupted\n"), 75;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return fprintf(stderr, "dtrain: find-batch: cannot start a trial: %s\n", strerror(errno)),
               71;
    if (pid == 0)
        exec_trial(s, m, result, log);
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR)
        if (interrupted)
            kill(pid, SIGTERM);
    int st = -1, dev = 0;
    unsigned long long used = 0, peak = 0, total = 0, saving = 0;
    char msg[700] = "";
    FILE *f = fopen(result, "r");
    if (f) {
        if (fscanf(f, "%d %d %llu %llu %llu %llu ", &st, &dev, &used, &peak, &total, &saving) != 6)
            st = -1;
        if (!fgets(msg, sizeof msg, f))
            msg[0] = '\0';
        msg[strcspn(msg, "\n")] = '\0';
        fclose(f);
    }
    nftw(run, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (interrupted)
        return fprintf(stderr,
                       "dtrain: find-batch: interrupted during the trial of "
                       "train.micro_batch=%lld\n",
                       (long long)m),
               75;
    t->device = dev;
    t->peak = dev ? peak : (uint64_t)ru.ru_maxrss * 1024;
    /* comm.shard on the job's ranks: each holds that much less */
    t->saving = !dev && saving < t->peak ? saving : 0;
    t->peak -= t->saving;
    t->limit = dev ? total : (uint64_t)(s->limit_gib * GIB);
    if (WIFSIGNALED(status)) {
        snprintf(t->why, sizeof t->why, "killed by signal %d%s", WTERMSIG(status),
                 WTERMSIG(status) == SIGKILL ? " (the kernel's out-of-memory killer?)" : "");
        return 0;
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 70;
    /* Out of memory, memory not free now, or the start-up memory check
     * (runtime/monitor/memory.c, whose refusal that even the smallest
     * micro-batch would meet is a usage error) refusing this size. */
    if (st == DT_ERR_NOMEM || st == DT_ERR_BUSY ||
        (st == DT_ERR_USAGE && strstr(msg, "of host memory on each rank"))) {
        snprintf(t->why, sizeof t->why, "%s", msg);
        return 0;
    }
    if (code != 0 || st != DT_OK) {
        if (!msg[0])
            last_error_line(log, msg, sizeof msg);
        fprintf(stderr,
                "dtrain: find-batch: the trial with train.micro_batch=%lld failed for a "
                "reason other than memory: %s\n",
                (long long)m, msg);
        return code ? code : 70;
    }
    t->ran_ok = 1;
    uint64_t allowed = (uint64_t)((double)t->limit * (1.0 - s->margin));
    t->fits = t->limit == 0 || t->peak <= allowed;
    if (!t->fits) {
        char a[32];
        dt_format_bytes(allowed, a, sizeof a);
        snprintf(t->why, sizeof t->why, "over %s, the limit less the %g%% margin", a,
                 100.0 * s->margin);
    }
    return 0;
}

static void print_trial(const struct trial *t)
{
    char p[32], l[32], sv[32], split[96] = "";
    dt_format_bytes(t->peak, p, sizeof p);
    dt_format_bytes(t->limit, l, sizeof l);
    dt_format_bytes(t->saving, sv, sizeof sv);
    if (t->saving)
        snprintf(split, sizeof split, " (one rank's trial less %s that comm.shard splits)", sv);
    printf("micro-batch %6lld: peak %s memory %s (%llu bytes)%s of %s: %s%s%s\n",
           (long long)t->micro, t->device ? "device" : "host", p, (unsigned long long)t->peak, split,
           t->limit ? l : "no limit", t->fits ? "fits" : "does not fit", t->fits ? "" : ": ",
           t->why);
    fflush(stdout);
}

/* Doubling from 1, then bisection over the usable micro-batches between
 * the last fit and the first miss; *best is the largest usable that fits
 * (0: none). */
static int search_sizes(const struct search *s, int64_t *best)
{
    struct trial t;
    int64_t fit = 0, miss = 0, rc;
    for (int64_t m = 1;; m = m * 2 < s->cap ? m * 2 : s->cap) {
        if ((rc = try_size(s, m, &t)) != 0)
            return (int)rc;
        print_trial(&t);
        if (!t.fits) {
            miss = m;
            break;
        }
        fit = m;
        if (m == s->cap)
            break;
    }
    *best = 0;
    for (int64_t d = fit; d >= 1 && !*best; d--)
        if (s->per_rank % d == 0)
            *best = d;
    /* the usable sizes in (fit, miss), in order */
    int64_t hi = miss ? miss : s->cap + 1, n = 0, *cand = NULL;
    for (int64_t d = fit + 1; d < hi; d++)
        if (s->per_rank % d == 0)
            n++;
    if (n > 0 && !(cand = malloc((size_t)n * sizeof *cand)))
        return 71;
    n = 0;
    for (int64_t d = fit + 1; d < hi; d++)
        if (s->per_rank % d == 0)
            cand[n++] = d;
    int64_t lo = 0, up = n - 1;
    while (lo <= up) {
        int64_t mid = lo + (up - lo) / 2;
        if ((rc = try_size(s, cand[mid], &t)) != 0) {
            free(cand);
            return (int)rc;
        }
        print_trial(&t);
        if (t.fits) {
            *best = cand[mid];
            lo = mid + 1;
        } else {
            up = mid - 1;
        }
    }
    free(cand);
    return 0;
}

int dt_cmd_findbatch(int argc, char **argv)
{
    static struct dt_job job;
    static struct search s;
    if (argc >= 2 && !strcmp(argv[1], "--trial"))
        return run_trial(argc, argv);
    memset(&s, 0, sizeof s);
    s.margin = FB_DEFAULT_MARGIN;
    int rc = parse_args(argc, argv, &s);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if ((rc = load_job(s.job_path, s.sets, s.nsets, &job)) != 0)
        return rc;
    if (env_int(rank_vars) > 0)
        return 0; /* started under a launcher: rank 0 searches for all */
    if (s.ranks == 0)
        s.ranks = env_int(size_vars) > 0 ? env_int(size_vars) : 1;
    if ((rc = plan(&s, &job)) != 0)
        return rc;
    ssize_t k = readlink("/proc/self/exe", s.self, sizeof s.self - 1);
    if (k <= 0)
        return fprintf(stderr, "dtrain: find-batch: cannot find this program (/proc/self/exe)\n"),
               70;
    s.self[k] = '\0';
    if ((rc = dt_cli_check_env()) != 0) /* before the folder: what the trials would meet */
        return rc;
    const char *tmpdir = getenv("TMPDIR");
    snprintf(s.tmp, sizeof s.tmp, "%s/dtrain-find-batch.XXXXXX",
             tmpdir && *tmpdir ? tmpdir : "/tmp");
    install_signals();
    if (!mkdtemp(s.tmp))
        return fprintf(stderr, "dtrain: find-batch: cannot create a temporary folder %s: %s\n",
                       s.tmp, strerror(errno)),
               73;
    printf("find-batch: %s, global batch %lld over %lld rank%s = %lld rows per rank per step; "
           "trying micro-batches up to %lld, %d steps each, with a %g%% margin\n",
           s.job_path, (long long)job.train.global_batch, (long long)s.ranks,
           s.ranks == 1 ? "" : "s", (long long)s.per_rank, (long long)s.cap, FB_TRIAL_STEPS,
           100.0 * s.margin);
    int64_t best = 0;
    rc = search_sizes(&s, &best);
    nftw(s.tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (rc != 0)
        return rc;
    if (best == 0) {
        fprintf(stderr, "dtrain: find-batch: not even a micro-batch of 1 row fits (see the line "
                        "above): lower model.hidden or data.prefetch, raise "
                        "runtime.memory_limit, or use a machine with more memory\n");
        return FB_EXIT_NOTHING_FITS;
    }
    int64_t acc = s.per_rank / best;
    printf("largest micro-batch that fits with a %g%% margin: %lld\n", 100.0 * s.margin,
           (long long)best);
    printf("global batch %lld = micro-batch %lld x accumulation %lld x %lld rank%s\n",
           (long long)job.train.global_batch, (long long)best, (long long)acc, (long long)s.ranks,
           s.ranks == 1 ? "" : "s");
    printf("  --set train.micro_batch=%lld\n", (long long)best);
    return 0;
}
