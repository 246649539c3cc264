/*
 * files.h - how dtrain opens, writes and names files: inputs read only
 * when they are regular files, outputs written only onto regular files,
 * neither open ever blocking (a FIFO or a device of that name is an
 * error, not a hang), writes resumed after short writes, files of lines
 * kept whole, and paths checked against the length HDF5 and MPI-IO need.
 */
#ifndef DT_FILES_H
#define DT_FILES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"

/* mkdir -p with mode 0777 & ~umask. Errors name the path. */
dt_status dt_mkdir_p(const char *path);

/* The one way dtrain opens a file it reads (job files, datasets,
 * checkpoints, model files, IDX files): read-only and without blocking
 * (a FIFO or a device never hangs the open), then it must be a regular
 * file. `what` names the input in messages ("dataset", "IDX images").
 * Errors: DT_ERR_NOT_FOUND (no such file, not readable, a path that
 * cannot lead to a file: a symbolic link loop, a name too long; not a
 * regular file: a directory, FIFO, socket or device; exit 66), DT_ERR_IO
 * (anything else: the system failed to read, too many open files). On success *fd is open
 * (blocking) and *size holds the file's size; the caller closes it. */
dt_status dt_input_open(const char *path, const char *what, int *fd, int64_t *size);
/* dt_input_open and close: for readers that open the file by name
 * themselves (HDF5). size may be NULL. A symbolic link must also pass
 * dt_path_fits, as HDF5 resolves it to its full path. */
dt_status dt_input_check(const char *path, const char *what, int64_t *size);

/* Opens a file dtrain writes in a run directory (its log, metrics, the
 * resolved job), appending or truncating, never blocking and never onto
 * anything but a regular file: a FIFO or directory of that name is an
 * error (DT_ERR_IO naming it), not a hang. */
dt_status dt_output_open(const char *path, const char *what, int append, FILE **out);

/* Writes all len bytes of data to fd, resuming after short writes and
 * interrupts: 1, or 0 with errno saying why (ENOSPC for a write that
 * wrote nothing). */
int dt_write_all(int fd, const void *data, size_t len);

/* For a file of lines open to append (f from dt_output_open): when it
 * does not end with a newline (a write that failed or was cut short left
 * half a line), drop = 1 removes that incomplete line (for files of
 * records, so every line stays whole) and *partial gets the bytes
 * removed; drop = 0 ends it with a newline (for a log a person reads) and
 * *partial is 1. Both 0 when the file ends with a newline or is empty.
 * DT_ERR_IO naming what and path. */
dt_status dt_output_end_line(FILE *f, const char *path, const char *what, int drop,
                             int64_t *partial);

/* Whether path can be named in full, as MPI-IO (every path it opens)
 * and HDF5 (a symbolic link it resolves) do: the current directory's
 * path joined with a relative path, plus `extra` bytes of the names dtrain
 * adds beneath it, must stay below PATH_MAX. A cwd the system cannot
 * name (longer than PATH_MAX) with a relative path is DT_ERR_USAGE, as is
 * a path too long; a current directory that was removed is
 * DT_ERR_NOT_FOUND. Messages name `what` ("output.dir") and say what to
 * change. */
dt_status dt_path_fits(const char *path, size_t extra, const char *what);

#endif
