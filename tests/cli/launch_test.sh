#!/usr/bin/env bash
# Tests of the restart supervisor, `dtrain launch`: restarts after exit 75
# and after a crash, no restart after 64-66, restarts running out, the
# --resume argument on each attempt, arguments that reach the trainer byte
# for byte without a shell, signals forwarded (and during a backoff), the
# doubling backoff (from the log, never from the clock), what is left of an
# attempt being killed, a missing launcher, usage errors, two ranks under
# real mpirun, and the defaults inside a Slurm job (SLURM_* set by the test,
# srun played by tests/cli/fake_srun.sh).
#
# The trainer is tests/cli/fake_trainer.sh (through DTRAIN_LAUNCH_EXEC),
# which logs the arguments of every attempt and exits, crashes or waits for
# a signal as FAKE_PLAN says.
#   launch_test.sh DTRAIN WORKDIR
set -uo pipefail
DTRAIN=$(realpath "$1")
W=$2
HERE=$(cd "$(dirname "$0")" && pwd)
LIMIT=120 # seconds any one supervisor may run before the test gives up on it
TIMEOUT=$(command -v timeout) # by path: one test empties PATH
rm -rf "$W" && mkdir -p "$W"
cd "$W" || exit 1
cp "$HERE/fake_trainer.sh" fake_trainer.sh && chmod +x fake_trainer.sh
FAKE=$W/fake_trainer.sh
export DTRAIN_LAUNCH_EXEC=$FAKE
export OMPI_MCA_btl=self,vader # one node: shared memory, no interface probing
unset DTRAIN_LOG
# outside Slurm unless a test says otherwise (CI may itself run in a job)
unset SLURM_JOB_ID SLURM_NTASKS SLURM_NPROCS SLURM_PROCID SLURM_STEP_ID
pass=0 fail=0
bg_pids=()
trap 'for p in "${bg_pids[@]}"; do kill -KILL "$p" 2>/dev/null; done' EXIT

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# check DESCRIPTION GOT WANT
check() { if [ "$2" == "$3" ]; then ok; else bad "$1: got '$2', want '$3'"; fi; }
# has NAME PATTERN: the supervisor's stderr of run NAME matches PATTERN
has() { if grep -qE -- "$2" "$1.err"; then ok; else bad "$1: stderr lacks /$2/:" && cat "$1.err"; fi; }
hasnt() { if grep -qE -- "$2" "$1.err"; then bad "$1: stderr has /$2/:" && cat "$1.err"; else ok; fi; }
# attempts LOG: how many times the fake trainer ran
attempts() { if [ -f "$1" ]; then grep -c '^=== attempt ' "$1"; else echo 0; fi; }
# args_of LOG K: the arguments of attempt K, one per line
args_of() { awk -v k="$2" '/^=== attempt /{n++; next} n==k && !/^(ready|got |orphan )/' "$1"; }
# launch NAME PLAN [launch options...]: runs dtrain launch with FAKE_LOG=NAME.log;
# sets rc; stdout in NAME.out, stderr in NAME.err
launch() {
  local name=$1 plan=$2
  shift 2
  FAKE_PLAN=$plan FAKE_LOG=$W/$name.log "$TIMEOUT" -k 5 "$LIMIT" "$DTRAIN" launch "$@" \
    >"$name.out" 2>"$name.err"
  rc=$?
}
# start NAME PLAN [options...]: like launch, in the background; sets pid
start() {
  local name=$1 plan=$2
  shift 2
  FAKE_PLAN=$plan FAKE_LOG=$W/$name.log "$DTRAIN" launch "$@" >"$name.out" 2>"$name.err" &
  pid=$!
  bg_pids+=("$pid")
}
# wait_for FILE PATTERN: until FILE has a line matching PATTERN (or LIMIT)
wait_for() {
  for _ in $(seq $((LIMIT * 10))); do
    grep -qE -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  bad "timed out waiting for /$2/ in $1"
  return 1
}
# finish: waits for the background supervisor; sets rc
finish() {
  local t=0
  while kill -0 "$pid" 2>/dev/null && [ $t -lt $((LIMIT * 10)) ]; do sleep 0.1; t=$((t + 1)); done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  wait "$pid"
  rc=$?
}
# gone PID: the process has ended (or is a zombie waiting for init)
gone() {
  for _ in $(seq 50); do
    local st
    st=$(ps -o stat= -p "$1" 2>/dev/null | tr -d ' ')
    [ -z "$st" ] || [ "${st:0:1}" = Z ] && return 0
    sleep 0.1
  done
  return 1
}
NONE=(--launcher none --backoff 0)

# ---- restarts --------------------------------------------------------------
launch r75 75,0 "${NONE[@]}" -- train job.yaml
check "restart after 75: exit" "$rc" 0
check "restart after 75: attempts" "$(attempts r75.log)" 2
has r75 'launch: attempt 1/4: .*fake_trainer\.sh train job\.yaml --resume auto$'
has r75 'attempt 1 ended with exit 75 \(stopped, restartable\) after [0-9.]+s; restarting in 0s'
has r75 'launch: done after 2 attempts'
# the supervisor's lines go to stderr, the trainer's stdout stays stdout
check "trainer stdout kept" "$(grep -c '^fake: attempt' r75.out)" 2
check "no launch lines on stdout" "$(grep -c 'launch:' r75.out)" 0

launch crash kill,0 "${NONE[@]}" -- train job.yaml
check "restart after kill -9: exit" "$rc" 0
check "restart after kill -9: attempts" "$(attempts crash.log)" 2
has crash 'attempt 1 ended with signal 9 \(Killed\) after [0-9.]+s; restarting'

launch several 75,kill,1,0 "${NONE[@]}" -- train job.yaml
check "success after 3 restarts: exit" "$rc" 0
check "success after 3 restarts: attempts" "$(attempts several.log)" 4
has several 'attempt 3 ended with exit 1 \(failed\)'
has several 'launch: attempt 4/4: '
has several 'launch: done after 4 attempts'

for code in 64 65 66; do
  launch final$code $code,0 "${NONE[@]}" -- train job.yaml
  check "no restart after $code: exit" "$rc" $code
  check "no restart after $code: attempts" "$(attempts final$code.log)" 1
  has final$code "attempt 1 ended with exit $code .*: not restarting"
done
has final65 'exit 65 \(bad data\)'

launch exhausted 75 "${NONE[@]}" --max-restarts 2 -- train job.yaml
check "restarts exhausted: exit" "$rc" 75
check "restarts exhausted: attempts" "$(attempts exhausted.log)" 3
has exhausted 'attempt 3 ended with exit 75 .*: no restarts left \(2 used'
hasnt exhausted 'attempt 4'

launch exhausted_kill kill "${NONE[@]}" --max-restarts 1 -- train job.yaml
check "restarts exhausted after crashes: exit 128+9" "$rc" 137
check "restarts exhausted after crashes: attempts" "$(attempts exhausted_kill.log)" 2

launch norestarts 70 "${NONE[@]}" --max-restarts 0 -- train job.yaml
check "--max-restarts 0: exit" "$rc" 70
check "--max-restarts 0: attempts" "$(attempts norestarts.log)" 1

# ---- --resume on each attempt -----------------------------------------------
launch resume_given 75,0 "${NONE[@]}" -- train job.yaml --resume never --set a=b
check "user's --resume kept on attempt 1" "$(args_of resume_given.log 1 | paste -sd' ')" \
  "train job.yaml --resume never --set a=b"
check "--resume replaced on attempt 2" "$(args_of resume_given.log 2 | paste -sd' ')" \
  "train job.yaml --set a=b --resume auto"

launch resume_eq 75,0 "${NONE[@]}" -- train job.yaml --resume=run/ckpt.h5 --set --resume=x
check "--resume=PATH kept on attempt 1" "$(args_of resume_eq.log 1 | paste -sd' ')" \
  "train job.yaml --resume=run/ckpt.h5 --set --resume=x"
check "--resume=PATH replaced, a --set value left alone" \
  "$(args_of resume_eq.log 2 | paste -sd' ')" "train job.yaml --set --resume=x --resume auto"

# ---- arguments arrive byte for byte, and nothing runs them ---------------------
weird=('a b' "it's \"quoted\"" '$(touch pwned)' 'x; touch pwned2' '`touch pwned3`' '*' ''
  'tab	here' '\n' '--set=k=v w')
launch bytes 75,0 "${NONE[@]}" -- train 'my job.yaml' "${weird[@]}"
check "odd arguments: exit" "$rc" 0
printf '%s\n' train 'my job.yaml' "${weird[@]}" --resume auto >bytes.want
for k in 1 2; do
  args_of bytes.log $k >bytes.got$k
  if cmp -s bytes.want bytes.got$k; then ok; else bad "attempt $k arguments differ:" && diff bytes.want bytes.got$k; fi
done
for f in pwned pwned2 pwned3; do
  if [ -e "$f" ]; then bad "an argument was executed: $f exists"; else ok; fi
done
# the log line quotes them so that it reads back as the same words
has bytes "train 'my job\.yaml' 'a b' 'it'\\\\''s \"quoted\"' '\\$\\(touch pwned\\)' 'x; touch pwned2'"
has bytes "'\\*' '' \\$'tab\\\\there' '\\\\n' '--set=k=v w' --resume auto$"

# ---- signals ----------------------------------------------------------------
for sig in TERM INT USR1; do
  start sig$sig hang "${NONE[@]}" -- train job.yaml
  wait_for sig$sig.log '^ready$' && kill -$sig "$pid"
  finish
  check "SIG$sig forwarded: exit" "$rc" 75
  check "SIG$sig forwarded: trainer got it" "$(grep -c "^got $sig$" sig$sig.log)" 1
  check "SIG$sig forwarded: attempts" "$(attempts sig$sig.log)" 1
  has sig$sig "got SIG$sig: forwarding it to attempt 1 \(process group [0-9]+\)"
  has sig$sig "not restarting after SIG$sig"
done

start backoff_term 75,0 --launcher none --backoff 60 -- train job.yaml
wait_for backoff_term.err 'restarting in 60s' && kill -TERM "$pid"
finish
check "SIGTERM during backoff: exit 128+15" "$rc" 143
check "SIGTERM during backoff: attempts" "$(attempts backoff_term.log)" 1
has backoff_term 'got SIGTERM while waiting to restart: stopping \(exit 143\)'

start backoff_int 75,0 --launcher none --backoff 60 -- train job.yaml
wait_for backoff_int.err 'restarting in 60s' && kill -INT "$pid"
finish
check "SIGINT during backoff: exit 128+2" "$rc" 130
check "SIGINT during backoff: attempts" "$(attempts backoff_int.log)" 1

# ---- backoff doubles, up to the cap (read from the log) ---------------------------
launch backoff 75 --launcher none --backoff 0.05 --max-backoff 0.15 --max-restarts 4 -- train j
check "backoff: exit" "$rc" 75
check "backoff: attempts" "$(attempts backoff.log)" 5
check "backoff: delays" "$(grep -oE 'restarting in [0-9.]+s' backoff.err | awk '{print $3}' | paste -sd' ')" \
  "0.05s 0.1s 0.15s 0.15s"

# ---- what is left of an attempt is killed before the next ----------------------
launch orphan orphan,0 "${NONE[@]}" -- train job.yaml
check "orphan: exit" "$rc" 0
opid=$(awk '/^orphan /{print $2; exit}' orphan.log)
if [ -n "$opid" ] && gone "$opid"; then ok; else bad "process $opid left by attempt 1 still runs"; fi

# ---- a missing launcher or trainer ----------------------------------------------
for l in mpirun srun; do
  PATH=/nonexistent launch nolauncher_$l 0 --launcher $l -- train job.yaml
  check "missing $l: exit" "$rc" 66
  has nolauncher_$l "cannot start the launcher '$l'"
done
DTRAIN_LAUNCH_EXEC=$W/no-such-trainer launch notrainer 0 --launcher none -- train job.yaml
check "missing trainer: exit" "$rc" 66
has notrainer "cannot run '$W/no-such-trainer'"

# ---- usage errors: 64, naming what is wrong, and nothing started -----------------
usage() {
  local pat=$1
  shift
  launch usage 0 "$@"
  check "usage error for '$*': exit" "$rc" 64
  has usage "$pat"
  check "usage error for '$*': nothing ran" "$(attempts usage.log)" 0
}
usage "-n needs a whole number from 1 to 1000000, not '0'" -n 0 --launcher none -- train j
usage "-n needs a whole number from 1 to 1000000, not 'two'" -n two -- train j
usage "--max-restarts needs a whole number from 0 to 1000000, not '-1'" --max-restarts -1 -- train j
usage "--launcher wants mpirun, srun or none, not 'ssh'" --launcher ssh -- train j
usage "-n 2 with --launcher none" --launcher none -n 2 -- train j
usage "--backoff needs a number from 0 to 604800 seconds .*not '-1'" --backoff -1 -- train j
usage "--max-backoff needs a number from 0 to 604800 seconds .*not 'soon'" --max-backoff=soon -- train j
usage "--backoff needs a value" --launcher none --backoff
usage "unknown option '--bogus'" --bogus -- train j
usage "must be 'train JOB.yaml ...', not 'eval'" -- eval j
usage "unexpected 'train': put the training command after '--'" train j
usage "no training command" --launcher none --
"$DTRAIN" launch --help >help.out 2>&1
check "--help: exit" "$?" 0
if grep -q -- '--max-restarts' help.out; then ok; else bad "--help lacks the options"; fi

# ---- two ranks under real mpirun ----------------------------------------------------
MPI=(-n 2 --launcher mpirun --launcher-arg --oversubscribe --launcher-arg=--bind-to
  --launcher-arg none --backoff 0)
root=
[ "$(id -u)" = 0 ] && root='--allow-run-as-root '
launch mpi kill,75,0 "${MPI[@]}" -- train job.yaml 'a b'
check "mpirun: exit" "$rc" 0
has mpi "launch: attempt 1/4: mpirun ${root}--oversubscribe --bind-to none -np 2 $FAKE train job\.yaml 'a b' --resume auto$"
has mpi 'launch: done after 3 attempts'
for r in 0 1; do
  check "mpirun rank $r: attempts" "$(attempts mpi.log.r$r)" 3
  for k in 1 2 3; do
    check "mpirun rank $r attempt $k: arguments" "$(args_of mpi.log.r$r $k | paste -sd'|')" \
      "train|job.yaml|a b|--resume|auto"
  done
done

start mpi_term hang "${MPI[@]}" -- train job.yaml
wait_for mpi_term.log.r0 '^ready$' && wait_for mpi_term.log.r1 '^ready$' && kill -TERM "$pid"
finish
check "mpirun SIGTERM: exit" "$rc" 75
has mpi_term 'got SIGTERM: passing it to attempt 1 as SIGUSR1'
for r in 0 1; do
  check "mpirun SIGTERM: rank $r checkpoints (got SIGUSR1)" "$(grep -c '^got USR1$' mpi_term.log.r$r)" 1
  check "mpirun SIGTERM: rank $r attempts" "$(attempts mpi_term.log.r$r)" 1
done

# ---- inside a Slurm job: srun and SLURM_NTASKS by default, exit 75 ends it -----
mkdir -p bin && cp "$HERE/fake_srun.sh" bin/srun && chmod +x bin/srun
SLURM=(env PATH="$W/bin:$PATH" SLURM_JOB_ID=4242 SLURM_NTASKS=3)
launch_slurm() { # NAME PLAN [options...]: launch inside the pretend job
  local name=$1 plan=$2
  shift 2
  FAKE_PLAN=$plan FAKE_LOG=$W/$name.log "$TIMEOUT" -k 5 "$LIMIT" "${SLURM[@]}" "$DTRAIN" launch \
    "$@" >"$name.out" 2>"$name.err"
  rc=$?
}
launch_slurm sl_default 0 --backoff 0 -- train job.yaml
check "Slurm defaults: exit" "$rc" 0
has sl_default "launch: attempt 1/4: srun --mpi=pmix -n 3 $FAKE train job\.yaml --resume auto$"
for r in 0 1 2; do
  check "Slurm defaults: rank $r ran" "$(attempts sl_default.log.r$r)" 1
done
launch_slurm sl_n2 0 -n 2 --backoff 0 -- train job.yaml
check "Slurm -n 2: exit" "$rc" 0
has sl_n2 "launch: attempt 1/4: srun --mpi=pmix -n 2 $FAKE"
check "Slurm -n 2: no third rank" "$(attempts sl_n2.log.r2)" 0
launch_slurm sl_toomany 0 -n 4 -- train job.yaml
check "Slurm -n 4 of 3 tasks: exit" "$rc" 64
has sl_toomany "-n 4 is more than the 3 tasks of Slurm job 4242 \(SLURM_NTASKS\)"
check "Slurm -n 4 of 3 tasks: nothing ran" "$(attempts sl_toomany.log.r0)" 0
launch_slurm sl_none 0 --launcher none -- train job.yaml
check "Slurm --launcher none: exit" "$rc" 0
check "Slurm --launcher none: one process" "$(attempts sl_none.log)" 1
# the default launcher, seen through its absence
PATH=/nonexistent launch nosrun_out 0 -- train job.yaml
has nosrun_out "cannot start the launcher 'mpirun'"
FAKE_PLAN=0 FAKE_LOG=$W/nosrun_in.log env PATH=/nonexistent SLURM_JOB_ID=7 \
  "$DTRAIN" launch -- train job.yaml >nosrun_in.out 2>nosrun_in.err
check "inside Slurm, no srun: exit" "$?" 66
has nosrun_in "cannot start the launcher 'srun'"
# a crash is still restarted in place
launch_slurm sl_crash kill,0 -n 1 --backoff 0 -- train job.yaml
check "Slurm crash: exit" "$rc" 0
check "Slurm crash: restarted in place" "$(attempts sl_crash.log.r0)" 2
# Slurm's own stop reaches the ranks, not the supervisor: they exit 75 and
# the supervisor exits 75 too (the batch script requeues), no restart
FAKE_PLAN=hang FAKE_LOG=$W/sl_stop.log "${SLURM[@]}" "$DTRAIN" launch -n 2 --backoff 0 \
  -- train job.yaml >sl_stop.out 2>sl_stop.err &
pid=$!
bg_pids+=("$pid")
if wait_for sl_stop.log.r0 '^ready$' && wait_for sl_stop.log.r1 '^ready$'; then
  for p in $(awk '/^pid /{print $2}' sl_stop.log.srun); do kill -TERM "$p"; done
fi
finish
check "Slurm step stop: exit" "$rc" 75
for r in 0 1; do
  check "Slurm step stop: rank $r got TERM" "$(grep -c '^got TERM$' sl_stop.log.r$r)" 1
  check "Slurm step stop: rank $r not restarted" "$(attempts sl_stop.log.r$r)" 1
done
has sl_stop "not restarting inside Slurm job 4242 .*exiting 75 so that the batch script requeues"
hasnt sl_stop 'attempt 2/'
# a signal to the supervisor inside Slurm reaches the ranks as SIGUSR1
FAKE_PLAN=hang FAKE_LOG=$W/sl_usr1.log "${SLURM[@]}" "$DTRAIN" launch -n 2 --backoff 0 \
  -- train job.yaml >sl_usr1.out 2>sl_usr1.err &
pid=$!
bg_pids+=("$pid")
wait_for sl_usr1.log.r0 '^ready$' && wait_for sl_usr1.log.r1 '^ready$' && kill -TERM "$pid"
finish
check "Slurm supervisor SIGTERM: exit" "$rc" 75
for r in 0 1; do
  check "Slurm supervisor SIGTERM: rank $r got USR1" "$(grep -c '^got USR1$' sl_usr1.log.r$r)" 1
done
has sl_usr1 'got SIGTERM: passing it to attempt 1 as SIGUSR1 .*srun hands it to every rank'

echo "launch_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
