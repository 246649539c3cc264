/*
 * fz_util.h - what every fuzz target shares: a reader that turns the
 * fuzzer's bytes into choices, a private scratch directory, and the checks
 * that turn a broken promise of dtrain's into a crash the fuzzer reports.
 *
 * The reader returns 0 for every read past the end of the input, and the
 * targets map 0 to the ordinary, valid choice. So an empty or short input
 * builds a well-formed file, and each byte the fuzzer adds or flips makes
 * one part of it hostile: mutations start from files that get past the
 * format checks instead of dying at the first one.
 */
#ifndef DT_FZ_UTIL_H
#define DT_FZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

/* The fuzzer's bytes, consumed front to back. */
struct fz_in {
    const uint8_t *p;
    size_t n;
};

uint8_t fz_u8(struct fz_in *in);
uint16_t fz_u16(struct fz_in *in);
uint32_t fz_u32(struct fz_in *in);
uint64_t fz_u64(struct fz_in *in);
/* A value in [0, n) (n >= 1); 0 once the input is used up. */
unsigned fz_pick(struct fz_in *in, unsigned n);
/* Up to max bytes: a length byte pair, then that many bytes (fewer when
 * the input ends first). *out points into the input. */
size_t fz_blob(struct fz_in *in, size_t max, const uint8_t **out);
/* A NUL-terminated string of at most cap - 1 bytes from a blob (a NUL in
 * the blob ends it early). */
void fz_str(struct fz_in *in, char *buf, size_t cap);

/* An int64: mostly `good`, else 0, -1, 1, the extremes, a small number or
 * raw bits. */
int64_t fz_i64(struct fz_in *in, int64_t good);
/* A double: mostly `good`, else 0, -0, NaN, the infinities, a denormal, a
 * huge value or raw bits. */
double fz_f64(struct fz_in *in, double good);
/* A dimension: mostly `good`, else 0, 1, small, or huge (2^31, 2^32 + 1,
 * 2^40, 2^62 + 1, 2^63, 2^64 - 2) for sizes declared and never written. */
uint64_t fz_dim(struct fz_in *in, uint64_t good);

/* The process's scratch directory (made on first use, removed at exit),
 * emptied by fz_scratch_clear. Paths under it are `<dir>/<name>`. With
 * DTRAIN_FUZZ_KEEP set it is left in place (and named), to look at the
 * files an input made. */
const char *fz_scratch(void);
void fz_scratch_path(char *buf, size_t len, const char *name);
void fz_scratch_clear(void);

/* Writes n bytes to path (created, truncated); aborts when it cannot. */
void fz_write_file(const char *path, const void *data, size_t n);
/* The same, gzip-compressed. */
void fz_write_gz(const char *path, const void *data, size_t n);

/* With DTRAIN_FUZZ_VERBOSE set, prints what a call returned and its
 * message (for writing seeds and reading regressions). */
void fz_note(const char *call, dt_status st);

/* Quiet logs: dtrain's INFO lines would drown the fuzzer's own output. */
void fz_quiet(void);

/* A dtrain promise the input broke: prints why and aborts, which the
 * fuzzer reports as a crash with this input. */
#define FZ_REQUIRE(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) fz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                              \
    } while (0)
__attribute__((noreturn, format(printf, 4, 5))) void
fz_fail(const char *file, int line, const char *cond, const char *fmt, ...);

/* What every failing dtrain call owes its caller: a real error status and
 * one sentence saying what went wrong. */
void fz_check_error(dt_status st, const char *call);

#endif
