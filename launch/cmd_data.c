/*
 * cmd_data.c - `dtrain data import idx|npy|csv|text|tokens ...` and `dtrain
 * data info FILE`.
 */
#include <errno.h>
#include <float.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/csv.h"
#include "io/dataset.h"
#include "io/idx.h"
#include "io/lm_import.h"
#include "io/npy.h"
#include "io/outfile.h"
#include "core/alloc.h"
#include "cli.h"

/* A signal that ends an import removes the temporary file it was writing,
 * then ends the process as the signal would have (a shell sees 128 + the
 * signal's number), so an interrupted import leaves nothing behind. What
 * a kill -9 leaves, the next import of the same output removes. */
static const int import_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};

static void on_import_signal(int sig)
{
    dt_outfile_remove_pending();
    signal(sig, SIG_DFL);
    raise(sig); /* delivered when the handler returns, as the signal is blocked in it */
}

/* Signals ignored when dtrain started (nohup's SIGHUP, a background job's
 * SIGINT) stay ignored: they would not have ended the import. */
static void install_import_signals(void)
{
    for (size_t i = 0; i < sizeof import_signals / sizeof import_signals[0]; i++) {
        struct sigaction sa, old;
        if (sigaction(import_signals[i], NULL, &old) != 0 || old.sa_handler == SIG_IGN) continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_import_signal;
        sigemptyset(&sa.sa_mask);
        for (size_t k = 0; k < sizeof import_signals / sizeof import_signals[0]; k++)
            sigaddset(&sa.sa_mask, import_signals[k]);
        sigaction(import_signals[i], &sa, NULL);
    }
}

/* One value option of an importer: `NAME VALUE` stores VALUE in *slot. */
struct import_opt {
    const char *name;
    const char **slot;
};

/* Parses an importer's command line: the value options in `opts` (ended by
 * a NULL name), --force (or its synonym --overwrite), and, when `dir` is
 * not NULL, one positional directory (the IDX importer's). Returns 0, or 64
 * after a usage message. */
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
        } else if (!strcmp(argv[i], "--force") || !strcmp(argv[i], "--overwrite"))
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

/* data import text FILE... -o OUT.h5 [--val-fraction F] [--tokenizer DIR] [--force] */
static int import_text(int argc, char **argv)
{
    struct dt_text_import_opts o = {.val_fraction = DT_LM_DEFAULT_VAL_FRACTION};
    const char *frac = NULL;
    const char **files = NULL;
    int nfiles = 0;
    if (argc > 0 &&
        dt_malloc((size_t)argc * sizeof *files, "the file list", (void **)&files) != DT_OK)
        return dt_cli_fail(DT_ERR_NOMEM);
    int rc = 0;
    for (int i = 0; i < argc && !rc; i++) {
        const char **slot = !strcmp(argv[i], "-o") || !strcmp(argv[i], "--output") ? &o.out_path
                            : !strcmp(argv[i], "--val-fraction")                   ? &frac
                            : !strcmp(argv[i], "--tokenizer") ? &o.tokenizer
                                                              : NULL;
        if (slot && i + 1 >= argc)
            rc = dt_cli_usage("data import text: %s needs a value", argv[i]);
        else if (slot)
            *slot = argv[++i];
        else if (!strcmp(argv[i], "--force") || !strcmp(argv[i], "--overwrite"))
            o.overwrite = 1;
        else if (argv[i][0] == '-' && argv[i][1])
            rc = dt_cli_usage("data import text: unknown option '%s'", argv[i]);
        else
            files[nfiles++] = argv[i];
    }
    if (!rc && !o.out_path)
        rc = dt_cli_usage("data import text: no output file (-o OUT.h5)");
    if (!rc && !nfiles)
        rc = dt_cli_usage("data import text: no input files (data import text FILE... -o OUT.h5)");
    if (!rc && frac) {
        char *end;
        errno = 0;
        o.val_fraction = strtod(frac, &end);
        if (end == frac || *end)
            rc = dt_cli_usage("data import text: --val-fraction '%s' is not a number; expected "
                              "a number between 0 and 1 (exclusive)",
                              frac);
        else if (errno == ERANGE && o.val_fraction == 0.0)
            rc = dt_cli_usage("data import text: --val-fraction '%s' is too close to 0 to be "
                              "told from it (a double's smallest is about %.2g): split 'val' "
                              "would get no bytes",
                              frac, DBL_TRUE_MIN);
        else if (!(o.val_fraction > 0.0 && o.val_fraction < 1.0))
            rc = dt_cli_usage("data import text: --val-fraction '%s' is outside (0, 1); "
                              "expected a number between 0 and 1 (exclusive): the part of the "
                              "text that becomes split 'val'",
                              frac);
    }
    if (!rc) {
        o.files = files;
        o.nfiles = nfiles;
        dt_status st = dt_text_import(&o, stdout);
        rc = st == DT_OK ? 0 : dt_cli_fail(st);
    }
    free(files);
    return rc;
}

/* data import tokens --train F [--val F] -o OUT.h5 [--vocab-size N] [--tokenizer T] */
static int import_tokens(int argc, char **argv)
{
    struct dt_tokens_import_opts o = {0};
    const char *vocab = NULL;
    const struct import_opt opts[] = {
        {"-o", &o.out_path}, {"--output", &o.out_path}, {"--train", &o.train},
        {"--val", &o.val},   {"--vocab-size", &vocab},  {"--tokenizer", &o.tokenizer},
        {NULL, NULL}};
    int rc = parse_import("tokens", argc, argv, opts, &o.overwrite, NULL);
    if (rc)
        return rc;
    if (!o.out_path)
        return dt_cli_usage("data import tokens: no output file (-o OUT.h5)");
    if (!o.train)
        return dt_cli_usage("data import tokens: need --train FILE");
    if (vocab) {
        char *end;
        errno = 0;
        long long v = strtoll(vocab, &end, 10);
        if (end == vocab || *end)
            return dt_cli_usage("data import tokens: --vocab-size '%s' is not a whole number; "
                                "expected one from 2 to %lld",
                                vocab, 1LL << 24);
        if (errno == ERANGE || v < 2 || v > (1LL << 24))
            return dt_cli_usage("data import tokens: --vocab-size '%s' is outside 2 to %lld "
                                "(token ids are stored exactly as floats up to 2^24)",
                                vocab, 1LL << 24);
        o.vocab_size = v;
    }
    if (o.tokenizer && strcmp(o.tokenizer, "gpt2") != 0 && strcmp(o.tokenizer, "none") != 0)
        return dt_cli_usage("data import tokens: --tokenizer '%s': expected gpt2 or none",
                            o.tokenizer);
    dt_status st = dt_tokens_import(&o, stdout);
    return st == DT_OK ? 0 : dt_cli_fail(st);
}

static const char import_help[] =
    "usage: dtrain data import FORMAT ... -o OUT.h5 [--force]\n"
    "\n"
    "formats:\n"
    "  idx DIR | --train-images F --train-labels F [--test-images F --test-labels F]\n"
    "        [--classes a,b,...]\n"
    "        IDX files (MNIST format, raw or gzipped): a classification dataset\n"
    "  npy --train-x F --train-y F [--test-x F --test-y F] [--classes a,b,...]\n"
    "        NumPy .npy arrays (inputs (N, ...), integer labels (N,))\n"
    "  csv --train F [--test F] [--label-column N|NAME] [--header auto|yes|no]\n"
    "        [--classes a,b,...]\n"
    "        CSV files (a label column and numeric feature columns)\n"
    "  text FILE... [--val-fraction F] [--tokenizer DIR]\n"
    "        text as byte tokens (vocab 256) for a language model: the files' bytes in the\n"
    "        order given; the last F (default 0.1) of them, cut at a byte, is split 'val';\n"
    "        with --tokenizer, GPT-2's byte-level BPE of DIR/vocab.json and DIR/merges.txt\n"
    "        (<|endoftext|> after each file when the vocabulary has it; the last F of the\n"
    "        tokens is split 'val'), and the dataset keeps a copy of the two files\n"
    "  tokens --train F [--val F] [--vocab-size N] [--tokenizer gpt2|none]\n"
    "        token files for a language model: raw uint16 (nanoGPT's train.bin) or llm.c's\n"
    "        .bin (a 1024-byte header); vocab 50257 and tokenizer gpt2 unless given\n"
    "        (128256 and none for llm.c Llama 3 files)\n"
    "\n"
    "--force (or --overwrite) replaces an existing OUT.h5; a failed or interrupted import\n"
    "leaves no file and an old OUT.h5 as it was. OUT.h5 is written as OUT.h5.tmp.HOST.PID,\n"
    "which a signal removes; one a killed import left is removed by the next import of\n"
    "OUT.h5. A second import of an OUT.h5 that one on this host is writing exits 75.\n";

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

static const char data_usage[] =
    "usage: dtrain data import FORMAT ... -o OUT.h5 [--force]\n"
    "       dtrain data info FILE.h5 | 'GLOB' | FILE...\n"
    "  import  converts files into a dtrain dataset (formats idx, npy, csv, text, tokens;\n"
    "          'dtrain data import --help' shows each)\n"
    "  info    shows a dataset ('dtrain data info --help')\n";

static const char info_usage[] =
    "usage: dtrain data info FILE.h5 | 'GLOB' | FILE...\n"
    "Shows a dataset's files, format version, classes and normalisation, and per split\n"
    "its samples, shapes, dtypes and size. A quoted glob pattern or several files are one\n"
    "dataset that spans them, shown as a whole and file by file.\n";

int dt_cmd_data(int argc, char **argv)
{
    if (argc == 2 && dt_cli_is_help(argv[1])) return fputs(data_usage, stdout), 0;
    if (argc >= 3 && !strcmp(argv[1], "import") && dt_cli_asks_help(argc - 3, argv + 3))
        return fputs(import_help, stdout), 0;
    if (argc >= 2 && !strcmp(argv[1], "import")) install_import_signals();
    if (argc >= 3 && !strcmp(argv[1], "import") && !strcmp(argv[2], "idx"))
        return import_idx(argc - 3, argv + 3);
    if (argc >= 3 && !strcmp(argv[1], "import") && !strcmp(argv[2], "npy"))
        return import_npy(argc - 3, argv + 3);
    if (argc >= 3 && !strcmp(argv[1], "import") && !strcmp(argv[2], "csv"))
        return import_csv(argc - 3, argv + 3);
    if (argc >= 3 && !strcmp(argv[1], "import") && !strcmp(argv[2], "text"))
        return import_text(argc - 3, argv + 3);
    if (argc >= 3 && !strcmp(argv[1], "import") && !strcmp(argv[2], "tokens"))
        return import_tokens(argc - 3, argv + 3);
    if (argc >= 3 && !strcmp(argv[1], "import") &&
        (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h") || !strcmp(argv[2], "help"))) {
        fputs(import_help, stdout);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "import")) {
        fputs(import_help, stderr);
        return 64;
    }
    if (argc >= 2 && !strcmp(argv[1], "import"))
        return dt_cli_usage("data import: unknown format '%s' (this version imports: idx, npy, "
                            "csv, text, tokens; see 'dtrain data import --help')",
                            argv[2]);
    if (argc >= 2 && !strcmp(argv[1], "info") && dt_cli_asks_help(argc - 2, argv + 2))
        return fputs(info_usage, stdout), 0;
    if (argc >= 3 && !strcmp(argv[1], "info"))
        return info(argc - 2, argv + 2);
    return dt_cli_usage("data: expected 'import idx|npy|csv|text|tokens ...' or 'info FILE...'");
}
