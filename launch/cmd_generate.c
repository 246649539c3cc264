/*
 * cmd_generate.c - `dtrain generate JOB --checkpoint PATH --prompt TEXT
 * [--tokens N] [--temperature T] [--top-k K] [--seed S] [--tokenizer DIR]
 * [--no-cache] [--set k=v ...]`.
 *
 * Text from a language model the job trained: the prompt and the new
 * tokens' bytes go to stdout as they come (nothing else does, so the
 * output can be piped or compared), messages to stderr. One process, one
 * rank: it starts MPI only because the start-up it shares with training
 * and evaluation runs on a communicator, and refuses to run as several
 * ranks rather than have them all print the same text.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/comm.h"
#include "core/log.h"
#include "runtime/generate/generate.h"
#include "cli.h"

#define DEFAULT_TOKENS 200
#define DEFAULT_TEMPERATURE 0.8
#define MAX_TOKENS 1000000000 /* days of generation on a CPU; the context stays in memory */

static const char generate_usage[] =
    "usage: dtrain generate JOB.yaml --checkpoint PATH --prompt TEXT [--tokens N]\n"
    "                       [--temperature T] [--top-k K] [--seed S] [--tokenizer DIR]\n"
    "                       [--no-cache] [--set key=value ...]\n"
    "\n"
    "Writes the prompt and N new tokens from the language model JOB.yaml trained, to stdout\n"
    "(the bytes alone; messages go to stderr, DTRAIN_LOG=info shows the model and the speed).\n"
    "The job gives the model (model.*, data.seq_len) and the dataset whose tokenizer is used\n"
    "(data.path): bytes, or the byte-pair tokenizer the dataset was imported with. One rank.\n"
    "\n"
    "  --checkpoint PATH   a checkpoint of the run, or the run's model.h5\n"
    "  --prompt TEXT       the text to continue; '' starts from a newline (not printed)\n"
    "  --tokens N          new tokens to write (default 200)\n"
    "  --temperature T     probabilities raised to 1/T before the draw (default 0.8);\n"
    "                      0 takes the most likely token (greedy)\n"
    "  --top-k K           draw among the K most likely tokens (default 0: all)\n"
    "  --seed S            the draws' seed (default 0): the same seed, the same text\n"
    "  --tokenizer DIR     vocab.json and merges.txt of GPT-2's byte-level BPE, for a dataset\n"
    "                      that keeps no copy of its tokenizer (GPT-2 token files)\n"
    "  --no-cache          run the whole window for each token (no key/value cache)\n"
    "  --set key=value     override a job setting (as for train)\n";

static int parse_seed(const char *v, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = isdigit((unsigned char)v[0]) ? strtoull(v, &end, 10) : 0;
    if (!end || *end || errno == ERANGE)
        return dt_cli_usage("generate: --seed needs a whole number from 0 to %llu, not '%s'",
                            (unsigned long long)UINT64_MAX, v);
    *out = x;
    return 0;
}

/* The value of option argv[*i] ("--opt V" or "--opt=V"), or NULL when it
 * is not that option. */
static const char *opt_value(int argc, char **argv, int *i, const char *opt, int *missing)
{
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

/* Takes the generation options out of argv; the rest (job file, --set)
 * goes to rest. 0, -1 after printing the help, or the exit code of a
 * usage error. */
static int parse_opts(int argc, char **argv, struct dt_generate_opts *o, char **rest, int *nrest)
{
    int have_prompt = 0, rc = 0;
    for (int i = 1; i < argc && rc == 0; i++) {
        int missing = 0;
        const char *v;
        if ((v = opt_value(argc, argv, &i, "--checkpoint", &missing)))
            o->checkpoint = v;
        else if ((v = opt_value(argc, argv, &i, "--prompt", &missing))) {
            o->prompt = v;
            have_prompt = 1;
        } else if ((v = opt_value(argc, argv, &i, "--tokens", &missing)))
            rc = dt_cli_opt_int("generate", "--tokens", v, 0, MAX_TOKENS,
                                " (the most one run generates)", &o->tokens);
        else if ((v = opt_value(argc, argv, &i, "--top-k", &missing)))
            rc = dt_cli_opt_int("generate", "--top-k", v, 0, INT64_MAX, " (0: all tokens)",
                                &o->top_k);
        else if ((v = opt_value(argc, argv, &i, "--temperature", &missing)))
            rc = dt_cli_opt_real("generate", "--temperature", v, 0, INFINITY, 0,
                                 " (0: always the most likely token)", &o->temperature);
        else if ((v = opt_value(argc, argv, &i, "--seed", &missing)))
            rc = parse_seed(v, &o->seed);
        else if ((v = opt_value(argc, argv, &i, "--tokenizer", &missing)))
            o->tokenizer = v;
        else if (!strcmp(argv[i], "--no-cache"))
            o->no_cache = 1;
        else if (missing)
            rc = dt_cli_usage("generate: %s needs a value", argv[i]);
        else if (dt_cli_is_help(argv[i]))
            return fputs(generate_usage, stdout), -1;
        else if (!strcmp(argv[i], "--set") || !strncmp(argv[i], "--set=", 6)) {
            rest[(*nrest)++] = argv[i];
            if (!strcmp(argv[i], "--set") && i + 1 < argc)
                rest[(*nrest)++] = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1] != '\0')
            rc = dt_cli_usage("generate: unknown option '%s'", argv[i]);
        else
            rest[(*nrest)++] = argv[i];
    }
    if (rc != 0)
        return rc;
    if (!o->checkpoint || !o->checkpoint[0])
        return dt_cli_usage("generate: --checkpoint PATH is required (a checkpoint in the run's "
                            "checkpoints/ folder, or the run's model.h5)");
    if (!have_prompt)
        return dt_cli_usage("generate: --prompt TEXT is required ('' starts from a newline)");
    o->prompt_len = strlen(o->prompt);
    return 0;
}

/* Each token's bytes as they come; a failed write stops the generation
 * (main's exit path reports it, with its cause). */
static dt_status emit_stdout(void *ctx, const char *bytes, size_t n)
{
    (void)ctx;
    if (fwrite(bytes, 1, n, stdout) != n || fflush(stdout) != 0)
        return dt_set_error(DT_ERR_IO, "generate: cannot write the text to standard output");
    return DT_OK;
}

static int run_one_rank(const struct dt_job *job, const struct dt_generate_opts *o, int *argc,
                        char ***argv)
{
    char command[DT_JOB_PATH + 64];
    dt_comm_t *comm = NULL;
    snprintf(command, sizeof command, "'dtrain generate --checkpoint %s'", o->checkpoint);
    int rc = dt_cli_ranks_start(argc, argv, command, job, &comm);
    if (rc != 0) return rc;
    dt_status st = dt_generate_run(job, comm, o);
    rc = dt_status_exit_code(st);
    /* several ranks all refuse the same way; one of them says so */
    if (st != DT_OK && dt_comm_rank(comm) == 0 && !dt_cli_output_failed()) dt_cli_fail(st);
    if (st == DT_OK && isatty(STDOUT_FILENO))
        putchar('\n');
    dt_cli_ranks_end(comm);
    return rc;
}

int dt_cmd_generate(int argc, char **argv)
{
    static struct dt_job job;
    struct dt_generate_opts o = {
        .tokens = DEFAULT_TOKENS, .temperature = DEFAULT_TEMPERATURE, .emit = emit_stdout};
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int nrest = 1;
    if (!rest)
        return dt_cli_fail(dt_set_error(DT_ERR_NOMEM, "out of memory reading the command line"));
    rest[0] = argv[0];
    int rc = parse_opts(argc, argv, &o, rest, &nrest);
    if (rc < 0) { /* --help */
        free(rest);
        return 0;
    }
    if (rc == 0) rc = dt_cli_parse_job("generate", generate_usage, nrest, rest, &job, NULL, NULL);
    free(rest);
    if (rc != 0) return rc < 0 ? 0 : rc;
    /* stdout is the text alone; the job's log level only applies through
     * DTRAIN_LOG, so the model's description does not precede the text */
    dt_log_set_stderr_only(1);
    if (getenv("DTRAIN_LOG") == NULL)
        dt_log_set_level(DT_LOG_LEVEL_WARN);
    return run_one_rank(&job, &o, &argc, &argv);
}
