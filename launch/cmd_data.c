/*
 * cmd_data.c - `dtrain data import idx|npy|csv ...`, `dtrain data info
 * FILE` and `dtrain config reference|layers|defaults`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/csv.h"
#include "../io/dataset.h"
#include "../io/idx.h"
#include "../io/npy.h"
#include "../runtime/config.h"
#include "../runtime/layers/layer.h"
#include "../runtime/core/util.h"
#include "cli.h"

/* One value option of an importer: `NAME VALUE` stores VALUE in *slot. */
struct import_opt {
    const char *name;
    const char **slot;
};

/* Parses an importer's command line: the value options in `opts` (ended by
 * a NULL name), --force, and, when `dir` is not NULL, one positional
 * directory (the IDX importer's). Returns 0, or 64 after a usage message. */
static int parse_import(const char *what, int argc, char **argv, const struct import_opt *opts,
                        int *force, const char **dir)
{
    for (int i = 0; i < argc; i++) {
        const struct import_opt *op = opts;
        while (op->name && strcmp(argv[i], op->name) != 0)
            op++;
        if (op->name) {
            if (i + 1 >= argc)
                return dt_cli_usage("data import %s: %s needs a value", what, argv[i]);
            *op->slot = argv[++i];
        } else if (!strcmp(argv[i], "--force"))
            *force = 1;
        else if (!dir)
            return dt_cli_usage("data import %s: unknown argument '%s'", what, argv[i]);
        else if (argv[i][0] == '-')
            return dt_cli_usage("data import %s: unknown option '%s'", what, argv[i]);
        else if (*dir)
            return dt_cli_usage("data import %s: more than one directory given", what);
        else
            *dir = argv[i];
    }
    return 0;
}

static int import_idx(int argc, char **argv)
{
    struct dt_idx_import_opts o = {0};
    const char *dir = NULL;
    static char found[4][4096];
    const struct import_opt opts[] = {{"-o", &o.out_path},
                                      {"--output", &o.out_path},
                                      {"--train-images", &o.train_images},
                                      {"--train-labels", &o.train_labels},
                                      {"--test-images", &o.test_images},
                                      {"--test-labels", &o.test_labels},
                                      {"--classes", &o.class_names},
                                      {NULL, NULL}};
    int rc = parse_import("idx", argc, argv, opts, &o.overwrite, &dir);
    if (rc)
        return rc;
    if (!o.out_path)
        return dt_cli_usage("data import idx: no output file (-o OUT.h5)");
    dt_status st;
    if (dir) {
        if (o.train_images || o.train_labels || o.test_images || o.test_labels)
            return dt_cli_usage("data import idx: give a directory or --train-images/... files, "
                                "not both");
        if ((st = dt_idx_find_in_dir(dir, &o, found)) != DT_OK)
            return dt_cli_fail(st);
    }
    if (!o.train_images || !o.train_labels)
        return dt_cli_usage("data import idx: need a directory or --train-images and "
                            "--train-labels");
    if (!o.test_images != !o.test_labels)
        return dt_cli_usage("data import idx: --test-images and --test-labels go together");
    if ((st = dt_idx_import(&o, stdout)) != DT_OK)
        return dt_cli_fail(st);
    return 0;
}

static int import_npy(int argc, char **argv)
{
    struct dt_npy_import_opts o = {0};
    const struct import_opt opts[] = {{"-o", &o.out_path},       {"--output", &o.out_path},
                                      {"--train-x", &o.train_x}, {"--train-y", &o.train_y},
                                      {"--test-x", &o.test_x},   {"--test-y", &o.test_y},
                                      {"--classes", &o.class_names}, {NULL, NULL}};
    int rc = parse_import("npy", argc, argv, opts, &o.overwrite, NULL);
    if (rc)
        return rc;
    if (!o.out_path)
        return dt_cli_usage("data import npy: no output file (-o OUT.h5)");
    if (!o.train_x || !o.train_y)
        return dt_cli_usage("data import npy: need --train-x and --train-y");
    if (!o.test_x != !o.test_y)
        return dt_cli_usage("data import npy: --test-x and --test-y go together");
    dt_status st = dt_npy_import(&o, stdout);
    return st == DT_OK ? 0 : dt_cli_fail(st);
}

static int import_csv(int argc, char **argv)
{
    struct dt_csv_import_opts o = {0};
    const char *header = NULL;
    const struct import_opt opts[] = {{"-o", &o.out_path},
                                      {"--output", &o.out_path},
                                      {"--train", &o.train},
                                      {"--test", &o.test},
                                      {"--label-column", &o.label_column},
                                      {"--header", &header},
                                      {"--classes", &o.class_names},
                                      {NULL, NULL}};
    int rc = parse_import("csv", argc, argv, opts, &o.overwrite, NULL);
    if (rc)
        return rc;
    if (!o.out_path)
        return dt_cli_usage("data import csv: no output file (-o OUT.h5)");
    if (!o.train)
        return dt_cli_usage("data import csv: need --train FILE");
    if (!header || !strcmp(header, "auto"))
        o.header = DT_CSV_HEADER_AUTO;
    else if (!strcmp(header, "yes"))
        o.header = DT_CSV_HEADER_YES;
    else if (!strcmp(header, "no"))
        o.header = DT_CSV_HEADER_NO;
    else
        return dt_cli_usage("data import csv: --header '%s': expected auto, yes or no", header);
    if (o.label_column && !*o.label_column)
        return dt_cli_usage("data import csv: --label-column is empty");
    dt_status st = dt_csv_import(&o, stdout);
    return st == DT_OK ? 0 : dt_cli_fail(st);
}

/* data info FILE... : one file, a quoted glob pattern, or several files
 * that together are one dataset (shown as a whole, with each file). */
static int info(int n, char **files)
{
    dt_dataset_t *ds;
    char *path = NULL;
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += strlen(files[i]) + 1;
    if (dt_malloc(len, "the dataset list", (void **)&path) != DT_OK)
        return dt_cli_fail(DT_ERR_NOMEM);
    path[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (strchr(files[i], '\n') || !files[i][0]) {
            free(path);
            return dt_cli_usage("data info: file name %d is empty or holds a newline", i + 1);
        }
        if (i)
            strcat(path, "\n");
        strcat(path, files[i]);
    }
    dt_status st = dt_dataset_open(path, &ds);
    free(path);
    if (st != DT_OK)
        return dt_cli_fail(st);
    dt_dataset_print(ds, stdout);
    dt_dataset_close(ds);
    return 0;
}

int dt_cmd_data(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "import") && !strcmp(argv[2], "idx"))
        return import_idx(argc - 3, argv + 3);
    if (argc >= 3 && !strcmp(argv[1], "import") && !strcmp(argv[2], "npy"))
        return import_npy(argc - 3, argv + 3);
    if (argc >= 3 && !strcmp(argv[1], "import") && !strcmp(argv[2], "csv"))
        return import_csv(argc - 3, argv + 3);
    if (argc >= 2 && !strcmp(argv[1], "import"))
        return dt_cli_usage("data import: unknown format '%s' (this version imports: idx, npy, "
                            "csv)",
                            argc >= 3 ? argv[2] : "");
    if (argc >= 3 && !strcmp(argv[1], "info"))
        return info(argc - 2, argv + 2);
    return dt_cli_usage("data: expected 'import idx|npy|csv ...' or 'info FILE...'");
}

int dt_cmd_config(int argc, char **argv)
{
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
