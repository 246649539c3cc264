/*
 * dataset_lm.c - language-model datasets: one 1-D token stream per split,
 * read as windows of seq_len + 1 tokens (the inputs and, shifted by one,
 * the targets).
 *
 * Once the sequence length is set, a split of N tokens holds (N - 1) /
 * seq_len windows; with two or more, each epoch may start its windows at
 * an offset in [0, seq_len), so one fewer window is counted and every
 * offset has them all. A window is one hyperslab read of seq_len + 1
 * tokens, each checked against the vocabulary. A language-model dataset is
 * one file.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "dataset_impl.h"
#include "hdf5_lock.h"

dt_status dt_dataset_set_seq_len(dt_dataset_t *ds, int64_t seq_len)
{
    struct dt_ds_file *f = ds->files[0];
    if (!ds->info.lm)
        return dt_set_error(DT_ERR_USAGE,
                            "dataset %s holds classification samples, not token streams; a "
                            "sequence length applies to language-model datasets",
                            ds->info.path);
    if (seq_len < 1 || seq_len > DT_DATASET_MAX_SEQ_LEN)
        return dt_set_error(DT_ERR_USAGE, "sequence length %lld is outside [1, %lld]",
                            (long long)seq_len, (long long)DT_DATASET_MAX_SEQ_LEN);
    for (int i = 0; i < f->info.nsplits; i++) {
        struct dt_split_info *si = &f->info.splits[i];
        int64_t w = si->tokens > 0 ? (si->tokens - 1) / seq_len : 0;
        if (w < 1)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: split '%s' has %lld tokens, fewer than one window "
                                "of seq_len + 1 = %lld tokens; lower the sequence length or "
                                "import more text",
                                ds->info.path, si->name, (long long)si->tokens,
                                (long long)seq_len + 1);
        si->n = w >= 2 ? w - 1 : 1;
        si->window_shifts = w >= 2 ? seq_len : 1;
        si->ndim = 1;
        si->shape[0] = seq_len;
        si->sample_elems = seq_len;
    }
    f->info.seq_len = seq_len;
    memcpy(ds->info.splits, f->info.splits, sizeof ds->info.splits);
    ds->info.seq_len = seq_len;
    return DT_OK;
}

dt_status dt_dataset_read_windows(dt_dataset_t *ds, const char *split, const uint64_t *idx,
                                  size_t n, int64_t shift, float *x, int32_t *y,
                                  uint64_t *bytes_read)
{
    struct dt_ds_file *f = ds->files[0];
    const char *path = ds->info.path;
    dt_status st = DT_OK;
    int32_t *tok = NULL;
    hid_t mem = -1, fs = -1;
    int s = dt_ds_find_split(f, split);
    if (!ds->info.lm || ds->info.seq_len < 1)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dataset %s: windows are read from a language-model dataset after "
                            "its sequence length is set",
                            path);
    if (s < 0) {
        const struct dt_split_info *dummy;
        return dt_ds_file_split(f, split, &dummy);
    }
    const struct dt_split_info *si = &f->info.splits[s];
    const int64_t T = ds->info.seq_len;
    if (shift < 0 || shift >= si->window_shifts)
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dataset %s: window offset %lld of split '%s' is outside [0, %lld)",
                            path, (long long)shift, split, (long long)si->window_shifts);
    for (size_t i = 0; i < n; i++)
        if (idx[i] >= (uint64_t)si->n)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: window %llu of split '%s' requested, which has %lld",
                                path, (unsigned long long)idx[i], split, (long long)si->n);
    if (n == 0)
        return DT_OK;
    DT_CHECK(dt_malloc((size_t)(T + 1) * sizeof *tok, "a token window", (void **)&tok));
    hsize_t count = (hsize_t)(T + 1);
    dt_h5_lock();
    mem = H5Screate_simple(1, &count, NULL);
    fs = H5Dget_space(f->splits[s].x);
    for (size_t i = 0; i < n && st == DT_OK; i++) {
        hsize_t start = (hsize_t)(shift + (int64_t)idx[i] * T);
        if (mem < 0 || fs < 0 ||
            H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &count, NULL) < 0 ||
            H5Dread(f->splits[s].x, H5T_NATIVE_INT32, mem, fs, H5P_DEFAULT, tok) < 0) {
            st = dt_h5_error(DT_ERR_IO, "dataset %s: cannot read tokens %llu to %llu of split '%s'",
                             path, (unsigned long long)start,
                             (unsigned long long)(start + count - 1), split);
            break;
        }
        for (int64_t t = 0; t <= T; t++)
            if (tok[t] < 0 || tok[t] >= ds->info.vocab_size) {
                st = dt_set_error(DT_ERR_BAD_DATA,
                                  "dataset %s: token %llu of split '%s' is %d, outside the "
                                  "vocabulary [0, %lld)",
                                  path, (unsigned long long)(start + (hsize_t)t), split,
                                  (int)tok[t], (long long)ds->info.vocab_size);
                break;
            }
        for (int64_t t = 0; t < T && st == DT_OK; t++) {
            x[i * (size_t)T + (size_t)t] = (float)tok[t];
            if (y)
                y[i * (size_t)T + (size_t)t] = tok[t + 1];
        }
    }
    dt_h5_close(fs);
    dt_h5_close(mem);
    dt_h5_unlock();
    if (st == DT_OK && bytes_read)
        *bytes_read += (uint64_t)n * (uint64_t)(T + 1) * f->splits[s].x_file_size;
out:
    free(tok);
    return st;
}
