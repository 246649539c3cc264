/*
 * cmd_version.c - `dtrain version`: the version, the compute backends this
 * build has, and the GPU found or why none is usable (a probe of the
 * driver, no backend is created).
 */
#include <stdio.h>

#include "kernels/backend.h"
#include "cli.h"

static const char version_usage[] =
    "usage: dtrain version\n"
    "Prints dtrain's version, the compute backends built in, and the GPU found (or why\n"
    "none is usable).\n";

int dt_cmd_version(int argc, char **argv)
{
    if (argc >= 2 && dt_cli_is_help(argv[1])) return fputs(version_usage, stdout), 0;
    if (argc >= 2) return dt_cli_usage("version: unexpected argument '%s'", argv[1]);
    char why[512];
    int gpu = dt_cuda_usable(why, sizeof why);
    printf("dtrain %s (backends: %s)\ngpu: %s%s\n", DT_VERSION, dt_backend_list(),
           gpu ? "" : "none; ", why);
    return 0;
}
