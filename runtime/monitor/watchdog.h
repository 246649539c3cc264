/*
 * watchdog.h - a thread per rank that ends the rank when one phase of the
 * work (a step, a collective, an evaluation) runs far past
 * runtime.timeout_s: the backstop for hangs no communicator can see.
 *
 * Who acts on a hang, by design:
 *   1. A rank waiting in a collective gives up first: the communicator's
 *      wait is bounded by runtime.timeout_s (dt_comm_set_timeout), fails
 *      with DT_ERR_TIMEOUT naming the collective, and the launcher's error
 *      path aborts the job (MPI_Abort from the main thread), so every
 *      other rank is ended at once by the MPI runtime rather than at its
 *      own deadline.
 *   2. The watchdog fires later, at runtime.timeout_s plus a grace of
 *      max(DT_WATCHDOG_GRACE_MIN_S, DT_WATCHDOG_GRACE_SHARE of it), for a
 *      hang the communicator cannot see: a kernel, I/O, a blocking library
 *      call, a rank stuck outside any collective (its peers, waiting for
 *      it in a collective, normally act first under 1). It prints which
 *      rank, step and phase hung and ends the job with exit 75: through
 *      dt_comm_abort when the communicator may be aborted from another
 *      thread (MPI_THREAD_MULTIPLE), else with _exit(75), and the MPI
 *      launcher (mpirun, srun) then ends the other ranks because one
 *      exited with a failure.
 * Exit 75 (restartable) either way, so `dtrain launch` or a Slurm requeue
 * restarts the job from its last checkpoint. The rank that acted (1 or 2)
 * first appends one line to the note DT_WATCHDOG_NOTE in the run
 * directory; the next run there logs the note and removes it, so a
 * restart says why the previous attempt ended even when that attempt could
 * not write its own log (a watchdog ends the process at once). The
 * training loop marks phases; marking is two atomic stores.
 */
#ifndef DT_WATCHDOG_H
#define DT_WATCHDOG_H

#include <stdint.h>

#include "core/status.h"
#include "collectives/comm.h"

#define DT_WATCHDOG_GRACE_MIN_S 10.0
#define DT_WATCHDOG_GRACE_SHARE 0.1
#define DT_WATCHDOG_EXIT 75

#define DT_WATCHDOG_NOTE "hang.txt"

struct dt_watchdog;

/* Appends "<UTC time> rank R: <what>\n" to the note at `path` in one
 * write (several ranks may act at once). Best effort: a note that cannot
 * be written is skipped, as the process is ending anyway. Safe from any
 * thread. */
void dt_watchdog_note(const char *path, int rank, const char *what);

/* The watchdog's deadline for runtime.timeout_s = timeout_s: timeout_s
 * plus the grace (0 for timeout_s <= 0). */
double dt_watchdog_limit(double timeout_s);

/* timeout_s <= 0: no thread, every call below is a no-op. `comm` (may be
 * NULL) is aborted on expiry when dt_comm_abort_from_any_thread allows;
 * it must outlive the watchdog. `note_path` (may be NULL: none) is where
 * the expiry is noted (dt_watchdog_note); it is copied. */
dt_status dt_watchdog_start(double timeout_s, int rank, dt_comm_t *comm, const char *note_path,
                            struct dt_watchdog **out);
void dt_watchdog_stop(struct dt_watchdog *wd);

/* Enters `phase` (a string literal) of step `step`; the clock restarts. */
void dt_watchdog_phase(struct dt_watchdog *wd, const char *phase, int64_t step);
/* Leaves any phase: nothing is timed until the next dt_watchdog_phase. */
void dt_watchdog_idle(struct dt_watchdog *wd);

#endif
