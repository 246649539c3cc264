/*
 * test_hdf5_lock.c - CUnit suite for the HDF5 helpers every io/ source
 * uses (io/hdf5_lock.c): dt_h5_close closes a handle of each kind it is
 * given, whatever the kind, and does nothing for one never opened.
 *
 * Whether a handle was really closed is asked of HDF5 itself (H5Iis_valid
 * and the count of objects a file has open), so a kind the helper missed
 * shows up as a handle still open.
 */
#define _GNU_SOURCE
#include <hdf5.h>

#include "io_common.h"
#include "io/hdf5_lock.h"

/* One handle of every kind io/ opens, each closed by dt_h5_close. */
static void test_h5_close_every_kind(void)
{
    char p[4096];
    hsize_t n = 4;
    int v = 7;
    tpath(p, sizeof p, "close.h5");
    dt_h5_lock();
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    hid_t g = H5Gcreate2(f, "g", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t s = H5Screate_simple(1, &n, NULL);
    hid_t t = H5Tcopy(H5T_NATIVE_INT);
    hid_t d = H5Dcreate2(g, "d", t, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t as = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(d, "a", t, as, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(fapl >= 0 && f >= 0 && g >= 0 && s >= 0 && t >= 0 && d >= 0 && as >= 0 &&
                    a >= 0);
    CU_ASSERT(H5Awrite(a, H5T_NATIVE_INT, &v) >= 0);
    hid_t all[] = {a, as, d, t, s, g, fapl};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CU_ASSERT_EQUAL(dt_h5_close(all[i]), 0);
        CU_ASSERT(H5Iis_valid(all[i]) <= 0);
    }
    CU_ASSERT_EQUAL(H5Fget_obj_count(f, H5F_OBJ_ALL), 1); /* the file alone */
    CU_ASSERT_EQUAL(dt_h5_close(f), 0);
    CU_ASSERT(H5Iis_valid(f) <= 0);
    CU_ASSERT_EQUAL(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
    dt_h5_unlock();
}

/* A handle never opened is no error and closes nothing; one closed
 * already, or one HDF5 will not close (a predefined type), is -1. */
static void test_h5_close_invalid(void)
{
    char p[4096];
    tpath(p, sizeof p, "close-again.h5");
    dt_h5_lock();
    CU_ASSERT_EQUAL(dt_h5_close(-1), 0);
    CU_ASSERT_EQUAL(dt_h5_close(H5I_INVALID_HID), 0);
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CU_ASSERT_FATAL(f >= 0);
    CU_ASSERT_EQUAL(dt_h5_close(f), 0);
    CU_ASSERT_EQUAL(dt_h5_close(f), -1);
    CU_ASSERT_EQUAL(dt_h5_close(H5T_NATIVE_INT), -1);
    CU_ASSERT_EQUAL(H5Tget_size(H5T_NATIVE_INT), sizeof(int)); /* still usable */
    dt_h5_unlock();
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("io_hdf5_lock", io_suite_init, NULL);
    CU_ADD(s, test_h5_close_every_kind);
    CU_ADD(s, test_h5_close_invalid);
    return io_run_all();
}
