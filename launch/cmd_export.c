/*
 * cmd_export.c - `dtrain export JOB --checkpoint PATH -o OUT [--format
 * safetensors|hf] [--force] [--set k=v ...]`: a trained model written for
 * other tools (runtime/export/export.h). One process, one rank.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/comm.h"
#include "core/log.h"
#include "runtime/export/export.h"
#include "cli.h"

static const char export_usage[] =
    "usage: dtrain export JOB.yaml --checkpoint PATH -o OUT [--format safetensors|hf] [--force]\n"
    "                     [--set key=value ...]\n"
    "\n"
    "Writes the model JOB.yaml trained, with the parameters of PATH, for other tools.\n"
    "\n"
    "  --checkpoint PATH   a checkpoint of the run, or the run's model.h5\n"
    "  -o, --output OUT    the file or directory to write (must not exist, unless --force)\n"
    "  --format F          safetensors: one file, dtrain's tensor names (parameters and\n"
    "                      buffers); the default when OUT ends in .safetensors\n"
    "                      hf: a Hugging Face GPT-2 directory (config.json, model.safetensors)\n"
    "                      for a model.type gpt job; the default otherwise\n"
    "  --force             replace an existing OUT, once the new one is complete\n"
    "  --set key=value     override a job setting (as for train)\n";

static int ends_with(const char *s, const char *end)
{
    size_t a = strlen(s), b = strlen(end);
    return a >= b && strcmp(s + a - b, end) == 0;
}

/* Takes the export options out of argv; the rest goes to rest. 0, -1
 * after the help, or 64 after a usage error. */
static int parse_opts(int argc, char **argv, struct dt_export_opts *o, char **rest, int *nrest)
{
    const char *format = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--checkpoint")                      ? &o->checkpoint
                           : !strcmp(a, "-o") || !strcmp(a, "--output")   ? &o->out
                           : !strcmp(a, "--format")                        ? &format
                                                                           : NULL;
        if (dst) {
            if (i + 1 >= argc)
                return dt_cli_usage("export: %s needs a value", a);
            *dst = argv[++i];
        } else if (!strncmp(a, "--checkpoint=", 13))
            o->checkpoint = a + 13;
        else if (!strncmp(a, "--output=", 9))
            o->out = a + 9;
        else if (!strncmp(a, "--format=", 9))
            format = a + 9;
        else if (!strcmp(a, "--force"))
            o->force = 1;
        else if (dt_cli_is_help(a))
            return fputs(export_usage, stdout), -1;
        else if (!strcmp(a, "--set") || !strncmp(a, "--set=", 6)) {
            rest[(*nrest)++] = argv[i];
            if (!strcmp(a, "--set") && i + 1 < argc)
                rest[(*nrest)++] = argv[++i];
        } else if (a[0] == '-' && a[1] != '\0')
            return dt_cli_usage("export: unknown option '%s'", a);
        else
            rest[(*nrest)++] = argv[i];
    }
    if (!o->checkpoint || !o->checkpoint[0])
        return dt_cli_usage("export: --checkpoint PATH is required (a checkpoint in the run's "
                            "checkpoints/ folder, or the run's model.h5)");
    if (!o->out || !o->out[0])
        return dt_cli_usage("export: -o OUT is required (a .safetensors file, or a directory "
                            "for --format hf)");
    if (!format)
        o->format = ends_with(o->out, ".safetensors") ? DT_EXPORT_SAFETENSORS : DT_EXPORT_HF;
    else if (!strcmp(format, "safetensors"))
        o->format = DT_EXPORT_SAFETENSORS;
    else if (!strcmp(format, "hf"))
        o->format = DT_EXPORT_HF;
    else
        return dt_cli_usage("export: --format is safetensors or hf, not '%s'", format);
    return 0;
}

int dt_cmd_export(int argc, char **argv)
{
    static struct dt_job job;
    struct dt_export_opts o = {0};
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int nrest = 1;
    if (!rest)
        return dt_cli_fail(dt_set_error(DT_ERR_NOMEM, "out of memory reading the command line"));
    rest[0] = argv[0];
    int rc = parse_opts(argc, argv, &o, rest, &nrest);
    if (rc < 0) {
        free(rest);
        return 0;
    }
    if (rc == 0) rc = dt_cli_parse_job("export", export_usage, nrest, rest, &job, NULL, NULL);
    free(rest);
    if (rc != 0) return rc < 0 ? 0 : rc;
    if (getenv("DTRAIN_LOG") == NULL)
        dt_log_set_level(DT_LOG_LEVEL_WARN);
    char command[DT_JOB_PATH + 64];
    dt_comm_t *comm = NULL;
    snprintf(command, sizeof command, "'dtrain export'");
    rc = dt_cli_ranks_start(&argc, &argv, command, &job, &comm);
    if (rc != 0) return rc;
    dt_status st = dt_export_run(&job, comm, &o);
    rc = dt_status_exit_code(st);
    if (st != DT_OK && dt_comm_rank(comm) == 0) dt_cli_fail(st);
    else if (st == DT_OK)
        fprintf(stderr, "dtrain: wrote %s\n", o.out);
    dt_cli_ranks_end(comm);
    return rc;
}
