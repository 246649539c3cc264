#!/usr/bin/env bash
# A stand-in for srun in the launch tests: logs its arguments to
# $FAKE_LOG.srun, starts -n copies of the command with SLURM_PROCID set
# (the fake trainer then logs per rank), each in its own session as the
# tasks of a real srun are (a signal to srun's process group does not reach
# them), logs their pids ("pid N", so that a test can signal the ranks
# directly, as Slurm does), passes SIGUSR1 on to them, and exits with the
# last non-zero exit code of the copies.
echo "srun $*" >>"${FAKE_LOG:?}.srun"
n=1
while [ $# -gt 0 ]; do
  case $1 in
  --mpi=*) shift ;;
  -n) n=$2 && shift 2 ;;
  *) break ;;
  esac
done
pids=()
for ((r = 0; r < n; r++)); do
  SLURM_PROCID=$r setsid "$@" &
  pids+=($!)
  echo "pid $!" >>"$FAKE_LOG.srun"
done
trap 'kill -USR1 "${pids[@]}" 2>/dev/null' USR1
rc=0
for p in "${pids[@]}"; do
  while :; do
    wait "$p"
    c=$?
    kill -0 "$p" 2>/dev/null || break # a trapped signal interrupted the wait
  done
  [ "$c" = 0 ] || rc=$c
done
exit $rc
