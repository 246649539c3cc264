/*
 * cmd_config.c - `dtrain config reference|layers|defaults`: the job-file
 * and layer references and the default job, each printed from the tables
 * the job is read with (runtime/config, runtime/model/layers), so they
 * cannot drift from what dtrain accepts.
 */
#include <stdio.h>
#include <string.h>

#include "runtime/config/config.h"
#include "runtime/model/layers/layer.h"
#include "cli.h"

static const char config_usage[] =
    "usage: dtrain config reference | layers | defaults\n"
    "  reference  print the job-file reference as Markdown: every key, its type, default,\n"
    "             allowed values and meaning, and the rules between keys (docs/config.md)\n"
    "  layers     print the layer reference: every layer kind of model.layers and its\n"
    "             settings (docs/layers.md)\n"
    "  defaults   print the default job as YAML (a job file)\n";

int dt_cmd_config(int argc, char **argv)
{
    if (dt_cli_asks_help(argc - 1, argv + 1)) return fputs(config_usage, stdout), 0;
    if (argc == 2 && !strcmp(argv[1], "layers")) {
        dt_layer_write_reference(stdout);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "reference")) {
        dt_job_write_reference(stdout);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "defaults")) {
        static struct dt_job job;
        dt_job_defaults(&job);
        dt_job_write_yaml(&job, stdout);
        return 0;
    }
    return dt_cli_usage("config: expected 'reference', 'layers' or 'defaults'");
}
