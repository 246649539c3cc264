/*
 * test_monitor.c - the pieces of run monitoring that work without a run:
 * CRC-32C against published check values, the TFRecord framing and Event
 * encoding of TensorBoard files byte by byte, metrics.jsonl's whole
 * records (a write cut short, a half line left by a killed run), and NVML
 * loading. NVML is
 * checked absent (no library, or a device it does not know: nothing
 * opens, nothing fails) and, when ctest points DT_TEST_FAKE_NVML at a
 * stand-in libnvidia-ml.so.1 (fake_nvml.c), through every sample call.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "core/files.h"
#include "runtime/monitor/metrics.h"
#include "runtime/monitor/nvml.h"
#include "runtime/monitor/tbevents.h"
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

/* ---- metrics.jsonl ------------------------------------------------------ */

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
}

static dt_status put_record(dt_metrics_t *m, const char *type, int pad)
{
    char filler[256];
    struct dt_metrics_rec rec;
    memset(filler, 'x', sizeof filler);
    filler[pad < 255 ? pad : 255] = '\0';
    dt_metrics_begin(&rec, type);
    dt_metrics_str(&rec, "pad", filler);
    return dt_metrics_put(m, &rec);
}

/* A record that does not fit in what the disk has left (a file-size
 * limit here, which cuts the write short as a full disk does) is left out
 * whole: the file ends with its last complete line. */
static void test_metrics_whole_records(void)
{
    char path[4096];
    struct rlimit old, lim;
    dt_metrics_t *m = NULL;
    snprintf(path, sizeof path, "%s/whole.jsonl", cu_tmpdir());
    unlink(path);
    CU_ASSERT_EQUAL_FATAL(dt_metrics_open(path, &m), DT_OK);
    CU_ASSERT_EQUAL(put_record(m, "one", 10), DT_OK);
    struct stat sb;
    CU_ASSERT_EQUAL_FATAL(stat(path, &sb), 0);
    signal(SIGXFSZ, SIG_IGN);
    CU_ASSERT_EQUAL_FATAL(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = (rlim_t)sb.st_size + 40; /* room for part of the next record */
    CU_ASSERT_EQUAL_FATAL(setrlimit(RLIMIT_FSIZE, &lim), 0);
    dt_status st = put_record(m, "two", 100);
    setrlimit(RLIMIT_FSIZE, &old);
    CU_ASSERT_EQUAL(st, DT_ERR_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "whole.jsonl"));
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "left out whole"));
    CU_ASSERT_EQUAL(put_record(m, "three", 5), DT_OK);
    dt_metrics_close(m);
    const char *text = read_all(path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\"type\":\"one\""));
    CU_ASSERT_PTR_NULL(strstr(text, "\"type\":\"two\""));
    const char *three = strstr(text, "{\"time\"");
    CU_ASSERT_PTR_NOT_NULL_FATAL(three);
    three = strstr(three + 1, "{\"time\"");
    CU_ASSERT_PTR_NOT_NULL_FATAL(three);
    CU_ASSERT_EQUAL(three[-1], '\n'); /* the next record starts a line of its own */
    CU_ASSERT_PTR_NOT_NULL(strstr(three, "\"type\":\"three\""));
}

/* A file that ends in half a record (a run killed inside the write) loses
 * that half when it is opened again; a log keeps its half line and gets
 * the newline. */
static void test_metrics_repairs_tail(void)
{
    char path[4096];
    dt_metrics_t *m = NULL;
    int64_t partial = -1;
    snprintf(path, sizeof path, "%s/tail.jsonl", cu_tmpdir());
    write_file(path, "{\"time\":1,\"type\":\"start\"}\n{\"time\":2,\"type\":\"tr");
    CU_ASSERT_EQUAL_FATAL(dt_metrics_open(path, &m), DT_OK);
    CU_ASSERT_EQUAL(put_record(m, "next", 1), DT_OK);
    dt_metrics_close(m);
    const char *text = read_all(path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT_EQUAL(strncmp(text, "{\"time\":1,\"type\":\"start\"}\n{\"time\":", 34), 0);
    CU_ASSERT_PTR_NULL(strstr(text, "\"tr\""));
    CU_ASSERT_PTR_NULL(strstr(text, "\"type\":\"tr{"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\"type\":\"next\""));
    /* a file of one half line only, longer than a read chunk */
    static char big[10000];
    memset(big, 'y', sizeof big - 1);
    write_file(path, big);
    FILE *f = NULL;
    CU_ASSERT_EQUAL_FATAL(dt_output_open(path, "metrics file", 1, &f), DT_OK);
    CU_ASSERT_EQUAL(dt_output_end_line(f, path, "metrics file", 1, &partial), DT_OK);
    CU_ASSERT_EQUAL(partial, (int64_t)sizeof big - 1);
    fclose(f);
    struct stat sb;
    CU_ASSERT(stat(path, &sb) == 0 && sb.st_size == 0);
    /* the log: kept, ended */
    write_file(path, "line one\nhalf a li");
    CU_ASSERT_EQUAL_FATAL(dt_output_open(path, "log", 1, &f), DT_OK);
    CU_ASSERT_EQUAL(dt_output_end_line(f, path, "log", 0, &partial), DT_OK);
    CU_ASSERT_EQUAL(partial, 1);
    fputs("next\n", f);
    fclose(f);
    CU_ASSERT_STRING_EQUAL(read_all(path), "line one\nhalf a li\nnext\n");
    /* nothing to do for a whole file */
    CU_ASSERT_EQUAL_FATAL(dt_output_open(path, "log", 1, &f), DT_OK);
    CU_ASSERT_EQUAL(dt_output_end_line(f, path, "log", 1, &partial), DT_OK);
    CU_ASSERT_EQUAL(partial, 0);
    fclose(f);
}

/* A log file that cannot be written (a full disk: /dev/full) is said once
 * on stderr, not passed over in silence. */
static void test_log_file_full(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/stderr.txt", cu_tmpdir());
    FILE *full = fopen("/dev/full", "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(full);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    FILE *cap = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(cap);
    dup2(fileno(cap), STDERR_FILENO);
    dt_log_set_file(full);
    DT_LOG_WARN("test", "first line");
    DT_LOG_WARN("test", "second line");
    dt_log_set_file(NULL);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    fclose(cap);
    fclose(full);
    const char *text = read_all(path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    const char *w = strstr(text, "cannot write the log file: No space left on device");
    CU_ASSERT_PTR_NOT_NULL(w);
    CU_ASSERT(w && !strstr(w + 1, "cannot write the log file")); /* once */
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "second line"));
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
    CU_ADD(s, test_metrics_whole_records);
    CU_ADD(s, test_metrics_repairs_tail);
    CU_ADD(s, test_log_file_full);
    return cu_run_all();
}
