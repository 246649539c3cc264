/*
 * fault.h - a testing aid: DTRAIN_FAULT makes a chosen rank fail at a
 * chosen point, so tests can start a real multi-rank job and watch every
 * rank stop, or the job recover. Comma-separated entries RANK:EVENT[:STEP]:
 *   open           the dataset cannot be opened on that rank
 *   nomem          the model's memory cannot be allocated on that rank
 *   oom:ROWS       allocating the activation arena for a micro-batch of
 *                  more than ROWS rows fails as out of memory on that
 *                  rank (the micro-batch fallback and dtrain find-batch
 *                  can be tried without filling a GPU)
 *   read:STEP      reading a training batch fails at optimizer step STEP
 *   kill:STEP      the rank kills itself (SIGKILL) in the middle of step STEP,
 *                  once a background checkpoint it was writing is committed
 *                  (so the checkpoint a restart resumes from does not depend
 *                  on how fast the background write was)
 *   bgkill:STEP    the rank kills itself in the middle of step STEP while its
 *                  background checkpoint write is still in flight (not at
 *                  all when none is)
 *   ckptkill:STEP  the rank kills itself in the middle of writing the
 *                  checkpoint of step STEP (after the temporary file exists;
 *                  in the writer thread when the write is in the background)
 *   hang:STEP      the rank stops responding in step STEP (its peers' collective
 *                  timeout ends the job; when every rank hangs, the watchdog)
 *   nan:STEP       the rank's loss is NaN at step STEP
 *   overflow:STEP  the rank's gradients overflow to infinity at step STEP
 *                  (every step when STEP is left out), as fp16 ones can
 *   otherhost      dtrain doctor: the rank acts as if it ran on another
 *                  node without a shared file system: it reports the host
 *                  "<host>-otherhost" and writes its run-directory marker
 *                  into a private temporary directory instead
 *   slowdata:MS    every batch the rank's loaders read takes MS ms longer
 *                  (a slow file system: the loader starvation warning)
 *   slowckpt:MS    every background checkpoint write of the rank starts MS ms
 *                  late (a slow file system: the next checkpoint waits, a
 *                  kill or a stop finds a write in flight)
 * STEP counts optimizer steps from 0. Under `dtrain launch` the faults act
 * in the first attempt only (DTRAIN_LAUNCH_ATTEMPT=1), so a restart shows
 * the recovery. Unset (the normal case) it costs one getenv at start-up.
 */
#ifndef DT_FAULT_H
#define DT_FAULT_H

#include <stdint.h>

#include "status.h"

/* Parses DTRAIN_FAULT; DT_ERR_USAGE on a malformed value. */
dt_status dt_fault_init(void);

/* 1 when `event` is armed for `rank` (and `step`, for step events). */
int dt_fault_armed(const char *event, int rank, int64_t step);

/* 1 and the entry's number (its STEP field) in *value when `event` is
 * armed for `rank` with a number, else 0: for events such as oom:ROWS and
 * slowdata:MS. */
int dt_fault_value(const char *event, int rank, int64_t *value);

#endif
