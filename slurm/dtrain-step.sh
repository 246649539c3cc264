#!/usr/bin/env bash
# dtrain-step.sh - runs one training step of a Slurm batch job so that a
# stop (time-limit warning, preemption, `scontrol requeue`) ends in a
# checkpoint and a requeued job that resumes from it.
#
#   source dtrain-step.sh   (from a batch script; then)
#   dtrain_step srun --mpi=pmix dtrain train JOB.yaml --resume auto
#   bash dtrain-step.sh srun --mpi=pmix dtrain train JOB.yaml --resume auto
#
# Why it is built this way:
# - `#SBATCH --signal=B:USR1@T` sends SIGUSR1 to the batch shell only. A
#   shell without a trap dies of it and never reaches the lines after srun,
#   so the step runs in the background and the shell waits for it with a
#   trap set. `wait` returns as soon as a trapped signal arrives, so the
#   shell waits again until the step has really ended.
# - The trap passes the stop on as SIGUSR1 to srun (or to `dtrain launch`),
#   which hands it to every rank: each finishes its step, writes a
#   checkpoint and exits 75. The batch shell then asks Slurm to requeue the
#   job (`scontrol requeue`); the next run resumes with `--resume auto`.
# - A stop from outside the job (`scontrol requeue`, preemption, scancel)
#   makes Slurm send SIGTERM to every process of the job, the ranks
#   included, which checkpoint and exit 75 on their own. Slurm requeues the
#   job itself (or, for scancel, ends it), so after a SIGTERM the script
#   does not requeue; it only waits for the checkpoint and passes the exit
#   code on. Slurm gives the job KillWait seconds (slurm.conf, often 30)
#   before SIGKILL: a checkpoint must be written within that time.
# - Every other exit code is passed on as the batch job's exit code.
#
# DTRAIN_STEP_REQUEUE=0 turns the requeue off (exit 75 is passed on).

# dtrain_step COMMAND [ARGS...]: runs the step, returns its exit code (or
# 0 after a requeue was asked for).
dtrain_step() {
  local pid rc stop_sig="" live
  echo "dtrain-step: job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on" \
    "${SLURM_JOB_NODELIST:-$(hostname)}: $*"
  "$@" &
  pid=$!
  # The traps only record the stop and pass it on; the loop below does the
  # waiting.
  trap '_dtrain_step_stop USR1 "$pid"; stop_sig=${stop_sig:-USR1}' USR1
  trap '_dtrain_step_seen TERM "$pid"; stop_sig=TERM' TERM
  trap '_dtrain_step_stop INT "$pid"; stop_sig=${stop_sig:-INT}' INT
  while :; do
    wait "$pid"
    rc=$?
    # rc > 128 either because the step ended by a signal or because a
    # trapped signal interrupted the wait: only the second leaves it running.
    live=0
    kill -0 "$pid" 2>/dev/null && live=1
    [ "$live" = 1 ] || break
  done
  trap - USR1 TERM INT
  echo "dtrain-step: step ended with exit $rc${stop_sig:+ after SIG$stop_sig}"
  if [ "$rc" = 75 ] && [ "$stop_sig" != TERM ] && [ "${DTRAIN_STEP_REQUEUE:-1}" = 1 ] &&
    [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "dtrain-step: checkpoint written; requeueing job $SLURM_JOB_ID (scontrol requeue)"
    if scontrol requeue "$SLURM_JOB_ID"; then
      return 0
    fi
    echo "dtrain-step: scontrol requeue failed (is the job submitted with --requeue and" \
      "JobRequeue allowed?); exiting 75: submit it again to resume" >&2
  fi
  return "$rc"
}

# _dtrain_step_stop SIGNAME PID: passes a stop on to the step as SIGUSR1,
# which srun hands to every task untouched and which dtrain (and dtrain
# launch) takes as "checkpoint and stop".
_dtrain_step_stop() {
  echo "dtrain-step: got SIG$1: asking the step to checkpoint and stop (SIGUSR1 to pid $2)"
  kill -USR1 "$2" 2>/dev/null
}

# _dtrain_step_seen SIGNAME PID: a SIGTERM comes from Slurm itself
# (requeue, preemption, scancel), which sends it to every process of the
# job, so the ranks have it already; SIGUSR1 goes on as well, for a SIGTERM
# sent to the batch shell alone (dtrain takes a repeated stop signal as
# one). Slurm requeues or ends the job itself, so no requeue follows.
_dtrain_step_seen() {
  echo "dtrain-step: got SIG$1 (Slurm requeues, preempts or cancels the job): the step" \
    "checkpoints and stops; Slurm decides what follows"
  kill -USR1 "$2" 2>/dev/null
}

# Run directly (not sourced): run the step and exit with its code.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  dtrain_step "$@"
  exit $?
fi
