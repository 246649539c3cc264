/*
 * test_model_file.c - CUnit suite for model files (io/model_file.c): a
 * round trip, a save that meets a file-size limit or a full disk, damaged
 * files.
 *
 * Every file a test needs is made here or by io_common.c, in the
 * suite's private directory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <hdf5.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_common.h"
#include "io/dataset.h"
#include "io/model_file.h"
#include "core/status.h"

/* ---- model files ------------------------------------------------------------- */

/* Whole file into a malloc'd buffer (NULL when unreadable). */
static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    *len = buf && fread(buf, 1, (size_t)n, f) == (size_t)n ? (size_t)n : 0;
    fclose(f);
    return buf;
}

static void test_model_round_trip(void)
{
    char dir[4096], p[4200];
    float w[6] = {1, -2, 3.5f, 4, 5, 6}, b[3] = {0.25f, 0, -1};
    struct dt_named_tensor t[2] = {{"fc1.weight", {2, {2, 3}}, w}, {"fc1.bias", {1, {3}}, b}};
    tpath(dir, sizeof dir, "model-rt");
    mkdir(dir, 0777);
    snprintf(p, sizeof p, "%s/model.h5", dir);
    ASSERT_STATUS(dt_model_file_save(p, t, 2), DT_OK);
    CU_ASSERT_EQUAL(dir_entries(dir), 1); /* no temporary file left */
    struct dt_named_tensor *got = NULL;
    int n = 0;
    ASSERT_STATUS(dt_model_file_load(p, &got, &n), DT_OK);
    CU_ASSERT_EQUAL_FATAL(n, 2);
    CU_ASSERT_STRING_EQUAL(got[0].name, "fc1.bias"); /* name order */
    CU_ASSERT(got[0].shape.ndim == 1 && got[0].shape.dim[0] == 3 &&
              !memcmp(got[0].data, b, sizeof b));
    CU_ASSERT(got[1].shape.ndim == 2 && got[1].shape.dim[0] == 2 && got[1].shape.dim[1] == 3 &&
              !memcmp(got[1].data, w, sizeof w));
    dt_model_file_free(got, n);
}

/* Saves a 4 MiB model into dir where a small model.h5 already is, with the
 * file size limited to 256 KiB when fsize (else in whatever room dir has):
 * the save fails with the system's reason and the free space, and the old
 * model.h5 is untouched, with no temporary file beside it. */
static void failing_model_save(const char *dir, int fsize, const char *reason)
{
    enum { BIG = 1 << 20 };
    char p[4200];
    float small[4] = {1, 2, 3, 4};
    struct dt_named_tensor t = {"fc1.weight", {1, {4}}, small};
    snprintf(p, sizeof p, "%s/model.h5", dir);
    ASSERT_STATUS(dt_model_file_save(p, &t, 1), DT_OK);
    size_t before_len = 0, after_len = 0;
    char *before = read_all(p, &before_len);
    float *big = calloc(BIG, sizeof *big);
    CU_ASSERT_FATAL(before && big);
    for (size_t i = 0; i < BIG; i++)
        big[i] = (float)i;
    struct dt_named_tensor bt = {"fc1.weight", {2, {1024, 1024}}, big};
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 256 * 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CU_ASSERT(!fsize || setrlimit(RLIMIT_FSIZE, &lim) == 0);
    dt_clear_error();
    dt_status st = dt_model_file_save(p, &bt, 1);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    ASSERT_STATUS(st, DT_ERR_IO);
    ASSERT_MSG(p);
    ASSERT_MSG(reason);
    ASSERT_MSG("free on its file system");
    char *after = read_all(p, &after_len);
    CU_ASSERT(after && after_len == before_len && !memcmp(after, before, before_len));
    CU_ASSERT_EQUAL(dir_entries(dir), 1);
    free(after);
    free(before);
    free(big);
}

static void test_model_save_file_size_limit(void)
{
    char dir[4096];
    tpath(dir, sizeof dir, "model-efbig");
    mkdir(dir, 0777);
    failing_model_save(dir, 1, "File too large (the file-size limit, ulimit -f, is 256 KiB)");
}

/* A real full disk (a 1 MiB tmpfs); needs the right to mount. */
static void test_model_save_disk_full(void)
{
    char dir[4096];
    tpath(dir, sizeof dir, "model-enospc");
    mkdir(dir, 0777);
    if (mount("dtrain-test", dir, "tmpfs", 0, "size=1m,mode=0755") != 0) {
        printf("SKIPPED (cannot mount a small tmpfs: %s) ", strerror(errno));
        return;
    }
    failing_model_save(dir, 0, "cannot reserve 4.00 MiB for it: No space left on device");
    CU_ASSERT_EQUAL(umount2(dir, MNT_DETACH), 0);
}

/* Model files that are not what they claim: each is refused with a clear
 * status before anything is allocated from what it declares. */
static void test_model_bad_files(void)
{
    char dir[4096], p[4200];
    struct dt_named_tensor *got = NULL;
    int n = 0;
    tpath(dir, sizeof dir, "model-bad");
    mkdir(dir, 0777);
    ASSERT_STATUS(dt_model_file_load(dir, &got, &n), DT_ERR_NOT_FOUND);
    ASSERT_MSG("not a regular file");
    snprintf(p, sizeof p, "%s/fifo.h5", dir);
    CU_ASSERT_EQUAL_FATAL(mkfifo(p, 0600), 0);
    alarm(60); /* a blocking open would hang: fail loudly instead */
    ASSERT_STATUS(dt_model_file_load(p, &got, &n), DT_ERR_NOT_FOUND);
    alarm(0);
    ASSERT_MSG("FIFO");
    snprintf(p, sizeof p, "%s/text.h5", dir);
    FILE *fp = fopen(p, "w");
    fputs("not HDF5\n", fp);
    fclose(fp);
    ASSERT_STATUS(dt_model_file_load(p, &got, &n), DT_ERR_BAD_DATA);
    ASSERT_MSG("is damaged or is not an HDF5 file");

    /* a tensor declaring 2^60 floats it never wrote, a name longer than a
     * tensor's name buffer, a link */
    float w[2] = {1, 2};
    struct dt_named_tensor t = {"w", {1, {2}}, w};
    const char *edits[] = {"huge", "long", "link"};
    for (int k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s/%s.h5", dir, edits[k]);
        ASSERT_STATUS(dt_model_file_save(p, &t, 1), DT_OK);
        hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
        CU_ASSERT_FATAL(f >= 0);
        if (k == 0) {
            hsize_t dims[2] = {(hsize_t)1 << 40, (hsize_t)1 << 20};
            hid_t sp = H5Screate_simple(2, dims, NULL);
            hid_t d = H5Dcreate2(f, "params/huge", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT,
                                 H5P_DEFAULT);
            CU_ASSERT(d >= 0);
            H5Dclose(d);
            H5Sclose(sp);
        } else if (k == 1) {
            char name[7 + 100] = "params/";
            memset(name + 7, 'a', 99);
            name[106] = '\0';
            CU_ASSERT(H5Lcreate_hard(f, "params/w", f, name, H5P_DEFAULT, H5P_DEFAULT) >= 0);
        } else {
            CU_ASSERT(H5Lcreate_soft("/params/w", f, "params/v", H5P_DEFAULT, H5P_DEFAULT) >= 0);
        }
        H5Fclose(f);
        got = NULL;
        ASSERT_STATUS(dt_model_file_load(p, &got, &n), DT_ERR_BAD_DATA);
        CU_ASSERT(got == NULL);
        ASSERT_MSG(p);
        ASSERT_MSG(k == 0   ? "/params/huge declares"
                   : k == 1 ? "is longer than 63"
                            : "/params/v is a link");
    }
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("io_model", io_suite_init, NULL);
    CU_ADD(s, test_model_round_trip);
    CU_ADD(s, test_model_save_file_size_limit);
    CU_ADD(s, test_model_save_disk_full);
    CU_ADD(s, test_model_bad_files);
    return io_run_all();
}
