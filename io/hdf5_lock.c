/*
 * hdf5_lock.c - the process-wide HDF5 mutex and HDF5 error text (see
 * hdf5_lock.h). The mutex is the one mutable global of io/: HDF5 itself is
 * process-global state, so its lock has to be too.
 */
#include "hdf5_lock.h"

#include <hdf5.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t h5_mutex = PTHREAD_MUTEX_INITIALIZER;
static int h5_ready; /* guarded by h5_mutex */

void dt_h5_lock(void)
{
    pthread_mutex_lock(&h5_mutex);
    if (!h5_ready) {
        H5open();
        H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
        h5_ready = 1;
    }
}

void dt_h5_unlock(void) { pthread_mutex_unlock(&h5_mutex); }

struct walk_ctx {
    char *buf;
    size_t len;
};

/* Walking upward, entry 0 is the innermost: where HDF5 found the problem. */
static herr_t walk_cb(unsigned n, const H5E_error2_t *err, void *data)
{
    struct walk_ctx *ctx = data;
    if (n == 0 && err->desc)
        snprintf(ctx->buf, ctx->len, "%s", err->desc);
    return 0;
}

void dt_h5_error_text(char *buf, size_t len)
{
    if (len == 0)
        return;
    buf[0] = '\0';
    struct walk_ctx ctx = {buf, len};
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_cb, &ctx);
}

dt_status dt_h5_error(dt_status st, const char *fmt, ...)
{
    char h5[512];
    char msg[1536];
    dt_h5_error_text(h5, sizeof h5);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (h5[0])
        return dt_set_error(st, "%s (HDF5: %s)", msg, h5);
    return dt_set_error(st, "%s", msg);
}
