/*
 * cmd_train.c - `dtrain train JOB [--set k=v ...] [--print-config]`.
 *
 * `--resume auto|never|PATH` (default auto) picks the checkpoint to start
 * from. SIGTERM, SIGUSR1 or SIGINT make every rank checkpoint at the next
 * step boundary and exit 75; a second SIGINT exits at once.
 *
 * Loads the job, applies overrides in order, validates, then starts MPI
 * (one rank per process: `mpirun -np N dtrain train JOB`, or srun; see
 * ranks.c for the checks before and the agreement after) and runs the
 * training on every rank. Errors the ranks agreed on are printed
 * once, by rank 0; when the ranks fell out of step, the failing rank
 * prints its error and aborts the job so that no rank hangs.
 */
#include <math.h>
#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/comm.h"
#include "io/outfile.h"
#include "runtime/config/config.h"
#include "core/log.h"
#include "runtime/model/model.h"
#include "runtime/train/train.h"
#include "cli.h"

/* After --print-config's job: the layer list model.type expands into. */
static int print_expansion(const struct dt_job *job)
{
    struct dt_layer_spec *l = calloc(DT_MODEL_MAX_LAYERS, sizeof *l);
    int n = 0;
    if (!l)
        return dt_cli_fail(dt_set_error(DT_ERR_NOMEM, "out of memory"));
    dt_status st = dt_model_expand(job, l, DT_MODEL_MAX_LAYERS, &n);
    if (st == DT_OK && strcmp(job->model.type, "layers") != 0) {
        printf("# model.type %s is this layer list (the same model as model.type: layers with\n"
               "# these model.layers; residual entries are blocks of conv2d, batchnorm, %s and\n"
               "# add layers named <block>.conv1 ...):\n#   layers:",
               job->model.type, job->model.activation);
        dt_job_write_layer_list(l, n, "#     ", stdout);
        putchar('\n');
    }
    free(l);
    return st == DT_OK ? 0 : dt_cli_fail(st);
}

static const char train_usage[] =
    "usage: dtrain train JOB.yaml [--set key=value ...] [--resume auto|never|PATH]\n"
    "                    [--print-config]\n"
    "\n"
    "Trains the model the job file describes and writes the run into its run directory\n"
    "(output.dir): config.yaml, train.log, metrics.jsonl, tensorboard/, checkpoints/,\n"
    "model.h5. One process, or N ranks: mpirun -np N dtrain train JOB.yaml (or srun).\n"
    "\n"
    "  --set key=value   override a job key after the file is read, in the order given\n"
    "                    (lists as [256,128]); 'dtrain config reference' lists every key\n"
    "  --resume auto     continue from the newest checkpoint of the run that verifies\n"
    "                    (the default; a finished run is only evaluated)\n"
    "  --resume never    start over from step 0\n"
    "  --resume PATH     start from that checkpoint\n"
    "  --print-config    print the resolved job (itself a job file) and the layer list\n"
    "                    its model.type expands into, and exit\n"
    "\n"
    "SIGTERM, SIGUSR1 or SIGINT: checkpoint at the next step boundary and exit 75 (run\n"
    "again to resume); a second SIGINT exits at once. Exit codes: 'dtrain --help'.\n";

static const char eval_usage[] =
    "usage: dtrain eval JOB.yaml --checkpoint PATH [--set key=value ...]\n"
    "\n"
    "Evaluates the parameters of a checkpoint of the job on its test split\n"
    "(data.test_split) and prints the test loss and accuracy (for a language model the\n"
    "loss, perplexity and next-token accuracy). Writes no files. One process, or N\n"
    "ranks (mpirun -np N dtrain eval ...), which share the split.\n"
    "\n"
    "  --checkpoint PATH  the checkpoint to evaluate\n"
    "  --set key=value    override a job key after the file is read (as for train)\n";

/* First SIGTERM, SIGUSR1 or SIGINT: finish the step, checkpoint, exit 75
 * (the stop message names the signal, so it is stored). A second SIGINT:
 * leave at once. */
static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    if (sig == SIGINT && stop_requested) {
        static const char msg[] = "dtrain: second interrupt: exiting now\n";
        ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)ignored;
        dt_outfile_remove_pending(); /* a model.h5 being written */
        _exit(130);
    }
    stop_requested = sig;
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

/* MPI and the communicator around one collective run; the exit code. */
static int run_ranks(const struct dt_job *job, const struct dt_train_opts *opts,
                     const char *checkpoint, int *argc, char ***argv)
{
    /* what every rank must run alike: the command and the options that
     * change it (the job is compared too) */
    char command[DT_JOB_PATH + 64];
    if (checkpoint)
        snprintf(command, sizeof command, "'dtrain eval --checkpoint %s'", checkpoint);
    else
        snprintf(command, sizeof command, "'dtrain train --resume %s'", opts->resume);
    /* MPI carries start-up and the per-step control traffic; the gradient
     * communicator (comm.backend) is opened once the device is known. */
    dt_comm_t *comm = NULL;
    int rc = dt_cli_ranks_start(argc, argv, command, job, &comm);
    if (rc != 0) return rc;
    int rank = dt_comm_rank(comm);
    dt_status st;
    if (opts && opts->stop_flag)
        install_signals(); /* after MPI_Init, which may install handlers of its own */
    struct dt_train_result res;
    if (checkpoint)
        st = dt_eval_run(job, comm, checkpoint, &res);
    else
        st = dt_train_run(job, comm, opts, &res);
    rc = dt_status_exit_code(st);
    if (st != DT_OK && res.comm_failed) {
        /* the ranks are out of step: say why here and end the whole job at
         * once (MPI_Abort from the main thread, which MPI_THREAD_FUNNELED
         * allows); the other ranks are ended by the MPI runtime */
        fprintf(stderr, "dtrain: rank %d: %s; ending the whole job (exit %d)\n", rank,
                dt_last_error(), rc);
        dt_comm_abort(comm, rc);
    }
    if (st != DT_OK && rank == 0) /* agreed: every rank has the same message */
        dt_cli_fail(st);
    if (st == DT_OK && checkpoint && rank == 0 && res.lm)
        printf("test loss %.6f, perplexity %.4f, next-token accuracy %.4f (checkpoint %s, step "
               "%lld)\n",
               res.test_loss, exp(res.test_loss), res.test_acc, checkpoint, (long long)res.steps);
    else if (st == DT_OK && checkpoint && rank == 0)
        printf("test loss %.6f, test accuracy %.4f (checkpoint %s, step %lld)\n", res.test_loss,
               res.test_acc, checkpoint, (long long)res.steps);
    dt_cli_ranks_end(comm);
    return rc;
}

static void apply_log_level(const struct dt_job *job)
{
    if (getenv("DTRAIN_LOG") == NULL)
        dt_log_set_level((enum dt_log_level)dt_log_parse_level(job->runtime.log_level));
}

int dt_cmd_train(int argc, char **argv)
{
    static struct dt_job job;
    int print_only;
    const char *resume;
    int rc = dt_cli_parse_job("train", train_usage, argc, argv, &job, &print_only, &resume);
    if (rc != 0) return rc < 0 ? 0 : rc;
    if (print_only) {
        dt_job_write_yaml(&job, stdout);
        return print_expansion(&job);
    }
    apply_log_level(&job);
    struct dt_train_opts opts = {.resume = resume, .stop_flag = &stop_requested};
    return run_ranks(&job, &opts, NULL, &argc, &argv);
}

/* `dtrain eval JOB --checkpoint PATH [--set k=v ...]` */
int dt_cmd_eval(int argc, char **argv)
{
    static struct dt_job job;
    const char *ckpt = NULL;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int nrest = 0, rc = 0;
    if (!rest)
        return dt_cli_fail(dt_set_error(DT_ERR_NOMEM, "out of memory reading the command line"));
    for (int i = 0; i < argc && rc == 0; i++) {
        if (i > 0 && dt_cli_is_help(argv[i]))
            rc = -1;
        else if (!strcmp(argv[i], "--checkpoint") && i + 1 < argc && argv[i + 1][0])
            ckpt = argv[++i];
        else if (!strncmp(argv[i], "--checkpoint=", 13) && argv[i][13])
            ckpt = argv[i] + 13;
        else if (!strcmp(argv[i], "--checkpoint") || !strcmp(argv[i], "--checkpoint="))
            rc = dt_cli_usage("eval: --checkpoint needs the path of a checkpoint");
        else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            rest[nrest++] = argv[i++];
            rest[nrest++] = argv[i];
        } else
            rest[nrest++] = argv[i];
    }
    if (rc == 0 && !ckpt) rc = dt_cli_usage("eval: --checkpoint PATH is required");
    if (rc == 0) rc = dt_cli_parse_job("eval", eval_usage, nrest, rest, &job, NULL, NULL);
    free(rest);
    if (rc < 0) return fputs(eval_usage, stdout), 0;
    if (rc != 0)
        return rc;
    apply_log_level(&job);
    return run_ranks(&job, NULL, ckpt, &argc, &argv);
}
