/*
 * fz_util.c - the fuzz targets' shared reader, scratch directory and
 * checks (see fz_util.h).
 *
 * The scratch directory is the one piece of process state: libFuzzer calls
 * a target with nothing but the input, so the directory is made once,
 * emptied after every input and removed when the process exits normally.
 * It lives under $TMPDIR (or /tmp), so a runner that sets TMPDIR to a
 * folder of its own also collects what a crashed process leaves behind.
 */
#define _GNU_SOURCE
#include "fz_util.h"

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "core/log.h"

#define SCRATCH_PATH 1024
#define NFTW_FDS 16

/* ---- reading the input ---------------------------------------------------- */

uint8_t fz_u8(struct fz_in *in)
{
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

/* Little-endian; each byte read in its own statement (operands of | are
 * evaluated in no fixed order). */
uint16_t fz_u16(struct fz_in *in)
{
    uint16_t lo = fz_u8(in);
    return (uint16_t)(lo | fz_u8(in) << 8);
}

uint32_t fz_u32(struct fz_in *in)
{
    uint32_t lo = fz_u16(in);
    return lo | (uint32_t)fz_u16(in) << 16;
}

uint64_t fz_u64(struct fz_in *in)
{
    uint64_t lo = fz_u32(in);
    return lo | (uint64_t)fz_u32(in) << 32;
}

unsigned fz_pick(struct fz_in *in, unsigned n)
{
    return n > 1 ? fz_u8(in) % n : 0;
}

size_t fz_blob(struct fz_in *in, size_t max, const uint8_t **out)
{
    size_t len = fz_u16(in);
    if (len > max) len = max;
    if (len > in->n) len = in->n;
    *out = in->p;
    in->p += len;
    in->n -= len;
    return len;
}

void fz_str(struct fz_in *in, char *buf, size_t cap)
{
    const uint8_t *b;
    size_t len = fz_blob(in, cap - 1, &b);
    size_t end = 0;
    while (end < len && b[end])
        end++;
    memcpy(buf, b, end);
    buf[end] = '\0';
}

int64_t fz_i64(struct fz_in *in, int64_t good)
{
    switch (fz_u8(in) % 16) {
    case 1:
        return 0;
    case 2:
        return -1;
    case 3:
        return 1;
    case 4:
        return INT64_MAX;
    case 5:
        return INT64_MIN;
    case 6:
        return INT32_MAX;
    case 7:
        return (int64_t)INT32_MAX + 1;
    case 8:
        return (int8_t)fz_u8(in);
    case 9:
        return good + 1;
    case 10:
        return good - 1;
    case 11:
        return (int64_t)fz_u64(in);
    default:
        return good;
    }
}

double fz_f64(struct fz_in *in, double good)
{
    uint64_t bits;
    double v;
    switch (fz_u8(in) % 16) {
    case 1:
        return 0.0;
    case 2:
        return -0.0;
    case 3:
        return NAN;
    case 4:
        return INFINITY;
    case 5:
        return -INFINITY;
    case 6:
        return 4.9e-324;
    case 7:
        return 1e308;
    case 8:
        return -good;
    case 9:
        return (double)(int8_t)fz_u8(in);
    case 10:
        bits = fz_u64(in);
        memcpy(&v, &bits, sizeof v);
        return v;
    default:
        return good;
    }
}

uint64_t fz_dim(struct fz_in *in, uint64_t good)
{
    switch (fz_u8(in) % 16) {
    case 1:
        return 0;
    case 2:
        return 1;
    case 3:
        return fz_u8(in);
    case 4:
        return fz_u16(in);
    case 5:
        return UINT64_C(1) << 31;
    case 6:
        return (UINT64_C(1) << 32) + 1;
    case 7:
        return UINT64_C(1) << 40;
    case 8:
        return (UINT64_C(1) << 62) + 1;
    case 9:
        return UINT64_C(1) << 63;
    case 10:
        return UINT64_MAX - 1;
    case 11:
        return good + 1;
    default:
        return good;
    }
}

/* ---- scratch directory ---------------------------------------------------- */

static char scratch[SCRATCH_PATH];

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    if (ftw->level > 0) remove(path);
    return 0;
}

void fz_scratch_clear(void)
{
    if (scratch[0] && !getenv("DTRAIN_FUZZ_KEEP"))
        nftw(scratch, remove_entry, NFTW_FDS, FTW_DEPTH | FTW_PHYS);
}

static void scratch_remove(void)
{
    if (getenv("DTRAIN_FUZZ_KEEP")) {
        fprintf(stderr, "fuzz: kept %s\n", scratch);
        return;
    }
    fz_scratch_clear();
    rmdir(scratch);
}

const char *fz_scratch(void)
{
    if (scratch[0]) return scratch;
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof scratch, "%s/dtrain-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(scratch)) {
        fprintf(stderr, "fuzz: cannot make a scratch directory %s: %s\n", scratch, strerror(errno));
        abort();
    }
    atexit(scratch_remove);
    return scratch;
}

void fz_scratch_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", fz_scratch(), name);
}

void fz_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "fuzz: cannot write %s: %s\n", path, strerror(errno));
        abort();
    }
}

void fz_write_gz(const char *path, const void *data, size_t n)
{
    gzFile gz = gzopen(path, "wb");
    if (!gz || (n && gzwrite(gz, data, (unsigned)n) != (int)n) || gzclose(gz) != Z_OK) {
        fprintf(stderr, "fuzz: cannot write %s\n", path);
        abort();
    }
}

/* ---- checks ---------------------------------------------------------------- */

void fz_quiet(void)
{
    dt_log_set_level(DT_LOG_LEVEL_ERROR);
}

void fz_note(const char *call, dt_status st)
{
    if (getenv("DTRAIN_FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz: %s: %s%s%s\n", call, dt_status_str(st), st ? ": " : "",
                st ? dt_last_error() : "");
}

void fz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "fuzz: %s:%d: '%s' does not hold: ", file, line, cond);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

void fz_check_error(dt_status st, const char *call)
{
    FZ_REQUIRE(st > DT_OK && st < DT_STATUS_COUNT, "%s returned status %d", call, (int)st);
    const char *msg = dt_last_error();
    FZ_REQUIRE(msg && msg[0], "%s failed (%s) without a message", call, dt_status_str(st));
}
