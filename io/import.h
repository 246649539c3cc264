/*
 * import.h - internal to io/: what the dataset importers (IDX, NumPy .npy,
 * CSV, and the language-model text and token importers) share: the
 * class-name option, the check of the output path, the root attributes of
 * a dtrain dataset (dataset.h), and a writer for splits already held in
 * memory.
 *
 * The .npy and CSV importers read and check every input completely before
 * anything is written, so their samples are in memory by then and one
 * writer serves both; the IDX importer streams its images instead and
 * shares only the attributes and the options; the language-model
 * importers stream too, and share the output check and their attributes.
 * Not a public header: nothing outside io/ includes it.
 */
#ifndef DT_IO_IMPORT_H
#define DT_IO_IMPORT_H

#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "dataset.h"

struct dt_class_list {
    int count; /* 0: not given */
    char names[DT_DATASET_MAX_CLASSES][DT_NAME_MAX];
};

/* "a,b,c" (NULL: none given) into cl. DT_ERR_USAGE for an empty, repeated
 * or too long name, or more than DT_DATASET_MAX_CLASSES. */
dt_status dt_import_parse_classes(const char *s, struct dt_class_list *cl);

/* The output path can be created: not a directory, not too long, and not
 * already there unless overwrite (DT_ERR_USAGE otherwise); and no other
 * import on this host is writing it (DT_ERR_BUSY). Temporaries of it that
 * dead imports left are removed (outfile.h: dt_outfile_clear_stale), said
 * on progress when not NULL. */
dt_status dt_import_check_output(const char *out_path, int overwrite, FILE *progress);

/* Writes the root attributes (dtrain_format, format_version, task,
 * num_classes, class_names: cl's names or "0", "1", ..., and
 * norm_scale/mean/std) on the open HDF5 file `file` (a hid_t). The caller
 * holds the HDF5 lock. */
dt_status dt_import_write_root_attrs(int64_t file, const char *path, int num_classes,
                                     const struct dt_class_list *cl, float scale, double mean,
                                     double sd);

/* Writes the root attributes of a language-model dataset (dtrain_format,
 * format_version, task = "language_model", vocab_size, tokenizer) on the
 * open HDF5 file `file` (a hid_t). The caller holds the HDF5 lock. */
dt_status dt_import_write_lm_root_attrs(int64_t file, const char *path, int32_t vocab_size,
                                        const char *tokenizer);

/* One split held in memory: n samples of `shape` in x (row major; uint8,
 * float16 as raw IEEE half bits, or float32) and n labels in y. */
struct dt_import_split {
    const char *name;    /* "train", "test" */
    const char *source;  /* for the progress line */
    enum dt_dtype dtype; /* DT_U8, DT_F16 or DT_F32 */
    int ndim;
    int64_t shape[DT_DATASET_MAX_DIMS];
    int64_t n;
    const void *x;
    const int32_t *y;
};

/* Writes splits[0..nsplits) to out_path as "<out>.tmp.<host>.<pid>",
 * renamed into place when complete and removed on failure (or by
 * dt_outfile_remove_pending on a signal). Normalisation comes from
 * splits[0] (the training split): uint8 inputs are scaled by 1/255 first,
 * float inputs are not scaled. When every split holds (C, H, W) images of
 * the same C, the file also gets per-channel norm_channel_mean and
 * norm_channel_std over the training split (which then replace the
 * scalar mean and std, kept for readers that know only those). */
dt_status dt_import_write(const char *out_path, const struct dt_import_split *splits, int nsplits,
                          int num_classes, const struct dt_class_list *cl, FILE *progress);

/* The importers' last line on progress (when not NULL): "wrote OUT (N
 * MiB) in T", T counted from t0 (dt_now()). */
void dt_import_report_written(FILE *progress, const char *out_path, double t0);

/* Whether head[0..n), the start of a file (a few hundred bytes or more),
 * is gzip data: gzip's magic and header, and a start that inflates
 * without error (so raw tokens that happen to begin like gzip are not
 * taken for it). For the importers that read their input as it is, to
 * refuse a gzipped one instead of importing its compressed bytes. */
int dt_import_is_gzip(const unsigned char *head, size_t n);

/* float16 bits to float (for statistics and checks). */
float dt_import_half_to_float(uint16_t h);

#endif
