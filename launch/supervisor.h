/*
 * supervisor.h - the restart supervisor behind `dtrain launch`.
 *
 * Runs one training command (through mpirun, srun or directly) as a child
 * in its own process group, and starts it again with `--resume auto` when
 * it ends in a way a restart can fix: exit 75 (stopped or restartable),
 * any other unexpected non-zero exit, or death by a signal. Exits 64-66
 * (bad job, bad data, missing input) are final. SIGTERM, SIGINT and
 * SIGUSR1 sent to the supervisor are forwarded to the child's process
 * group (through mpirun or srun the first one as SIGUSR1, the signal those
 * pass to every rank untouched) and end the supervision once that child
 * ends.
 *
 * Inside a Slurm job (slurm_job set) an attempt that exits 75 is not
 * restarted in place: Slurm's time-limit, preemption and requeue signals
 * reach the ranks directly, not through the supervisor, and the ranks then
 * checkpoint and exit 75. The supervisor exits 75 as well, so that the
 * batch script requeues the job (slurm/dtrain-step.sh) instead of training
 * on into a time limit or a preemption. Crashes and other failures are
 * still restarted in place.
 *
 * The child is started with fork + exec, never through a shell, so every
 * argument reaches the trainer byte for byte. Not thread-safe: it blocks
 * signals for the whole process and expects to be its only waiter.
 */
#ifndef DT_SUPERVISOR_H
#define DT_SUPERVISOR_H

#include <stddef.h>

#include "core/status.h"

enum dt_launcher { DT_LAUNCHER_MPIRUN = 0, DT_LAUNCHER_SRUN, DT_LAUNCHER_NONE };

/* Defaults of `dtrain launch`. */
#define DT_LAUNCH_DEFAULT_RESTARTS 3
#define DT_LAUNCH_DEFAULT_BACKOFF_S 1.0
#define DT_LAUNCH_DEFAULT_MAX_BACKOFF_S 60.0

/* What to run and how often. The supervisor only reads it; the strings stay
 * owned by the caller. */
struct dt_launch_opts {
    enum dt_launcher launcher;
    int nprocs;           /* ranks; must be 1 with DT_LAUNCHER_NONE */
    int max_restarts;     /* restarts after the first attempt, >= 0 */
    double backoff_s;     /* delay before the first restart, >= 0 */
    double max_backoff_s; /* cap on the doubling delay, >= 0 */
    const char *exec;     /* the dtrain executable each rank runs */
    char **launcher_args; /* extra arguments for mpirun/srun */
    int n_launcher_args;
    char **train_args; /* "train" JOB [options...] */
    int n_train_args;
    const char *slurm_job; /* SLURM_JOB_ID inside a Slurm job, else NULL: exit 75
                              then ends the supervision (the batch script requeues) */
};

/* Name of a launcher as typed on the command line ("mpirun", ...). */
const char *dt_launcher_name(enum dt_launcher l);

/* Builds the NULL-terminated argv of attempt `attempt` (0 = the first):
 * launcher, launcher options, exec, then the train arguments, with
 * `--resume auto` appended on the first attempt when the user gave no
 * --resume, and replacing any --resume on every later attempt. `as_root`
 * adds mpirun's --allow-run-as-root. Free with dt_launch_argv_free(). */
dt_status dt_launch_argv(const struct dt_launch_opts *o, int attempt, int as_root, char ***out);
void dt_launch_argv_free(char **argv);

/* Writes argv as one line of shell-quoted words, so that the line is
 * unambiguous (it is only ever shown, never run). Truncates to len. */
void dt_launch_quote_argv(char *const *argv, char *buf, size_t len);

/* Delay before restart number `restart` (1 = the first restart):
 * backoff_s doubled restart-1 times, capped at max_backoff_s. */
double dt_launch_backoff(const struct dt_launch_opts *o, int restart);

/* Runs attempts until one succeeds, one fails for good, the restarts are
 * used up, or a forwarded signal ends the child. *exit_code receives the
 * exit code the supervisor should end with: the child's exit code, or
 * 128 + signal number when it died by a signal (or when a signal ended the
 * supervisor during a backoff). Returns a failing status (with a message)
 * only when the supervisor itself cannot go on, e.g. the launcher is not
 * installed (DT_ERR_NOT_FOUND) or fork fails. */
dt_status dt_launch_run(const struct dt_launch_opts *o, int *exit_code);

#endif
