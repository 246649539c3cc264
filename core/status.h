/*
 * status.h - status codes and the thread-local error message.
 *
 * Every fallible dtrain function returns a dt_status. The site that fails
 * records one sentence (what, where, why) with dt_set_error(); callers on the
 * way up may prepend context with dt_error_context(). The launcher turns the
 * final status into a sysexits exit code with dt_status_exit_code(). The
 * library itself never exits.
 */
#ifndef DT_STATUS_H
#define DT_STATUS_H

#include <stdio.h>
#include <stdlib.h>

typedef enum dt_status {
    DT_OK = 0,
    DT_ERR_INVALID_ARG,   /* a caller passed a bad value (programmer or user) */
    DT_ERR_USAGE,         /* bad command line or job file */
    DT_ERR_NOMEM,         /* host or device allocation failed */
    DT_ERR_UNSUPPORTED,   /* not implemented for this backend/dtype/shape */
    DT_ERR_CUDA,          /* CUDA, cuBLAS, cuDNN */
    DT_ERR_COMM,          /* MPI or NCCL */
    DT_ERR_IO,            /* read/write failure on a file that exists */
    DT_ERR_BAD_DATA,      /* a dataset or checkpoint is malformed */
    DT_ERR_NOT_FOUND,     /* an input file or object does not exist */
    DT_ERR_REMOTE,        /* another rank failed */
    DT_ERR_TIMEOUT,       /* a step or collective took too long */
    DT_ERR_STOPPED,       /* stopped cleanly on request (signal) */
    DT_ERR_INTERNAL,      /* a bug in dtrain */
    DT_ERR_BUSY,          /* in use by another run (a run directory), or memory not free now */
    DT_STATUS_COUNT
} dt_status;

/* Short name of a status, e.g. "bad data". Never NULL. */
const char *dt_status_str(dt_status st);

/* sysexits code for a status: 0, 64 usage, 65 data, 66 no input, 70 software,
 * 74 I/O, 75 temporary failure (restartable, or busy). */
int dt_status_exit_code(dt_status st);

/* Records the message for the calling thread (printf-style) and returns st,
 * so a failing site can write `return dt_set_error(DT_ERR_IO, "...", ...)`. */
dt_status dt_set_error(dt_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "context: " to the calling thread's message and returns st. */
dt_status dt_error_context(dt_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The calling thread's last message ("" if none). Valid until the next set. */
const char *dt_last_error(void);

/* Clears the calling thread's message. */
void dt_clear_error(void);

/* Programmer errors only: always on, prints file/line and aborts. */
#define DT_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "dtrain: internal error: assertion '%s' failed at %s:%d\n", #cond,     \
                    __FILE__, __LINE__);                                                           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Propagates a failing status to the function's `out` label. Needs a local
 * `dt_status st`. */
#define DT_CHECK(expr)                                                                             \
    do {                                                                                           \
        st = (expr);                                                                               \
        if (st != DT_OK)                                                                           \
            goto out;                                                                              \
    } while (0)

#endif
