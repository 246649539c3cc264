/*
 * main.c - the dtrain command line's dispatch: the command table and
 * main(), nothing else. Each command lives in its own cmd_*.c and uses
 * only the shared helpers (cli.c: the messages for a failure and a usage
 * error, which map it to a sysexits exit code, and reading a job;
 * options.c, ranks.c, output.c), never another command's file or this
 * one (tests/layout/cli_check.py checks it). Every command returns
 * through dt_cli_ranks_join (ranks.c: a rank that did not start MPI still
 * meets its peers' start-up agreement) and dt_cli_output_end (output.c,
 * which checks what it printed).
 */
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "kernels/backend.h"
#include "cli.h"

static const char usage_text[] =
    "usage: dtrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  train JOB.yaml [--set key=value ...] [--resume auto|never|PATH] [--print-config]\n"
    "                       train the model the job file describes\n"
    "  eval JOB.yaml --checkpoint PATH [--set key=value ...]\n"
    "                       evaluate a checkpoint on the job's test split (any number of ranks)\n"
    "  generate JOB.yaml --checkpoint PATH --prompt TEXT [--tokens N] [--temperature T]\n"
    "                  [--top-k K] [--seed S] [--tokenizer DIR] [--no-cache] [--set key=value ...]\n"
    "                       write text from a language model the job trained (one rank; PATH\n"
    "                       a checkpoint or the run's model.h5; a key/value cache unless\n"
    "                       --no-cache): the prompt, then N new tokens (200);\n"
    "                       temperature 0.8 (0: always the most likely token), top-k 0 (all),\n"
    "                       seed 0 (the same seed, the same text); --prompt '' starts from a\n"
    "                       newline. The text goes to stdout, messages to stderr\n"
    "  export JOB.yaml --checkpoint PATH -o OUT [--format safetensors|hf] [--force]\n"
    "                       write the trained model as safetensors (dtrain's names), or for a\n"
    "                       gpt as a Hugging Face GPT-2 directory (config.json, model.safetensors)\n"
    "  launch [-n N] [--max-restarts K] [--launcher mpirun|srun|none] -- train JOB ...\n"
    "                       run a training job and restart it after a restartable failure\n"
    "  ckpt list DIR | info PATH | verify PATH|DIR\n"
    "                       show and verify the checkpoints of a run\n"
    "  data import idx DIR -o OUT.h5 [--classes a,b,...] [--force]\n"
    "  data import idx --train-images F --train-labels F [--test-images F --test-labels F]\n"
    "                  -o OUT.h5 [--classes a,b,...] [--force]\n"
    "                       convert IDX files (MNIST format, raw or gzipped) to a dataset\n"
    "  data import npy --train-x F --train-y F [--test-x F --test-y F] -o OUT.h5\n"
    "                  [--classes a,b,...] [--force]\n"
    "                       convert NumPy .npy arrays (inputs (N, ...), integer labels (N,))\n"
    "  data import csv --train F [--test F] -o OUT.h5 [--label-column N|NAME]\n"
    "                  [--header auto|yes|no] [--classes a,b,...] [--force]\n"
    "                       convert CSV files (a label column and numeric feature columns)\n"
    "  data import text FILE... -o OUT.h5 [--val-fraction F] [--force]\n"
    "                       text as byte tokens for a language model (last F, default 0.1: val)\n"
    "  data import tokens --train F [--val F] -o OUT.h5 [--vocab-size N]\n"
    "                  [--tokenizer gpt2|none] [--force]\n"
    "                       token files for a language model (nanoGPT raw uint16, llm.c .bin)\n"
    "  data info FILE.h5 | 'GLOB' | FILE...\n"
    "                       show a dataset's files, splits, shapes, dtypes, classes and sizes\n"
    "  find-batch JOB.yaml [--set key=value ...] [-n RANKS] [--margin F] [--max MICRO]\n"
    "                       find the largest train.micro_batch that fits in memory, by trial\n"
    "  bench allreduce [--min-bytes N] [--max-bytes N] [--iters N]\n"
    "                       all-reduce time and bandwidth for 8 B to 256 MiB (run under mpirun)\n"
    "  doctor [JOB.yaml] [--set key=value ...] [--dir PATH]\n"
    "                       check this machine or cluster (run it under mpirun/srun too):\n"
    "                       GPUs, drivers, libraries, all-reduce, the run directory\n"
    "  config reference     print the job-file reference (every key and default)\n"
    "  config layers        print the layer reference (every layer kind and its settings)\n"
    "  config defaults      print the default job as YAML\n"
    "  version              print the version, the backends built in and the GPU found\n"
    "\n"
    "Every command and subcommand prints its own usage with -h or --help (or: dtrain help\n"
    "COMMAND ...).\n"
    "Logging: DTRAIN_LOG=error|warn|info|debug. Exit codes follow sysexits: 0 done,\n"
    "64 usage or job error, 65 bad data, 66 missing input, 74 I/O error, 70 internal,\n"
    "75 stopped or restartable failure (run again to resume from the last checkpoint),\n"
    "69 (doctor) the environment has a problem.\n";

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} commands[] = {
    {"train", dt_cmd_train},          {"eval", dt_cmd_eval},       {"generate", dt_cmd_generate},
    {"export", dt_cmd_export},
    {"launch", dt_cmd_launch},        {"ckpt", dt_cmd_ckpt},       {"data", dt_cmd_data},
    {"find-batch", dt_cmd_findbatch}, {"bench", dt_cmd_bench},     {"doctor", dt_cmd_doctor},
    {"config", dt_cmd_config},        {"version", dt_cmd_version}, {"--version", dt_cmd_version},
};

/* `dtrain help CMD [SUB]` is `dtrain CMD [SUB] --help`. */
static int run_help(int argc, char **argv);

static int run_command(int argc, char **argv)
{
    if (dt_log_init_from_env() != 0)
        return dt_cli_usage("DTRAIN_LOG='%s' is not a log level (error, warn, info, debug)",
                            getenv("DTRAIN_LOG"));
    if (argc < 2)
        return fprintf(stderr, "%s", usage_text), 64;
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") && argc > 2) return run_help(argc, argv);
    if (dt_cli_is_help(cmd) || !strcmp(cmd, "help")) return fputs(usage_text, stdout), 0;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    return dt_cli_usage("unknown command '%s'", cmd);
}

static int run_help(int argc, char **argv)
{
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args)
        return dt_cli_fail(dt_set_error(DT_ERR_NOMEM, "out of memory reading the command line"));
    args[0] = argv[0];
    for (int i = 2; i < argc; i++)
        args[i - 1] = argv[i];
    args[argc - 1] = (char *)"--help";
    int rc = run_command(argc, args);
    free(args);
    return rc;
}

/* OpenBLAS that did not know this CPU and runs kernels from before its
 * instruction sets (kernels/cpu/blas_info.c): dtrain starts again, as the
 * same process (exec keeps the process id, so launchers and MPI see no
 * change), with OPENBLAS_CORETYPE naming the kernels the CPU calls for.
 * Nothing has been opened or started yet. A user's OPENBLAS_CORETYPE is
 * kept; when the restart fails, dtrain goes on with OpenBLAS's choice. */
static void blas_kernels(char **argv)
{
    char chosen[64], self[4096];
    const char *core = dt_blas_better_core(chosen, sizeof chosen);
    if (!core || getenv(DT_BLAS_FALLBACK_ENV))
        return;
    /* The binary's own path, not /proc/self/exe, so that the process keeps
     * its name (ps, pgrep, top show "dtrain"). */
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || n >= (ssize_t)sizeof self - 1)
        return;
    self[n] = '\0';
    if (access(self, X_OK) != 0)
        return; /* replaced or removed since it started */
    if (setenv("OPENBLAS_CORETYPE", core, 1) == 0 && setenv(DT_BLAS_FALLBACK_ENV, chosen, 1) == 0)
        execv(self, argv);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(DT_BLAS_FALLBACK_ENV);
}

int main(int argc, char **argv)
{
    blas_kernels(argv);
    /* A write past a file-size limit fails with EFBIG and is reported as an
     * I/O error naming the file, instead of killing the process. */
    signal(SIGXFSZ, SIG_IGN);
    dt_cli_output_begin();
    int rc = dt_cli_ranks_join(argc, argv, run_command(argc, argv));
    return dt_cli_output_end(rc);
}
