/*
 * h5probe.c - the HDF5 checks of `dtrain doctor`.
 *
 * The probe file is what a checkpoint needs from a file system, in small:
 * HDF5 creates it through the same driver (MPI-IO when HDF5 is parallel),
 * writes one dataset, closes it, and a fresh open with the default driver
 * reads it back. Values derive from a token so that a stale file of an
 * earlier run, or another rank's, does not pass for this one.
 */
#include "h5probe.h"

#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

#include "hdf5_lock.h"

#define PROBE_VALUES 1024
#define PROBE_DATASET "dtrain_doctor_probe"

void dt_h5_library_version(char *buf, size_t len, int *parallel)
{
    unsigned major = 0, minor = 0, rel = 0;
    dt_h5_lock();
    herr_t e = H5get_libversion(&major, &minor, &rel);
    dt_h5_unlock();
    if (e < 0)
        snprintf(buf, len, "HDF5 (version not known; built with %d.%d.%d)", H5_VERS_MAJOR,
                 H5_VERS_MINOR, H5_VERS_RELEASE);
    else if (major != H5_VERS_MAJOR || minor != H5_VERS_MINOR || rel != H5_VERS_RELEASE)
        snprintf(buf, len, "HDF5 %u.%u.%u (built with %d.%d.%d)", major, minor, rel, H5_VERS_MAJOR,
                 H5_VERS_MINOR, H5_VERS_RELEASE);
    else
        snprintf(buf, len, "HDF5 %u.%u.%u", major, minor, rel);
#ifdef H5_HAVE_PARALLEL
    *parallel = 1;
#else
    *parallel = 0;
#endif
}

static void pattern(uint64_t token, int64_t *v)
{
    for (int i = 0; i < PROBE_VALUES; i++)
        v[i] = (int64_t)((token ^ 0x9e3779b97f4a7c15ull) + (uint64_t)i * 2654435761u);
}

static hid_t create_fapl(void)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
#ifdef H5_HAVE_PARALLEL
    if (fapl >= 0 && H5Pset_fapl_mpio(fapl, MPI_COMM_SELF, MPI_INFO_NULL) < 0) {
        H5Pclose(fapl);
        return -1;
    }
#endif
    return fapl;
}

static dt_status write_locked(const char *path, const int64_t *v)
{
    hsize_t dims[1] = {PROBE_VALUES};
    hid_t fapl = -1, f = -1, sp = -1, d = -1;
    dt_status st = DT_OK;
    fapl = create_fapl();
    f = fapl < 0 ? -1 : H5Fcreate(path, H5F_ACC_EXCL, H5P_DEFAULT, fapl);
    if (f < 0) {
        st = dt_h5_write_error("HDF5 test file", path, path, "create it");
        goto out;
    }
    sp = H5Screate_simple(1, dims, NULL);
    d = sp < 0 ? -1
               : H5Dcreate2(f, PROBE_DATASET, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT,
                            H5P_DEFAULT);
    if (d < 0 || H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) {
        st = dt_h5_write_error("HDF5 test file", path, path, "write it");
        goto out;
    }
out:
    dt_h5_close(d);
    dt_h5_close(sp);
    if (dt_h5_close(f) < 0 && st == DT_OK)
        st = dt_h5_write_error("HDF5 test file", path, path, "close it");
    dt_h5_close(fapl);
    return st;
}

dt_status dt_h5_probe_write(const char *path, uint64_t token)
{
    int64_t v[PROBE_VALUES];
    pattern(token, v);
    dt_h5_lock();
    dt_status st = write_locked(path, v);
    dt_h5_unlock();
    if (st != DT_OK)
        unlink(path);
    return st;
}

static dt_status read_locked(const char *path, int64_t *got)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), d = -1;
    dt_status st = DT_OK;
    if (f < 0) {
        st = dt_h5_open_error("HDF5 test file", path, " cannot be read back");
        goto out;
    }
    d = H5Dopen2(f, PROBE_DATASET, H5P_DEFAULT);
    if (d < 0 || H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, got) < 0)
        st = dt_h5_error(DT_ERR_IO, "HDF5 test file %s: its dataset cannot be read back", path);
out:
    dt_h5_close(d);
    dt_h5_close(f);
    return st;
}

dt_status dt_h5_probe_read(const char *path, uint64_t token)
{
    int64_t want[PROBE_VALUES], got[PROBE_VALUES];
    pattern(token, want);
    dt_h5_lock();
    dt_status st = read_locked(path, got);
    dt_h5_unlock();
    if (st != DT_OK)
        return st;
    for (int i = 0; i < PROBE_VALUES; i++)
        if (got[i] != want[i])
            return dt_set_error(DT_ERR_BAD_DATA,
                                "HDF5 test file %s: value %d read back as %lld, written as %lld: "
                                "the file system returned other data than was written",
                                path, i, (long long)got[i], (long long)want[i]);
    return DT_OK;
}
