/*
 * fuzz_safetensors.c - fuzz target: reading safetensors files
 * (io/safetensors.h: dt_safetensors_open, dt_safetensors_read).
 *
 * The input makes the file: with its first byte 0, a well-formed file of
 * up to three F32/F16/BF16/F64 tensors whose header the rest of the input
 * may damage (a header length that lies, a byte of the JSON changed,
 * offsets moved, bytes cut from or added to the data); otherwise the
 * input's bytes as they are. Besides "no crash, no leak, no read outside
 * the file", the target checks what the reader promises: a failure says
 * why; an accepted file's tensors lie inside its data without overlap, and
 * each one reads.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fz_util.h"
#include "io/safetensors.h"

#define PATH_LEN 1024
#define HEADER_CAP 2048

static const char *const dtypes[] = {"F32", "F16", "BF16", "F64", "I32", "BOOL", "F8_E4M3", "X"};
static const int dsize[] = {4, 2, 2, 8, 4, 1, 1, 4};

/* A file built from choices: header JSON, then data; returns its length. */
static size_t make_file(struct fz_in *in, uint8_t *buf, size_t cap)
{
    char header[HEADER_CAP];
    int k = snprintf(header, sizeof header, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t at = 0;
    unsigned nt = 1 + fz_pick(in, 3);
    for (unsigned t = 0; t < nt; t++) {
        unsigned d = fz_u8(in) % 8 < 6 ? fz_pick(in, 4) : fz_pick(in, 8);
        uint64_t rows = 1 + fz_pick(in, 4), cols = fz_dim(in, 3);
        /* a hostile dimension makes the size wrap: the offsets then say a small one */
        uint64_t bytes = cols < (1u << 20) ? rows * cols * (uint64_t)dsize[d] : 16;
        int64_t begin = fz_i64(in, (int64_t)at), end = fz_i64(in, (int64_t)(at + bytes));
        k += snprintf(header + k, sizeof header - (size_t)k,
                      ",\"t%u\":{\"dtype\":\"%s\",\"shape\":[%" PRIu64 ",%" PRIu64
                      "],\"data_offsets\":[%" PRId64 ",%" PRId64 "]}",
                      t, dtypes[d], rows, cols, begin, end);
        if (bytes < 4096)
            at += bytes;
    }
    k += snprintf(header + k, sizeof header - (size_t)k, "}");
    size_t hlen = (size_t)k < sizeof header ? (size_t)k : sizeof header - 1;
    if (fz_pick(in, 8) == 1) /* one byte of the JSON changed */
        header[fz_u16(in) % hlen] = (char)fz_u8(in);
    uint64_t said = fz_pick(in, 8) == 1 ? fz_u64(in) : hlen;
    size_t data = at < 4096 ? (size_t)at : 4096;
    if (fz_pick(in, 8) == 1)
        data = fz_u16(in) % 4100;
    if (8 + hlen + data > cap)
        data = cap - 8 - hlen;
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(said >> (8 * i));
    memcpy(buf + 8, header, hlen);
    for (size_t i = 0; i < data; i++)
        buf[8 + hlen + i] = fz_u8(in);
    return 8 + hlen + data;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_in in = {data, size};
    static uint8_t buf[8 + HEADER_CAP + 4100];
    char path[PATH_LEN];
    fz_quiet();
    fz_scratch_path(path, sizeof path, "m.safetensors");
    if (fz_u8(&in) == 0) {
        size_t n = make_file(&in, buf, sizeof buf);
        fz_write_file(path, buf, n);
    } else
        fz_write_file(path, in.p, in.n);
    dt_safetensors_t *f = NULL;
    dt_status st = dt_safetensors_open(path, &f);
    fz_note("dt_safetensors_open", st);
    if (st != DT_OK) {
        fz_check_error(st, "dt_safetensors_open");
        FZ_REQUIRE(f == NULL, "a failed open returned a handle");
    } else {
        uint64_t at = 0;
        for (int i = 0; i < dt_safetensors_count(f); i++) {
            const struct dt_st_tensor *t = dt_safetensors_tensor(f, i);
            FZ_REQUIRE(t->begin == at && t->end >= t->begin,
                       "tensor %d at [%llu, %llu) after data ending at %llu", i,
                       (unsigned long long)t->begin, (unsigned long long)t->end,
                       (unsigned long long)at);
            at = t->end;
            int64_t n = dt_st_numel(t);
            float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
            FZ_REQUIRE(v != NULL, "%lld floats of an accepted tensor", (long long)n);
            st = dt_safetensors_read(f, t, v);
            FZ_REQUIRE(st == DT_OK, "an accepted tensor does not read: %s", dt_last_error());
            free(v);
        }
        dt_safetensors_close(f);
    }
    fz_scratch_clear();
    return 0;
}
