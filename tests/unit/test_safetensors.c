/*
 * test_safetensors.c - io/safetensors.h: a round trip of tensors of 0 to 4
 * dimensions (an empty one among them) with metadata; F16, BF16 and F64
 * files written byte by byte read back to the floats they hold; every
 * refusal of the reader (a header length past the file, not JSON, not an
 * object, a missing or wrong field, unknown and unsupported dtypes, a
 * negative dimension, offsets that lie about the shape's bytes, overlap,
 * a gap, data past the last tensor, duplicate names, a name too long) as
 * DT_ERR_BAD_DATA naming the file and what was expected; the writer's
 * refusals (a non-UTF-8 name or metadata, a size past 64 bits); a FIFO
 * refused without blocking; a hundred metadata pairs kept; a failed write that leaves the earlier file as it was.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "io_common.h"
#include "io/safetensors.h"

/* Writes a safetensors file: header (padded to 8) and data as given. */
static void write_raw(const char *path, const char *header, const void *data, size_t n)
{
    size_t h = strlen(header), pad = (8 - h % 8) % 8;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)(h + pad) >> (8 * i));
    FILE *fp = fopen(path, "wb");
    CU_ASSERT_FATAL(fp != NULL);
    fwrite(len8, 1, 8, fp);
    fwrite(header, 1, h, fp);
    for (size_t i = 0; i < pad; i++)
        fputc(' ', fp);
    if (n)
        fwrite(data, 1, n, fp);
    fclose(fp);
}

static void test_round_trip(void)
{
    char p[512];
    tpath(p, sizeof p, "rt.safetensors");
    float a[6] = {1, -2, 3.5f, 4, 5, 6}, s[1] = {7}, c[24];
    for (int i = 0; i < 24; i++)
        c[i] = (float)i / 3.0f;
    struct dt_st_out t[] = {
        {.name = "a.weight", .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "scalar", .ndim = 0, .data = s},
        {.name = "conv", .ndim = 4, .shape = {2, 3, 2, 2}, .data = c},
        {.name = "empty", .ndim = 2, .shape = {0, 5}, .data = NULL},
    };
    const char *meta[] = {"producer", "dtrain"};
    ASSERT_STATUS(dt_safetensors_save(p, t, 4, meta, 1), DT_OK);
    dt_safetensors_t *f = NULL;
    ASSERT_STATUS(dt_safetensors_open(p, &f), DT_OK);
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_EQUAL(dt_safetensors_count(f), 4);
    CU_ASSERT_STRING_EQUAL(dt_safetensors_meta(f, "producer"), "dtrain");
    CU_ASSERT_STRING_EQUAL(dt_safetensors_meta(f, "format"), "pt");
    float got[24];
    const struct dt_st_tensor *x = dt_safetensors_find(f, "conv");
    CU_ASSERT_FATAL(x != NULL);
    CU_ASSERT_EQUAL(x->ndim, 4);
    CU_ASSERT_EQUAL(dt_st_numel(x), 24);
    ASSERT_STATUS(dt_safetensors_read(f, x, got), DT_OK);
    CU_ASSERT(memcmp(got, c, sizeof c) == 0);
    x = dt_safetensors_find(f, "a.weight");
    ASSERT_STATUS(dt_safetensors_read(f, x, got), DT_OK);
    CU_ASSERT(memcmp(got, a, sizeof a) == 0 && x->shape[0] == 2 && x->shape[1] == 3);
    x = dt_safetensors_find(f, "scalar");
    CU_ASSERT(x && x->ndim == 0 && dt_st_numel(x) == 1);
    ASSERT_STATUS(dt_safetensors_read(f, x, got), DT_OK);
    CU_ASSERT_EQUAL(got[0], 7.0f);
    x = dt_safetensors_find(f, "empty");
    CU_ASSERT(x && dt_st_numel(x) == 0 && x->begin == x->end);
    CU_ASSERT(dt_safetensors_find(f, "nope") == NULL);
    dt_safetensors_close(f);
    /* the file's size: 8 + a header padded to 8 + the data */
    struct stat sb;
    CU_ASSERT(stat(p, &sb) == 0 && (sb.st_size - 8 - (6 + 1 + 24) * 4) % 8 == 0);
}

static void test_dtypes(void)
{
    char p[512];
    tpath(p, sizeof p, "dt.safetensors");
    /* F16 1.0, -2.0, 65504, the smallest subnormal 2^-24; BF16 1.0, -0.5;
     * F64 0.1 */
    unsigned char d[8 + 4 + 8] = {0x00, 0x3c, 0x00, 0xc0, 0xff, 0x7b, 0x01, 0x00,
                                  0x80, 0x3f, 0x00, 0xbf};
    double tenth = 0.1;
    memcpy(d + 12, &tenth, 8);
    write_raw(p,
              "{\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]},"
              "\"d\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[12,20]}}",
              d, sizeof d);
    dt_safetensors_t *f = NULL;
    ASSERT_STATUS(dt_safetensors_open(p, &f), DT_OK);
    CU_ASSERT_FATAL(f != NULL);
    float v[4];
    ASSERT_STATUS(dt_safetensors_read(f, dt_safetensors_find(f, "h"), v), DT_OK);
    CU_ASSERT(v[0] == 1.0f && v[1] == -2.0f && v[2] == 65504.0f && v[3] == 0x1p-24f);
    ASSERT_STATUS(dt_safetensors_read(f, dt_safetensors_find(f, "b"), v), DT_OK);
    CU_ASSERT(v[0] == 1.0f && v[1] == -0.5f);
    ASSERT_STATUS(dt_safetensors_read(f, dt_safetensors_find(f, "d"), v), DT_OK);
    CU_ASSERT_EQUAL(v[0], 0.1f);
    CU_ASSERT_STRING_EQUAL(dt_st_dtype_name(dt_safetensors_find(f, "b")->dtype), "BF16");
    dt_safetensors_close(f);
}

/* A file of this header and n bytes of data is refused with `want` in the
 * message (and the file's name). */
static void refused(const char *header, size_t n, const char *want)
{
    char p[512];
    static unsigned char zeros[64];
    tpath(p, sizeof p, "bad.safetensors");
    write_raw(p, header, zeros, n);
    dt_safetensors_t *f = (dt_safetensors_t *)1;
    ASSERT_STATUS(dt_safetensors_open(p, &f), DT_ERR_BAD_DATA);
    CU_ASSERT(f == NULL);
    ASSERT_MSG(p);
    ASSERT_MSG(want);
}

#define T1(extra) "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}" extra "}"

static void test_refused(void)
{
    refused("[1, 2]", 0, "not a JSON object");
    refused("{\"w\": ", 0, "not valid JSON");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "needs \"dtype\"");
    refused("{\"w\":{\"dtype\":\"F99\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
            "unknown dtype 'F99'");
    refused("{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
            "dtype I64, which dtrain cannot take");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
            "not a whole number >= 0");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
            "data_offsets [0, 8) hold 8 bytes, but F32 of shape [3] is 12 bytes");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
            "begin <= end");
    refused(T1(",\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}"), 12,
            "overlaps the tensor before it");
    refused(T1(",\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}"), 16,
            "leaving a gap");
    refused(T1(""), 12, "ends at byte 8 of the data, but the file holds 12 bytes");
    refused(T1(""), 4, "ends at byte 8 of the data, but the file holds 4 bytes");
    refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
            "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
            8, "not valid JSON");
    refused("{\"__metadata__\":{\"a\":1}}", 0, "__metadata__ value is not a string");
    char longname[400] = "{\"";
    memset(longname + 2, 'n', 300);
    strcpy(longname + 302, "\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}");
    refused(longname, 4, "a tensor name of 300 bytes");

    /* a header length past the end of the file */
    char p[512];
    tpath(p, sizeof p, "lies.safetensors");
    unsigned char b[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    FILE *fp = fopen(p, "wb");
    fwrite(b, 1, 10, fp);
    fclose(fp);
    dt_safetensors_t *f = NULL;
    ASSERT_STATUS(dt_safetensors_open(p, &f), DT_ERR_BAD_DATA);
    ASSERT_MSG("header length is 65535 bytes, but the file holds 2 after it");
    tpath(p, sizeof p, "absent.safetensors");
    ASSERT_STATUS(dt_safetensors_open(p, &f), DT_ERR_NOT_FOUND);
    ASSERT_MSG(p);
    /* a FIFO is refused at once (nothing writes to it: a blocking open
     * would hang here) */
    tpath(p, sizeof p, "fifo.safetensors");
    unlink(p);
    CU_ASSERT_FATAL(mkfifo(p, 0600) == 0);
    CU_ASSERT(dt_safetensors_open(p, &f) != DT_OK && f == NULL);
    ASSERT_MSG(p);
    unlink(p);
}

/* Every metadata pair is kept, however many there are. */
static void test_many_metadata(void)
{
    char p[512], kv[200][24];
    const char *meta[200];
    float x[1] = {3};
    for (int i = 0; i < 100; i++) {
        snprintf(kv[2 * i], sizeof kv[0], "key%d", i);
        snprintf(kv[2 * i + 1], sizeof kv[0], "value%d", i);
        meta[2 * i] = kv[2 * i];
        meta[2 * i + 1] = kv[2 * i + 1];
    }
    tpath(p, sizeof p, "meta.safetensors");
    struct dt_st_out one[] = {{.name = "a", .ndim = 1, .shape = {1}, .data = x}};
    ASSERT_STATUS(dt_safetensors_save(p, one, 1, meta, 100), DT_OK);
    dt_safetensors_t *f = NULL;
    ASSERT_STATUS(dt_safetensors_open(p, &f), DT_OK);
    CU_ASSERT_FATAL(f != NULL);
    int kept = 0;
    for (int i = 0; i < 100; i++) {
        const char *v = dt_safetensors_meta(f, kv[2 * i]);
        kept += v && !strcmp(v, kv[2 * i + 1]);
    }
    CU_ASSERT_EQUAL(kept, 100);
    CU_ASSERT(dt_safetensors_meta(f, "key100") == NULL);
    dt_safetensors_close(f);
}

static void test_writer_refusals(void)
{
    char p[512], dir[512];
    float x[2] = {1, 2};
    tpath(p, sizeof p, "w.safetensors");
    struct dt_st_out dup[] = {{.name = "a", .ndim = 1, .shape = {2}, .data = x},
                              {.name = "a", .ndim = 1, .shape = {2}, .data = x}};
    ASSERT_STATUS(dt_safetensors_save(p, dup, 2, NULL, 0), DT_ERR_INVALID_ARG);
    struct dt_st_out neg[] = {{.name = "a", .ndim = 1, .shape = {-1}, .data = x}};
    ASSERT_STATUS(dt_safetensors_save(p, neg, 1, NULL, 0), DT_ERR_INVALID_ARG);
    struct dt_st_out noname[] = {{.name = "", .ndim = 1, .shape = {2}, .data = x}};
    ASSERT_STATUS(dt_safetensors_save(p, noname, 1, NULL, 0), DT_ERR_INVALID_ARG);
    struct dt_st_out latin1[] = {{.name = "caf\xe9", .ndim = 1, .shape = {2}, .data = x}};
    ASSERT_STATUS(dt_safetensors_save(p, latin1, 1, NULL, 0), DT_ERR_INVALID_ARG);
    ASSERT_MSG("not UTF-8");
    struct dt_st_out ok[] = {{.name = "a", .ndim = 1, .shape = {2}, .data = x}};
    const char *badmeta[] = {"k", "caf\xe9"};
    ASSERT_STATUS(dt_safetensors_save(p, ok, 1, badmeta, 1), DT_ERR_INVALID_ARG);
    ASSERT_MSG("not two UTF-8 strings");
    struct dt_st_out huge[] = {
        {.name = "a", .ndim = 3, .shape = {1LL << 40, 1LL << 20, 1LL << 10}, .data = x}};
    ASSERT_STATUS(dt_safetensors_save(p, huge, 1, NULL, 0), DT_ERR_INVALID_ARG);
    CU_ASSERT(access(p, F_OK) != 0);
    /* a good file, then a write into a directory that is gone: the file stays */
    struct dt_st_out one[] = {{.name = "a", .ndim = 1, .shape = {2}, .data = x}};
    ASSERT_STATUS(dt_safetensors_save(p, one, 1, NULL, 0), DT_OK);
    tpath(dir, sizeof dir, "gone/w.safetensors");
    ASSERT_STATUS(dt_safetensors_save(dir, one, 1, NULL, 0), DT_ERR_IO);
    ASSERT_MSG("gone");
    float y[2] = {9, 9};
    struct dt_st_out bad[] = {{.name = "b", .ndim = 1, .shape = {2}, .data = y},
                              {.name = "b", .ndim = 1, .shape = {2}, .data = y}};
    ASSERT_STATUS(dt_safetensors_save(p, bad, 2, NULL, 0), DT_ERR_INVALID_ARG);
    dt_safetensors_t *f = NULL;
    ASSERT_STATUS(dt_safetensors_open(p, &f), DT_OK);
    CU_ASSERT(f && dt_safetensors_find(f, "a") != NULL);
    dt_safetensors_close(f);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("io_safetensors", io_suite_init, NULL);
    CU_ADD(s, test_round_trip);
    CU_ADD(s, test_dtypes);
    CU_ADD(s, test_refused);
    CU_ADD(s, test_writer_refusals);
    CU_ADD(s, test_many_metadata);
    return io_run_all();
}
