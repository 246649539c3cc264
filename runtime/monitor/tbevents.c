/*
 * tbevents.c - TensorBoard event file writer (see tbevents.h).
 *
 * The Event message needs only four protobuf wire forms: varints (field
 * keys, lengths, the step), 64-bit doubles (wall_time), 32-bit floats
 * (simple_value) and length-delimited bytes (strings, nested messages).
 * Nested messages are small and their lengths are known before they are
 * written, so each is sized first and encoded straight into one buffer.
 * Field numbers, from TensorFlow's event.proto and summary.proto:
 *   Event:         wall_time 1 (double), step 2 (int64),
 *                  file_version 3 (string), summary 5 (Summary)
 *   Summary:       value 1 (repeated Summary.Value)
 *   Summary.Value: tag 1 (string), simple_value 2 (float)
 */
#define _GNU_SOURCE
#include "tbevents.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/files.h"

#define TB_FILE_VERSION "brain.Event:2"
#define TB_CRC_MASK_DELTA 0xa282ead8u
#define TB_CRC_POLY 0x82F63B78u
#define TB_EVENT_MAX 8192 /* bytes: DT_TB_MAX_VALUES tags of DT_TB_MAX_TAG fit */
#define TB_HOST_MAX 256

/* protobuf wire types */
enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_BYTES = 2, WT_FIXED32 = 5 };

struct dt_tb {
    FILE *fp;
    char path[4096 + 512];
};

/* ---- CRC-32C ------------------------------------------------------------- */

uint32_t dt_crc32c(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= b[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (TB_CRC_POLY & (0u - (c & 1u)));
    }
    return c ^ 0xffffffffu;
}

uint32_t dt_crc32c_masked(const void *p, size_t n)
{
    uint32_t c = dt_crc32c(p, n);
    return ((c >> 15) | (c << 17)) + TB_CRC_MASK_DELTA;
}

/* ---- protobuf encoding --------------------------------------------------- */

/* An output cursor; `bad` is set once anything did not fit. */
struct enc {
    uint8_t *p;
    size_t len, cap;
    int bad;
};

static void put_bytes(struct enc *e, const void *v, size_t n)
{
    if (e->bad || n > e->cap - e->len) {
        e->bad = 1;
        return;
    }
    memcpy(e->p + e->len, v, n);
    e->len += n;
}

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static void put_varint(struct enc *e, uint64_t v)
{
    uint8_t b[10];
    size_t n = 0;
    while (v >= 0x80) {
        b[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    b[n++] = (uint8_t)v;
    put_bytes(e, b, n);
}

static void put_key(struct enc *e, unsigned field, unsigned wire)
{
    put_varint(e, (uint64_t)(field << 3 | wire));
}

static void put_le(struct enc *e, uint64_t v, int bytes)
{
    uint8_t b[8];
    for (int i = 0; i < bytes; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    put_bytes(e, b, (size_t)bytes);
}

static void put_double(struct enc *e, unsigned field, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_key(e, field, WT_FIXED64);
    put_le(e, bits, 8);
}

static void put_float(struct enc *e, unsigned field, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_key(e, field, WT_FIXED32);
    put_le(e, bits, 4);
}

static void put_string(struct enc *e, unsigned field, const char *s)
{
    size_t n = strlen(s);
    put_key(e, field, WT_BYTES);
    put_varint(e, n);
    put_bytes(e, s, n);
}

/* Bytes of one Summary.Value: tag (key, length, text) and simple_value
 * (key, 4 bytes). */
static size_t value_size(const char *tag)
{
    size_t n = strlen(tag);
    return 1 + varint_size(n) + n + 1 + 4;
}

size_t dt_tb_encode_event(double wall_time, const struct dt_tb_rec *rec, uint8_t *buf, size_t cap)
{
    struct enc e = {buf, 0, cap, 0};
    put_double(&e, 1, wall_time);
    if (!rec) {
        put_string(&e, 3, TB_FILE_VERSION);
        return e.bad ? 0 : e.len;
    }
    put_key(&e, 2, WT_VARINT);
    put_varint(&e, (uint64_t)rec->step);
    size_t summary = 0;
    for (int i = 0; i < rec->n; i++) {
        size_t v = value_size(rec->tags[i]);
        summary += 1 + varint_size(v) + v;
    }
    put_key(&e, 5, WT_BYTES);
    put_varint(&e, summary);
    for (int i = 0; i < rec->n; i++) {
        put_key(&e, 1, WT_BYTES);
        put_varint(&e, value_size(rec->tags[i]));
        put_string(&e, 1, rec->tags[i]);
        put_float(&e, 2, rec->values[i]);
    }
    return e.bad ? 0 : e.len;
}

/* ---- records and the file ------------------------------------------------ */

void dt_tb_begin(struct dt_tb_rec *rec, int64_t step)
{
    rec->step = step;
    rec->n = 0;
}

void dt_tb_add(struct dt_tb_rec *rec, const char *tag, double value)
{
    if (rec->n == DT_TB_MAX_VALUES)
        return;
    snprintf(rec->tags[rec->n], DT_TB_MAX_TAG, "%s", tag);
    rec->values[rec->n++] = (float)value;
}

static double wall_now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

/* One TFRecord around payload[0..n), flushed. */
static dt_status write_record(dt_tb_t *tb, const uint8_t *payload, size_t n)
{
    uint8_t head[12];
    struct enc e = {head, 0, sizeof head, 0};
    put_le(&e, (uint64_t)n, 8);
    put_le(&e, dt_crc32c_masked(head, 8), 4);
    uint8_t tail[4];
    struct enc t = {tail, 0, sizeof tail, 0};
    put_le(&t, dt_crc32c_masked(payload, n), 4);
    if (fwrite(head, 1, sizeof head, tb->fp) != sizeof head || fwrite(payload, 1, n, tb->fp) != n ||
        fwrite(tail, 1, sizeof tail, tb->fp) != sizeof tail || fflush(tb->fp) != 0)
        return dt_set_error(DT_ERR_IO, "cannot write TensorBoard event file '%s': %s", tb->path,
                            strerror(errno));
    return DT_OK;
}

static dt_status put_event(dt_tb_t *tb, const struct dt_tb_rec *rec)
{
    uint8_t buf[TB_EVENT_MAX];
    size_t n = dt_tb_encode_event(wall_now(), rec, buf, sizeof buf);
    if (n == 0)
        return dt_set_error(DT_ERR_INTERNAL, "a TensorBoard event does not fit in %d bytes",
                            TB_EVENT_MAX);
    return write_record(tb, buf, n);
}

/* The host name as it goes into the file name: no '/' or '.'-only parts. */
static void host_name(char *buf, size_t len)
{
    if (gethostname(buf, len) != 0 || !buf[0])
        snprintf(buf, len, "localhost");
    buf[len - 1] = '\0';
    for (char *p = buf; *p; p++)
        if (*p == '/')
            *p = '_';
}

dt_status dt_tb_open(const char *dir, dt_tb_t **out, char *path, size_t len)
{
    dt_status st = DT_OK;
    char host[TB_HOST_MAX];
    dt_tb_t *tb = calloc(1, sizeof *tb);
    *out = NULL;
    if (!tb)
        return dt_set_error(DT_ERR_NOMEM, "out of memory opening a TensorBoard event file");
    if (dir) {
        if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
            st = dt_set_error(DT_ERR_IO, "cannot create TensorBoard directory '%s': %s", dir,
                              strerror(errno));
            goto out;
        }
        host_name(host, sizeof host);
        snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%lld.%s.%ld", dir,
                 (long long)wall_now(), host, (long)getpid());
        DT_CHECK(dt_output_open(tb->path, "TensorBoard event file", 1, &tb->fp));
        DT_CHECK(put_event(tb, NULL));
        if (path)
            snprintf(path, len, "%s", tb->path);
    }
out:
    if (st != DT_OK) {
        dt_tb_close(tb);
        return st;
    }
    *out = tb;
    return DT_OK;
}

void dt_tb_close(dt_tb_t *tb)
{
    if (!tb)
        return;
    if (tb->fp)
        fclose(tb->fp);
    free(tb);
}

dt_status dt_tb_put(dt_tb_t *tb, const struct dt_tb_rec *rec)
{
    if (!tb || !tb->fp || rec->n == 0)
        return DT_OK;
    return put_event(tb, rec);
}
