/*
 * cmd_doctor.c - `dtrain doctor [JOB.yaml] [--set k=v ...] [--dir PATH]`:
 * checks the machine or cluster dtrain is about to run on. Run it alone,
 * or under mpirun or srun with the ranks a job would have.
 *
 * The job file (optional) gives the run directory (output.dir) whose file
 * system is checked and runtime.threads; --dir names a directory instead,
 * and without either the working directory is checked. Options and the
 * job are read before MPI starts, so a usage error needs no MPI.
 *
 * Exit codes: 0 no problem found; 69 (EX_UNAVAILABLE) the environment has
 * a problem, each printed on one line with its cause and fix; 64 a bad
 * command line or job; 70 when the doctor itself could not finish.
 */
#include <stdio.h>
#include <string.h>

#include "collectives/comm.h"
#include "runtime/config/config.h"
#include "runtime/doctor/doctor.h"
#include "core/fault.h"
#include "core/log.h"
#include "cli.h"

#define EXIT_PROBLEMS 69 /* sysexits EX_UNAVAILABLE */

static const char doctor_usage[] =
    "usage: dtrain doctor [JOB.yaml] [--set key=value ...] [--dir PATH]\n"
    "Checks that this machine (or, under mpirun/srun, every rank of the job) can run\n"
    "dtrain: prints one row per rank (host, GPU, memory, compute capability, driver and\n"
    "CUDA versions, threads, Slurm task) and the libraries (MPI, HDF5, BLAS, NCCL), runs\n"
    "a kernel and a GEMM on each GPU and the BLAS GEMM against the CPU reference, an\n"
    "all-reduce over all ranks (MPI, and NCCL on GPUs) with its bus bandwidth, and an\n"
    "HDF5 file written and read where the run directory lives (the job's output.dir, or\n"
    "its nearest existing parent; --dir PATH instead; else the working directory), then\n"
    "checks that every host sees the others' files there. Each problem is printed on one\n"
    "line with its cause and fix. Nothing is left in the directory checked.\n"
    "Exit status: 0 no problem, 69 a problem was found, 64 bad command line or job.\n";

struct doctor_args {
    const char *job_path;
    const char *dir;
};

/* 0, -1 after printing the usage (-h, --help), or 64 after a message. */
static int parse_args(int argc, char **argv, struct doctor_args *a)
{
    for (int i = 1; i < argc; i++) {
        if (dt_cli_is_help(argv[i])) {
            return fputs(doctor_usage, stdout), -1;
        } else if (!strcmp(argv[i], "--set")) {
            if (++i >= argc)
                return dt_cli_usage("doctor: --set needs key=value");
        } else if (!strncmp(argv[i], "--set=", 6)) {
            continue;
        } else if (!strcmp(argv[i], "--dir")) {
            if (++i >= argc || !argv[i][0])
                return dt_cli_usage("doctor: --dir needs a directory");
            a->dir = argv[i];
        } else if (!strncmp(argv[i], "--dir=", 6) && argv[i][6]) {
            a->dir = argv[i] + 6;
        } else if (argv[i][0] == '-') {
            return dt_cli_usage("doctor: unknown option '%s'", argv[i]);
        } else if (a->job_path) {
            return dt_cli_usage("doctor: more than one job file ('%s' and '%s')", a->job_path,
                                argv[i]);
        } else {
            a->job_path = argv[i];
        }
    }
    return 0;
}

/* The job (defaults without a file) with the --set overrides applied. */
static int load_job(int argc, char **argv, const struct doctor_args *a, struct dt_job *job)
{
    dt_status st = DT_OK;
    int sets = 0;
    if (a->job_path)
        st = dt_job_load(a->job_path, job);
    else
        dt_job_defaults(job);
    for (int i = 1; i < argc && st == DT_OK; i++) {
        const char *kv = NULL;
        if (!strcmp(argv[i], "--set"))
            kv = argv[++i];
        else if (!strncmp(argv[i], "--set=", 6))
            kv = argv[i] + 6;
        else if (!strcmp(argv[i], "--dir"))
            i++; /* its value is not a job file */
        if (kv) {
            st = dt_job_set(job, kv);
            sets++;
        }
    }
    if (st == DT_OK && (a->job_path || sets))
        st = dt_job_validate(job);
    return st == DT_OK ? 0 : dt_cli_fail(st);
}

/* On MPI's ranks (started here): the checks; the exit code. */
static int run(const struct dt_job *job, const struct doctor_args *a, int has_job, int *argc,
               char ***argv)
{
    char command[DT_JOB_PATH + 64];
    dt_comm_t *c = NULL;
    snprintf(command, sizeof command, "'dtrain doctor%s%s'", a->dir ? " --dir " : "",
             a->dir ? a->dir : "");
    int rc = dt_cli_ranks_start(argc, argv, command, job, &c);
    if (rc != 0) return rc;
    int rank = dt_comm_rank(c), problems = 0;
    dt_status st;
    struct dt_doctor_opts o = {.threads = (long)job->runtime.threads};
    if (a->dir) {
        o.dir = a->dir;
        o.dir_explicit = 1;
        o.dir_origin = "--dir";
    } else if (has_job) {
        o.dir = job->output.dir;
        o.dir_origin = "output.dir";
    } else {
        o.dir = ".";
        o.dir_explicit = 1;
        o.dir_origin = "the working directory";
    }
    st = dt_doctor_run(c, &o, stdout, &problems);
    if (st != DT_OK) {
        fprintf(stderr, "dtrain: rank %d: the doctor could not finish: %s\n", rank,
                dt_last_error());
        dt_comm_abort(c, 70);
    }
    dt_cli_ranks_end(c);
    return problems ? EXIT_PROBLEMS : 0;
}

int dt_cmd_doctor(int argc, char **argv)
{
    static struct dt_job job;
    struct doctor_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc == 0)
        rc = load_job(argc, argv, &a, &job);
    if (rc != 0) return rc < 0 ? 0 : rc;
    int has_job = a.job_path != NULL;
    for (int i = 1; i < argc && !has_job; i++)
        has_job = !strcmp(argv[i], "--set") || !strncmp(argv[i], "--set=", 6);
    dt_status st = dt_fault_init();
    if (st != DT_OK)
        return dt_cli_fail(st);
    return run(&job, &a, has_job, &argc, &argv);
}
