/*
 * io_common.h - what the io/ unit suites share: a private directory for
 * the files they write, the status and message assertions, and the
 * writers of small IDX files and HDF5 datasets (made directly with HDF5:
 * valid ones, and ones with bad labels, odd dtypes, missing pieces) and
 * the loader's sample-id datasets, so every suite makes its own inputs.
 *
 * Each suite program (test_idx, test_npy, test_csv, test_dataset,
 * test_dataset_lm, test_loader, test_cache, test_model_file) registers
 * io_suite_init, which makes the directory <tmp>/<program>.<pid> under
 * cu_tmpdir(), and ends with io_run_all(), which runs the suites and
 * removes the directory unless something failed (its files are kept for a
 * look).
 */
#ifndef DT_TEST_IO_COMMON_H
#define DT_TEST_IO_COMMON_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cu_util.h"
#include "io/dataset.h"
#include "io/idx.h"
#include "io/loader.h"
#include "core/status.h"

/* Makes the suite's private directory and quiets HDF5's error printing
 * (tests call HDF5 directly too); a CUnit suite init: 0, or -1. */
int io_suite_init(void);

/* cu_run_all, then removes the private directory when every test passed. */
int io_run_all(void);

/* The suite's private directory, and name inside it into buf. */
extern char g_dir[2048];
void tpath(char *buf, size_t len, const char *name);

/* expr gives status want; else the status and message are printed. */
#define ASSERT_STATUS(expr, want)                                                                  \
    do {                                                                                           \
        dt_status st_ = (expr);                                                                    \
        CU_ASSERT_EQUAL(st_, (want));                                                              \
        if (st_ != (want))                                                                         \
            fprintf(stderr, "\n    %s:%d: got '%s' (%s), wanted '%s'\n", __FILE__, __LINE__,       \
                    dt_status_str(st_), dt_last_error(), dt_status_str(want));                     \
    } while (0)

/* The last error message holds sub; else it is printed. */
#define ASSERT_MSG(sub)                                                                            \
    do {                                                                                           \
        int ok_ = strstr(dt_last_error(), (sub)) != NULL;                                          \
        CU_ASSERT(ok_);                                                                            \
        if (!ok_)                                                                                  \
            fprintf(stderr, "\n    %s:%d: message '%s' lacks '%s'\n", __FILE__, __LINE__,          \
                    dt_last_error(), (sub));                                                       \
    } while (0)

/* ---- IDX files ---- */

/* v as 4 big-endian bytes at p. */
void put_be32(unsigned char *p, uint32_t v);

/* Writes an IDX file: magic, dims, then `nbytes` of data (which may be
 * fewer than the dims say, to make a truncated file). */
void write_idx(const char *path, int gz, uint32_t magic, const uint32_t *dims, int nd,
               const unsigned char *data, size_t nbytes);

/* Pixel p of image i, and the label of item i of k classes, in the
 * files make_pair writes. */
unsigned char pixel(uint32_t i, uint32_t p);
unsigned char label_of(uint32_t i, int k);

/* An IDX images/labels pair: n items of rows x cols, labels in [0, k). */
struct idx_pair {
    char images[4096], labels[4096];
};

void make_pair(const char *stem, int gz, uint32_t n, uint32_t rows, uint32_t cols, int k,
               struct idx_pair *out);

/* Reads up to cap bytes of path into buf (not terminated): how many, or
 * -1. */
int slurp(const char *path, char *buf, size_t cap);

/* Entries of a directory other than . and .. */
int dir_entries(const char *dir);

/* Rows and columns of the images of the IDX tests. */
#define IMG_R 5
#define IMG_C 4

/* ---- HDF5 datasets written directly ---- */

/* A string attribute, a numeric one (stored as ftype, given as mtype),
 * and the root attributes of a classification dataset. */
void put_str_attr(hid_t obj, const char *name, const char *v);
void put_num_attr(hid_t obj, const char *name, hid_t ftype, hid_t mtype, const void *v);
void put_root_attrs(hid_t f, int version, int num_classes, double scale, double mean, double sd);

/* Writes /<split>/x (n x d, stored as ftype, given as floats) and
 * /<split>/y (ny int32 labels) into an open file. */
void put_split(hid_t f, const char *split, hid_t ftype, hsize_t n, hsize_t d, const float *x,
               hsize_t ny, const int32_t *y);

/* A small dataset: split "train" (and "test"), n x d floats where x[i][j]
 * = i + j/8 (exact in f16 for small i), labels i % k. */
void make_ds(const char *path, hid_t ftype, hsize_t n, hsize_t d, int k, int version, double scale,
             double mean, double sd);

/* The vocabulary of make_lm's files, and token i of their streams. */
#define LM_V 50
int32_t lm_tok(int64_t i);

/* A token-stream file: split "train" of ntrain tokens lm_tok(i) and "val"
 * of nval, stored as ftype; `attrs` 0: complete, 1: no vocab_size, 2: a
 * bad tokenizer; vocab: the vocab_size attribute. */
void make_lm(const char *path, hid_t ftype, hsize_t ntrain, hsize_t nval, int attrs, int vocab);

/* A part of a larger dataset: rows [from, from + n) of the pattern of
 * make_ds (x[i][j] = i + j/8, label i % 3) in "train" and in "test". */
void make_part(const char *name, hsize_t from, hsize_t n, double mean);

/* A split of n rows of d floats given in x, labels 0. */
void make_float_ds(const char *path, hid_t ftype, hsize_t n, hsize_t d, const float *x,
                   double scale, double mean, double sd);

/* Reads every row of split back and checks x against want (before
 * normalisation) and y against labels. */
void check_values(const char *path, const char *split, int64_t n, int64_t per, const float *want,
                  const int32_t *labels);

/* Writes /<split>/x of n samples of shape dims[0..nd) (stored as ftype,
 * given as floats) and /<split>/y (labels i % 2) into an open file. */
void put_image_split(hid_t f, const char *split, hid_t ftype, hsize_t n, int nd,
                     const hsize_t *dims, const float *x);

/* A 1-D float64 attribute of n values. */
void put_float_array_attr(hid_t obj, const char *name, hsize_t n, const double *v);

/* An image dataset: splits train and test of n samples of dims (x[i] =
 * given values, the test split the first n/2 of them), scalar norm
 * (scale, 0, 1), and per-channel attributes when nmean/nstd > 0. */
void make_image_ds(const char *name, hid_t ftype, hsize_t n, int nd, const hsize_t *dims,
                   const float *x, double scale, int nmean, const double *mean, int nstd,
                   const double *sd);

/* dt_dataset_open of name in the suite's directory. */
dt_status open_named(const char *name, dt_dataset_t **ds);

/* ---- the loader's sample-id datasets ---- */

/* Classes of open_seq's dataset. */
#define SEQ_K 7

/* A dataset whose sample i has x = (i, -i) and label i % SEQ_K, with the
 * identity normalisation, so a batch row can be checked against its id. */
dt_dataset_t *open_seq(const char *name, hsize_t n);

/* One batch the loader handed out, and every batch of a run. */
struct rec {
    int64_t batch, row0, rows, global_rows;
    int micro, micro_count;
    uint64_t ids[64];
};
struct run {
    struct rec r[4096];
    int n;
    int bad_rows; /* rows whose x or y do not match the sample id */
    uint64_t bytes;
};

/* Loader options for open_seq's dataset: split train, global batch G,
 * micro-batches of micro, rank of world, shuffled, one worker. */
struct dt_loader_opts seq_opts(dt_dataset_t *ds, int64_t G, int64_t micro, int rank, int world);

/* Runs the loader from (epoch, first) to the end of the epoch. */
void collect(const struct dt_loader_opts *o, int64_t epoch, int64_t first, struct run *out);

/* ---- the augmentation dataset ---- */

/* AUG_N samples of (AUG_C, AUG_H, AUG_W), crops padded by AUG_PAD. */
#define AUG_N 48
#define AUG_C 2
#define AUG_H 3
#define AUG_W 4
#define AUG_ELEMS (AUG_C * AUG_H * AUG_W)
#define AUG_PAD 1
#define AUG_SEED 777

/* Sample i of the augmentation dataset holds i * 100 + k at element k. */
float aug_value(uint64_t i, int64_t k);

/* Writes and opens the augmentation dataset (float32, identity
 * normalisation). */
dt_dataset_t *open_aug(void);

#endif
