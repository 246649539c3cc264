#!/usr/bin/env bash
# Who acts on a hang, end to end under real mpirun -np 2:
#   - rank 1 hangs in a step (DTRAIN_FAULT=1:hang:3) with runtime.timeout_s=3:
#     rank 0's gradient all-reduce gives up first and names the step, the
#     collective and the limit; the job ends with 75 at once (MPI_Abort),
#     before any watchdog (whose deadline is 3 s plus a grace of 10 s) says
#     anything; the run directory holds the note hang.txt;
#   - the next run in that directory shows the note and removes it;
#   - both ranks hang outside any collective: their watchdogs end them,
#     exit 75, the note has a line per rank;
#   - under `dtrain launch`, the restart after such a hang finishes and
#     shows why the first attempt ended.
# Which actor fired is read from the messages, not from wall-clock times.
#   watchdog_test.sh DTRAIN MAKE_H5 WORKDIR
set -uo pipefail
DTRAIN=$1
MAKE_H5=$2
W=$3
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/../mpi/mpirun.sh"
rm -rf "$W" && mkdir -p "$W"
cd "$W"
source "$HERE/lib.sh"

"$MAKE_H5" data.h5 512 128 16 4 || { echo "cannot make data"; exit 1; }
cat > job.yaml <<JOB
model:
  hidden: [16]
  dropout: 0
data:
  path: data.h5
train:
  epochs: 1
  global_batch: 32
  eval_batch: 64
  log_every: 4
  optimizer:
    lr: 0.01
runtime:
  threads: 1
  progress: lines
  timeout_s: 3
output:
  dir: run
JOB

# --- a rank hangs: its peer's collective gives up first ----------------------------
DTRAIN_FAULT=1:hang:3 timeout 120 $MPIRUN 2 "$DTRAIN" train job.yaml --set output.dir=coll > coll.out 2>&1
rc=$?
[ "$rc" = 75 ] && ok || bad "collective timeout: exit $rc, expected 75: $(grep dtrain: coll.out)"
grep -qE "^dtrain: rank 0: step 4: gradient bucket .*(MPI_Iallreduce|ring all-reduce) .*did not complete within 3 s on rank 0.*ending the whole job \(exit 75\)" coll.out \
  && ok || bad "no collective timeout line naming rank 0, step 4, the collective and the limit: $(grep dtrain: coll.out)"
grep -qE "rank [0-9]+: watchdog:" coll.out && bad "a watchdog fired although the collective timed out first: $(grep -E "rank [0-9]+: watchdog:" coll.out)" || ok
[ "$(wc -l < coll/hang.txt 2>/dev/null)" = 1 ] \
  && grep -qE "^[0-9T:-]+Z rank 0: step 4: gradient bucket .*did not complete within 3 s" coll/hang.txt \
  && ok || bad "coll/hang.txt: $(cat coll/hang.txt 2>&1)"

# the next run in that directory tells why the last one ended, once
expect 0 "the previous run in coll ended on a hang \(hang.txt\): .* rank 0: step 4: gradient bucket" -- \
  $MPIRUN 2 "$DTRAIN" train job.yaml --set output.dir=coll
[ ! -e coll/hang.txt ] && ok || bad "coll/hang.txt was not removed after it was shown"
grep -q "ended on a hang" coll/train.log && ok || bad "the note is not in coll/train.log"
expect 0 "final test accuracy" -- $MPIRUN 2 "$DTRAIN" train job.yaml --set output.dir=coll --set train.epochs=2
grep -c "ended on a hang" coll/train.log | grep -qx 1 && ok || bad "the note was shown twice"

# --- every rank hangs outside a collective: the watchdogs act ------------------------
DTRAIN_FAULT=0:hang:3,1:hang:3 timeout 120 $MPIRUN 2 "$DTRAIN" train job.yaml --set output.dir=wd > wd.out 2>&1
rc=$?
[ "$rc" = 75 ] && ok || bad "watchdog: exit $rc, expected 75: $(grep dtrain: wd.out)"
grep -qE "^dtrain: rank [01]: watchdog: step 4 has been in phase 'forward/backward' for .*runtime.timeout_s=3 plus a grace of 10s.*exit 75" wd.out \
  && ok || bad "no watchdog line: $(grep dtrain: wd.out)"
grep -q "did not complete within" wd.out && bad "a collective timed out though no rank was in one" || ok
grep -qE "rank [01]: watchdog: step 4 has been in phase 'forward/backward'" wd/hang.txt 2>/dev/null \
  && ok || bad "wd/hang.txt: $(cat wd/hang.txt 2>&1)"

# --- under the restart supervisor: the second attempt finishes ----------------------
# (DTRAIN_FAULT acts in the first attempt only)
DTRAIN_FAULT=1:hang:3 timeout -k 10 300 "$DTRAIN" launch -n 2 --launcher mpirun \
  --launcher-arg --oversubscribe --launcher-arg --bind-to --launcher-arg none --backoff 0 \
  --max-restarts 2 -- train job.yaml --set output.dir=sup > sup.out 2>&1
rc=$?
[ "$rc" = 0 ] && ok || bad "launch: exit $rc: $(grep -E 'launch|dtrain:' sup.out | head -5)"
grep -q "attempt 1 ended with exit 75" sup.out && ok || bad "launch: attempt 1 did not end with 75: $(grep launch: sup.out)"
grep -qE "dtrain: rank 0: step 4: .*did not complete within 3 s" sup.out && ok || bad "launch: no collective timeout line"
grep -qE "the previous run in sup ended on a hang \(hang.txt\): .*rank 0: step 4" sup.out \
  && ok || bad "launch: attempt 2 does not show the note: $(grep -E 'warn|launch' sup.out | head -5)"
grep -qE "rank [0-9]+: watchdog:" sup.out && bad "launch: a watchdog fired: $(grep -E "rank [0-9]+: watchdog:" sup.out)" || ok

echo "watchdog: $pass passed, $fail failed"
[ "$fail" = 0 ]
