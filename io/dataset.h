/*
 * dataset.h - dtrain's HDF5 dataset format (version 1) and reading it.
 *
 * Layout of a file:
 *   /                  attributes: dtrain_format = "dataset" (string),
 *                      format_version = 1 (int), task = "classification",
 *                      num_classes (int), class_names (string array),
 *                      norm_scale, norm_mean, norm_std (float):
 *                      an input value v becomes (v * norm_scale - norm_mean) / norm_std;
 *                      optional norm_channel_mean, norm_channel_std (arrays of C
 *                      floats): a value v of channel c becomes
 *                      (v * norm_scale - norm_channel_mean[c]) / norm_channel_std[c],
 *                      replacing norm_mean and norm_std (which a file may still
 *                      carry, for readers that know only those)
 *   /<split>/x         N x sample shape, uint8, float16 or float32. A sample of
 *                      shape (D) is a vector; (H, W) is an image of one channel,
 *                      read as (1, H, W); (C, H, W) is an image of C channels,
 *                      channels first
 *   /<split>/y         N labels, integer type, each in [0, num_classes)
 * Splits are groups at the root ("train", "test", ...). A dataset may be
 * several such files (see dt_dataset_open).
 *
 * Language-model files (task = "language_model") hold token streams:
 *   /                  attributes: dtrain_format = "dataset", format_version = 1,
 *                      task = "language_model", vocab_size (int, 2 to 2^24),
 *                      tokenizer (string): "byte" (the UTF-8 bytes of text, ids
 *                      0-255), "gpt2" (GPT-2's byte-pair encoding, token files
 *                      imported without the tokenizer's files), "bpe" (a
 *                      byte-level BPE whose files the dataset keeps) or "none"
 *   /<split>/tokens    1-D uint16 or int32 token ids, each in [0, vocab_size),
 *                      the split's documents one after another
 *   /tokenizer/vocab.json, /tokenizer/merges.txt  (tokenizer "bpe") the
 *                      tokenizer's files, 1-D uint8 arrays of their bytes
 * A sample of such a split is a window of seq_len + 1 consecutive tokens
 * (dt_dataset_set_seq_len): x is its first seq_len tokens (as floats,
 * exact below 2^24), y the seq_len tokens that follow each one.
 *
 * A handle may be used from several threads: HDF5 calls are serialised by
 * one process-wide lock inside io/, because the parallel HDF5 build is not
 * thread-safe.
 */
#ifndef DT_DATASET_H
#define DT_DATASET_H

#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "core/tensor.h"

#define DT_DATASET_FORMAT_VERSION 1
#define DT_DATASET_MAX_SPLITS 16
#define DT_DATASET_MAX_DIMS 4
#define DT_DATASET_MAX_CLASSES 1024
#define DT_NAME_MAX 64
#define DT_DATASET_MAX_CHANNELS 1024 /* length of the per-channel normalisation */

typedef struct dt_dataset dt_dataset_t;


struct dt_split_info {
    char name[DT_NAME_MAX];
    int64_t n;                              /* samples */
    int ndim;                               /* dims of one sample */
    int64_t shape[DT_DATASET_MAX_DIMS];     /* sample shape */
    int64_t sample_elems;                   /* product of shape */
    enum dt_dtype x_dtype;
    enum dt_dtype y_dtype;
    int64_t x_bytes;                        /* stored size of x in the file */
    int64_t class_counts[DT_DATASET_MAX_CLASSES]; /* samples per label */
    /* language-model splits: tokens in the stream; n, ndim, shape and
     * sample_elems describe windows once a sequence length is set
     * (dt_dataset_set_seq_len; n = 0 until then); x_dtype and y_dtype are
     * the tokens' type */
    int64_t tokens;
    int64_t window_shifts; /* epoch offsets the windows may start at: 1 or seq_len */
};

struct dt_dataset_info {
    char path[4096];
    int format_version;
    int num_classes;
    char class_names[DT_DATASET_MAX_CLASSES][DT_NAME_MAX];
    float norm_scale, norm_mean, norm_std;
    /* 0: norm_mean and norm_std apply to every value; C: per-channel mean
     * and std of the C channels of every split's (C, H, W) or (1, H, W)
     * samples, in place of norm_mean and norm_std */
    int norm_channels;
    float norm_channel_mean[DT_DATASET_MAX_CHANNELS];
    float norm_channel_std[DT_DATASET_MAX_CHANNELS];
    int nsplits;
    struct dt_split_info splits[DT_DATASET_MAX_SPLITS];
    int64_t file_bytes;
    /* language-model datasets (num_classes, class names and normalisation
     * are unused: 0, none, identity) */
    int lm;
    int64_t vocab_size;
    char tokenizer[16]; /* byte | gpt2 | bpe | none */
    int64_t seq_len;    /* 0 until dt_dataset_set_seq_len */
};

#define DT_DATASET_MAX_VOCAB ((int64_t)1 << 24)
#define DT_DATASET_MAX_SEQ_LEN ((int64_t)1 << 20)

/* Opens and validates a dataset file: format attributes, every split's x
 * and y (shapes agree, supported dtypes), every label in range, and,
 * before anything is allocated from a declared shape, that the data is
 * really in the file (contiguous data inside it, every chunk written,
 * external raw files regular files; links out of the file and virtual
 * datasets refused). A split may have 0 rows (it is listed, never read).
 * With uint8 x, every normalised value must be finite. Per-channel
 * normalisation attributes must come together, hold one finite float per
 * channel (std > 0), and every split must have image samples of that many
 * channels.
 * Errors: DT_ERR_NOT_FOUND (no such file, not readable, not a regular
 * file), DT_ERR_BAD_DATA (not HDF5, not a dtrain dataset, wrong version,
 * bad shapes, data the file does not hold, labels out of range), DT_ERR_IO
 * (a system call failed inside HDF5: a lock another process holds, EIO),
 * each message naming the file and the object. */
dt_status dt_dataset_open(const char *path, dt_dataset_t **out);
/* path may also name several files that together are one dataset: entries
 * separated by newlines (a list, kept in its order), or a glob pattern
 * (containing *, ? or [; expanded sorted by name). Every file must match
 * the first in splits, sample shapes, dtypes, classes and normalisation
 * (DT_ERR_BAD_DATA naming both files and what differs). A split's rows are
 * the files' rows in order: info and reads use these global row numbers.
 * A pattern that matches nothing, or a missing list entry, is
 * DT_ERR_NOT_FOUND naming it. */
void dt_dataset_close(dt_dataset_t *ds);

/* The whole dataset: for several files, rows, sizes and class counts are
 * summed and path is the list (entries joined by ',') or the pattern. */
const struct dt_dataset_info *dt_dataset_get_info(const dt_dataset_t *ds);

/* How many files the dataset is, and file f's own description (NULL when
 * f is out of range). */
int dt_dataset_nfiles(const dt_dataset_t *ds);
const struct dt_dataset_info *dt_dataset_file_info(const dt_dataset_t *ds, int f);

/* The split called `name`, or DT_ERR_BAD_DATA naming the file, the split
 * and the splits it does have. */
dt_status dt_dataset_split(const dt_dataset_t *ds, const char *name,
                           const struct dt_split_info **out);

/* Reads samples idx[0..n) (any order, no duplicates needed) of `split`:
 * x gets n * sample_elems normalised floats, y gets n labels (y may be NULL;
 * n * seq_len next tokens for a language-model split, see below).
 * Adds the bytes read from the file to *bytes_read when not NULL.
 * A non-finite input (NaN or infinity stored in float x, or a value that
 * normalisation takes past float32's range) is DT_ERR_BAD_DATA naming the
 * file, split, row and value. Thread-safe. */
dt_status dt_dataset_read(dt_dataset_t *ds, const char *split, const uint64_t *idx, size_t n,
                          float *x, int32_t *y, uint64_t *bytes_read);

/* The channels-first image reading of a split's samples: (H, W) is
 * (1, H, W), (C, H, W) stays; returns 0 for other samples (vectors). */
int dt_split_image_shape(const struct dt_split_info *si, int64_t *c, int64_t *h, int64_t *w);

/* Where a random crop and flip takes one image sample from: the crop is
 * the sample's H x W window at (top, left) of the sample zero-padded by
 * `pad` pixels on each side (top, left in [0, 2 * pad]), and flip mirrors
 * it left-right. The padding is 0 after normalisation (the mean, where
 * the normalisation is the data's mean and std). */
struct dt_crop_flip {
    int32_t top, left;
    int32_t flip;
};

/* dt_dataset_read with sample i of the output taken as cf[i] says from
 * stored sample idx[i], in the same single pass that normalises it.
 * The split's samples must be images (dt_split_image_shape), else
 * DT_ERR_INVALID_ARG. Stored non-finite floats are refused wherever they
 * are in the sample; a normalisation overflow only where the crop uses it. */
dt_status dt_dataset_read_crop_flip(dt_dataset_t *ds, const char *split, const uint64_t *idx,
                                    size_t n, int32_t pad, const struct dt_crop_flip *cf, float *x,
                                    int32_t *y, uint64_t *bytes_read);

/* A split's rows held in memory as stored (data.cache: memory): uint8 x
 * stays uint8, float16 and float32 x are held as float32, with each row's
 * label and dataset row number. A read from it gathers rows from memory
 * and normalises (and crops and flips) them exactly as dt_dataset_read and
 * dt_dataset_read_crop_flip do, with no HDF5 call and no lock, so any
 * number of threads may read one cache at once. */
typedef struct dt_row_cache dt_row_cache_t;

/* Largest single H5Dread of a cache fill. */
#define DT_ROW_CACHE_READ_BYTES ((uint64_t)64 << 20)

/* Memory a cache holds per row of split si. */
uint64_t dt_row_cache_row_bytes(const struct dt_split_info *si);

/* Reads the rows [start[k], start[k] + count[k]) of `split`, k = 0 ..
 * nranges - 1, into a new cache, under the HDF5 lock, in contiguous reads
 * of at most DT_ROW_CACHE_READ_BYTES (several files: one read per file
 * part). Cache position p is the p-th of those rows in range order.
 * Stored non-finite floats are refused here (DT_ERR_BAD_DATA naming the
 * row), not at the first read of the row. A language-model dataset is
 * DT_ERR_UNSUPPORTED; an allocation that fails is DT_ERR_NOMEM. The
 * dataset must stay open while the cache lives. */
dt_status dt_row_cache_create(dt_dataset_t *ds, const char *split, const int64_t *start,
                              const int64_t *count, int nranges, dt_row_cache_t **out);
void dt_row_cache_destroy(dt_row_cache_t *c);

int64_t dt_row_cache_rows(const dt_row_cache_t *c);
uint64_t dt_row_cache_bytes(const dt_row_cache_t *c);               /* memory held */
uint64_t dt_row_cache_bytes_read(const dt_row_cache_t *c);          /* bytes read from the file */
uint64_t dt_row_cache_row_id(const dt_row_cache_t *c, int64_t pos); /* dataset row at pos */

/* dt_dataset_read (cf NULL) or dt_dataset_read_crop_flip (cf given, pad
 * its padding) of the cached rows at positions pos[0..n): the same floats
 * and labels, bit for bit. A normalisation that overflows float32 is
 * DT_ERR_BAD_DATA naming the dataset row. Thread-safe. */
dt_status dt_row_cache_read(const dt_row_cache_t *c, const uint64_t *pos, size_t n, int32_t pad,
                            const struct dt_crop_flip *cf, float *x, int32_t *y);

/* Language-model datasets: makes every split a set of windows of seq_len
 * + 1 tokens. With W = (tokens - 1) / seq_len whole windows in a split,
 * a split of 2 or more windows offers W - 1 of them and window_shifts =
 * seq_len: window i of a read with offset `shift` (dt_dataset_read_windows)
 * starts at token shift + i * seq_len, so a trainer can move the window
 * boundaries every epoch; a split of one window offers it at shift 0
 * (window_shifts = 1). A split too short for one window is
 * DT_ERR_BAD_DATA naming it; a seq_len outside [1, DT_DATASET_MAX_SEQ_LEN]
 * is DT_ERR_USAGE; a dataset that is not a language-model one is
 * DT_ERR_USAGE. */
dt_status dt_dataset_set_seq_len(dt_dataset_t *ds, int64_t seq_len);

/* Reads windows idx[0..n) of a language-model split at offset shift (in
 * [0, window_shifts)): x gets each window's first seq_len tokens as
 * floats, y (may be NULL) the seq_len tokens after each of them. A token
 * outside [0, vocab_size) is DT_ERR_BAD_DATA naming the file, split,
 * position and value. dt_dataset_read on such a split reads at shift 0.
 * Thread-safe. */
dt_status dt_dataset_read_windows(dt_dataset_t *ds, const char *split, const uint64_t *idx,
                                  size_t n, int64_t shift, float *x, int32_t *y,
                                  uint64_t *bytes_read);

/* Prints a human summary (splits, shapes, dtypes, classes, sizes) of an
 * opened dataset to out. */
void dt_dataset_print(const dt_dataset_t *ds, FILE *out);

#endif
