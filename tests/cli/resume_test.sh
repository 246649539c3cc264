#!/usr/bin/env bash
# Which state a run continues from, end to end: starting over and then
# crashing resumes the new run, never the old one (whose checkpoints are
# moved aside, unchanged); a resume from another checkpoint becomes the
# new run's starting point; files in checkpoints/ that dtrain did not
# write are never replaced; a checkpoint of a job that differs is said.
#   resume_test.sh DTRAIN MAKE_H5 COMPARE_MODELS WORKDIR
set -uo pipefail
DTRAIN=$1
MAKE_H5=$2
COMPARE=$3
W=$4
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/../mpi/mpirun.sh"
rm -rf "$W" && mkdir -p "$W"
cd "$W"
source "$HERE/lib.sh"
sums() { (cd "$1" && md5sum -- * 2>/dev/null | sort); }

"$MAKE_H5" data.h5 512 128 16 4 || { echo "cannot make data"; exit 1; }
cat > job.yaml <<JOB
model:
  hidden: [16]
  dropout: 0
data:
  path: data.h5
train:
  epochs: 1
  global_batch: 64
  log_every: 4
  optimizer:
    lr: 0.01
runtime:
  threads: 1
  progress: lines
checkpoint:
  every_steps: 1
  keep_last: 3
output:
  dir: run
JOB
T="$DTRAIN train job.yaml"

# --- starting over, then a crash, then the ordinary restart ---------------------
expect 0 "final test accuracy" -- $T
before=$(sums run/checkpoints)
DTRAIN_FAULT=0:kill:3 $T --resume never --set train.optimizer.lr=0.05 > never.out 2>&1
rc=$?
[ "$rc" = 137 ] && ok || bad "the killed run exited $rc: $(tail -3 never.out)"
grep -q "starting over (--resume never): the checkpoints of the earlier run in run/checkpoints were moved to run/checkpoints.1" never.out \
  && ok || bad "no word of the old checkpoints moved aside: $(grep -i ckpt never.out | head -3)"
[ "$(sums run/checkpoints.1)" = "$before" ] && ok || bad "the old run's checkpoints changed when moved aside"
expect 0 "resumed from run/checkpoints/ckpt-0000000003.h5: step 3" -- $T --set train.optimizer.lr=0.05
[ "$(sums run/checkpoints.1)" = "$before" ] && ok || bad "the old run's checkpoints changed after the restart"
# the result is the new run's: the same bits as the run with lr 0.05 that never stopped
expect 0 "final test accuracy" -- $T --set train.optimizer.lr=0.05 --set output.dir=clean
"$COMPARE" run/model.h5 clean/model.h5 0 >/dev/null && ok || bad "the restarted run did not end as the new run"
# a restart that forgets the new learning rate says so
expect 0 "was written by a job that differs from this one in 1 key; .*train.optimizer.lr: this job 0.01, checkpoint 0.05" -- $T
# a crash before the new run's first checkpoint resumes nothing old either
DTRAIN_FAULT=0:kill:0 $T --resume never --set output.dir=clean > early.out 2>&1
expect 0 "no checkpoint in clean/checkpoints: starting fresh" -- $T --set output.dir=clean
[ -d clean/checkpoints.1 ] && [ "$(ls clean/checkpoints.1 | grep -c '^ckpt-')" = 3 ] && ok \
  || bad "clean/checkpoints.1: $(ls clean/checkpoints.1 2>&1)"

# --- resuming from another checkpoint starts a new run from it -----------------
expect 0 "final test accuracy" -- $T --set output.dir=branch
old=$(sums branch/checkpoints)
cp branch/checkpoints/ckpt-0000000006.h5 six.h5
DTRAIN_FAULT=0:kill:7 $T --set output.dir=branch --set train.optimizer.lr=0.02 --resume six.h5 > branch.out 2>&1
grep -q "resuming from another checkpoint: the checkpoints of the earlier run in branch/checkpoints were moved to branch/checkpoints.1" branch.out \
  && ok || bad "branch: $(grep -i ckpt branch.out | head -3)"
grep -q "checkpoint branch/checkpoints/ckpt-0000000006.h5 written (the starting point of this run)" branch.out \
  && ok || bad "branch: the starting point was not saved: $(grep -i ckpt branch.out | head -3)"
[ "$(sums branch/checkpoints.1)" = "$old" ] && ok || bad "branch: the earlier checkpoints changed"
# the restart takes the new run's step 7, written with this job's learning rate
expect 0 "resumed from branch/checkpoints/ckpt-0000000007.h5: step 7" -- $T --set output.dir=branch --set train.optimizer.lr=0.02
cp -r branch branch-copy
$T --set output.dir=branch-copy --set train.optimizer.lr=0.02 \
  --resume branch-copy/checkpoints/ckpt-0000000007.h5 > again.out 2>&1
grep -q "differs from this one" again.out && bad "branch: step 7 is not the new run's: $(grep differs again.out)" || ok
# resuming from the newest checkpoint by its path continues the run in place
expect 0 "already reached step 8" -- $T --set output.dir=branch --set train.optimizer.lr=0.02 \
  --resume branch/checkpoints/ckpt-0000000008.h5
[ ! -e branch/checkpoints.2 ] && ok || bad "resuming from the newest checkpoint moved the run's checkpoints"

# --- files dtrain did not write in checkpoints/ ---------------------------------
expect 0 "final test accuracy" -- $T --set output.dir=foreign
echo "my notes" > foreign/checkpoints/ckpt-0000000009.h5
mkfifo foreign/checkpoints/ckpt-0000000010.h5
cp data.h5 foreign/checkpoints/ckpt-0000000011.h5
mine=$(cd foreign/checkpoints && md5sum ckpt-0000000009.h5 ckpt-0000000011.h5)
expect 0 "step 9: checkpoint foreign/checkpoints/ckpt-0000000009-2.h5 written" -- timeout 120 $T --set output.dir=foreign --set train.epochs=2
[ "$(cd foreign/checkpoints && md5sum ckpt-0000000009.h5 ckpt-0000000011.h5)" = "$mine" ] && ok \
  || bad "the user's files in checkpoints/ changed"
[ -p foreign/checkpoints/ckpt-0000000010.h5 ] && ok || bad "the FIFO was replaced"
[ "$(ls foreign/checkpoints | grep -c '^ckpt-00000000\(1[4-6]\)\.h5$')" = 3 ] && ok \
  || bad "retention kept: $(ls foreign/checkpoints)"
# and the run resumes past them
expect 0 "resumed from foreign/checkpoints/ckpt-0000000016.h5" -- timeout 120 $T --set output.dir=foreign --set train.epochs=2

# --- on two ranks ---------------------------------------------------------------
expect 0 "final test accuracy" -- $MPIRUN 2 $DTRAIN train job.yaml --set output.dir=two
DTRAIN_FAULT=1:kill:2 $MPIRUN 2 $DTRAIN train job.yaml --set output.dir=two --resume never \
  --set train.optimizer.lr=0.05 > two.out 2>&1
expect 0 "resumed from two/checkpoints/ckpt-0000000002.h5: step 2" -- $MPIRUN 2 $DTRAIN train job.yaml \
  --set output.dir=two --set train.optimizer.lr=0.05
expect 0 "final test accuracy" -- $MPIRUN 2 $DTRAIN train job.yaml --set output.dir=two-clean \
  --set train.optimizer.lr=0.05
"$COMPARE" two/model.h5 two-clean/model.h5 0 >/dev/null && ok || bad "2 ranks: the restarted run did not end as the new run"

echo "resume: $pass passed, $fail failed"
[ "$fail" = 0 ]
