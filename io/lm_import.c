/*
 * lm_import.c - importing token streams for language models (see
 * lm_import.h): text files as byte tokens, and nanoGPT / llm.c token
 * files, into the "Language-model files" of dataset.h.
 *
 * Both importers reduce their inputs to a list of segments per split (a
 * run of tokens of 1, 2 or 4 bytes at an offset of an open file) and
 * everything is checked that can be checked without reading the tokens
 * (sizes, headers, counts, the split sizes) before the output is created.
 * One writer then streams the segments through a buffer of
 * LM_CHUNK_TOKENS tokens into a fixed-size, contiguous 1-D `tokens`
 * dataset per split, by hyperslabs: GPT-2 token sets are gigabytes, and
 * a contiguous dataset is what random windows of seq_len + 1 tokens read
 * best (one read each, no chunk index or cache). Each token is checked
 * against vocab_size on the way; a bad one names the file, its position
 * and its value. Token files are read as little-endian whatever the host.
 * The file is written through outfile.h as "<out>.tmp.<host>.<pid>" in
 * the output's directory: its space reserved first, then closed, fsynced
 * and renamed into place; the temporary file is removed on any failure, so
 * a bad token found late leaves nothing behind either (and on a signal, by
 * launch/'s handler; one a killed import left is removed by the next
 * import of the same output).
 */
#define _GNU_SOURCE
#include "lm_import.h"

#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/files.h"
#include "bpe.h"
#include "dataset.h"
#include "hdf5_lock.h"
#include "import.h"
#include "outfile.h"

#define LM_CHUNK_TOKENS ((int64_t)1 << 20) /* tokens read and written at a time */
#define LM_PROGRESS_SECONDS 10.0           /* between progress lines of a long split */
#define LM_MIN_SPLIT_TOKENS 2              /* one input token and its target */
#define LM_MAX_VOCAB ((int64_t)1 << 24)    /* dataset.h: token ids are exact as floats */
#define LM_U16_VOCAB 65536                 /* up to this, tokens are stored as uint16 */
#define LM_BYTE_VOCAB 256

/* llm.c's token files (dev/data/data_common.py): 256 little-endian int32,
 * [0] magic, [1] version, [2] token count, then the tokens. */
#define LLMC_HEADER_INTS 256
#define LLMC_HEADER_BYTES (LLMC_HEADER_INTS * 4)
#define LLMC_MAGIC_GPT2 20240520
#define LLMC_VERSION_GPT2 1 /* uint16 tokens */
#define LLMC_MAGIC_LLAMA3 20240801
#define LLMC_VERSION_LLAMA3 7    /* uint32 tokens */
#define LLMC_MAGIC_EVAL 20240522 /* HellaSwag / MMLU examples, not a token stream */
#define LLAMA3_VOCAB 128256
/* Files that are often passed by mistake: refused by their signatures. */
#define NPY_SIGNATURE "\x93NUMPY"
#define HDF5_SIGNATURE "\x89HDF\r\n\x1a\n"
/* A raw file whose first int32 falls here may be an llm.c file whose
 * magic dtrain does not know (llm.c's magics are dates). */
#define LLMC_MAGIC_LIKE_MIN 20000000
#define LLMC_MAGIC_LIKE_MAX 21000000

/* A run of `count` tokens of `in_bytes` bytes each, at byte `offset` of
 * an open input; `first` is the index of its first token among the file's
 * tokens (for messages). */
struct lm_segment {
    const char *path;
    const char *what; /* "text file", "token file" */
    int fd;
    int64_t offset;
    int64_t first;
    int64_t count;
    int in_bytes;     /* 1, 2 or 4 */
    int raw;          /* a token file without a header */
    const int32_t *mem; /* tokens already in memory (the BPE-encoded text), or NULL */
    int64_t head_int; /* a raw file's first 4 bytes as an int32 (for a hint) */
};

struct lm_split {
    const char *name; /* "train", "val" */
    struct lm_segment *seg;
    int nseg;
    int64_t ntokens;
    char source[9000]; /* for the summary line: up to two paths and more */
};

/* ---- reading --------------------------------------------------------------- */

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Reads len bytes at offset; a file that ends early or fails is DT_ERR_IO. */
static dt_status read_at(const struct lm_segment *s, void *buf, size_t len, int64_t offset)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(s->fd, (char *)buf + got, len - got, (off_t)(offset + (int64_t)got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return dt_set_error(DT_ERR_IO, "%s %s: cannot read at byte %lld: %s", s->what, s->path,
                                (long long)(offset + (int64_t)got), strerror(errno));
        if (n == 0)
            return dt_set_error(DT_ERR_IO,
                                "%s %s: ends at byte %lld, but it held at least %lld bytes when "
                                "the import began (it changed while being read); import it again",
                                s->what, s->path, (long long)(offset + (int64_t)got),
                                (long long)(offset + (int64_t)len));
        got += (size_t)n;
    }
    return DT_OK;
}

/* Converts n tokens of s from `in` (little-endian) to out (uint16 or
 * int32), checking each against vocab; `pos` is the index in the segment
 * of in's first token. */
static dt_status convert(const struct lm_segment *s, const unsigned char *in, int64_t n,
                         int64_t pos, int64_t vocab, int out_u16, void *out)
{
    for (int64_t i = 0; i < n; i++) {
        const unsigned char *p = in + i * s->in_bytes;
        uint32_t v = s->in_bytes == 1   ? p[0]
                     : s->in_bytes == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8
                                        : le32(p);
        if ((int64_t)v >= vocab) {
            int64_t idx = s->first + pos + i;
            char hint[320] = "";
            if (s->raw && idx < 2 && s->head_int >= LLMC_MAGIC_LIKE_MIN &&
                s->head_int <= LLMC_MAGIC_LIKE_MAX)
                snprintf(hint, sizeof hint,
                         "; its first 4 bytes read as an int32 are %lld: if it is an llm.c token "
                         "file, its magic is not one this version reads (%d: GPT-2 tokens, %d: "
                         "Llama 3 tokens)",
                         (long long)s->head_int, LLMC_MAGIC_GPT2, LLMC_MAGIC_LLAMA3);
            return dt_set_error(DT_ERR_BAD_DATA,
                                "%s %s: token %lld (byte %lld) is %lu, not below the vocabulary "
                                "size %lld (--vocab-size)%s",
                                s->what, s->path, (long long)idx,
                                (long long)(s->offset + (pos + i) * s->in_bytes), (unsigned long)v,
                                (long long)vocab, hint);
        }
        if (out_u16)
            ((uint16_t *)out)[i] = (uint16_t)v;
        else
            ((int32_t *)out)[i] = (int32_t)v;
    }
    return DT_OK;
}

/* ---- writing --------------------------------------------------------------- */

struct lm_writer {
    const char *out_path, *tmp;
    hid_t file;
    int64_t vocab;
    int out_u16;
    unsigned char *in; /* LM_CHUNK_TOKENS tokens as read */
    void *out;         /* the same converted */
    FILE *progress;
    const dt_bpe_t *bpe; /* its files go into /tokenizer, or NULL */
};

/* Creates /<name>/tokens of n tokens. Caller holds the HDF5 lock. */
static dt_status create_tokens(const struct lm_writer *w, const char *name, int64_t n, hid_t *d)
{
    dt_status st = DT_OK;
    hsize_t dims = (hsize_t)n;
    hid_t g = H5Gcreate2(w->file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t s = H5Screate_simple(1, &dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    *d = -1;
    if (g < 0 || s < 0 || dcpl < 0 || H5Pset_layout(dcpl, H5D_CONTIGUOUS) < 0 ||
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0 ||
        (*d = H5Dcreate2(g, "tokens", w->out_u16 ? H5T_STD_U16LE : H5T_STD_I32LE, s, H5P_DEFAULT,
                         dcpl, H5P_DEFAULT)) < 0)
        st = dt_h5_write_error("dataset", w->out_path, w->tmp, "create /%s/tokens", name);
    dt_h5_close(dcpl);
    dt_h5_close(s);
    dt_h5_close(g);
    return st;
}

/* Writes n converted tokens at `at` of d. Caller holds the HDF5 lock. */
static dt_status write_tokens(const struct lm_writer *w, const char *name, hid_t d, int64_t at,
                              int64_t n)
{
    dt_status st = DT_OK;
    hsize_t start = (hsize_t)at, count = (hsize_t)n;
    hid_t fs = H5Dget_space(d);
    hid_t ms = H5Screate_simple(1, &count, NULL);
    if (fs < 0 || ms < 0 ||
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &count, NULL) < 0 ||
        H5Dwrite(d, w->out_u16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_INT32, ms, fs, H5P_DEFAULT,
                 w->out) < 0)
        st = dt_h5_write_error("dataset", w->out_path, w->tmp, "write tokens %lld to %lld of /%s",
                               (long long)at, (long long)(at + n), name);
    dt_h5_close(ms);
    dt_h5_close(fs);
    return st;
}

static dt_status write_split(struct lm_writer *w, const struct lm_split *sp)
{
    dt_status st = DT_OK;
    hid_t d = -1;
    int64_t done = 0;
    double t0 = dt_now(), last = t0;
    dt_h5_lock();
    st = create_tokens(w, sp->name, sp->ntokens, &d);
    dt_h5_unlock();
    if (st != DT_OK)
        goto out;
    for (int k = 0; k < sp->nseg; k++) {
        const struct lm_segment *s = &sp->seg[k];
        for (int64_t pos = 0; pos < s->count; pos += LM_CHUNK_TOKENS) {
            int64_t n = s->count - pos < LM_CHUNK_TOKENS ? s->count - pos : LM_CHUNK_TOKENS;
            if (s->mem)
                memcpy(w->in, s->mem + pos, (size_t)n * sizeof *s->mem);
            else
                DT_CHECK(read_at(s, w->in, (size_t)(n * s->in_bytes),
                                 s->offset + pos * s->in_bytes));
            DT_CHECK(convert(s, w->in, n, pos, w->vocab, w->out_u16, w->out));
            dt_h5_lock();
            st = write_tokens(w, sp->name, d, done, n);
            dt_h5_unlock();
            if (st != DT_OK)
                goto out;
            done += n;
            if (w->progress && dt_now() - last >= LM_PROGRESS_SECONDS) {
                last = dt_now();
                fprintf(w->progress, "  %s: %lld of %lld tokens (%.0f%%, %.1f M tokens/s)\n",
                        sp->name, (long long)done, (long long)sp->ntokens,
                        100.0 * (double)done / (double)sp->ntokens,
                        (double)done / (last - t0) / 1e6);
                fflush(w->progress);
            }
        }
    }
    if (w->progress) {
        fprintf(w->progress, "  %s: %lld tokens (%s) from %s\n", sp->name, (long long)sp->ntokens,
                w->out_u16 ? "uint16" : "int32", sp->source);
        fflush(w->progress);
    }
out:
    if (d >= 0) {
        dt_h5_lock();
        if (H5Dclose(d) < 0 && st == DT_OK)
            st = dt_h5_write_error("dataset", w->out_path, w->tmp, "finish /%s/tokens", sp->name);
        dt_h5_unlock();
    }
    return st;
}

/* The tokenizer's files as /tokenizer/vocab.json and /tokenizer/merges.txt
 * (uint8). Caller holds the HDF5 lock. */
static dt_status write_tokenizer(const struct lm_writer *w)
{
    const char *f[2];
    size_t len[2];
    static const char *const names[2] = {"vocab.json", "merges.txt"};
    dt_status st = DT_OK;
    dt_bpe_files(w->bpe, &f[0], &len[0], &f[1], &len[1]);
    hid_t g = H5Gcreate2(w->file, "tokenizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0)
        return dt_h5_write_error("dataset", w->out_path, w->tmp, "create /tokenizer");
    for (int i = 0; i < 2 && st == DT_OK; i++) {
        hsize_t n = (hsize_t)len[i];
        hid_t s = H5Screate_simple(1, &n, NULL);
        hid_t d = s >= 0 ? H5Dcreate2(g, names[i], H5T_STD_U8LE, s, H5P_DEFAULT, H5P_DEFAULT,
                                      H5P_DEFAULT)
                         : -1;
        if (d < 0 || (n && H5Dwrite(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, f[i]) < 0))
            st = dt_h5_write_error("dataset", w->out_path, w->tmp, "write /tokenizer/%s",
                                   names[i]);
        dt_h5_close(d);
        dt_h5_close(s);
    }
    dt_h5_close(g);
    return st;
}

static uint64_t estimate(const struct lm_split *sp, int nsplits, int out_u16)
{
    uint64_t data = 0;
    for (int i = 0; i < nsplits; i++)
        data += (uint64_t)sp[i].ntokens * (out_u16 ? 2u : 4u);
    return dt_outfile_hdf5_estimate(data, 2 * (uint64_t)nsplits, 256);
}

/* Writes the splits to the temporary file w->tmp; *made when it exists. */
static dt_status write_file(struct lm_writer *w, const struct lm_split *sp, int nsplits,
                            const char *tokenizer, int *made)
{
    dt_status st = DT_OK;
    uint64_t bytes = estimate(sp, nsplits, w->out_u16);
    dt_h5_lock();
    w->file = H5Fcreate(w->tmp, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    if (w->file < 0)
        st = dt_h5_write_error("dataset", w->out_path, w->tmp, "create %s", w->tmp);
    dt_h5_unlock();
    if (st != DT_OK)
        return st;
    *made = 1;
    DT_CHECK(dt_outfile_reserve("dataset", w->tmp, bytes));
    for (int i = 0; i < nsplits; i++)
        DT_CHECK(write_split(w, &sp[i]));
    dt_h5_lock();
    st = dt_import_write_lm_root_attrs(w->file, w->out_path, (int32_t)w->vocab, tokenizer);
    if (st == DT_OK && w->bpe)
        st = write_tokenizer(w);
    dt_h5_unlock();
out:
    dt_h5_lock();
    if (H5Fclose(w->file) < 0 && st == DT_OK)
        st = dt_h5_write_error("dataset", w->out_path, w->tmp, "finish writing %s", w->tmp);
    dt_h5_unlock();
    if (st == DT_OK)
        dt_outfile_release(w->tmp, bytes);
    return st;
}

/* The one writer of both importers: splits to out_path, through a
 * temporary file that is renamed into place when complete. */
static dt_status write_lm(const char *out_path, const struct lm_split *sp, int nsplits,
                          int64_t vocab, const char *tokenizer, const dt_bpe_t *bpe,
                          FILE *progress)
{
    dt_status st = DT_OK;
    char tmp[DT_OUTFILE_TMP_LEN] = "";
    int made = 0, committed = 0;
    double t0 = dt_now();
    struct lm_writer w = {.out_path = out_path,
                          .tmp = tmp,
                          .file = -1,
                          .vocab = vocab,
                          .out_u16 = vocab <= LM_U16_VOCAB,
                          .progress = progress,
                          .bpe = bpe};
    DT_CHECK(dt_malloc((size_t)LM_CHUNK_TOKENS * 4, "the token read buffer", (void **)&w.in));
    DT_CHECK(dt_malloc((size_t)LM_CHUNK_TOKENS * 4, "the token write buffer", &w.out));
    DT_CHECK(dt_outfile_tmp_begin("dataset", out_path, tmp, sizeof tmp));
    DT_CHECK(write_file(&w, sp, nsplits, tokenizer, &made));
    DT_CHECK(dt_outfile_commit("dataset", tmp, out_path));
    committed = 1;
    dt_import_report_written(progress, out_path, t0);
out:
    dt_outfile_tmp_end(made ? tmp : "", committed);
    free(w.in);
    free(w.out);
    return st;
}

/* ---- text ------------------------------------------------------------------ */

/* "a.txt", "a.txt, b.txt" or "a.txt ... c.txt (5 files)" for the files of
 * segments seg[0..n). */
static void describe_files(const struct lm_segment *seg, int n, char *buf, size_t len)
{
    if (n == 1)
        snprintf(buf, len, "%s", seg[0].path);
    else if (n == 2)
        snprintf(buf, len, "%s, %s", seg[0].path, seg[1].path);
    else
        snprintf(buf, len, "%s ... %s (%d files)", seg[0].path, seg[n - 1].path, n);
}

/* The bytes [from, to) of the stream made of files[0..n) (sizes size[]),
 * as segments of split sp (whose seg array holds n entries). */
static void text_segments(struct lm_split *sp, const char *const *files, const int *fd,
                          const int64_t *size, int n, int64_t from, int64_t to)
{
    int64_t at = 0;
    sp->nseg = 0;
    sp->ntokens = to - from;
    for (int i = 0; i < n; i++) {
        int64_t lo = from > at ? from : at, hi = to < at + size[i] ? to : at + size[i];
        if (hi > lo)
            sp->seg[sp->nseg++] = (struct lm_segment){.path = files[i],
                                                      .what = "text file",
                                                      .fd = fd[i],
                                                      .offset = lo - at,
                                                      .first = lo - at,
                                                      .count = hi - lo,
                                                      .in_bytes = 1};
        at += size[i];
    }
}

/* A gzipped text file is DT_ERR_BAD_DATA: its compressed bytes would be
 * imported as text. */
static dt_status refuse_gzip_text(const char *path, int fd, int64_t size)
{
    unsigned char head[LLMC_HEADER_BYTES];
    struct lm_segment s = {.path = path, .what = "text file", .fd = fd};
    size_t n = size < (int64_t)sizeof head ? (size_t)size : sizeof head;
    dt_status st = read_at(&s, head, n, 0);
    if (st == DT_OK && dt_import_is_gzip(head, n))
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "text file %s: gzip-compressed; decompress it first (gunzip -k %s): "
                          "its bytes are the tokens, as they are",
                          path, path);
    return st;
}

/* DT_ERR_BAD_DATA for a split of the text stream that is too short. */
static dt_status short_text(const struct lm_split *sp, const struct dt_text_import_opts *o,
                            int64_t total)
{
    char files[8400];
    if (o->nfiles == 1)
        snprintf(files, sizeof files, "text file %s", o->files[0]);
    else
        snprintf(files, sizeof files, "the %d text files %s ... %s", o->nfiles, o->files[0],
                 o->files[o->nfiles - 1]);
    return dt_set_error(DT_ERR_BAD_DATA,
                        "%s: %lld bytes in all; with --val-fraction %g split '%s' gets %lld "
                        "byte%s, and a split needs at least %d tokens (an input and its target); "
                        "give more text or another --val-fraction",
                        files, (long long)total, o->val_fraction, sp->name, (long long)sp->ntokens,
                        sp->ntokens == 1 ? "" : "s", LM_MIN_SPLIT_TOKENS);
}

/* ---- text through a byte-pair tokenizer ------------------------------------------- */

#define BPE_READ (16u << 20) /* bytes of text encoded at a time, at least */

/* The end of the text in buf[0..have) that can be encoded without what
 * follows: just before the last letter that starts a line (a pre-token
 * always starts there, and no special token holds a newline); all of it at
 * the end of the file; 0 when there is no such place. */
static size_t safe_cut(const char *buf, size_t have, int eof)
{
    if (eof)
        return have;
    for (size_t p = have - 1; p > 0; p--)
        if (buf[p - 1] == '\n' && (((unsigned char)buf[p] | 0x20) >= 'a' &&
                                   ((unsigned char)buf[p] | 0x20) <= 'z'))
            return p;
    return 0;
}

/* Appends the tokens of one file (and <|endoftext|>) to ids. */
static dt_status encode_file(dt_bpe_t *bpe, const char *path, int fd, int32_t **ids, size_t *n,
                             size_t *cap)
{
    dt_status st = DT_OK;
    size_t bcap = BPE_READ + 1, have = 0;
    char *buf = NULL;
    int eof = 0;
    DT_CHECK(dt_malloc(bcap, "the text read buffer", (void **)&buf));
    while (!eof || have) {
        if (!eof && have == bcap) {
            char *b = realloc(buf, 2 * bcap);
            if (!b) {
                st = dt_set_error(DT_ERR_NOMEM, "text file %s: no memory for a line of %zu bytes",
                                  path, have);
                goto out;
            }
            buf = b;
            bcap *= 2;
        }
        if (!eof) {
            ssize_t r = read(fd, buf + have, bcap - have);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0) {
                st = dt_set_error(DT_ERR_IO, "text file %s: cannot read it: %s", path,
                                  strerror(errno));
                goto out;
            }
            eof = r == 0;
            have += (size_t)r;
            if (!eof && have < bcap)
                continue;
        }
        size_t cut = safe_cut(buf, have, eof);
        if (!cut)
            continue; /* no safe place yet: read more */
        DT_CHECK(dt_bpe_encode(bpe, buf, cut, ids, n, cap));
        memmove(buf, buf + cut, have - cut);
        have -= cut;
    }
    if (dt_bpe_eot(bpe) >= 0) {
        if (*n == *cap) {
            int32_t *p = realloc(*ids, (*cap ? 2 * *cap : 1024) * sizeof *p);
            if (!p) {
                st = dt_set_error(DT_ERR_NOMEM, "text import: no memory for the tokens");
                goto out;
            }
            *ids = p;
            *cap = *cap ? 2 * *cap : 1024;
        }
        (*ids)[(*n)++] = dt_bpe_eot(bpe);
    }
out:
    free(buf);
    return st;
}

static dt_status text_import_bpe(const struct dt_text_import_opts *o, FILE *progress)
{
    dt_status st = DT_OK;
    dt_bpe_t *bpe = NULL;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int64_t bytes = 0;
    struct lm_segment seg[2] = {{0}};
    struct lm_split sp[2] = {{.name = "train", .seg = &seg[0], .nseg = 1},
                             {.name = "val", .seg = &seg[1], .nseg = 1}};
    DT_CHECK(dt_import_check_output(o->out_path, o->overwrite, progress));
    DT_CHECK(dt_bpe_load_dir(o->tokenizer, &bpe));
    for (int i = 0; i < o->nfiles; i++) {
        int fd = -1;
        int64_t size = 0;
        DT_CHECK(dt_input_open(o->files[i], "text file", &fd, &size));
        st = refuse_gzip_text(o->files[i], fd, size);
        if (st == DT_OK)
            st = encode_file(bpe, o->files[i], fd, &ids, &n, &cap);
        close(fd);
        if (st != DT_OK)
            goto out;
        bytes += size;
    }
    int64_t cut = (int64_t)floor((double)n * (1.0 - o->val_fraction));
    for (int i = 0; i < 2; i++) {
        seg[i] = (struct lm_segment){.path = o->files[0],
                                     .what = "text file",
                                     .fd = -1,
                                     .first = i ? cut : 0,
                                     .count = i ? (int64_t)n - cut : cut,
                                     .in_bytes = 4,
                                     .mem = ids + (i ? cut : 0)};
        sp[i].ntokens = seg[i].count;
        snprintf(sp[i].source, sizeof sp[i].source,
                 "%d text file%s, tokens %lld to %lld of %zu (tokenizer %s)", o->nfiles,
                 o->nfiles > 1 ? "s" : "", (long long)(i ? cut : 0), (long long)(i ? (int64_t)n : cut),
                 n, o->tokenizer);
        if (sp[i].ntokens < LM_MIN_SPLIT_TOKENS) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "text import: the text is %zu tokens in all; with --val-fraction %g "
                              "split '%s' gets %lld, and a split needs at least %d",
                              n, o->val_fraction, sp[i].name, (long long)sp[i].ntokens,
                              LM_MIN_SPLIT_TOKENS);
            goto out;
        }
    }
    if (progress) {
        fprintf(progress,
                "importing text into %s (tokenizer bpe from %s, vocab_size %lld, %lld bytes, "
                "%zu tokens)\n",
                o->out_path, o->tokenizer, (long long)dt_bpe_vocab_size(bpe), (long long)bytes, n);
        fflush(progress);
    }
    st = write_lm(o->out_path, sp, 2, dt_bpe_vocab_size(bpe), "bpe", bpe, progress);
out:
    dt_bpe_free(bpe);
    free(ids);
    return st;
}

dt_status dt_text_import(const struct dt_text_import_opts *o, FILE *progress)
{
    dt_status st = DT_OK;
    int *fd = NULL, nopen = 0;
    int64_t *size = NULL, total = 0;
    struct lm_split sp[2] = {{.name = "train"}, {.name = "val"}};
    if (o->nfiles < 1)
        return dt_set_error(DT_ERR_USAGE, "text import: no input files given");
    if (!(o->val_fraction > 0.0 && o->val_fraction < 1.0))
        return dt_set_error(DT_ERR_USAGE,
                            "text import: --val-fraction %g is outside (0, 1): it is the part of "
                            "the text that becomes split 'val'",
                            o->val_fraction);
    if (o->tokenizer)
        return text_import_bpe(o, progress);
    DT_CHECK(dt_import_check_output(o->out_path, o->overwrite, progress));
    DT_CHECK(dt_calloc((size_t)o->nfiles, sizeof *fd, "the text files", (void **)&fd));
    DT_CHECK(dt_calloc((size_t)o->nfiles, sizeof *size, "the text files", (void **)&size));
    DT_CHECK(
        dt_calloc((size_t)o->nfiles, sizeof *sp[0].seg, "the text files", (void **)&sp[0].seg));
    DT_CHECK(
        dt_calloc((size_t)o->nfiles, sizeof *sp[1].seg, "the text files", (void **)&sp[1].seg));
    for (int i = 0; i < o->nfiles; i++) {
        DT_CHECK(dt_input_open(o->files[i], "text file", &fd[i], &size[i]));
        nopen++;
        DT_CHECK(refuse_gzip_text(o->files[i], fd[i], size[i]));
        total += size[i];
    }
    if (total == 0) {
        st = o->nfiles == 1
                 ? dt_set_error(DT_ERR_BAD_DATA,
                                "text file %s is empty: there is no text to import", o->files[0])
                 : dt_set_error(DT_ERR_BAD_DATA,
                                "the %d text files %s ... %s are all empty: there is no text to "
                                "import",
                                o->nfiles, o->files[0], o->files[o->nfiles - 1]);
        goto out;
    }
    int64_t cut = (int64_t)floor((double)total * (1.0 - o->val_fraction));
    if (cut > total)
        cut = total;
    text_segments(&sp[0], o->files, fd, size, o->nfiles, 0, cut);
    text_segments(&sp[1], o->files, fd, size, o->nfiles, cut, total);
    for (int i = 0; i < 2; i++)
        if (sp[i].ntokens < LM_MIN_SPLIT_TOKENS) {
            st = short_text(&sp[i], o, total);
            goto out;
        }
    for (int i = 0; i < 2; i++) {
        char files[8400];
        describe_files(sp[i].seg, sp[i].nseg, files, sizeof files);
        snprintf(sp[i].source, sizeof sp[i].source, "%s (bytes %lld to %lld of the stream%s)",
                 files, (long long)(i ? cut : 0), (long long)(i ? total : cut),
                 i ? "; cut at a byte, which may be inside a line or a UTF-8 character" : "");
    }
    if (progress) {
        fprintf(progress, "importing text into %s (tokenizer byte, vocab_size %d, %lld bytes)\n",
                o->out_path, LM_BYTE_VOCAB, (long long)total);
        fflush(progress);
    }
    st = write_lm(o->out_path, sp, 2, LM_BYTE_VOCAB, "byte", NULL, progress);
out:
    for (int i = 0; i < nopen; i++)
        close(fd[i]);
    free(sp[0].seg);
    free(sp[1].seg);
    free(size);
    free(fd);
    return st;
}

/* ---- token files ----------------------------------------------------------- */

enum token_format { FMT_RAW, FMT_LLMC_GPT2, FMT_LLMC_LLAMA3 };

static const char *format_name(enum token_format f)
{
    return f == FMT_RAW         ? "nanoGPT-style raw uint16, no header"
           : f == FMT_LLMC_GPT2 ? "llm.c header, GPT-2 uint16 tokens"
                                : "llm.c header, Llama 3 uint32 tokens";
}

/* Opens a token file and reads its layout into s (what the tokens are,
 * where, how many) and *fmt, checking everything but the tokens. */
static dt_status open_token_file(const char *path, struct lm_segment *s, enum token_format *fmt)
{
    dt_status st;
    int64_t size;
    unsigned char h[LLMC_HEADER_BYTES];
    *s = (struct lm_segment){.path = path, .what = "token file", .fd = -1};
    DT_CHECK(dt_input_open(path, "token file", &s->fd, &size));
    uint32_t magic = 0;
    size_t head = size < LLMC_HEADER_BYTES ? (size_t)size : LLMC_HEADER_BYTES;
    if (size >= 4) {
        DT_CHECK(read_at(s, h, head, 0));
        magic = le32(h);
    }
    if (dt_import_is_gzip(h, head)) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "token file %s: gzip-compressed; decompress it first (gunzip -k %s): "
                          "tokens are read as they are",
                          path, path);
        goto out;
    }
    if (size >= 8 && (!memcmp(h, NPY_SIGNATURE, 6) || !memcmp(h, HDF5_SIGNATURE, 8))) {
        int npy = !memcmp(h, NPY_SIGNATURE, 6);
        st = dt_set_error(DT_ERR_BAD_DATA, "token file %s: this is %s, not a token file; %s", path,
                          npy ? "a NumPy .npy file (numpy.save)" : "an HDF5 file",
                          npy ? "write the tokens with arr.astype(np.uint16).tofile(path), as "
                                "nanoGPT does"
                              : "an imported dataset is used as it is (data.path)");
        goto out;
    }
    if (magic == LLMC_MAGIC_EVAL) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "token file %s: magic %d is llm.c's evaluation file (HellaSwag/MMLU "
                          "examples), not a token stream; import the dataset's train/val .bin",
                          path, LLMC_MAGIC_EVAL);
        goto out;
    }
    if (magic != LLMC_MAGIC_GPT2 && magic != LLMC_MAGIC_LLAMA3) {
        *fmt = FMT_RAW;
        if (size % 2) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "token file %s: %lld bytes, an odd number; a file without an llm.c "
                              "header must be raw uint16 tokens (2 bytes each, as nanoGPT "
                              "writes them)",
                              path, (long long)size);
            goto out;
        }
        s->raw = 1;
        s->head_int = size >= 4 ? (int64_t)(int32_t)magic : 0;
        s->in_bytes = 2;
        s->count = size / 2;
    } else {
        int llama = magic == LLMC_MAGIC_LLAMA3;
        int want = llama ? LLMC_VERSION_LLAMA3 : LLMC_VERSION_GPT2;
        *fmt = llama ? FMT_LLMC_LLAMA3 : FMT_LLMC_GPT2;
        if (size < LLMC_HEADER_BYTES) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "token file %s: starts with llm.c's magic %u but holds %lld bytes, "
                              "less than its %d-byte header; the file is truncated",
                              path, magic, (long long)size, LLMC_HEADER_BYTES);
            goto out;
        }
        DT_CHECK(read_at(s, h, LLMC_HEADER_BYTES, 0));
        int32_t version = (int32_t)le32(h + 4), count = (int32_t)le32(h + 8);
        if (version != want) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "token file %s: llm.c header version %d is not supported (magic %u "
                              "goes with version %d: %s tokens)",
                              path, version, magic, want, llama ? "uint32" : "uint16");
            goto out;
        }
        s->in_bytes = llama ? 4 : 2;
        s->offset = LLMC_HEADER_BYTES;
        s->count = count;
        int64_t expect = LLMC_HEADER_BYTES + (int64_t)count * s->in_bytes;
        if (count < 0 || expect != size) {
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "token file %s: the llm.c header says %d tokens (a file of %lld "
                              "bytes) but the file holds %lld bytes; it is truncated or damaged",
                              path, count, (long long)expect, (long long)size);
            goto out;
        }
    }
    if (s->count < LM_MIN_SPLIT_TOKENS) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "token file %s: holds %lld token%s; a split needs at least %d (an "
                          "input and its target)",
                          path, (long long)s->count, s->count == 1 ? "" : "s", LM_MIN_SPLIT_TOKENS);
        goto out;
    }
out:
    if (st != DT_OK && s->fd >= 0) {
        close(s->fd);
        s->fd = -1;
    }
    return st;
}

/* The vocabulary and tokenizer: given, or the defaults for the files'
 * formats; DT_ERR_USAGE when they do not fit. */
static dt_status choose_vocab(const struct dt_tokens_import_opts *o, const enum token_format *fmt,
                              const struct lm_segment *seg, int n, int64_t *vocab,
                              const char **tokenizer)
{
    int llama = -1;
    for (int i = 0; i < n; i++)
        if (fmt[i] == FMT_LLMC_LLAMA3)
            llama = i;
    *tokenizer = o->tokenizer ? o->tokenizer : llama >= 0 ? "none" : "gpt2";
    *vocab = o->vocab_size ? o->vocab_size : llama >= 0 ? LLAMA3_VOCAB : DT_LM_DEFAULT_VOCAB;
    if (strcmp(*tokenizer, "gpt2") != 0 && strcmp(*tokenizer, "none") != 0)
        return dt_set_error(DT_ERR_USAGE, "--tokenizer '%s': expected gpt2 or none", *tokenizer);
    if (*vocab < 2 || *vocab > LM_MAX_VOCAB)
        return dt_set_error(DT_ERR_USAGE, "--vocab-size %lld: expected 2 to %lld",
                            (long long)*vocab, (long long)LM_MAX_VOCAB);
    if (!strcmp(*tokenizer, "gpt2") && *vocab < DT_LM_DEFAULT_VOCAB)
        return dt_set_error(DT_ERR_USAGE,
                            "--vocab-size %lld is smaller than GPT-2's %d tokens; give at least "
                            "%d, or --tokenizer none",
                            (long long)*vocab, DT_LM_DEFAULT_VOCAB, DT_LM_DEFAULT_VOCAB);
    if (!strcmp(*tokenizer, "gpt2") && llama >= 0)
        return dt_set_error(DT_ERR_USAGE,
                            "token file %s holds Llama 3 tokens (llm.c magic %d), not GPT-2's; "
                            "use --tokenizer none",
                            seg[llama].path, LLMC_MAGIC_LLAMA3);
    return DT_OK;
}

dt_status dt_tokens_import(const struct dt_tokens_import_opts *o, FILE *progress)
{
    dt_status st = DT_OK;
    struct lm_segment seg[2] = {{.fd = -1}, {.fd = -1}};
    enum token_format fmt[2];
    struct lm_split sp[2];
    const char *paths[2] = {o->train, o->val}, *names[2] = {"train", "val"};
    int n = o->val ? 2 : 1;
    int64_t vocab;
    const char *tokenizer;
    if (!o->train)
        return dt_set_error(DT_ERR_USAGE, "token import: no train file given (--train FILE)");
    DT_CHECK(dt_import_check_output(o->out_path, o->overwrite, progress));
    for (int i = 0; i < n; i++)
        DT_CHECK(open_token_file(paths[i], &seg[i], &fmt[i]));
    DT_CHECK(choose_vocab(o, fmt, seg, n, &vocab, &tokenizer));
    for (int i = 0; i < n; i++) {
        sp[i] =
            (struct lm_split){.name = names[i], .seg = &seg[i], .nseg = 1, .ntokens = seg[i].count};
        snprintf(sp[i].source, sizeof sp[i].source, "%s (%s)", paths[i], format_name(fmt[i]));
    }
    if (progress) {
        fprintf(progress, "importing token files into %s (tokenizer %s, vocab_size %lld)\n",
                o->out_path, tokenizer, (long long)vocab);
        fflush(progress);
    }
    st = write_lm(o->out_path, sp, n, vocab, tokenizer, NULL, progress);
out:
    for (int i = 0; i < 2; i++)
        if (seg[i].fd >= 0)
            close(seg[i].fd);
    return st;
}
