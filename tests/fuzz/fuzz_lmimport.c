/*
 * fuzz_lmimport.c - fuzz target: importing language-model token streams
 * (io/lm_import.h: dt_text_import, dt_tokens_import).
 *
 * The input chooses text mode or token mode. Text mode writes one to three
 * text files of the input's bytes and a val fraction (mostly 0.1, else
 * anything, NaN included). Token mode writes a train and an optional val
 * file, each, as the input chooses: nanoGPT raw uint16 tokens below the
 * vocabulary (byte 0), an llm.c file with a GPT-2 or a Llama 3 header
 * whose count matches, an llm.c header with a hostile magic, version or
 * count, raw bytes, an empty file, a missing file or a directory; the
 * vocabulary size and tokenizer are given or not. Further choices: an
 * output that already exists, with or without overwrite, a progress
 * stream. Besides "no crash, no leak", the target checks what lm_import.h
 * promises: a failure says why and leaves no output and no temporary
 * file behind; a success leaves an HDF5 file whose root says
 * task = "language_model" and whose /train/tokens (and /val/tokens) hold
 * exactly the tokens written, when the input made them well-formed.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fz_h5.h"
#include "fz_util.h"
#include "io/lm_import.h"

#define RAW_MAX 4096 /* bytes of one file taken from the input */
#define PATH_LEN 1024
#define MAX_TEXT_FILES 3
#define GPT2_VOCAB 50257
#define LLAMA3_VOCAB 128256

enum {
    TEXT_MODE = 1,
    WITH_VAL = 2,
    OUT_EXISTS = 4,
    OVERWRITE = 8,
    WITH_PROGRESS = 16,
    GIVE_VOCAB = 32,
    GIVE_TOKENIZER = 64
};

/* What a split should hold after a successful import: the tokens, or
 * known = 0 when the input's file was not built well-formed. */
struct expect {
    int known;
    uint32_t *tok;
    size_t n;
};

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* n tokens below vocab from the input's bytes (a pattern when none). */
static uint32_t *make_tokens(struct fz_in *in, size_t n, uint32_t vocab)
{
    const uint8_t *raw;
    size_t rawlen = fz_blob(in, RAW_MAX, &raw);
    uint32_t *t = malloc((n ? n : 1) * sizeof *t);
    FZ_REQUIRE(t, "out of memory");
    for (size_t i = 0; i < n; i++) {
        uint32_t v = rawlen ? (uint32_t)raw[i % rawlen] << 9 ^ (uint32_t)i * 2654435761u
                            : (uint32_t)i * 7919u;
        t[i] = v % vocab;
    }
    return t;
}

/* A token file at path as the input chooses; fills e. */
static void make_token_file(struct fz_in *in, const char *path, struct expect *e)
{
    unsigned kind = fz_u8(in) % 9, n = fz_u8(in);
    size_t count = n ? n : 8, len = 0;
    uint8_t *b = NULL;
    const uint8_t *raw;
    *e = (struct expect){0};
    switch (kind) {
    case 1: /* llm.c GPT-2 */
    case 2: /* llm.c Llama 3 */
    case 3: /* llm.c header, hostile fields */
    {
        int llama = kind == 2, width = llama ? 4 : 2;
        e->tok = make_tokens(in, count, llama ? LLAMA3_VOCAB : GPT2_VOCAB);
        len = 1024 + count * (size_t)width;
        b = calloc(len + 8, 1);
        FZ_REQUIRE(b, "out of memory");
        put_le32(b, llama ? 20240801u : 20240520u);
        put_le32(b + 4, llama ? 7u : 1u);
        put_le32(b + 8, (uint32_t)count);
        for (size_t i = 0; i < count; i++)
            for (int k = 0; k < width; k++)
                b[1024 + i * (size_t)width + (size_t)k] = (uint8_t)(e->tok[i] >> (8 * k));
        if (kind == 3) {
            unsigned field = fz_pick(in, 3); /* magic, version or count */
            put_le32(b + 4 * field, fz_u32(in));
            len = fz_pick(in, 2) ? len : fz_u16(in) % (len + 8);
        } else {
            e->known = 1;
            e->n = count;
        }
        break;
    }
    case 4: /* raw bytes */
        len = fz_blob(in, RAW_MAX, &raw);
        b = malloc(len + 1);
        FZ_REQUIRE(b, "out of memory");
        memcpy(b, raw, len);
        break;
    case 5: /* empty */
        b = malloc(1);
        FZ_REQUIRE(b, "out of memory");
        break;
    case 6:
        return; /* missing */
    case 7:
        mkdir(path, 0700);
        return;
    default: /* nanoGPT raw uint16 */
        e->tok = make_tokens(in, count, GPT2_VOCAB);
        len = 2 * count;
        b = malloc(len);
        FZ_REQUIRE(b, "out of memory");
        for (size_t i = 0; i < count; i++) {
            b[2 * i] = (uint8_t)e->tok[i];
            b[2 * i + 1] = (uint8_t)(e->tok[i] >> 8);
        }
        e->known = 1;
        e->n = count;
    }
    fz_write_file(path, b, len);
    free(b);
}

/* No "<out>.tmp.<host>.<pid>" may outlive an import. */
static void check_no_temp(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    FZ_REQUIRE(d, "cannot list %s", dir);
    while ((de = readdir(d)) != NULL)
        FZ_REQUIRE(!strstr(de->d_name, ".tmp."), "an import left %s behind", de->d_name);
    closedir(d);
}

/* /<split>/tokens of the open file holds e's tokens. */
static void check_split(hid_t f, const char *split, const struct expect *e)
{
    char name[64];
    snprintf(name, sizeof name, "/%s/tokens", split);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    FZ_REQUIRE(d >= 0, "an imported file has no %s", name);
    hid_t s = H5Dget_space(d);
    hsize_t n = 0;
    FZ_REQUIRE(H5Sget_simple_extent_ndims(s) == 1, "%s is not 1-D", name);
    H5Sget_simple_extent_dims(s, &n, NULL);
    FZ_REQUIRE(n >= 2, "%s holds %llu tokens; a split needs 2", name, (unsigned long long)n);
    if (e->known) {
        FZ_REQUIRE(n == e->n, "%s holds %llu tokens, %zu were written", name, (unsigned long long)n,
                   e->n);
        uint32_t *got = malloc(n * sizeof *got);
        FZ_REQUIRE(got, "out of memory");
        FZ_REQUIRE(H5Dread(d, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, got) >= 0,
                   "cannot read %s", name);
        for (size_t i = 0; i < n; i++)
            FZ_REQUIRE(got[i] == e->tok[i], "%s token %zu is %u, %u was written", name, i, got[i],
                       e->tok[i]);
        free(got);
    }
    H5Sclose(s);
    H5Dclose(d);
}

static void check_output(const char *out, const struct expect *e, int nsplits)
{
    static const char *const names[2] = {"train", "val"};
    hid_t f = H5Fopen(out, H5F_ACC_RDONLY, H5P_DEFAULT);
    FZ_REQUIRE(f >= 0, "an imported file does not open");
    hid_t a = H5Aopen(f, "task", H5P_DEFAULT);
    FZ_REQUIRE(a >= 0, "an imported file has no task attribute");
    H5Aclose(a);
    for (int i = 0; i < nsplits; i++)
        check_split(f, names[i], &e[i]);
    H5Fclose(f);
}

static dt_status import_text(struct fz_in *in, const char *out, unsigned flags, FILE *progress,
                             struct expect *e)
{
    char paths[MAX_TEXT_FILES][PATH_LEN + 16];
    const char *files[MAX_TEXT_FILES];
    int n = 1 + (int)fz_pick(in, MAX_TEXT_FILES);
    for (int i = 0; i < n; i++) {
        char name[32];
        const uint8_t *raw;
        snprintf(name, sizeof name, "text%d.txt", i);
        fz_scratch_path(paths[i], sizeof paths[i], name);
        size_t len = fz_blob(in, RAW_MAX, &raw);
        if (!len && !fz_pick(in, 2))
            fz_write_file(paths[i], "To be, or not to be, that is the question.\n", 43);
        else
            fz_write_file(paths[i], raw, len);
        files[i] = paths[i];
    }
    struct dt_text_import_opts o = {.files = files,
                                    .nfiles = n,
                                    .out_path = out,
                                    .val_fraction = fz_f64(in, 0.1),
                                    .overwrite = (flags & OVERWRITE) != 0};
    e[0].known = e[1].known = 0;
    return dt_text_import(&o, progress);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_in in = {data, size};
    char train[PATH_LEN], val[PATH_LEN], out[PATH_LEN];
    struct expect e[2] = {{0}, {0}};
    fz_quiet();
    fz_h5_quiet();
    unsigned flags = fz_u8(&in);
    fz_scratch_path(train, sizeof train, "train.bin");
    fz_scratch_path(val, sizeof val, "val.bin");
    fz_scratch_path(out, sizeof out, "out.h5");
    if (flags & OUT_EXISTS)
        fz_write_file(out, "old", 3);
    char *progress_text = NULL;
    size_t progress_len = 0;
    FILE *progress = flags & WITH_PROGRESS ? open_memstream(&progress_text, &progress_len) : NULL;

    dt_status st;
    int nsplits = 2;
    if (flags & TEXT_MODE) {
        st = import_text(&in, out, flags, progress, e);
        fz_note("dt_text_import", st);
    } else {
        struct dt_tokens_import_opts o = {
            .train = train, .out_path = out, .overwrite = (flags & OVERWRITE) != 0};
        make_token_file(&in, train, &e[0]);
        if (flags & WITH_VAL) {
            make_token_file(&in, val, &e[1]);
            o.val = val;
        } else {
            nsplits = 1;
        }
        if (flags & GIVE_VOCAB)
            o.vocab_size = fz_i64(&in, 70000);
        if (flags & GIVE_TOKENIZER)
            o.tokenizer = fz_pick(&in, 3) == 0 ? "gpt2" : fz_pick(&in, 2) ? "none" : "bpe";
        st = dt_tokens_import(&o, progress);
        fz_note("dt_tokens_import", st);
    }
    /* The builder's own check: the empty input's files import. */
    FZ_REQUIRE(size || st == DT_OK, "the empty input's files do not import: %s", dt_last_error());
    if (progress)
        fclose(progress);
    free(progress_text);

    struct stat sb;
    check_no_temp(fz_scratch());
    if (st == DT_OK) {
        check_output(out, e, nsplits);
    } else {
        fz_check_error(st, "the import");
        if (!(flags & OUT_EXISTS))
            FZ_REQUIRE(stat(out, &sb) != 0, "a failed import left its output behind");
        else
            FZ_REQUIRE(stat(out, &sb) == 0 && sb.st_size == 3,
                       "a failed import changed the output that was there");
    }
    FZ_REQUIRE(fz_h5_open_objects() == 0, "dtrain left %ld HDF5 objects open",
               fz_h5_open_objects());
    free(e[0].tok);
    free(e[1].tok);
    fz_scratch_clear();
    return 0;
}
