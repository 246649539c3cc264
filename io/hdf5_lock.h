/*
 * hdf5_lock.h - internal to io/: the one process-wide lock around HDF5 and
 * the conversion of HDF5 failures into dt_status.
 *
 * Debian's parallel HDF5 is built without thread safety, so every HDF5 call
 * made by io/ (dataset reads from loader threads, imports, checkpoints)
 * happens with this lock held. The first lock also switches off HDF5's
 * automatic printing of its error stack: failures are reported through
 * dt_set_error instead, with HDF5's own innermost message appended.
 * Not a public header: nothing outside io/ includes it.
 */
#ifndef DT_IO_HDF5_LOCK_H
#define DT_IO_HDF5_LOCK_H

#include <stddef.h>

#include "../runtime/status.h"

/* Takes / releases the HDF5 lock. Not recursive: never lock twice. */
void dt_h5_lock(void);
void dt_h5_unlock(void);

/* Copies the description of the innermost entry of HDF5's current error
 * stack (where the error was detected, e.g. "file signature not found")
 * into buf, or "" when the stack is empty. Call with the lock held, right
 * after the failing call: the next HDF5 API call clears the stack. */
void dt_h5_error_text(char *buf, size_t len);

/* dt_set_error(st, fmt, ...) with " (HDF5: <innermost message>)" appended
 * when HDF5 has one. Lock held. Returns st. */
dt_status dt_h5_error(dt_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
