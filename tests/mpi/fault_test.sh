#!/usr/bin/env bash
# Checkpoints and recovery with real processes and real files. Every
# recovered run must end with the parameters of an uninterrupted run:
#   - kill -9 of a rank mid-step, mid-checkpoint and just after a commit,
#     restarted by `dtrain launch`: bit-identical;
#   - the newest checkpoints truncated and bit-flipped: skipped, the
#     previous good one used: bit-identical;
#   - a file-size limit (disk full) during a checkpoint: exit 74, earlier
#     checkpoints and `latest` untouched, no temporary file left;
#   - a hung rank: its peer's collective times out and aborts the job, the
#     supervisor restarts (and shows why): identical;
#   - resume on another world size: within 1e-5;
#   - SIGTERM: a checkpoint and exit 75, then resume: bit-identical;
#   - a NaN step: skipped and rolled back: bit-identical;
#   - a checkpoint of another model: refused with what differs;
#   - background checkpoint writes (checkpoint.async, on by default): the
#     same tensors as synchronous ones; a rank killed while a write is in
#     flight (the previous checkpoint resumed, bit-identical); a write so
#     slow that the next checkpoint waits (the log and metrics.jsonl say
#     how long); a stop with a write in flight (it is finished, then the
#     final state saved); a disk that fills during a background write
#     (exit 74 in the middle of the run, nothing earlier lost).
# Prints the count of faults injected and survived.
#   fault_test.sh DTRAIN COMPARE_MODELS WORKDIR
set -uo pipefail
DTRAIN=$1 COMPARE=$2 W=$3
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/fault_lib.sh" "  every_steps: 10
  every_minutes: 0
  keep_last: 10"
injected=0 survived=0
fault() { injected=$((injected + 1)); }
survive() { survived=$((survived + 1)); ok; }
term_at() { # LOG STEP DIR: once LOG shows step STEP, SIGTERM the ranks of the run in DIR
  for _ in $(seq 1 300); do grep -q "step $2/" "$1" 2>/dev/null && break; sleep 0.1; done
  for p in $(pgrep -x dtrain); do
    tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "output.dir=$3 " && kill -TERM "$p"
  done
}
# 60 steps, checkpoints at 10, 20, ..., 60

train 2 base > base.out 2>&1 || { cat base.out; exit 1; }
[ -f base/checkpoints/latest ] && ok || bad "no latest pointer"
"$DTRAIN" ckpt verify base/checkpoints > verify.out 2>&1 && ok || bad "verify: $(cat verify.out)"
"$DTRAIN" ckpt list base > list.out 2>&1 && grep -q "ckpt-0000000060" list.out && ok \
  || bad "ckpt list: $(cat list.out)"

# --- kill -9 at several points, restarted by the supervisor --------------------
for spec in "1:kill:25" "0:kill:20" "1:ckptkill:30" "0:kill:59"; do
  fault
  dir=kill_${spec//:/_}
  DTRAIN_FAULT=$spec launch 2 "$dir" > "$dir.out" 2>&1
  rc=$?
  if [ "$rc" = 0 ] && same base "$dir" && grep -q "attempt 2" "$dir.out"; then survive
  else bad "$spec: exit $rc, $(tail -5 "$dir.out")"; fi
done
ls kill_1_ckptkill_30/checkpoints/.ckpt-* >/dev/null 2>&1 \
  && bad "temporary checkpoint left after recovery" || ok

# --- damaged checkpoints are skipped ----------------------------------------------
cp -r base damaged
truncate -s 2000 damaged/checkpoints/ckpt-0000000060.h5
"$PY" - damaged/checkpoints/ckpt-0000000050.h5 <<'PY'
import sys
p = sys.argv[1]
data = bytearray(open(p, "rb").read())
data[len(data) // 2] ^= 0x10
open(p, "wb").write(data)
PY
fault; fault
"$DTRAIN" ckpt verify damaged/checkpoints > dverify.out 2>&1
[ $? = 65 ] && grep -q "0000000060.*BAD" dverify.out && ok || bad "verify missed damage: $(cat dverify.out)"
rm damaged/model.h5
train 2 damaged > damaged.out 2>&1
if grep -q "skipping checkpoint .*0000000060" damaged.out && grep -q "skipping checkpoint .*0000000050" damaged.out \
   && grep -q "resumed from .*0000000040" damaged.out && same base damaged; then survive; survive
else bad "damaged checkpoints: $(grep -E 'skip|resumed|error' damaged.out)"; fi

# --- disk full: the run directory on a small file system ---------------------------
# (a 1 MiB tmpfs, filled after the first checkpoint to 32 KiB free: room
# for model.h5, about 9 KiB, and the run's growing logs, but not for a
# checkpoint, about 48 KiB)
mkdir -p small
if mount -t tmpfs -o size=1m dtrain-test small 2>/dev/null; then
  trap 'umount "$W/small" 2>/dev/null' EXIT
  train 2 small/run --set train.steps=10 > full1.out 2>&1 || bad "full: first run: $(tail -3 full1.out)"
  free=$(df --output=avail -B1 small | tail -n 1)
  head -c $((free - 32768)) /dev/zero > small/filler 2>/dev/null
  before=$(md5sum small/run/checkpoints/* | sort)
  fault
  train 2 small/run --set train.steps=20 > full2.out 2>&1
  rc=$?
  after=$(md5sum small/run/checkpoints/* | sort)
  if [ "$rc" = 74 ] && [ "$before" = "$after" ] && ! ls small/run/checkpoints/.ckpt-* >/dev/null 2>&1 \
     && grep -q "dtrain: .*ckpt-0000000020" full2.out; then
    survive
  else bad "disk full: exit $rc, $(grep dtrain: full2.out | head -3)"; fi
  # checkpoint.on_error=continue: warn and train on
  train 2 small/run --set train.steps=20 --set checkpoint.on_error=continue > full3.out 2>&1
  rc=$?
  [ "$rc" = 0 ] && grep -q "checkpoint not written, training continues" full3.out \
    && [ "$before" = "$(md5sum small/run/checkpoints/* | sort)" ] && ok \
    || bad "on_error=continue: exit $rc: $(grep -E 'dtrain:|warn' full3.out | head -3)"
  # the same failure found in the middle of the run: the background write
  # of step 20 fails, the run ends with it at once (not at the next
  # checkpoint or the end), exit 74, nothing earlier touched (last:
  # its log lines take the space the runs above need)
  fault
  train 2 small/run --set train.steps=60 --set checkpoint.every_steps=20 > full4.out 2>&1
  rc=$?
  if [ "$rc" = 74 ] && [ "$before" = "$(md5sum small/run/checkpoints/* | sort)" ] \
     && ! ls small/run/checkpoints/.ckpt-* >/dev/null 2>&1 && grep -q "dtrain: .*ckpt-0000000020" full4.out \
     && ! grep -q "step 40/" full4.out; then
    survive
  else bad "disk full in a background write: exit $rc, $(grep -E 'dtrain:|step 40/' full4.out | head -3)"; fi
  umount small
  trap - EXIT
else
  echo "SKIP: disk full (mounting a small tmpfs needs root)"
fi

# --- a hung rank --------------------------------------------------------------------
fault
DTRAIN_FAULT=1:hang:33 launch 2 hang --set runtime.timeout_s=3 > hang.out 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -qE "dtrain: rank 0: step 34: .*did not complete within 3 s" hang.out \
   && grep -q "ended on a hang (hang.txt)" hang.out && same base hang; then survive
else bad "hang: exit $rc: $(grep -E 'did not complete|rank [0-9]+: watchdog:|attempt|error' hang.out | head -5)"; fi

# --- another world size ---------------------------------------------------------------
fault
DTRAIN_FAULT=2:kill:35 train 4 resize > resize1.out 2>&1
train 2 resize > resize2.out 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -q "resumed from .*0000000030" resize2.out && same base resize 1e-5; then
  survive
else bad "resume on another world size: exit $rc: $(grep -E 'resumed|error|dtrain:' resize2.out | head)"; fi

# --- SIGTERM: checkpoint, exit 75, resume ----------------------------------------------
fault
train 2 term --set train.epochs=40 > term1.out 2>&1 &
pid=$!
term_at term1.out 50 term
wait "$pid"
rc=$?
if [ "$rc" = 75 ] && grep -qE "stopped by SIGTERM on [12] of 2 ranks after step" term1.out; then ok; else bad "SIGTERM: exit $rc: $(tail -3 term1.out)"; fi
train 2 term --set train.epochs=40 > term2.out 2>&1 && train 2 termbase --set train.epochs=40 > termbase.out 2>&1
if same termbase term && grep -q "resumed from" term2.out; then survive
else bad "SIGTERM resume differs: $(grep -E 'resumed|error' term2.out)"; fi

# --- a NaN step: skipped, rolled back ---------------------------------------------------
fault
DTRAIN_FAULT=0:nan:24 train 2 nan --set runtime.max_bad_steps=1 > nan.out 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -q "rolled back to step 20" nan.out && same base nan; then survive
else bad "NaN rollback: exit $rc: $(grep -E 'not finite|rolled|error' nan.out | head)"; fi
DTRAIN_FAULT=0:nan:4 train 2 nan2 --set runtime.max_bad_steps=1 > nan2.out 2>&1
[ $? = 64 ] && grep -q "no checkpoint to roll back to" nan2.out && ok || bad "NaN without checkpoint: $(tail -2 nan2.out)"

# --- a checkpoint of another job ------------------------------------------------------------
cp -r base other && rm other/model.h5
train 2 other --set model.hidden=[16] > other.out 2>&1
[ $? = 64 ] && grep -q "belongs to another job: model.hidden (width): job 16, checkpoint 32" other.out \
  && ok || bad "incompatible checkpoint: $(grep dtrain: other.out)"

# --- --resume PATH and --resume never ---------------------------------------------------------
train 2 frompath --resume "$W/base/checkpoints/ckpt-0000000030.h5" > frompath.out 2>&1
grep -q "resumed from .*ckpt-0000000030.h5" frompath.out && same base frompath && ok \
  || bad "--resume PATH: $(grep -E 'resumed|dtrain:' frompath.out)"
cp -r base again && rm again/model.h5
train 2 again --resume never > again.out 2>&1
! grep -q "resumed from" again.out && grep -q "step 60/60" again.out && same base again && ok \
  || bad "--resume never: $(grep -E 'resumed|dtrain:' again.out)"

# --- evaluate a checkpoint on any number of ranks -----------------------------------------------
a=$(timeout -k 10 120 $MPIRUN 1 "$DTRAIN" eval job.yaml --checkpoint base/checkpoints/ckpt-0000000060.h5 2>/dev/null | grep "^test loss")
b=$(timeout -k 10 120 $MPIRUN 3 "$DTRAIN" eval job.yaml --checkpoint base/checkpoints/ckpt-0000000060.h5 2>/dev/null | grep "^test loss")
[ -n "$a" ] && [ "${a%% (*}" = "${b%% (*}" ] && ok || bad "eval on 1 and 3 ranks: '$a' vs '$b'"

# --- background checkpoint writes ---------------------------------------------------------------
# base wrote its periodic checkpoints in the background; the same job
# written synchronously holds the same tensors and ends the same
train 2 syncbase --set checkpoint.async=off > syncbase.out 2>&1
if grep -q "written (checkpoint.every_steps) in the background" base.out \
   && ! grep -q "in the background" syncbase.out && same base syncbase \
   && h5diff base/checkpoints/ckpt-0000000030.h5 syncbase/checkpoints/ckpt-0000000030.h5 /params /params \
   && h5diff base/checkpoints/ckpt-0000000030.h5 syncbase/checkpoints/ckpt-0000000030.h5 /optim /optim; then ok
else bad "background and synchronous checkpoints differ: $(grep -E 'ckpt|error' syncbase.out | head -3)"; fi
# a rank killed while its write of step 20 is held in flight: step 10's is resumed
fault
DTRAIN_FAULT=1:slowckpt:3000,1:bgkill:25 launch 2 bgkill > bgkill.out 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -q "killing itself at step 26 with a background checkpoint in flight" bgkill.out \
   && grep -q "resumed from .*ckpt-0000000010" bgkill.out && same base bgkill \
   && ! ls bgkill/checkpoints/.ckpt-* >/dev/null 2>&1; then survive
else bad "killed during a background write: exit $rc: $(grep -E 'killing|resumed|error' bgkill.out | head -4)"; fi
# each write held 400 ms: the next checkpoint waits for it, and says how long
DTRAIN_FAULT=0:slowckpt:400 train 2 slow > slow.out 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -q "the checkpoint waited [0-9.]*s for the one before it" slow.out && same base slow \
   && "$PY" - slow/metrics.jsonl <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"checkpoint"' in l]
recs = [r for r in recs if r.get("type") == "checkpoint"]
assert [r["step"] for r in recs] == [10, 20, 30, 40, 50, 60], recs
assert all(r["mode"] == "background" for r in recs), recs
assert max(r["checkpoint_wait_s"] for r in recs) > 0.2, recs
assert all(r["write_s"] > 0.4 for r in recs), recs
PY
then ok; else bad "slow background writes: exit $rc: $(grep -E 'waited|error' slow.out | head -3)"; fi
# SIGTERM while a write is held in flight: it is finished, then the final state saved
fault
DTRAIN_FAULT=1:slowckpt:2000 train 2 bgterm --set train.epochs=40 --set checkpoint.every_steps=50 \
  > bgterm1.out 2>&1 &
pid=$!
term_at bgterm1.out 60 bgterm
wait "$pid"
rc=$?
final=$(sed -n 's/.*checkpoint \(.*ckpt-[0-9]*\.h5\) written (stop requested).*/\1/p' bgterm1.out)
if [ "$rc" = 75 ] && grep -q "ckpt-0000000050.h5 written (checkpoint.every_steps) in the background" bgterm1.out \
   && [ -n "$final" ] && [ "$(cat bgterm/checkpoints/latest)" = "$(basename "$final")" ]; then ok
else bad "SIGTERM with a write in flight: exit $rc: $(grep -E 'ckpt|stop|error' bgterm1.out | tail -4)"; fi
train 2 bgterm --set train.epochs=40 --set checkpoint.every_steps=50 > bgterm2.out 2>&1
if same termbase bgterm && grep -q "resumed from" bgterm2.out; then survive
else bad "SIGTERM with a write in flight: the resumed run differs: $(grep -E 'resumed|error' bgterm2.out)"; fi

echo "faults injected: $injected, survived: $survived"
echo "fault_test: $pass passed, $fail failed"
[ "$fail" = 0 ]
