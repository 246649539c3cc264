/*
 * snapshot.h - in-memory snapshots: one rank's training state as a file
 * in node-local shared memory (/dev/shm or a directory the user names),
 * kept between file checkpoints so that a restart after a lost process
 * resumes from memory, and a copy of it on a rank of another node, so that
 * a lost node's ranks take their peer's copy.
 *
 * A snapshot is the rank's own layout of its state (what it holds, as its
 * checkpoint staging holds it), not the global layout of a checkpoint: it
 * resumes only the same run on the same world size and the same sharding,
 * which the layout key checks. Anything else falls back to the file
 * checkpoints.
 *
 * Files (mode 600, never replacing another file: written under a
 * temporary name, then renamed):
 *   <dir>/dtrain-<run key>/node<N>/r<owner>-s<step>.own   this rank's own
 *   <dir>/dtrain-<run key>/node<N>/r<owner>-s<step>.peer  a copy held for
 *                                                         a rank of another node
 * Each holds a header (magic, version, run key, owner rank, world size,
 * step, layout key, the checkpoint meta, the data's size and checksum,
 * and a checksum of the header) and the data. A file whose header or data
 * fails its checksum is damaged and never resumed from.
 */
#ifndef DT_IO_SNAPSHOT_H
#define DT_IO_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "io/checkpoint.h"

#define DT_SNAP_PATH 4352

enum dt_snap_kind { DT_SNAP_OWN, DT_SNAP_PEER };

/* What a snapshot is of: the run, the rank it belongs to, and its layout. */
struct dt_snap_id {
    uint64_t run_key;
    uint64_t layout_key;
    int owner, world;
};

/* The directory of this run's snapshots on node `node`. */
void dt_snap_dir(const char *base, uint64_t run_key, int node, char *buf, size_t len);

/* 64-bit checksum of n bytes (a pure function of the bytes). */
uint64_t dt_snap_checksum(const void *p, size_t n);

/* Writes the snapshot of `step` (data: `bytes` bytes) into dir (created
 * with mode 700 when missing), as `kind`. DT_ERR_IO naming the file, the
 * reason and the free space; nothing is left under the final name on
 * failure. */
dt_status dt_snap_write(const char *dir, enum dt_snap_kind kind, const struct dt_snap_id *id,
                        int64_t step, const struct dt_ckpt_meta *meta, const void *data,
                        uint64_t bytes);

/* The steps of owner's snapshots of `kind` in dir, newest first, up to max
 * (by name only). Returns how many. */
int dt_snap_list(const char *dir, enum dt_snap_kind kind, int owner, int64_t *steps, int max);

/* The path of owner's snapshot of `step` and `kind` in dir. */
void dt_snap_path(const char *dir, enum dt_snap_kind kind, int owner, int64_t step, char *buf,
                  size_t len);

/* Reads and checks a snapshot: its header (magic, version, checksum),
 * that it is id's (run, owner, world, layout) of `step`, holds `bytes`
 * bytes, and that the data's checksum verifies; data may be NULL to check
 * only (the data is still read and summed). DT_ERR_BAD_DATA saying what
 * failed, DT_ERR_NOT_FOUND when it does not exist. */
dt_status dt_snap_read(const char *path, const struct dt_snap_id *id, int64_t step, void *data,
                       uint64_t bytes, struct dt_ckpt_meta *meta);

/* Removes owner's snapshots of `kind` in dir older than `keep_from`
 * (steps below it), and stale temporary files of owner's. */
void dt_snap_prune(const char *dir, enum dt_snap_kind kind, int owner, int64_t keep_from);

/* Removes every snapshot of the run under base on this node (all its node
 * directories) and the run's directory; what is not the run's is left. */
void dt_snap_remove_run(const char *base, uint64_t run_key);

/* Bytes the run's snapshot files under base take on this machine (all
 * its node directories), which a new snapshot of the run replaces. */
uint64_t dt_snap_run_bytes(const char *base, uint64_t run_key);

/* Free bytes of the file system holding path (UINT64_MAX when unknown). */
uint64_t dt_snap_free_bytes(const char *path);

#endif
