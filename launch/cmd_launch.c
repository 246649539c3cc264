/*
 * cmd_launch.c - `dtrain launch [options] -- train JOB [train options]`.
 *
 * Parses the supervisor's options and hands them to dt_launch_run()
 * (supervisor.c), which starts the training under mpirun, srun or on its
 * own and restarts it with `--resume auto` after restartable failures.
 * Everything after `--` is passed on untouched, never through a shell.
 *
 * Inside a Slurm job (SLURM_JOB_ID set) the defaults come from the
 * allocation: srun as the launcher and SLURM_NTASKS ranks, so that
 * `dtrain launch -- train JOB` in a batch script uses every task the job
 * asked for; an -n beyond SLURM_NTASKS is refused before anything starts
 * (srun would refuse it on every attempt). Outside Slurm the defaults stay
 * mpirun and one rank.
 *
 * DTRAIN_LAUNCH_EXEC, when set, names the program each rank runs instead of
 * this dtrain executable: a testing aid that lets the tests substitute a
 * fake trainer.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "supervisor.h"

int dt_cmd_launch(int argc, char **argv);

static const char launch_usage[] =
    "usage: dtrain launch [-n N] [--launcher mpirun|srun|none] [--max-restarts K]\n"
    "                     [--backoff SECONDS] [--max-backoff SECONDS] [--launcher-arg ARG]...\n"
    "                     -- train JOB.yaml [train options]\n"
    "\n"
    "Runs the training with N ranks and starts it again, resuming from the last\n"
    "checkpoint (--resume auto), when it stops with exit 75, fails or a rank dies.\n"
    "Exits 64, 65 and 66 (bad job, bad data, missing input) are never restarted.\n"
    "\n"
    "  -n N                 ranks (default 1, inside a Slurm job SLURM_NTASKS;\n"
    "                       must be 1 with --launcher none)\n"
    "  --launcher L         mpirun (default outside Slurm): mpirun -np N dtrain ...\n"
    "                       srun (default inside a Slurm job): srun --mpi=pmix -n N dtrain ...\n"
    "                       none:             dtrain ... (one process)\n"
    "  --launcher-arg ARG   one more argument for mpirun or srun (repeatable)\n"
    "  --max-restarts K     restarts after the first attempt (default 3)\n"
    "  --backoff S          wait before the first restart, doubling each time (default 1)\n"
    "  --max-backoff S      longest wait (default 60)\n"
    "\n"
    "SIGTERM, SIGINT and SIGUSR1 are passed on to the training (through mpirun or\n"
    "srun as SIGUSR1, which they hand to every rank), which saves a checkpoint\n"
    "and stops; a second signal is passed on as it is and stops it at once. The\n"
    "supervisor then exits with the training's code, without restarting. When\n"
    "restarts run out it exits with the last attempt's code (128+N after signal N).\n"
    "\n"
    "Inside a Slurm job an attempt that exits 75 (Slurm's time-limit, preemption or\n"
    "requeue signal reached the ranks, which checkpointed) is not restarted in\n"
    "place: launch exits 75 so that the batch script requeues the job\n"
    "(see slurm/dtrain-step.sh). Crashes and other failures are restarted in place.\n";

/* Matches argv[*i] against `--name value` or `--name=value`. Returns 0 if it
 * is another option, 1 with *val set, -1 (after a usage message) if the
 * value is missing. */
static int take_opt(int argc, char **argv, int *i, const char *name, const char **val)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return 0;
    if (argv[*i][n] == '=' && name[1] == '-') {
        *val = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != '\0') return 0;
    if (*i + 1 >= argc) {
        dt_cli_usage("launch: %s needs a value", name);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

#define MAX_COUNT 1000000         /* ranks, restarts */
#define MAX_SECONDS (7 * 86400.0) /* a back-off: a week */

static int parse_count(const char *opt, const char *v, int min, int *out)
{
    int64_t x;
    int rc = dt_cli_opt_int("launch", opt, v, min, MAX_COUNT, NULL, &x);
    if (rc == 0) *out = (int)x;
    return rc;
}

static int parse_seconds(const char *opt, const char *v, double *out)
{
    return dt_cli_opt_real("launch", opt, v, 0, MAX_SECONDS, 0, " seconds (e.g. 1 or 0.5)", out);
}

static int parse_launcher(const char *v, enum dt_launcher *out)
{
    static const enum dt_launcher all[] = {DT_LAUNCHER_MPIRUN, DT_LAUNCHER_SRUN, DT_LAUNCHER_NONE};
    for (int i = 0; i < 3; i++)
        if (!strcmp(v, dt_launcher_name(all[i]))) return *out = all[i], 0;
    return dt_cli_usage("launch: --launcher wants mpirun, srun or none, not '%s'", v);
}

/* One option at argv[*i]; returns 0, or an exit code after a message.
 * *launcher_set becomes 1 when --launcher is given. */
static int parse_one(int argc, char **argv, int *i, struct dt_launch_opts *o, char **largs,
                     int *launcher_set)
{
    const char *v = NULL;
    int m;
    if ((m = take_opt(argc, argv, i, "-n", &v)) != 0)
        return m < 0 ? 64 : parse_count("-n", v, 1, &o->nprocs);
    if ((m = take_opt(argc, argv, i, "--max-restarts", &v)) != 0)
        return m < 0 ? 64 : parse_count("--max-restarts", v, 0, &o->max_restarts);
    if ((m = take_opt(argc, argv, i, "--launcher-arg", &v)) != 0) {
        if (m > 0) largs[o->n_launcher_args++] = (char *)v;
        return m < 0 ? 64 : 0;
    }
    if ((m = take_opt(argc, argv, i, "--launcher", &v)) != 0) {
        *launcher_set = 1;
        return m < 0 ? 64 : parse_launcher(v, &o->launcher);
    }
    if ((m = take_opt(argc, argv, i, "--backoff", &v)) != 0)
        return m < 0 ? 64 : parse_seconds("--backoff", v, &o->backoff_s);
    if ((m = take_opt(argc, argv, i, "--max-backoff", &v)) != 0)
        return m < 0 ? 64 : parse_seconds("--max-backoff", v, &o->max_backoff_s);
    if (argv[*i][0] == '-') return dt_cli_usage("launch: unknown option '%s'", argv[*i]);
    return dt_cli_usage("launch: unexpected '%s': put the training command after '--' "
                        "(dtrain launch -n 2 -- train job.yaml)",
                        argv[*i]);
}

static int check_train_args(const struct dt_launch_opts *o)
{
    if (o->n_train_args == 0)
        return dt_cli_usage("launch: no training command: add '-- train JOB.yaml' "
                            "after the launch options");
    if (strcmp(o->train_args[0], "train") != 0)
        return dt_cli_usage("launch: the command after '--' must be 'train JOB.yaml ...', "
                            "not '%s'",
                            o->train_args[0]);
    if (o->launcher == DT_LAUNCHER_NONE && o->nprocs != 1)
        return dt_cli_usage("launch: -n %d with --launcher none: without a launcher only one "
                            "process runs (use mpirun or srun)",
                            o->nprocs);
    return 0;
}

/* The allocation's task count from SLURM_NTASKS; 0 when it is unset or
 * not a count. */
static int slurm_ntasks(void)
{
    const char *v = getenv("SLURM_NTASKS");
    char *end;
    if (!v || !*v) return 0;
    errno = 0;
    long x = strtol(v, &end, 10);
    return errno || *end || x < 1 || x > 1000000 ? 0 : (int)x;
}

/* Defaults that depend on Slurm: inside a job (SLURM_JOB_ID) srun and
 * SLURM_NTASKS ranks, outside mpirun and 1. `nprocs` 0 means -n was not
 * given. Returns 0, or 64 after a message. */
static int apply_slurm(struct dt_launch_opts *o, int launcher_set)
{
    const char *job = getenv("SLURM_JOB_ID");
    o->slurm_job = job && *job ? job : NULL;
    if (!launcher_set) o->launcher = o->slurm_job ? DT_LAUNCHER_SRUN : DT_LAUNCHER_MPIRUN;
    int tasks = o->slurm_job && o->launcher != DT_LAUNCHER_NONE ? slurm_ntasks() : 0;
    if (o->nprocs == 0) {
        o->nprocs = tasks > 0 ? tasks : 1;
    } else if (tasks > 0 && o->nprocs > tasks) {
        return dt_cli_usage("launch: -n %d is more than the %d task%s of Slurm job %s "
                            "(SLURM_NTASKS): use -n %d or fewer, or leave -n out, or submit "
                            "the job with more tasks (sbatch --ntasks)",
                            o->nprocs, tasks, tasks == 1 ? "" : "s", o->slurm_job, tasks);
    }
    return 0;
}

/* Fills o from argv; largs has room for every argument. Returns 0, or an
 * exit code after a message (-1: help printed, exit 0). */
static int parse_args(int argc, char **argv, struct dt_launch_opts *o, char **largs)
{
    int launcher_set = 0;
    o->launcher = DT_LAUNCHER_MPIRUN;
    o->nprocs = 0;
    o->max_restarts = DT_LAUNCH_DEFAULT_RESTARTS;
    o->backoff_s = DT_LAUNCH_DEFAULT_BACKOFF_S;
    o->max_backoff_s = DT_LAUNCH_DEFAULT_MAX_BACKOFF_S;
    o->launcher_args = largs;
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return fputs(launch_usage, stdout), -1;
        int rc = parse_one(argc, argv, &i, o, largs, &launcher_set);
        if (rc) return rc;
    }
    int rc = apply_slurm(o, launcher_set);
    if (rc) return rc;
    if (i < argc) i++; /* the "--" */
    o->train_args = argv + i;
    o->n_train_args = argc - i;
    return check_train_args(o);
}

/* This executable, or DTRAIN_LAUNCH_EXEC when set. */
static int find_exec(char *buf, size_t len)
{
    const char *env = getenv("DTRAIN_LAUNCH_EXEC");
    if (env && *env) {
        snprintf(buf, len, "%s", env);
        return 0;
    }
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n <= 0 || (size_t)n >= len - 1) {
        fprintf(stderr, "dtrain: launch: cannot find this executable (/proc/self/exe): %s\n",
                n < 0 ? strerror(errno) : "path too long");
        return 70;
    }
    buf[n] = '\0';
    return 0;
}

int dt_cmd_launch(int argc, char **argv)
{
    struct dt_launch_opts o;
    char exe[4096];
    memset(&o, 0, sizeof o);
    char **largs = calloc((size_t)argc + 1, sizeof *largs);
    if (!largs) return fprintf(stderr, "dtrain: launch: out of memory\n"), 70;
    int rc = parse_args(argc, argv, &o, largs);
    /* what would fail every attempt, before mpirun or srun creates anything */
    if (rc == 0) rc = dt_cli_check_env();
    if (rc == 0 && (rc = find_exec(exe, sizeof exe)) == 0) {
        o.exec = exe;
        dt_status st = dt_launch_run(&o, &rc);
        if (st != DT_OK) rc = dt_cli_fail(st);
    }
    free(largs);
    return rc < 0 ? 0 : rc;
}
