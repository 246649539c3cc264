/*
 * cli.h - the dtrain subcommands. Each returns a process exit code
 * (sysexits) and prints its own errors; only launch/ turns statuses into
 * exit codes.
 */
#ifndef DT_CLI_H
#define DT_CLI_H

#include "../runtime/core/status.h"

int dt_cmd_train(int argc, char **argv);
int dt_cmd_data(int argc, char **argv);
int dt_cmd_config(int argc, char **argv);
int dt_cmd_bench(int argc, char **argv);
int dt_cmd_eval(int argc, char **argv);
int dt_cmd_ckpt(int argc, char **argv);
int dt_cmd_launch(int argc, char **argv);
int dt_cmd_doctor(int argc, char **argv);
int dt_cmd_findbatch(int argc, char **argv);

/* Prints "dtrain: <message>" for a failed status and returns its exit code. */
int dt_cli_fail(dt_status st);
/* Prints a usage error and returns 64. */
int dt_cli_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
