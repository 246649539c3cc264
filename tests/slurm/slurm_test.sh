#!/usr/bin/env bash
# The Slurm templates against a real Slurm: starts a one-node cluster on
# this machine (munged, slurmctld, slurmd, everything under a temporary
# folder, ports of its own), submits slurm/cpu.sbatch with a small
# Fashion-MNIST job on 2 tasks (srun --mpi=pmix) and checks:
#   a) the job completes (exit 0, model.h5): the reference run;
#   b) the time-limit warning, sent mid-run the way Slurm sends a
#      `--signal=B:USR1@T` (to the batch shell only: scancel --batch
#      --signal=USR1), makes the ranks checkpoint and exit 75, the batch
#      shell requeues the job, which resumes from that checkpoint
#      (SLURM_RESTART_COUNT=1) and ends with parameters bit-identical to a);
#   c) the same after `scontrol requeue` from outside mid-run (Slurm then
#      sends SIGTERM to the batch shell and the ranks);
#   e) the same with `dtrain launch` in the template in place of srun and
#      SIGUSR1 sent to the job step only (scancel --signal=USR1): launch
#      takes srun and the task count from the allocation, and exits 75 for
#      the batch shell to requeue instead of restarting in place;
#   d) a real time limit (--time=1 --signal=B:USR1@55) reaches the template's
#      trap and ends in a requeue, with a stand-in trainer (Slurm checks
#      limits only every half minute, too coarse to aim at a training step).
# The requeued job's start delay is skipped with scontrol update
# StartTime=now. The daemons are stopped by the PIDs the test started, and
# the jobs cancelled, on every exit. Skips (77) where Slurm or munge is not
# installed, the test does not run as root, or the daemons do not start.
#   slurm_test.sh DTRAIN SOURCE_DIR WORKDIR
set -uo pipefail
DTRAIN=$(realpath "$1")
SRC=$(realpath "$2")
W=$3
LIMIT=180 # seconds any one job may take before the test gives up on it
PATH=$PATH:/usr/sbin:/sbin # the daemons, where a root shell's PATH lacks them

skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root (slurmd starts job steps as their user)"
for p in munged slurmctld slurmd sbatch srun scontrol squeue scancel h5diff; do
  command -v "$p" >/dev/null ||
    skip "$p is not installed (DTRAIN_WITH_SLURM=1 bash launch/setup.sh installs slurm-wlm, munge and hdf5-tools)"
done
DATA=$SRC/data/fashion-mnist.h5
[ -f "$DATA" ] || skip "$DATA is missing (bash launch/setup.sh imports it)"

rm -rf "$W" && mkdir -p "$W" || exit 1
# munged wants every folder above its socket searchable and the key private
C=$(mktemp -d /tmp/dtrain-slurm.XXXXXX) || exit 1
chmod 711 "$C"
mkdir -p "$C/munge" "$C/state" "$C/spool" "$C/log" && chmod 711 "$C/munge"

pids=()
pass=0 fail=0
cleanup() {
  if [ -n "${SLURM_CONF:-}" ] && [ "${#pids[@]}" -gt 1 ]; then
    scancel --quiet --user=root 2>/dev/null
    for _ in $(seq 40); do
      [ -z "$(squeue -h 2>/dev/null)" ] && break
      sleep 0.5
    done
    # the job's processes (slurmstepd and below) end before slurmd does
    for _ in $(seq 40); do
      [ "$(scontrol listpids 2>/dev/null | wc -l)" -le 1 ] && break
      sleep 0.5
    done
  fi
  local p
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    p=${pids[i]}
    kill -TERM "$p" 2>/dev/null
    for _ in $(seq 50); do
      kill -0 "$p" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  # the daemons' logs stay with the test's files when something failed
  [ "$fail" -eq 0 ] || cp -r "$C/log" "$W/slurm-logs" 2>/dev/null
  rm -rf "$C"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { if [ "$2" == "$3" ]; then ok; else bad "$1: got '$2', want '$3'"; fi; }
# has FILE PATTERN: FILE has a line matching PATTERN
has() { if grep -qE -- "$2" "$1"; then ok; else bad "$1 lacks /$2/" && tail -40 "$1"; fi; }

# A port nothing listens on, from a range the usual daemons avoid.
free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 20000))
    (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null || { echo "$p" && return 0; }
  done
  return 1
}

# ---- the cluster ---------------------------------------------------------------
dd if=/dev/urandom of="$C/munge/key" bs=1024 count=1 2>/dev/null && chmod 600 "$C/munge/key"
munged --foreground --key-file="$C/munge/key" --socket="$C/munge/sock" \
  --pid-file="$C/munge/pid" --log-file="$C/log/munged.log" --seed-file="$C/munge/seed" \
  >"$C/log/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$C/munge/sock" ] && break; sleep 0.1; done
[ -S "$C/munge/sock" ] || { cat "$C/log/munged.out" "$C/log/munged.log" 2>/dev/null; skip "munged did not start"; }

NODE=$(slurmd -C | sed -n '1s/ RealMemory=[0-9]*//p')
HOST=$(hostname -s)
[ -n "$NODE" ] || skip "slurmd -C did not describe this machine"
CTLD_PORT=$(free_port) && SLURMD_PORT=$(free_port) || skip "no free port for slurmctld/slurmd"
cat >"$C/slurm.conf" <<EOF
ClusterName=dtraintest
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$C/munge/sock
StateSaveLocation=$C/state
SlurmdSpoolDir=$C/spool
SlurmctldPidFile=$C/slurmctld.pid
SlurmdPidFile=$C/slurmd.pid
SlurmctldLogFile=$C/log/slurmctld.log
SlurmdLogFile=$C/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
JobRequeue=1
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
KillWait=30
$NODE NodeAddr=127.0.0.1 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
# Only this cluster's settings reach the commands and the jobs (the test
# may itself run inside another Slurm job).
for v in $(compgen -v SLURM_); do unset "$v"; done
export SLURM_CONF=$C/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" >"$C/log/slurmctld.out" 2>&1 &
pids+=($!)
# slurmd registers once slurmctld answers; started earlier, on a busy
# machine, it would wait for its next registration attempt
for _ in $(seq 240); do
  scontrol ping 2>/dev/null | grep -q 'is UP' && break
  sleep 0.5
done
slurmd -D -f "$SLURM_CONF" >"$C/log/slurmd.out" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 240); do
  sinfo -h -o %T 2>/dev/null | grep -qx idle && up=1 && break
  sleep 0.5
done
if [ "$up" != 1 ]; then
  tail -20 "$C"/log/*
  skip "slurmctld/slurmd did not come up (logs above)"
fi
echo "slurm_test: one-node Slurm up: $NODE (slurm.conf in $C)"
T0=$(date +%s)

# ---- helpers ----------------------------------------------------------------------
export OMPI_MCA_btl=self,vader # one node: shared memory, no interface probing
# Six epochs (2808 steps): the interrupted jobs are stopped once step 200
# is in their output, and Slurm writes that file a little behind the
# ranks; at 30,000 samples/s two epochs (4 s) could end before the signal.
JOBARGS=(--set data.path="$DATA" --set train.epochs=6 --set data.workers=1)
# submit NAME [sbatch options...]: the CPU template, 2 tasks, run dir W/NAME
submit() {
  local name=$1
  shift
  sbatch --parsable -p debug -J "$name" --ntasks=2 --cpus-per-task=1 -o "$W/$name.out" \
    --export="ALL,DTRAIN=$DTRAIN,DTRAIN_HOME=$SRC,RUN_DIR=$W/$name" "$@" \
    "$SRC/slurm/cpu.sbatch" "${JOBARGS[@]}"
}
field() { scontrol show job "$1" 2>/dev/null | grep -oE "(^| )$2=[^ ]*" | head -1 | cut -d= -f2; }
# wait_until DESCRIPTION COMMAND...: until COMMAND succeeds or LIMIT passes
wait_until() {
  local what=$1
  shift
  for _ in $(seq $((LIMIT * 5))); do
    "$@" && return 0
    sleep 0.2
  done
  bad "timed out waiting for $what"
  return 1
}
state_is() { [ "$(field "$1" JobState)" = "$2" ]; }
ended() { case $(field "$1" JobState) in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) return 0 ;; esac; return 1; }
requeued() { state_is "$1" PENDING && [ "$(field "$1" Restarts)" = 1 ]; }
logged() { grep -qE -- "$2" "$1" 2>/dev/null; }
# no_processes J: nothing of job J runs on the node any more
no_processes() { [ "$(scontrol listpids "$1" 2>/dev/null | wc -l)" -le 1 ]; }
# start_again J: lets the requeued job J start now instead of after the
# requeue delay, once the processes of its last run are gone (a run that
# starts while the last one is still being torn down fails at once)
start_again() {
  wait_until "the processes of job $1 to end" no_processes "$1"
  sleep 1
  scontrol update JobId="$1" StartTime=now
}
# finished NAME J: the job ended well
finished() {
  local name=$1 j=$2
  wait_until "job $j ($name) to end" ended "$j"
  check "$name: state" "$(field "$j" JobState)" COMPLETED
  check "$name: exit code" "$(field "$j" ExitCode)" 0:0
  if [ -f "$W/$name/model.h5" ]; then ok; else bad "$name: no model.h5" && tail -30 "$W/$name.out"; fi
}
# interrupted NAME J HOW: checks after a stop and requeue, resumes the job
# and checks its end against the reference
resumed() {
  local name=$1 j=$2
  wait_until "job $j ($name) to be requeued" requeued "$j" || { tail -30 "$W/$name.out"; return; }
  start_again "$j"
  finished "$name" "$j"
  check "$name: restarts" "$(field "$j" Restarts)" 1
  local ck
  ck=$(sed -n 's/.*step [0-9]*: checkpoint \(.*\.h5\) written (stop requested).*/\1/p' \
    "$W/$name/train.log" | head -1)
  if [ -n "$ck" ]; then ok; else bad "$name: no checkpoint at the stop in train.log"; fi
  has "$W/$name/train.log" "resumed from ${ck:-CHECKPOINT}: step [0-9]+"
  has "$W/$name/train.log" "Slurm job $j, restart count 1 \(SLURM_RESTART_COUNT\)"
  has "$W/$name/metrics.jsonl" "\"type\":\"start\".*\"slurm_job_id\":\"$j\",\"slurm_restart_count\":1"
  has "$W/$name.out" "dtrain-step: step ended with exit 75"
  has "$W/$name.out" "dtrain-step: job $j \(restart 1\)"
  if h5diff "$W/plain/model.h5" "$W/$name/model.h5" /params /params >"$W/$name.h5diff" 2>&1; then
    ok
  else
    bad "$name: final parameters differ from the uninterrupted run" && head -20 "$W/$name.h5diff"
  fi
}

# ---- a) the template runs a job to the end -------------------------------------------
J=$(submit plain) || bad "sbatch failed"
finished plain "$J"
check "plain: restarts" "$(field "$J" Restarts)" 0
has "$W/plain/train.log" "Slurm job $J, restart count 0"
has "$W/plain.out" "dtrain-step: step ended with exit 0"

# ---- b) the time-limit warning, as Slurm delivers B:USR1 --------------------------------
J=$(submit warn) || bad "sbatch failed"
wait_until "training steps in warn.out" logged "$W/warn.out" 'step [2-9][0-9]{2}/2808' &&
  scancel --batch --signal=USR1 "$J"
resumed warn "$J"
has "$W/warn.out" "dtrain-step: got SIGUSR1: asking the step to checkpoint"
has "$W/warn.out" "dtrain-step: checkpoint written; requeueing job $J"
has "$W/warn/train.log" "stop requested by SIGUSR1"

# ---- c) scontrol requeue from outside ---------------------------------------------------
J=$(submit requeue) || bad "sbatch failed"
wait_until "training steps in requeue.out" logged "$W/requeue.out" 'step [2-9][0-9]{2}/2808' &&
  scontrol requeue "$J"
resumed requeue "$J"
has "$W/requeue.out" "dtrain-step: got SIGTERM"
# the ranks get SIGTERM from Slurm and SIGUSR1 from the batch shell's trap:
# whichever comes first is the one named
has "$W/requeue/train.log" "stop requested by SIG(TERM|USR1)"

# ---- e) dtrain launch in the template, a signal to the job step only -------------------
# The template with `dtrain launch` in place of srun: launch takes srun and
# 2 tasks from the allocation; `scancel --signal=USR1` (no --batch) reaches
# the ranks but not the batch step, so launch must exit 75 instead of
# restarting in place, and the batch shell requeues.
sed 's|^dtrain_step srun --mpi=pmix "$DTRAIN" train|dtrain_step "$DTRAIN" launch -- train|' \
  "$SRC/slurm/cpu.sbatch" >"$W/launch.sbatch"
if grep -q '^dtrain_step "$DTRAIN" launch -- train' "$W/launch.sbatch"; then ok; else bad "no srun line in cpu.sbatch"; fi
J=$(sbatch --parsable -p debug -J launch --ntasks=2 --cpus-per-task=1 -o "$W/launch.out" \
  --export="ALL,DTRAIN=$DTRAIN,DTRAIN_HOME=$SRC,RUN_DIR=$W/launch" "$W/launch.sbatch" \
  "${JOBARGS[@]}") || bad "sbatch failed"
wait_until "training steps in launch.out" logged "$W/launch.out" 'step [2-9][0-9]{2}/2808' &&
  scancel --signal=USR1 "$J"
resumed launch "$J"
has "$W/launch.out" "launch: attempt 1/4: srun --mpi=pmix -n 2 $DTRAIN train"
has "$W/launch.out" "not restarting inside Slurm job $J .*exiting 75 so that the batch script requeues"
has "$W/launch.out" "dtrain-step: checkpoint written; requeueing job $J"
if grep -q "launch: attempt 2/" "$W/launch.out"; then bad "launch: restarted inside the allocation"; else ok; fi

# ---- d) a real time limit and its warning, with a stand-in trainer ------------------------
cat >"$W/fake_dtrain.sh" <<'EOF'
#!/usr/bin/env bash
# stands in for dtrain: waits for a stop signal and exits 75 (or, after a
# requeue, exits 0 at once)
[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && echo "fake: resumed" && exit 0
start=$(date +%s)
trap 'echo "fake: got USR1 after $(($(date +%s) - start))s"; exit 75' USR1
trap 'echo "fake: got TERM"; exit 75' TERM
echo "fake: running"
for _ in $(seq 120); do sleep 1 & wait $!; done
exit 3
EOF
chmod +x "$W/fake_dtrain.sh"
J=$(sbatch --parsable -p debug -J limit --ntasks=1 --cpus-per-task=1 -o "$W/limit.out" \
  --time=1 --signal=B:USR1@55 --export="ALL,DTRAIN=$W/fake_dtrain.sh,DTRAIN_HOME=$SRC,RUN_DIR=$W/limit" \
  "$SRC/slurm/cpu.sbatch") || bad "sbatch failed"
if wait_until "job $J (limit) to be requeued" requeued "$J"; then
  start_again "$J"
  wait_until "job $J (limit) to end" ended "$J"
fi
check "limit: state" "$(field "$J" JobState)" COMPLETED
check "limit: exit code" "$(field "$J" ExitCode)" 0:0
has "$W/limit.out" "dtrain-step: got SIGUSR1"
has "$W/limit.out" "fake: got USR1"
has "$W/limit.out" "dtrain-step: checkpoint written; requeueing job $J"
has "$W/limit.out" "fake: resumed"
if grep -q "DUE TO TIME LIMIT" "$W/limit.out"; then bad "limit: the time limit killed the job"; else ok; fi

echo "slurm_test: $pass passed, $fail failed in $(($(date +%s) - T0))s of jobs"
[ "$fail" -eq 0 ]
