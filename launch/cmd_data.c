/*
 * cmd_data.c - `dtrain data import idx ...`, `dtrain data info FILE` and
 * `dtrain config reference|defaults`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/dataset.h"
#include "../io/idx.h"
#include "../runtime/config.h"
#include "../runtime/util.h"
#include "cli.h"

static int import_idx(int argc, char **argv)
{
    struct dt_idx_import_opts o = {0};
    const char *dir = NULL;
    static char found[4][4096];
    for (int i = 0; i < argc; i++) {
        const char **slot = NULL;
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output"))
            slot = &o.out_path;
        else if (!strcmp(argv[i], "--train-images"))
            slot = &o.train_images;
        else if (!strcmp(argv[i], "--train-labels"))
            slot = &o.train_labels;
        else if (!strcmp(argv[i], "--test-images"))
            slot = &o.test_images;
        else if (!strcmp(argv[i], "--test-labels"))
            slot = &o.test_labels;
        else if (!strcmp(argv[i], "--classes"))
            slot = &o.class_names;
        else if (!strcmp(argv[i], "--force")) {
            o.overwrite = 1;
            continue;
        } else if (argv[i][0] == '-')
            return dt_cli_usage("data import idx: unknown option '%s'", argv[i]);
        else if (dir)
            return dt_cli_usage("data import idx: more than one directory given");
        else {
            dir = argv[i];
            continue;
        }
        if (i + 1 >= argc)
            return dt_cli_usage("data import idx: %s needs a value", argv[i]);
        *slot = argv[++i];
    }
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
    if (argc >= 2 && !strcmp(argv[1], "import"))
        return dt_cli_usage("data import: unknown format '%s' (this version imports: idx)",
                            argc >= 3 ? argv[2] : "");
    if (argc >= 3 && !strcmp(argv[1], "info"))
        return info(argc - 2, argv + 2);
    return dt_cli_usage("data: expected 'import idx ...' or 'info FILE...'");
}

int dt_cmd_config(int argc, char **argv)
{
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
    return dt_cli_usage("config: expected 'reference' or 'defaults'");
}
