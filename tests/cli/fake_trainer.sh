#!/usr/bin/env bash
# A stand-in for `dtrain train` that the launch tests run through the
# supervisor (DTRAIN_LAUNCH_EXEC=fake_trainer.sh), so that restarts, signals
# and argument passing can be checked without training anything.
#
# Each run appends to its log file ($FAKE_LOG, or $FAKE_LOG.rN under
# mpirun, N being the rank) a line "=== attempt K" and then its arguments,
# one per line, exactly as received. What it then does comes from
# FAKE_PLAN, a comma list with one entry per attempt (the last entry
# repeats):
#   a number  exit with that code
#   kill      SIGKILL itself (a crash)
#   hang      write "ready" to the log and wait; on SIGTERM, SIGINT or
#             SIGUSR1 write "got TERM" (INT, USR1) and exit 75
#   orphan    leave behind a process that ignores SIGTERM, SIGINT and
#             SIGUSR1, write "orphan PID" to the log and exit 75 (the
#             supervisor must SIGKILL what is left of an attempt)
# It also prints "fake: attempt K" on stdout. Never evaluates its arguments.
set -u
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-}}}
log=${FAKE_LOG:?FAKE_LOG must name the log file}
[ -n "$rank" ] && log="$log.r$rank"

attempt=0
[ -f "$log" ] && attempt=$(grep -c '^=== attempt ' "$log")
{
    echo "=== attempt $((attempt + 1))"
    for a in "$@"; do printf '%s\n' "$a"; done
} >>"$log"
echo "fake: attempt $((attempt + 1))"

IFS=, read -r -a plan <<<"${FAKE_PLAN:-0}"
if [ "$attempt" -lt "${#plan[@]}" ]; then
    step=${plan[$attempt]}
else
    step=${plan[${#plan[@]} - 1]}
fi

got() {
    echo "got $1" >>"$log"
    exit 75
}

case $step in
kill)
    kill -KILL $$
    ;;
hang)
    trap 'got TERM' TERM
    trap 'got INT' INT
    trap 'got USR1' USR1
    echo ready >>"$log"
    # sleep in the background so that the traps run at once
    while :; do
        sleep 1000 &
        wait $!
    done
    ;;
orphan)
    (trap '' TERM INT USR1; exec sleep 1000 </dev/null >/dev/null 2>&1) &
    echo "orphan $!" >>"$log"
    exit 75
    ;;
*)
    exit "$step"
    ;;
esac
