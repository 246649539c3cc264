/*
 * cli.h - the dtrain subcommands and the helpers they share. Each command
 * (dt_cmd_*, one cmd_*.c file each; train and eval share cmd_train.c)
 * returns a process exit code (sysexits) and prints its own errors; only
 * launch/ turns statuses into exit codes. main.c dispatches to the
 * commands; the commands call only the helpers declared below (cli.c,
 * options.c, ranks.c, output.c), never each other or main.c.
 */
#ifndef DT_CLI_H
#define DT_CLI_H

#include <stdint.h>

#include "collectives/comm.h"
#include "runtime/config/config.h"
#include "core/status.h"

int dt_cmd_train(int argc, char **argv);
int dt_cmd_data(int argc, char **argv);
int dt_cmd_config(int argc, char **argv);
int dt_cmd_bench(int argc, char **argv);
int dt_cmd_eval(int argc, char **argv);
int dt_cmd_ckpt(int argc, char **argv);
int dt_cmd_launch(int argc, char **argv);
int dt_cmd_doctor(int argc, char **argv);
int dt_cmd_findbatch(int argc, char **argv);
int dt_cmd_generate(int argc, char **argv);
int dt_cmd_export(int argc, char **argv);
int dt_cmd_version(int argc, char **argv);

/* Reading a job (cli.c). Reads argv[1..argc) of subcommand cmd: one job file, --set key=value
 * (applied in order after the file), and where the pointers are not NULL
 * --print-config and --resume (others refuse them as unknown options);
 * loads and validates the job. 0; -1 after printing usage for -h or
 * --help (exit 0); or the exit code after printing the error. */
int dt_cli_parse_job(const char *cmd, const char *usage, int argc, char **argv, struct dt_job *job,
                     int *print_only, const char **resume);

/* Shared option parsing (options.c). is_help: arg is -h or --help, for
 * which every command prints its own usage to stdout and exits 0. */
int dt_cli_is_help(const char *arg);
/* 1 when any of the n args is -h or --help. */
int dt_cli_asks_help(int n, char **args);
/* The value `text` of option `opt` of command `cmd`: a whole number from lo
 * to hi, or a number from lo to hi (below hi with hi_open; hi INFINITY for
 * no upper bound). 0 with *out, or 64 after one message naming the option,
 * the range and `note` (appended to the range, e.g. " (0: all)"), whatever
 * is wrong with the text. */
int dt_cli_opt_int(const char *cmd, const char *opt, const char *text, int64_t lo, int64_t hi,
                   const char *note, int64_t *out);
int dt_cli_opt_real(const char *cmd, const char *opt, const char *text, double lo, double hi,
                    int hi_open, const char *note, double *out);

/* Messages (cli.c). Prints "dtrain: <message>" for a failed status and
 * returns its exit code. */
int dt_cli_fail(dt_status st);
/* Prints a usage error and returns 64. */
int dt_cli_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Starting as ranks (ranks.c). check_env: 0, or 64 after one message,
 * for what would leave MPI and dtrain unable to use the files they create
 * (a umask without the owner's permissions, an unusable TMPDIR or Open
 * MPI session directory); nothing is created. ranks_start: check_env,
 * MPI_Init_thread, the mpi communicator, then the agreement that every
 * rank runs the same `command` (quoted, with the options that change what
 * it does) and the same job (NULL: none); 0 with *comm, else the exit code
 * after the message (rank 0's for an agreed failure) with MPI finalised or
 * the job aborted. ranks_end: destroys comm and finalises MPI. ranks_join:
 * main's exit path for a process that returned rc without starting MPI:
 * when it is a rank of an Open MPI launch of several programs and rc is
 * 0, it takes part in the agreement (so peers that started MPI do not wait
 * for it) and returns 64 when they run something else; otherwise rc. */
int dt_cli_check_env(void);
int dt_cli_ranks_start(int *argc, char ***argv, const char *command, const struct dt_job *job,
                       dt_comm_t **comm);
void dt_cli_ranks_end(dt_comm_t *comm);
int dt_cli_ranks_join(int argc, char **argv, int rc);

/* Standard output (output.c). begin: before anything is printed; end:
 * the exit code for a command that returned rc, after flushing and closing
 * standard output: 74 with one message when a write to it failed (rc
 * itself when the command had failed already). failed: a write failed so
 * far (the exit path will say so: a command need not). */
void dt_cli_output_begin(void);
int dt_cli_output_end(int rc);
int dt_cli_output_failed(void);

#endif
