/*
 * h5probe.h - HDF5 as `dtrain doctor` checks it: the library's version and
 * whether it is parallel, and a small file written and read back in a
 * directory, to learn whether dtrain's checkpoints could be written there.
 */
#ifndef DT_IO_H5PROBE_H
#define DT_IO_H5PROBE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* "HDF5 1.14.0" as the loaded library reports it (and the headers' version
 * when they differ); *parallel = 1 when this HDF5 has MPI-IO (needed for
 * checkpoints written by all ranks together). */
void dt_h5_library_version(char *buf, size_t len, int *parallel);

/* Creates the HDF5 file `path` (it must not exist) and writes a small
 * dataset whose values derive from `token`, through the MPI-IO driver on
 * this process alone when HDF5 is parallel (the driver checkpoints use;
 * MPI must then be initialised), else through the default one. DT_ERR_IO
 * naming the file and the reason; a partly written file is removed. */
dt_status dt_h5_probe_write(const char *path, uint64_t token);

/* Opens `path` read-only and checks that it holds what
 * dt_h5_probe_write(path, token) wrote: DT_ERR_IO when it cannot be read,
 * DT_ERR_BAD_DATA when its values differ. */
dt_status dt_h5_probe_read(const char *path, uint64_t token);

#endif
