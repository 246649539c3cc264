/*
 * hdf5_lock.c - the process-wide HDF5 mutex, the one close of any HDF5
 * handle, HDF5 error text, and the checks of links and storage made before
 * a file's declared sizes are trusted (see hdf5_lock.h). The mutex is the
 * one mutable global of io/: HDF5 itself is process-global state, so its
 * lock has to be too.
 */
#include "hdf5_lock.h"

#include <hdf5.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/files.h"
#include "outfile.h"

#define COMPACT_MAX_BYTES 65536 /* a compact dataset lives in its object header */

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

int dt_h5_close(hid_t id)
{
    herr_t r = -1;
    if (id < 0) return 0;
    switch (H5Iget_type(id)) {
    case H5I_FILE:
        r = H5Fclose(id);
        break;
    case H5I_GROUP:
        r = H5Gclose(id);
        break;
    case H5I_DATASET:
        r = H5Dclose(id);
        break;
    case H5I_DATASPACE:
        r = H5Sclose(id);
        break;
    case H5I_DATATYPE:
        r = H5Tclose(id);
        break;
    case H5I_ATTR:
        r = H5Aclose(id);
        break;
    case H5I_GENPROP_LST:
        r = H5Pclose(id);
        break;
    default:
        break;
    }
    return r < 0 ? -1 : 0;
}

/* The innermost entry of HDF5's error stack (where the problem was found). */
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

static void innermost(char *buf, size_t len)
{
    buf[0] = '\0';
    struct walk_ctx ctx = {buf, len};
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_cb, &ctx);
}

/* A failed system call inside HDF5 reads "<what failed>: <details>, errno =
 * N, error message = '<strerror>', <more details>" (HDF5 keeps that form
 * for programs that parse it). Returns N, 0 when there is none. */
static int parse_errno(const char *desc)
{
    const char *e = strstr(desc, "errno = ");
    return e ? atoi(e + strlen("errno = ")) : 0;
}

void dt_h5_error_text(char *buf, size_t len)
{
    char desc[1024];
    if (len == 0) return;
    innermost(desc, sizeof desc);
    const char *msg = strstr(desc, "error message = '");
    if (!parse_errno(desc) || !msg) {
        snprintf(buf, len, "%s", desc);
        return;
    }
    /* keep "<what failed>: <strerror>" and drop times, addresses, sizes */
    msg += strlen("error message = '");
    size_t head = strcspn(desc, ":,"), tail = strcspn(msg, "'");
    snprintf(buf, len, "%.*s: %.*s", (int)head, desc, (int)tail, msg);
}

int dt_h5_errno(void)
{
    char desc[1024];
    innermost(desc, sizeof desc);
    return parse_errno(desc);
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

dt_status dt_h5_open_error(const char *what, const char *path, const char *bad)
{
    if (dt_h5_errno()) return dt_h5_error(DT_ERR_IO, "%s %s: cannot open it", what, path);
    return dt_h5_error(DT_ERR_BAD_DATA, "%s %s%s", what, path, bad);
}

dt_status dt_h5_write_error(const char *what, const char *path, const char *file,
                            const char *action_fmt, ...)
{
    char action[512], reason[256];
    va_list ap;
    va_start(ap, action_fmt);
    vsnprintf(action, sizeof action, action_fmt, ap);
    va_end(ap);
    int err = dt_h5_errno();
    if (err) {
        dt_outfile_reason(err, file, reason, sizeof reason);
        return dt_set_error(DT_ERR_IO, "%s %s: cannot %s: %s", what, path, action, reason);
    }
    dt_outfile_free_text(file, reason, sizeof reason);
    return dt_h5_error(DT_ERR_IO, "%s %s: cannot %s%s", what, path, action, reason);
}

/* ---- checks before trusting an object ------------------------------------ */

enum dt_h5_path dt_h5_hard_path(hid_t loc, const char *name)
{
    char part[1024];
    size_t len = strlen(name);
    if (len == 0 || len >= sizeof part) return DT_H5_PATH_MISSING;
    /* each prefix "a", "a/b", "a/b/c" must be a hard link */
    for (size_t i = 1; i <= len; i++) {
        if (name[i] != '/' && name[i] != '\0') continue;
        memcpy(part, name, i);
        part[i] = '\0';
        H5L_info_t li;
        htri_t e = H5Lexists(loc, part, H5P_DEFAULT);
        if (e <= 0) return e < 0 ? DT_H5_PATH_ERROR : DT_H5_PATH_MISSING;
        if (H5Lget_info(loc, part, &li, H5P_DEFAULT) < 0) return DT_H5_PATH_ERROR;
        if (li.type != H5L_TYPE_HARD) return DT_H5_PATH_LINK;
    }
    return DT_H5_PATH_HARD;
}

/* Where HDF5 looks for external file `name` of a dataset in `file`: under
 * HDF5_EXTFILE_PREFIX or the access list's prefix ("${ORIGIN}" = the
 * file's directory), else as given. */
static void external_path(hid_t d, const char *file, const char *name, char *buf, size_t len)
{
    char prefix[1024] = "";
    const char *env = getenv("HDF5_EXTFILE_PREFIX");
    if (env && *env) {
        snprintf(prefix, sizeof prefix, "%s", env);
    } else {
        hid_t dapl = H5Dget_access_plist(d);
        if (dapl >= 0 && H5Pget_efile_prefix(dapl, prefix, sizeof prefix) < 0) prefix[0] = '\0';
        dt_h5_close(dapl);
    }
    const char *origin = "${ORIGIN}";
    if (!strncmp(prefix, origin, strlen(origin))) {
        const char *slash = strrchr(file, '/');
        int dlen = slash ? (int)(slash - file) : 1;
        snprintf(buf, len, "%.*s%s/%s", dlen, slash ? file : ".", prefix + strlen(origin), name);
    } else if (prefix[0]) {
        snprintf(buf, len, "%s/%s", prefix, name);
    } else {
        snprintf(buf, len, "%s", name);
    }
}

/* External files (H5Pset_external) must be regular files: HDF5 opens them
 * by name and a FIFO would never answer. */
static dt_status check_external(hid_t d, hid_t dcpl, int count, const struct dt_h5_storage *s)
{
    for (int i = 0; i < count; i++) {
        char name[1024] = "", full[2048];
        off_t off = 0;
        hsize_t size = 0;
        if (H5Pget_external(dcpl, (unsigned)i, sizeof name, name, &off, &size) < 0)
            return dt_h5_error(DT_ERR_BAD_DATA, "%s: cannot read the external files of %s", s->what,
                               s->obj);
        external_path(d, s->file, name, full, sizeof full);
        dt_status st = dt_input_check(full, "external file", NULL);
        if (st != DT_OK)
            return dt_error_context(st, "%s: %s is stored outside the file", s->what, s->obj);
    }
    return DT_OK;
}

/* Every chunk of a chunked dataset is written, and they fit in the file. */
static dt_status check_chunks(hid_t d, hid_t dcpl, const struct dt_h5_storage *s)
{
    hsize_t dims[H5S_MAX_RANK], chunk[H5S_MAX_RANK], have = 0;
    int64_t want = 1;
    hid_t sp = H5Dget_space(d);
    int nd = sp < 0 ? -1 : H5Sget_simple_extent_dims(sp, dims, NULL);
    herr_t e = nd < 0 || H5Pget_chunk(dcpl, nd, chunk) != nd ? -1 : H5Dget_num_chunks(d, sp, &have);
    if (e < 0) {
        dt_status st =
            dt_h5_error(DT_ERR_BAD_DATA, "%s: cannot read the chunk layout of %s", s->what, s->obj);
        dt_h5_close(sp);
        return st;
    }
    H5Sclose(sp);
    for (int i = 0; i < nd; i++) {
        if (chunk[i] == 0)
            return dt_set_error(DT_ERR_BAD_DATA, "%s: %s has a chunk dimension of 0", s->what,
                                s->obj);
        hsize_t per = dims[i] / chunk[i] + (dims[i] % chunk[i] != 0);
        if (per > (hsize_t)INT64_MAX || !dt_mul_i64(want, (int64_t)per, &want)) want = INT64_MAX;
    }
    if ((uint64_t)want != have)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "%s: %s declares %s but only %llu of its %lld chunks were ever "
                            "written",
                            s->what, s->obj, s->declared, (unsigned long long)have,
                            (long long)want);
    hsize_t stored = H5Dget_storage_size(d);
    if ((int64_t)stored > s->file_bytes || stored > (hsize_t)INT64_MAX)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "%s: %s declares %llu stored bytes, more than the file's %lld "
                            "(truncated?)",
                            s->what, s->obj, (unsigned long long)stored, (long long)s->file_bytes);
    return DT_OK;
}

dt_status dt_h5_check_storage(hid_t d, const struct dt_h5_storage *s)
{
    dt_status st = DT_OK;
    hid_t dcpl = H5Dget_create_plist(d);
    H5D_layout_t layout = dcpl < 0 ? H5D_LAYOUT_ERROR : H5Pget_layout(dcpl);
    int external = dcpl < 0 ? -1 : H5Pget_external_count(dcpl);
    if (layout == H5D_LAYOUT_ERROR || external < 0) {
        st = dt_h5_error(DT_ERR_BAD_DATA, "%s: cannot read the storage layout of %s", s->what,
                         s->obj);
        goto out;
    }
    if (s->bytes == 0) goto out; /* nothing to read */
    if (layout == H5D_VIRTUAL) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "%s: %s is a virtual dataset (its data is in other datasets); dtrain "
                          "reads data stored in the file",
                          s->what, s->obj);
    } else if (external > 0) {
        st = s->external_ok ? check_external(d, dcpl, external, s)
                            : dt_set_error(DT_ERR_BAD_DATA,
                                           "%s: %s is stored in external files; dtrain writes "
                                           "it inside the file",
                                           s->what, s->obj);
    } else if (layout == H5D_CHUNKED) {
        st = check_chunks(d, dcpl, s);
    } else if (layout == H5D_CONTIGUOUS) {
        haddr_t at = H5Dget_offset(d);
        if (at == HADDR_UNDEF)
            st = dt_set_error(DT_ERR_BAD_DATA, "%s: %s declares %s but its data was never written",
                              s->what, s->obj, s->declared);
        else if (at > (haddr_t)s->file_bytes || s->bytes > (uint64_t)s->file_bytes - at)
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "%s: %s declares %s (%llu bytes from byte %llu) but the file "
                              "holds only %lld bytes (truncated?)",
                              s->what, s->obj, s->declared, (unsigned long long)s->bytes,
                              (unsigned long long)at, (long long)s->file_bytes);
    } else if (layout == H5D_COMPACT && s->bytes > COMPACT_MAX_BYTES) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "%s: %s declares %s (%llu bytes), more than a compact dataset holds",
                          s->what, s->obj, s->declared, (unsigned long long)s->bytes);
    }
out:
    dt_h5_close(dcpl);
    return st;
}

int dt_h5_read_format(hid_t f, char *buf, size_t len)
{
    enum { MAX = 256 };
    char text[MAX + 1] = "";
    if (len) buf[0] = '\0';
    htri_t e = H5Aexists(f, "dtrain_format");
    if (e <= 0) return e < 0 ? -1 : 0;
    int ok = 0;
    hid_t a = H5Aopen(f, "dtrain_format", H5P_DEFAULT);
    hid_t t = a < 0 ? -1 : H5Aget_type(a);
    hid_t sp = a < 0 ? -1 : H5Aget_space(a);
    hid_t mt = H5Tcopy(H5T_C_S1);
    if (t >= 0 && sp >= 0 && mt >= 0 && H5Tget_class(t) == H5T_STRING &&
        H5Sget_simple_extent_npoints(sp) == 1 && H5Tset_cset(mt, H5Tget_cset(t)) >= 0) {
        if (H5Tis_variable_str(t) > 0) {
            char *vl = NULL;
            if (H5Tset_size(mt, H5T_VARIABLE) >= 0 && H5Aread(a, mt, &vl) >= 0 && vl) {
                snprintf(text, sizeof text, "%s", vl);
                ok = 1;
            }
            if (vl) H5free_memory(vl);
        } else if (H5Tget_size(t) <= MAX && H5Tset_size(mt, MAX + 1) >= 0) {
            ok = H5Aread(a, mt, text) >= 0;
            text[MAX] = '\0';
        }
    }
    dt_h5_close(mt);
    dt_h5_close(sp);
    dt_h5_close(t);
    dt_h5_close(a);
    if (!ok) return -1;
    size_t i = 0;
    for (; text[i] && i + 1 < len; i++)
        buf[i] = text[i] >= 0x20 && text[i] < 0x7f ? text[i] : '?';
    if (len) buf[i] = '\0';
    return 1;
}

const char *dt_h5_format_kind(const char *format)
{
    if (!strcmp(format, "checkpoint")) return "a dtrain checkpoint";
    if (!strcmp(format, "dataset")) return "a dtrain dataset";
    if (!strcmp(format, "model")) return "a dtrain model file";
    return NULL;
}
