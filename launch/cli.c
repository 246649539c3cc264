/*
 * cli.c - what the commands share besides option parsing: the one-line
 * messages for a failed status and for a usage error, and the reading of a
 * job from the command line (one job file, then --set overrides in order)
 * that train, eval and generate all start with.
 *
 * These live apart from main.c (which is only the dispatch) and from the
 * commands themselves, so that no command reaches into another's file and
 * each cmd_*.c stands on launch/'s shared helpers alone
 * (tests/layout/cli_check.py holds the tree to that).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "runtime/config/config.h"
#include "cli.h"

int dt_cli_fail(dt_status st)
{
    const char *msg = dt_last_error();
    fprintf(stderr, "dtrain: %s\n", msg[0] ? msg : dt_status_str(st));
    return dt_status_exit_code(st);
}

int dt_cli_usage(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "dtrain: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see 'dtrain --help')\n");
    return 64;
}

int dt_cli_parse_job(const char *cmd, const char *usage, int argc, char **argv, struct dt_job *job,
                     int *print_only, const char **resume)
{
    const char *path = NULL;
    dt_status st;
    if (print_only) *print_only = 0;
    if (resume) *resume = "auto";
    for (int i = 1; i < argc; i++) {
        if (dt_cli_is_help(argv[i])) return fputs(usage, stdout), -1;
        if (print_only && !strcmp(argv[i], "--print-config"))
            *print_only = 1;
        else if (resume && !strcmp(argv[i], "--resume")) {
            if (++i >= argc || !argv[i][0])
                return dt_cli_usage("%s: --resume needs auto, never or a checkpoint path", cmd);
            *resume = argv[i];
        } else if (resume && !strncmp(argv[i], "--resume=", 9) && argv[i][9])
            *resume = argv[i] + 9;
        else if (!strcmp(argv[i], "--set") || !strncmp(argv[i], "--set=", 6)) {
            /* applied after the file is loaded, below */
            if (!strcmp(argv[i], "--set") && ++i >= argc)
                return dt_cli_usage("%s: --set needs key=value", cmd);
        } else if (argv[i][0] == '-')
            return dt_cli_usage("%s: unknown option '%s'", cmd, argv[i]);
        else if (path)
            return dt_cli_usage("%s: more than one job file ('%s' and '%s')", cmd, path, argv[i]);
        else
            path = argv[i];
    }
    if (!path)
        return dt_cli_usage("%s: no job file given (e.g. configs/fashion-mnist-mlp.yaml)", cmd);
    if ((st = dt_job_load(path, job)) != DT_OK)
        return dt_cli_fail(st);
    for (int i = 1; i < argc; i++) {
        const char *kv = NULL;
        if (!strcmp(argv[i], "--set"))
            kv = argv[++i];
        else if (!strncmp(argv[i], "--set=", 6))
            kv = argv[i] + 6;
        if (kv && (st = dt_job_set(job, kv)) != DT_OK)
            return dt_cli_fail(st);
    }
    if ((st = dt_job_validate(job)) != DT_OK)
        return dt_cli_fail(st);
    return 0;
}
