/*
 * test_monitor.c - the pieces of run monitoring that work without a run:
 * CRC-32C against published check values, the TFRecord framing and Event
 * encoding of TensorBoard files byte by byte, and NVML loading. NVML is
 * checked absent (no library, or a device it does not know: nothing
 * opens, nothing fails) and, when ctest points DT_TEST_FAKE_NVML at a
 * stand-in libnvidia-ml.so.1 (fake_nvml.c), through every sample call.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../runtime/nvml.h"
#include "../../runtime/tbevents.h"
#include "cu_util.h"

/* Check values of CRC-32C (RFC 3720, appendix B.4, and the "123456789"
 * check value of the Castagnoli polynomial). */
static void test_crc32c_vectors(void)
{
    uint8_t buf[32];
    CU_ASSERT_EQUAL(dt_crc32c("123456789", 9), 0xE3069283u);
    CU_ASSERT_EQUAL(dt_crc32c("", 0), 0u);
    memset(buf, 0, sizeof buf);
    CU_ASSERT_EQUAL(dt_crc32c(buf, sizeof buf), 0x8A9136AAu);
    memset(buf, 0xff, sizeof buf);
    CU_ASSERT_EQUAL(dt_crc32c(buf, sizeof buf), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    CU_ASSERT_EQUAL(dt_crc32c(buf, sizeof buf), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    CU_ASSERT_EQUAL(dt_crc32c(buf, sizeof buf), 0x113FDB5Cu);
}

static void test_crc32c_masked(void)
{
    uint32_t c = dt_crc32c("123456789", 9);
    uint32_t m = ((c >> 15) | (c << 17)) + 0xa282ead8u;
    CU_ASSERT_EQUAL(dt_crc32c_masked("123456789", 9), m);
}

/* The first event: wall_time (field 1, fixed64) and file_version
 * (field 3, bytes) "brain.Event:2". */
static void test_encode_file_version(void)
{
    uint8_t buf[64];
    double wt = 1234.5;
    size_t n = dt_tb_encode_event(wt, NULL, buf, sizeof buf);
    CU_ASSERT_EQUAL_FATAL(n, 1 + 8 + 2 + 13);
    CU_ASSERT_EQUAL(buf[0], 0x09);
    CU_ASSERT_EQUAL(memcmp(buf + 1, &wt, 8), 0); /* little-endian host */
    CU_ASSERT_EQUAL(buf[9], 0x1a);
    CU_ASSERT_EQUAL(buf[10], 13);
    CU_ASSERT_EQUAL(memcmp(buf + 11, "brain.Event:2", 13), 0);
    CU_ASSERT_EQUAL(dt_tb_encode_event(wt, NULL, buf, 10), 0); /* does not fit */
}

/* A scalar event: step 300 (varint ac 02), summary (field 5) holding one
 * value (field 1) of tag "a/b" (field 1) and simple_value 0.5 (field 2,
 * fixed32). */
static void test_encode_scalar(void)
{
    struct dt_tb_rec rec;
    uint8_t buf[128];
    dt_tb_begin(&rec, 300);
    dt_tb_add(&rec, "a/b", 0.5);
    size_t n = dt_tb_encode_event(0.0, &rec, buf, sizeof buf);
    static const uint8_t want[] = {0x10, 0xac, 0x02, 0x2a, 0x0c, 0x0a, 0x0a, 0x0a, 0x03,
                                   'a',  '/',  'b',  0x15, 0x00, 0x00, 0x00, 0x3f};
    CU_ASSERT_EQUAL_FATAL(n, 9 + sizeof want);
    CU_ASSERT_EQUAL(memcmp(buf + 9, want, sizeof want), 0);
}

static uint64_t le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* A file written through dt_tb_open/dt_tb_put holds two framed records
 * whose lengths and CRCs check. */
static void test_file_framing(void)
{
    char dir[512], path[1024];
    snprintf(dir, sizeof dir, "%s/tb-%ld", cu_tmpdir(), (long)getpid());
    dt_tb_t *tb = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_tb_open(dir, &tb, path, sizeof path), DT_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(path, "/events.out.tfevents."));
    struct dt_tb_rec rec;
    dt_tb_begin(&rec, 7);
    dt_tb_add(&rec, "train/loss", 1.25);
    dt_tb_add(&rec, "train/accuracy", 0.75);
    CU_ASSERT_EQUAL(dt_tb_put(tb, &rec), DT_OK);
    dt_tb_close(tb);

    uint8_t buf[4096];
    FILE *f = fopen(path, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t off = 0;
    int records = 0;
    while (off + 12 <= n) {
        uint64_t len = le(buf + off, 8);
        CU_ASSERT_EQUAL(le(buf + off + 8, 4), dt_crc32c_masked(buf + off, 8));
        CU_ASSERT_FATAL(off + 12 + len + 4 <= n);
        CU_ASSERT_EQUAL(le(buf + off + 12 + len, 4), dt_crc32c_masked(buf + off + 12, len));
        off += 12 + len + 4;
        records++;
    }
    CU_ASSERT_EQUAL(off, n);
    CU_ASSERT_EQUAL(records, 2);
    unlink(path);
    rmdir(dir);
}

static void test_open_failure_and_sink(void)
{
    dt_tb_t *tb = NULL;
    CU_ASSERT_EQUAL(dt_tb_open("/nonexistent-dir/sub/tensorboard", &tb, NULL, 0), DT_ERR_IO);
    CU_ASSERT_PTR_NULL(tb);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "TensorBoard directory"));
    CU_ASSERT_EQUAL_FATAL(dt_tb_open(NULL, &tb, NULL, 0), DT_OK);
    struct dt_tb_rec rec;
    dt_tb_begin(&rec, 1);
    dt_tb_add(&rec, "x", 1);
    CU_ASSERT_EQUAL(dt_tb_put(tb, &rec), DT_OK);
    dt_tb_close(tb);
}

/* Without the fake: no NVML for a made-up device, and no error. With the
 * fake (which knows only GPU-fake), every sample comes through. */
static void test_nvml(void)
{
    struct dt_nvml_sample s;
    int fake = getenv("DT_TEST_FAKE_NVML") != NULL;
    CU_ASSERT_PTR_NULL(dt_nvml_open(""));
    CU_ASSERT_PTR_NULL(dt_nvml_open(NULL));
    CU_ASSERT_PTR_NULL(dt_nvml_open("GPU-00000000-0000-0000-0000-000000000000"));
    CU_ASSERT_EQUAL(dt_nvml_sample(NULL, &s), 0);
    CU_ASSERT_FALSE(s.has_util || s.has_mem || s.has_power);
    dt_nvml_t *nv = dt_nvml_open("GPU-fake");
    if (!fake) {
        CU_ASSERT_PTR_NULL(nv);
        return;
    }
    CU_ASSERT_PTR_NOT_NULL_FATAL(nv);
    CU_ASSERT_EQUAL(dt_nvml_sample(nv, &s), 1);
    CU_ASSERT(s.has_util && s.has_mem && s.has_power);
    CU_ASSERT_DOUBLE_EQUAL(s.util, 0.42, 1e-12);
    CU_ASSERT_EQUAL(s.mem_used, 3ull << 30);
    CU_ASSERT_DOUBLE_EQUAL(s.power_w, 87.5, 1e-12);
    dt_nvml_close(nv);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("monitor", NULL, NULL);
    CU_ADD(s, test_crc32c_vectors);
    CU_ADD(s, test_crc32c_masked);
    CU_ADD(s, test_encode_file_version);
    CU_ADD(s, test_encode_scalar);
    CU_ADD(s, test_file_framing);
    CU_ADD(s, test_open_failure_and_sink);
    CU_ADD(s, test_nvml);
    return cu_run_all();
}
