/*
 * hdf5_lock.h - internal to io/: the one process-wide lock around HDF5,
 * the one close of any HDF5 handle, the conversion of HDF5 failures into
 * dt_status, and the checks every reader in io/ makes before it trusts
 * what a file declares.
 *
 * Debian's parallel HDF5 is built without thread safety, so every HDF5 call
 * made by io/ (dataset reads from loader threads, imports, checkpoints)
 * happens with this lock held. The first lock also switches off HDF5's
 * automatic printing of its error stack: failures are reported through
 * dt_set_error instead, with HDF5's own innermost message appended.
 * Not a public header: nothing outside io/ includes it but the tests that
 * build HDF5 files themselves (they use dt_h5_close).
 */
#ifndef DT_IO_HDF5_LOCK_H
#define DT_IO_HDF5_LOCK_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Takes / releases the HDF5 lock. Not recursive: never lock twice. */
void dt_h5_lock(void);
void dt_h5_unlock(void);

/* Copies the description of the innermost entry of HDF5's current error
 * stack (where the error was detected, e.g. "file signature not found")
 * into buf, or "" when the stack is empty; a failed system call becomes
 * "<what failed>: <strerror>" ("file write failed: File too large").
 * Call with the lock held, right after the failing call: the next HDF5 API
 * call clears the stack. */
void dt_h5_error_text(char *buf, size_t len);

/* The errno of a system call that failed inside HDF5, from the innermost
 * entry of its error stack, or 0 when the error was not a system call's.
 * Lock held, right after the failing call. */
int dt_h5_errno(void);

/* Closes id, whatever kind of HDF5 object it is (file, group, dataset,
 * dataspace, datatype, attribute, property list: H5Iget_type says which),
 * or does nothing when id < 0 (never opened, or its open failed): the one
 * cleanup of every HDF5 handle, `dt_h5_close(x)` at a function's `out`.
 * 0, or -1 when the close failed or id names no open object of those
 * kinds (nothing is closed then). With the lock held, as any HDF5 call. */
int dt_h5_close(hid_t id);

/* dt_set_error(st, fmt, ...) with " (HDF5: <innermost message>)" appended
 * when HDF5 has one. Lock held. Returns st. */
dt_status dt_h5_error(dt_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* H5Fopen (or H5Fis_accessible) of path failed. A system call that failed
 * inside HDF5 (a lock another process holds, EIO) is no damage:
 * DT_ERR_IO "<what> <path>: cannot open it (HDF5: <call>: <reason>)".
 * Anything else is DT_ERR_BAD_DATA "<what> <path><bad> (HDF5: ...)", bad
 * saying what that means (" is damaged or is not an HDF5 file"). Lock
 * held, right after the failing call. */
dt_status dt_h5_open_error(const char *what, const char *path, const char *bad);

/* A failed HDF5 write of `file` (the temporary file that becomes path):
 * "<what> <path>: cannot <action>: <OS reason>; <N> free on its file
 * system" when HDF5 recorded the system's errno, else HDF5's own text and
 * the free space. DT_ERR_IO. Lock held, right after the failing call. */
dt_status dt_h5_write_error(const char *what, const char *path, const char *file,
                            const char *action_fmt, ...) __attribute__((format(printf, 4, 5)));

/* How dt_h5_hard_path found name (relative to loc, "a/b/c"): every part a
 * hard link; missing; a part is a soft, external or user-defined link
 * (which can lead out of the file, to a FIFO that never answers); or an
 * HDF5 error. Lock held. */
enum dt_h5_path { DT_H5_PATH_ERROR = -1, DT_H5_PATH_MISSING, DT_H5_PATH_HARD, DT_H5_PATH_LINK };
enum dt_h5_path dt_h5_hard_path(hid_t loc, const char *name);

/* The root attribute dtrain_format of the open file f (which says what a
 * dtrain file is: "checkpoint", "dataset", "model"), stored as a fixed- or
 * variable-length string (h5py and the importers write the latter): 1 and
 * the value in buf (cut to len - 1 bytes, non-printable bytes as '?'), 0
 * when f has none, -1 when it is there but is not one string. Lock held. */
int dt_h5_read_format(hid_t f, char *buf, size_t len);

/* "a dtrain checkpoint", "a dtrain dataset", "a dtrain model file" for
 * those dtrain_format values, else NULL. */
const char *dt_h5_format_kind(const char *format);

/* What dt_h5_check_storage checks a dataset against. */
struct dt_h5_storage {
    const char *what;     /* message prefix: "dataset /data/x.h5" */
    const char *file;     /* the HDF5 file's path (for external file names) */
    const char *obj;      /* the dataset's name: "/train/x" */
    const char *declared; /* what its shape declares: "1099511627776 rows" */
    uint64_t bytes;       /* bytes its shape and type need */
    int64_t file_bytes;   /* size of the file */
    int external_ok;      /* external raw files allowed (regular files only) */
};

/* Before anything is allocated from a dataset's declared shape: its data
 * could really be there. Contiguous data lies inside the file, every chunk
 * of a chunked dataset was written and the chunks fit in the file, a
 * compact dataset fits its header, external files (when allowed) are
 * regular files; virtual datasets are refused. DT_ERR_BAD_DATA naming the
 * object, or dt_input_check's status for an external file. Lock held. */
dt_status dt_h5_check_storage(hid_t d, const struct dt_h5_storage *s);

#endif
