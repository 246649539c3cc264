/*
 * rundir.h - a run directory that is dtrain's alone.
 *
 * A run directory is recognisably dtrain's: the first run that uses it
 * writes a marker file, .dtrain-run, into it. An existing directory that
 * is not empty and has no marker belongs to someone else (a folder of the
 * user's, or a mistyped output.dir) and is refused, unless the job asks
 * for it with output.adopt; a run directory written by a dtrain before the
 * marker existed (its metrics.jsonl begins with a dtrain start record) is
 * recognised and marked.
 *
 * The marker is also the lock: the run holds an advisory lock on it (an
 * open-file-description lock, F_OFD_SETLK, or a POSIX record lock where
 * the kernel lacks those) for as long as the process lives. The kernel
 * drops it when the process ends in any way, so a killed run never leaves
 * a stale lock for the restart supervisor or a requeued Slurm job, and
 * NFS, Lustre (mounted with flock) and GPFS carry such locks between
 * nodes. A second run on the same directory fails with DT_ERR_BUSY (exit
 * 75) naming the PID and host that hold it. On a file system that cannot
 * lock at all the run goes on with a warning that says so.
 */
#ifndef DT_RUNDIR_H
#define DT_RUNDIR_H

#include "core/status.h"

#define DT_RUNDIR_MARKER ".dtrain-run"

typedef struct dt_rundir dt_rundir_t;

/* Creates dir (and parents) when missing, checks that it is a run
 * directory (see above; adopt = output.adopt), and locks it. Errors:
 * DT_ERR_USAGE (a foreign non-empty directory, or not a directory),
 * DT_ERR_BUSY (another run holds it), DT_ERR_IO. */
dt_status dt_rundir_claim(const char *dir, int adopt, dt_rundir_t **out);

/* Releases the lock (also released when the process ends). NULL is fine. */
void dt_rundir_release(dt_rundir_t *rd);

#endif
