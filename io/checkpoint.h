/*
 * checkpoint.h - training checkpoints: one HDF5 file per checkpoint in a
 * run's checkpoints/ directory, written by all ranks together through
 * parallel HDF5 (MPI-IO), each rank a disjoint slice of every tensor, so
 * saving time falls as ranks grow and any world size can load it.
 *
 * File layout (format version 3):
 *   /                     attributes: dtrain_format = "checkpoint",
 *                         format_version, dtrain_version, step, epoch,
 *                         batch, samples, seed, world, loss_scale, optim_t,
 *                         bad_steps, rollbacks, created, optimizer,
 *                         train_seconds and segments (optional: files
 *                         from before they existed lack them),
 *                         meta_checksum (uint64: every attribute, the job
 *                         and every tensor's name, shape and checksum)
 *   /job                  uint8 bytes: the resolved job as YAML
 *   /<tensor name>        float32 of the tensor's shape (1 to DT_MAX_DIMS
 *                         dimensions, row-major), with attribute checksum
 *                         (uint64, dt_ckpt_checksum of its values in
 *                         row-major order)
 * Tensor names carry their group: "params/fc1.weight", "optim/m/fc1.weight";
 * "job" is reserved. Versions 1 and 2 (read as well) hold only 1-D and 2-D
 * tensors; version 3 added tensors of up to DT_MAX_DIMS dimensions (a
 * convolution's K x C x R x S weights) and is otherwise the same: a file of
 * 1-D and 2-D tensors has the same meta_checksum whatever its version says.
 * Version 1 files keep the job in a root attribute "job" and may lack
 * meta_checksum: a large attribute is stored where HDF5 keeps no checksum
 * of its own, so version 2 moved it. A file of a newer version is refused
 * with a message naming its version and the versions this dtrain reads.
 *
 * Commit is atomic: the file is written as <dir>/.ckpt-<step>.h5.tmp,
 * closed, fsynced and renamed by rank 0 to <dir>/ckpt-<step>.h5 (step
 * zero-padded to 10 digits), the directory fsynced, and then <dir>/latest
 * (a one-line file naming the checkpoint) replaced the same way. The
 * rename never replaces a file: when something already has the name (a
 * file of the user's, a FIFO, a checkpoint written before), the checkpoint
 * takes the first free name of ckpt-<step>-2.h5 ... ckpt-<step>-99.h5,
 * which lists after the plain one as a later file of the same step. A crash at
 * any moment leaves either the new checkpoint complete or the old ones and
 * latest untouched; a reader never trusts a file it has not verified.
 * Rank r of W writes the flat elements [r*n/W, (r+1)*n/W) of each tensor
 * given whole, and of a tensor given in pieces (sharded state) the pieces
 * it holds, so no rank ever gathers another's shard.
 * Rank 0's meta and job YAML are what the file holds. A file-size limit,
 * a full disk or a quota too small for the file is found before any data
 * is written (rank 0 reserves the space right after creating the file).
 * Files get the user's umask (never world-writable).
 */
#ifndef DT_CHECKPOINT_H
#define DT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/comm.h"
#include "core/status.h"
#include "core/tensor.h"

#define DT_CKPT_FORMAT_VERSION 3
#define DT_CKPT_OLDEST_VERSION 1 /* the oldest format version read */
#define DT_CKPT_NAME 128
#define DT_CKPT_MAX_TENSORS 4096

struct dt_ckpt_meta {
    int64_t step;       /* optimizer steps completed */
    int64_t epoch;      /* epoch of the next step (0-based) */
    int64_t batch;      /* global batch of that epoch the next step takes */
    int64_t samples;    /* training samples consumed so far */
    uint64_t seed;      /* train.seed (keys every random draw) */
    int world;          /* ranks at save */
    double loss_scale;  /* 1 for fp32 */
    int64_t optim_t;    /* optimizer's own step counter */
    int64_t bad_steps;  /* consecutive non-finite steps at save */
    int64_t rollbacks;  /* rollbacks so far */
    double created;     /* Unix time of the save */
    char version[32];   /* dtrain version that wrote it */
    char optimizer[32]; /* train.optimizer.name */
    /* Training time summed over the run's segments (a segment: one
     * process lifetime, up to a stop and resume) up to this save, and
     * how many segments that is. has_time = 0: the file predates these
     * attributes (both 0); a saver always writes them. */
    double train_seconds;
    int64_t segments;
    int has_time;
};

/* A run of a tensor's flat (row-major) elements, [lo, hi). */
struct dt_ckpt_piece {
    uint64_t lo, hi;
};

struct dt_ckpt_tensor {
    char name[DT_CKPT_NAME];
    struct dt_shape shape; /* 1 to DT_MAX_DIMS dimensions (give a scalar shape [1]) */
    /* Host memory. pieces NULL: the full tensor in row-major order (the
     * same on every rank). Otherwise (sharded state) this rank holds just
     * the npieces runs of flat elements, in increasing order and disjoint,
     * their values one run after another in data; saving, every element
     * of the tensor must be held by exactly one rank. */
    float *data;
    const struct dt_ckpt_piece *pieces;
    int npieces;
};

/* Position-keyed 64-bit checksum of n floats (a pure function of the
 * values and their order): with m = splitmix64's finaliser,
 *   m(S ^ m(n + G)),  S = sum over i of m(bits(x[i]) ^ i * G)  (mod 2^64),
 * G = 0x9E3779B97F4A7C15. S is a sum, so ranks hash only the slices they
 * write and add the partial sums. */
uint64_t dt_ckpt_checksum(const float *x, size_t n);

/* Collective over c: writes a checkpoint of the n tensors with meta and
 * the job's YAML into dir (which must exist), commits it as above, and
 * puts the final path in path. On failure (disk full, quota, permission)
 * every rank gets the same error naming the file, the temporary file is
 * removed, and earlier checkpoints and latest are untouched. A tensor of
 * 0 dimensions (a scalar) or more than DT_MAX_DIMS, or with a negative
 * dimension, is DT_ERR_INVALID_ARG naming it. */
dt_status dt_ckpt_save(dt_comm_t *c, const char *dir, const struct dt_ckpt_meta *meta,
                       const struct dt_ckpt_tensor *t, int n, const char *job_yaml, char *path,
                       size_t len);

/* How the ranks write their slices: in collective MPI-IO calls (MPI-IO
 * may gather the data onto aggregator ranks first: the fewest, largest
 * writes), or each rank its own (no data crosses between ranks: what a
 * background writer wants, as its collective exchanges compete with the
 * training beside it; measured in bench/ckpt_async.sh). */
enum dt_ckpt_io { DT_CKPT_IO_COLLECTIVE, DT_CKPT_IO_INDEPENDENT };

/* dt_ckpt_save with the data written as io says; the file is the same. */
dt_status dt_ckpt_save_ex(dt_comm_t *c, const char *dir, const struct dt_ckpt_meta *meta,
                          const struct dt_ckpt_tensor *t, int n, const char *job_yaml, char *path,
                          size_t len, enum dt_ckpt_io io);

/* What a checkpoint holds, from dt_ckpt_verify. */
struct dt_ckpt_info {
    struct dt_ckpt_meta meta;
    int ntensors;
    char names[DT_CKPT_MAX_TENSORS][DT_CKPT_NAME];
    int64_t numel[DT_CKPT_MAX_TENSORS];
    int64_t file_bytes;
    int format_version; /* DT_CKPT_OLDEST_VERSION to DT_CKPT_FORMAT_VERSION */
    char *job_yaml;     /* malloc'd; free with dt_ckpt_info_free */
    struct dt_shape shape[DT_CKPT_MAX_TENSORS]; /* 1 to DT_MAX_DIMS dimensions */
};

/* Reads a checkpoint file alone (any process, no MPI needed): checks the
 * format, every attribute, meta_checksum and every tensor's checksum.
 * Nothing is allocated from a size the file declares before the file is
 * known to hold it. DT_ERR_BAD_DATA: "checkpoint X is damaged: ..." (with
 * HDF5's reason) for a file that shows it was written as a checkpoint
 * (truncated, a flipped bit, a tensor failing its checksum), "checkpoint X
 * is not a dtrain checkpoint (...)" only for an HDF5 file with nothing of
 * a checkpoint in it, "checkpoint X is damaged or is not an HDF5 file" for
 * one HDF5 cannot open. DT_ERR_IO: a system call failed inside HDF5 (a
 * lock another process holds, EIO): nothing says the file is bad.
 * DT_ERR_NOT_FOUND: no such file, or not a regular file (never opened, so
 * a FIFO cannot hang it). A file of a format version newer than
 * DT_CKPT_FORMAT_VERSION is DT_ERR_BAD_DATA: "checkpoint X has format
 * version 4; this dtrain reads versions 1 to 3: use a newer dtrain".
 * info may be NULL; its tensors come in name order. On failure
 * info->job_yaml is already freed (NULL). */
dt_status dt_ckpt_verify(const char *path, struct dt_ckpt_info *info);
void dt_ckpt_info_free(struct dt_ckpt_info *info);

/* Reads meta and, for each of the n tensors, the tensor of that name into
 * t[i].data (any process; every rank reads all), or, for one given in
 * pieces, just those pieces. A tensor missing or of another shape (another
 * number of dimensions included) is DT_ERR_BAD_DATA naming it and both
 * shapes. Checks the header (meta_checksum) and each whole tensor's
 * checksum as it reads; errors as dt_ckpt_verify. A checksum covers its
 * whole tensor, so pieces are not checked: verify the file first
 * (dt_ckpt_verify, in bounded memory). */
dt_status dt_ckpt_load(const char *path, struct dt_ckpt_meta *meta, struct dt_ckpt_tensor *t,
                       int n);

/* Committed checkpoints in dir (ckpt-*.h5, temporary files ignored),
 * newest (highest step, then the later file of a step) first: up to max file names (without the
 * directory) and their steps. Returns how many there are. By name only:
 * a reader verifies each before trusting it. */
int dt_ckpt_list(const char *dir, char (*names)[256], int64_t *steps, int max);

/* The file `latest` names in dir ("" and DT_ERR_NOT_FOUND when absent;
 * DT_ERR_BAD_DATA when it is no regular file or does not name a
 * ckpt-<step>.h5). */
dt_status dt_ckpt_latest(const char *dir, char *name, size_t len);

/* Retention, rank 0 only: keeps the newest keep_last checkpoints and those
 * whose step is a multiple of keep_every (0: none), and removes stale
 * temporary files; never removes the one latest names. A file named like
 * a checkpoint whose header does not open as a dtrain checkpoint of the
 * step in its name is not ours: it takes no slot, is never removed, and
 * gets one warning per call naming it. */
dt_status dt_ckpt_prune(const char *dir, int keep_last, int64_t keep_every);

/* Rank 0, before a run that does not continue from the newest state in
 * dir (it starts afresh, or from a checkpoint other than the one latest
 * names): when dir holds any checkpoint or a latest pointer, renames dir
 * to the first free <dir>.1, <dir>.2, ... (replacing nothing) and creates
 * dir again, empty. The earlier run's files are kept as they were, and no
 * resume, rollback or retention in dir ever sees them. moved receives the
 * new name, "" when dir held nothing to move. */
dt_status dt_ckpt_set_aside(const char *dir, char *moved, size_t len);

#endif
