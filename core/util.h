/*
 * util.h - small helpers shared by every module: monotonic time, CPU
 * count, directory creation, checked allocation, edit distance.
 */
#ifndef DT_UTIL_H
#define DT_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"

/* Seconds on a monotonic clock. */
double dt_now(void);

/* CPUs this process may run on (sched affinity), at least 1. */
int dt_cpu_count(void);

/* The threads a training rank uses: runtime.threads when > 0; else every
 * core it is bound to when the launcher bound it; when nothing bound it,
 * the CPUs Slurm gave the task (SLURM_CPUS_PER_TASK: with
 * TaskPlugin=task/none nothing binds), else an equal share of the node
 * among its `local_size` ranks. At least 1. */
int dt_rank_threads(long job_threads, int local_size);

/* mkdir -p with mode 0777 & ~umask. Errors name the path. */
dt_status dt_mkdir_p(const char *path);

/* malloc/calloc that record "out of memory allocating N bytes for what". */
dt_status dt_malloc(size_t bytes, const char *what, void **out);
dt_status dt_calloc(size_t n, size_t size, const char *what, void **out);

/* Checked products: *out = a * b and 1, or 0 when the product does not
 * fit (or, for int64, when either factor is negative). */
int dt_mul_i64(int64_t a, int64_t b, int64_t *out);
int dt_mul_size(size_t a, size_t b, size_t *out);

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

/* Whether stdout reaches a person's terminal. Under Open MPI's mpirun a
 * rank's stdout is a pseudo-terminal that mpirun creates whatever its own
 * stdout is (a batch job's output file, say), so there the launcher's own
 * stdout decides: mpirun is the rank's parent on its node. */
int dt_stdout_is_terminal(void);

/* Levenshtein distance between two strings (for "did you mean"). */
int dt_edit_distance(const char *a, const char *b);

/* Formats bytes with three significant digits in powers of 1024: "512 B",
 * "4.00 MiB", "23.5 GiB", "256 KiB"; UINT64_MAX as "more than 16 EiB"
 * (what saturating size arithmetic gives for "too large to count"). */
void dt_format_bytes(uint64_t bytes, char *buf, size_t len);

/* Formats seconds as "1h02m03s" / "2m05s" / "12.3s". */
void dt_format_duration(double seconds, char *buf, size_t len);

#endif
