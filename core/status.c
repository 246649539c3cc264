/*
 * status.c - status names, exit codes and the per-thread error message.
 *
 * The message buffer is thread-local so loader threads and the main thread
 * never overwrite each other's errors.
 */
#include "status.h"

#include <stdarg.h>
#include <string.h>

#define DT_ERRMSG_MAX 2048

static _Thread_local char errmsg[DT_ERRMSG_MAX];

static const char *const names[DT_STATUS_COUNT] = {
    [DT_OK] = "ok",
    [DT_ERR_INVALID_ARG] = "invalid argument",
    [DT_ERR_USAGE] = "usage error",
    [DT_ERR_NOMEM] = "out of memory",
    [DT_ERR_UNSUPPORTED] = "unsupported",
    [DT_ERR_CUDA] = "CUDA error",
    [DT_ERR_COMM] = "communication error",
    [DT_ERR_IO] = "I/O error",
    [DT_ERR_BAD_DATA] = "bad data",
    [DT_ERR_NOT_FOUND] = "not found",
    [DT_ERR_REMOTE] = "remote failure",
    [DT_ERR_TIMEOUT] = "timeout",
    [DT_ERR_STOPPED] = "stopped",
    [DT_ERR_INTERNAL] = "internal error",
    [DT_ERR_BUSY] = "in use",
};

const char *dt_status_str(dt_status st)
{
    if ((int)st < 0 || st >= DT_STATUS_COUNT)
        return "unknown status";
    return names[st];
}

int dt_status_exit_code(dt_status st)
{
    switch (st) {
    case DT_OK: return 0;
    case DT_ERR_USAGE:
    case DT_ERR_UNSUPPORTED: /* the job asks for something this build lacks */
    case DT_ERR_INVALID_ARG: return 64;  /* EX_USAGE */
    case DT_ERR_BAD_DATA: return 65;     /* EX_DATAERR */
    case DT_ERR_NOT_FOUND: return 66;    /* EX_NOINPUT */
    case DT_ERR_IO: return 74;           /* EX_IOERR */
    case DT_ERR_NOMEM:
    case DT_ERR_COMM:
    case DT_ERR_REMOTE:
    case DT_ERR_TIMEOUT:
    case DT_ERR_BUSY:
    case DT_ERR_STOPPED:
        return 75; /* EX_TEMPFAIL: restartable */
    case DT_ERR_CUDA:
    case DT_ERR_INTERNAL:
    default: return 70;                  /* EX_SOFTWARE */
    }
}

dt_status dt_set_error(dt_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return st;
}

dt_status dt_error_context(dt_status st, const char *fmt, ...)
{
    char joined[2 * DT_ERRMSG_MAX + 2];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(joined, DT_ERRMSG_MAX, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if (n >= DT_ERRMSG_MAX)
        n = DT_ERRMSG_MAX - 1;
    if (errmsg[0]) {
        memcpy(joined + n, ": ", 2);
        memcpy(joined + n + 2, errmsg, strlen(errmsg) + 1);
    }
    memcpy(errmsg, joined, DT_ERRMSG_MAX - 1);
    errmsg[DT_ERRMSG_MAX - 1] = '\0';
    return st;
}

const char *dt_last_error(void) { return errmsg; }

void dt_clear_error(void) { errmsg[0] = '\0'; }
