#!/usr/bin/env bash
# Bad input as an adversarial user gives it, end to end: a run directory
# that is not dtrain's or is in use, data and results that are not finite,
# sizes no machine holds, inputs that are not files. Each case checks the
# exit code, the message, and that nothing was lost or half written.
#   hardening_test.sh DTRAIN MAKE_H5 WORKDIR
set -uo pipefail
DTRAIN=$1
MAKE_H5=$2
W=$3
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/../mpi/mpirun.sh"
rm -rf "$W" && mkdir -p "$W"
cd "$W"
source "$HERE/lib.sh"
# every line of a metrics file parses as JSON
json_ok() { python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$1"; }

"$MAKE_H5" data.h5 512 128 16 4 || { echo "cannot make data"; exit 1; }
cat > job.yaml <<JOB
model:
  hidden: [16]
  dropout: 0
data:
  path: data.h5
train:
  epochs: 2
  global_batch: 32
  eval_batch: 64
  log_every: 4
  optimizer:
    lr: 0.01
runtime:
  threads: 1
  progress: lines
output:
  dir: run
JOB
T="$DTRAIN train job.yaml"

# --- the run directory -----------------------------------------------------------
# a folder of the user's is refused, and left exactly as it was
mkdir mine && echo "my own notes" > mine/config.yaml && echo "weights" > mine/model.h5
sum=$(cat mine/* | md5sum)
expect 64 "output.dir mine already exists, is not empty and is not a dtrain run directory.*output.adopt" -- $T --set output.dir=mine
[ "$(cat mine/* | md5sum)" = "$sum" ] && [ "$(ls -A mine | wc -l)" = 2 ] && ok || bad "refused run changed mine/: $(ls -A mine)"
# ... unless the job asks for it
expect 0 "final test accuracy" -- $T --set output.dir=mine --set output.adopt=true
[ -f mine/.dtrain-run ] && ok || bad "adopted directory has no marker"
# the current directory is the classic slip
expect 64 "output.dir \. already exists" -- $T --set output.dir=.
# an empty folder, a new one, and the run's own folder again are fine
mkdir empty
expect 0 "final test accuracy" -- $T --set output.dir=empty
grep -q "^dtrain run directory" empty/.dtrain-run && ok || bad "no marker text"
expect 0 "already reached step" -- $T --set output.dir=empty
# a run directory written before the marker existed is recognised
cp -r empty legacy && rm legacy/.dtrain-run
expect 0 "already reached step" -- $T --set output.dir=legacy
[ -f legacy/.dtrain-run ] && ok || bad "legacy run directory not marked"
# a file where the directory should be
echo x > afile
expect 64 "output.dir afile exists and is not a directory" -- $T --set output.dir=afile

# a second run on a directory in use: exit 75 naming the holder; the
# first run is not disturbed, and once it is killed the lock is free
DTRAIN_FAULT=0:hang:3 $T --set output.dir=busy --set train.log_every=1 > busy1.out 2>&1 &
pid=$!
for _ in $(seq 1 200); do grep -q "step 2/" busy1.out 2>/dev/null && break; sleep 0.1; done
expect 75 "output.dir busy is in use by another dtrain run \(pid $pid on host $(hostname) since" -- $T --set output.dir=busy
expect 75 "in use by another dtrain run \(pid $pid" -- $MPIRUN 2 $DTRAIN train job.yaml --set output.dir=busy
kill -0 "$pid" 2>/dev/null && ok || bad "the first run died: $(tail -3 busy1.out)"
kill -9 "$pid"; wait "$pid" 2>/dev/null
expect 0 "final test accuracy" -- $T --set output.dir=busy
# two runs started together: one trains, the other exits 75 at once (the
# runs are long enough, a few seconds, that the first cannot finish before
# the second starts, however the two are scheduled)
$T --set output.dir=race --set train.epochs=600 > race1.out 2>&1 & p1=$!
$T --set output.dir=race --set train.epochs=600 > race2.out 2>&1 & p2=$!
wait $p1; r1=$?; wait $p2; r2=$?
codes=$(printf '%s\n' $r1 $r2 | sort | tr '\n' ' ')
[ "$codes" = "0 75 " ] && ok || bad "two runs on one directory exited $r1 and $r2: $(tail -n 2 race1.out; tail -n 2 race2.out)"
grep -h "in use" race1.out race2.out | grep -q "pid" && ok || bad "the loser did not name the holder"
expect 0 "already reached step" -- $T --set output.dir=race

# --- data and results that are not finite ------------------------------------------
"$MAKE_H5" nan_test.h5 512 128 16 4 test:7:3=nan
expect 65 "nan_test.h5.*test.*row 7" -- $T --set data.path=nan_test.h5 --set output.dir=nan1
"$MAKE_H5" inf_train.h5 512 128 16 4 train:300:0=inf
expect 65 "inf_train.h5.*train.*row 300" -- $T --set data.path=inf_train.h5 --set output.dir=nan2
# finite inputs so large that the model's outputs overflow on the test split:
# the final evaluation is not finite, so the run is not a success
"$MAKE_H5" huge_test.h5 512 128 16 4 $(for c in $(seq 0 15); do printf 'test:5:%d=3e38 ' "$c"; done)
expect 64 "training diverged: the final test loss is NaN" -- $T --set data.path=huge_test.h5 --set output.dir=diverged
grep -q '"type":"eval".*"loss":null' diverged/metrics.jsonl && ok || bad "non-finite loss not written as null: $(grep eval diverged/metrics.jsonl | tail -1)"
json_ok diverged/metrics.jsonl && ok || bad "metrics.jsonl is not valid JSON"
[ ! -e diverged/model.h5 ] && ok || bad "a diverged run wrote model.h5"
expect 64 "gives a test loss of NaN" -- $DTRAIN eval job.yaml --set data.path=huge_test.h5 --checkpoint empty/checkpoints/ckpt-0000000032.h5

# --- sizes -------------------------------------------------------------------------
"$MAKE_H5" empty_test.h5 512 0 16 4
expect 65 "split 'test' \(data.test_split\) holds no samples" -- $T --set data.path=empty_test.h5 --set output.dir=e1
"$MAKE_H5" empty_train.h5 0 64 16 4
expect 65 "split 'train' \(data.train_split\) holds no samples" -- $T --set data.path=empty_train.h5 --set output.dir=e2
expect 64 "train.schedule.warmup_steps \(100\) is longer than the whole run \(32 steps" -- $T --set train.schedule.warmup_steps=100 --set output.dir=w1
# an evaluation batch larger than the test split is cut to the split
expect 0 "final test accuracy" -- $T --set train.eval_batch=1000000000 --set output.dir=evbig
expect 64 "train.eval_batch: expected an integer from 1 to 1000000000" -- $T --set train.eval_batch=4611686018427387904

# a model no machine holds is refused before anything is allocated, with the
# numbers, instead of being killed by the kernel; and so is one past the
# job's own runtime.memory_limit
# (with a periodic checkpoint written in the background, its snapshot of
# the parameters and the optimizer state counts too)
expect 64 "needs about 28.0 TiB of host memory on each rank \(parameters 4.00 TiB.*checkpoint staging 12.0 TiB.*can have at most" -- $T --set model.hidden=[1048576,1048576] --set output.dir=m1
expect 64 "needs about 16.0 TiB of host memory on each rank \(parameters 4.00 TiB.*checkpoint staging 0 B.*can have at most" -- $T --set model.hidden=[1048576,1048576] --set output.dir=m1 --set checkpoint.async=off
# one that fits only without the background write's snapshot is told so
# (a limit halfway through the snapshot, read off a first refusal: the
# process's own size differs between builds)
need=$($T --set model.hidden=[4096,4096] --set runtime.memory_limit=0.0001 --set output.dir=m3a 2>&1 |
       sed -n 's/.*needs about \([0-9.]*\) MiB .*checkpoint staging \([0-9.]*\) MiB.*/\1 \2/p' | head -1)
lim=$(awk '{ if (NF == 2) printf "%.6f", ($1 - $2 / 2) / 1024 }' <<<"$need")
if [ -n "$lim" ]; then
  expect 64 "more than runtime.memory_limit=$lim GiB: raise the limit, or set checkpoint.async: off \(.*without the [0-9.]+ MiB snapshot" -- $T --set model.hidden=[4096,4096] --set runtime.memory_limit=$lim --set output.dir=m4
  expect 0 "" -- $T --set model.hidden=[4096,4096] --set runtime.memory_limit=$lim --set checkpoint.async=off --set train.steps=2 --set output.dir=m5
else
  bad "no memory figures for the snapshot's advice: '$need'"
fi
expect 64 "more than runtime.memory_limit=0.01 GiB" -- $T --set runtime.memory_limit=0.01 --set output.dir=m2
expect 64 "needs about .*more than runtime.memory_limit" -- $MPIRUN 2 $DTRAIN train job.yaml --set runtime.memory_limit=0.01 --set output.dir=m3

# a checkpoint whose position this job cannot take (the training split
# shrank since): bad data, said at resume, not a loader error later
"$MAKE_H5" small.h5 256 128 16 4
expect 0 "" -- $T --set output.dir=pos --set train.steps=10 --set checkpoint.every_steps=10
expect 65 "its position \(step 10, epoch 0, batch 10.*does not fit this job \(8 batches per epoch" -- $T --set output.dir=pos --set train.steps=20 --set data.path=small.h5

# --- inputs that are not regular files ----------------------------------------------
mkfifo fifo
expect 66 "job file fifo: not a regular file \(it is a FIFO\)" -- $DTRAIN train fifo
expect 66 "dataset fifo: not a regular file \(it is a FIFO\)" -- $T --set data.path=fifo --set output.dir=f1
expect 66 "not a regular file \(it is a FIFO\)" -- $DTRAIN data info fifo
expect 66 "not a regular file" -- $DTRAIN data import idx --train-images fifo --train-labels fifo -o f.h5
expect 66 "not a regular file \(it is a directory\)" -- $DTRAIN data import idx --train-images mine --train-labels mine -o f.h5
expect 66 "not a regular file \(it is a directory\)" -- $DTRAIN train mine
expect 66 "checkpoint fifo: not a regular file \(it is a FIFO\)" -- $DTRAIN ckpt verify fifo
expect 66 "checkpoint fifo: not a regular file \(it is a FIFO\)" -- $DTRAIN ckpt info fifo
expect 66 "not a regular file \(it is a FIFO\)" -- $T --set output.dir=f2 --resume fifo
# a benchmark buffer larger than the machine is a usage error, not "out of memory" (75)
expect 64 "--max-bytes 99999999999999 \(90.9 TiB\) is more than rank 0" -- $DTRAIN bench allreduce --max-bytes 99999999999999
expect 64 "--mode 'fast' is not blocking, ring or library" -- $DTRAIN bench allreduce --mode fast
expect 64 "--mode ring applies to --backend mpi only" -- $DTRAIN bench allreduce --mode ring --backend nccl
# the training all-reduce, both ways, checked on every rank
for mode in ring library; do
  expect 0 "non-blocking, as in training" -- \
    $MPIRUN 2 $DTRAIN bench allreduce --min-bytes 64K --max-bytes 1M --iters 3 --mode $mode
done

# a FIFO where the run writes its metrics is an error, not a hang
mkdir -p fiforun && expect 0 "final test accuracy" -- $T --set output.dir=fiforun
rm fiforun/metrics.jsonl && mkfifo fiforun/metrics.jsonl
expect 74 "metrics file 'fiforun/metrics.jsonl': not a regular file \(it is a FIFO\)" -- $T --set output.dir=fiforun

# --- files of the run directory -------------------------------------------------------
# a FIFO named like the hang note is named, not read (a read would block
# for ever), and left alone; a long note goes into the log cut to size
mkdir -p noterun && expect 0 "final test accuracy" -- $T --set output.dir=noterun
mkfifo noterun/hang.txt
expect 0 "hang note noterun/hang.txt: not a regular file \(it is a FIFO\); it is left as it is" -- \
  timeout 120 $T --set output.dir=noterun --set train.epochs=3
[ -p noterun/hang.txt ] && ok || bad "the FIFO hang.txt was removed"
rm noterun/hang.txt
python3 -c 'import sys; sys.stdout.write(("w" * 5000 + "\n") * 40)' > noterun/hang.txt
out=$(timeout 120 $T --set output.dir=noterun --set train.epochs=4 2>&1)
n=$(grep -c "ended on a hang (hang.txt): w" <<<"$out")
long=$(grep "ended on a hang" <<<"$out" | awk '{ if (length($0) > m) m = length($0) } END { print m + 0 }')
[ "$n" = 32 ] && [ "$long" -lt 1200 ] && grep -q "8 more lines not shown" <<<"$out" && ok \
  || bad "hang note copied $n lines, the longest $long bytes: $(grep -c . <<<"$out") lines of output"
[ ! -e noterun/hang.txt ] && ok || bad "the hang note was not removed after it was shown"
# a metrics.jsonl that ends in half a record (a run killed inside the
# write, a full disk) loses that half line: the next record starts its own
printf '{"time":1,"type":"tra' >> noterun/metrics.jsonl
echo "half a log li" | tr -d '\n' >> noterun/train.log
expect 0 "noterun/metrics.jsonl ended in an incomplete record \(21 bytes" -- \
  $T --set output.dir=noterun --set train.epochs=5
json_ok noterun/metrics.jsonl && ok || bad "metrics.jsonl is not JSON lines after the repair"
grep -q "^half a log li$" noterun/train.log && ok || bad "the log's half line was not ended: $(grep -n 'half a log' noterun/train.log)"

# a model.h5 temporary that a killed run left is removed by the next save;
# one of another host is not
dead=$(sh -c 'echo $$')
host=$(hostname | tr -c 'A-Za-z0-9._\n-' '_')
echo stale > "noterun/model.h5.tmp.$host.$dead"
echo other > noterun/model.h5.tmp.otherhost.$dead
expect 0 "final test accuracy" -- $T --set output.dir=noterun --set train.epochs=6
[ ! -e "noterun/model.h5.tmp.$host.$dead" ] && [ -e noterun/model.h5.tmp.otherhost.$dead ] && ok \
  || bad "model.h5 temporaries: $(ls noterun)"

# --- what a file is, when it is given as another kind ---------------------------------
python3 - <<'PY'
import struct
def npy(path, shape, descr, data):
    hdr = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    hdr += " " * (63 - (len(hdr) + 10) % 64) + "\n"
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + data)
npy("kx.npy", "(8, 4)", "<f4", struct.pack("<32f", *range(32)))
npy("ky.npy", "(8,)", "<i8", struct.pack("<8q", *[0, 1] * 4))
PY
expect 0 "" -- $DTRAIN data import npy --train-x kx.npy --train-y ky.npy -o kinds.h5
expect 65 "kinds.h5 +BAD: not a dtrain checkpoint \(it is a dtrain dataset\)" -- $DTRAIN ckpt verify kinds.h5
expect 65 "checkpoint kinds.h5 is not a dtrain checkpoint \(it is a dtrain dataset\)" -- \
  $T --set output.dir=kinds --resume kinds.h5
expect 65 "checkpoint kinds.h5 is not a dtrain checkpoint \(it is a dtrain dataset\)" -- \
  $DTRAIN eval job.yaml --checkpoint kinds.h5
expect 65 "dataset empty/model.h5 is not a dtrain dataset \(it is a dtrain model file\)" -- $DTRAIN data info empty/model.h5
expect 65 "is not a dtrain dataset \(it is a dtrain checkpoint\)" -- $DTRAIN data info empty/checkpoints/ckpt-0000000032.h5

# --- cannot be found or opened: 66, whatever the reason ---------------------------------
expect 66 "dataset nodir/\*.h5: the pattern matches no file: nodir does not exist" -- $DTRAIN data info 'nodir/*.h5'
expect 66 "dataset nodir/\*.h5: the pattern matches no file: nodir does not exist" -- $T --set 'data.path=nodir/*.h5' --set output.dir=g1
ln -s loopb loopa && ln -s loopa loopb
expect 66 "dataset loopa: cannot open it: Too many levels of symbolic links" -- $DTRAIN data info loopa
expect 66 "job file loopa: cannot open it: Too many levels of symbolic links" -- $DTRAIN train loopa
expect 66 "checkpoint loopa: cannot open it: Too many levels of symbolic links" -- $DTRAIN ckpt verify loopa
expect 66 "the pattern matches no file: directory loopa cannot be read: Too many levels" -- $DTRAIN data info 'loopa/*.h5'

# --- a working directory longer than the system's path limit ---------------------------
# MPI-IO (checkpoints) and HDF5 (a symbolic link) need the full path: the
# run is refused before it starts, with what to change, instead of crashing
# at the final checkpoint
deep=$(mktemp -d "$W/deep.XXXX")
( cd "$deep" && for i in $(seq 1 45); do d=$(printf 'd%098d' "$i"); mkdir "$d" && cd "$d" || exit 1; done
  cp "$W/data.h5" "$W/job.yaml" . && ln -s data.h5 link.h5
  out=$(timeout 120 $DTRAIN train job.yaml 2>&1); rc=$?
  [ "$rc" = 64 ] && grep -q "output.dir 'run' is relative, but the current directory's path is longer than the system's limit of 4095 bytes" <<<"$out" \
    && echo PASS || echo "FAIL: long cwd train exited $rc: $(tail -2 <<<"$out")"
  [ ! -e run/checkpoints ] && echo PASS || echo "FAIL: the refused run wrote into run/"
  out=$(timeout 120 $DTRAIN data info link.h5 2>&1); rc=$?
  [ "$rc" = 64 ] && grep -q "dataset 'link.h5' is relative, but the current directory's path is longer" <<<"$out" \
    && ! grep -q damaged <<<"$out" && echo PASS || echo "FAIL: long cwd data info exited $rc: $out"
  out=$(timeout 120 $DTRAIN train job.yaml --set output.dir="$W/deeprun" --set data.path=link.h5 2>&1); rc=$?
  [ "$rc" = 64 ] && grep -q "data.path 'link.h5' is relative" <<<"$out" && echo PASS \
    || echo "FAIL: long cwd data.path exited $rc: $(tail -2 <<<"$out")"
) > deep.out 2>&1
[ "$(grep -c '^PASS$' deep.out)" = 4 ] && ok || bad "long working directory: $(grep -v '^PASS$' deep.out)"
rm -rf "$deep"

# --- ranks of one job that do not run the same thing ----------------------------------
# started under one mpirun on different subcommands (MPMD: -np 1 A : -np 1
# B), with different options or jobs: every rank stops at start-up, at
# once, with one message naming what differs (64); nothing runs, nothing
# hangs (a hang ends at the timeout, 124)
export OMPI_MCA_btl=self,vader
MPMD=(timeout 120 mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && MPMD+=(--allow-run-as-root)
ck=empty/checkpoints/ckpt-0000000032.h5
diff_cmd="^dtrain: rank 1: the command differs from rank 0's: here"
expect 64 "$diff_cmd 'dtrain train --resume auto', rank 0 has 'dtrain eval --checkpoint $ck'$" -- \
  "${MPMD[@]}" -np 1 $DTRAIN eval job.yaml --checkpoint $ck : -np 1 $T --set output.dir=mpmd1
[ ! -e mpmd1 ] && ok || bad "a rank of a mismatched job created its run directory"
expect 64 "$diff_cmd 'dtrain train --resume never', rank 0 has 'dtrain train --resume auto'$" -- \
  "${MPMD[@]}" -np 1 $T --set output.dir=mpmd2 : -np 1 $T --set output.dir=mpmd2 --resume never
expect 64 "^dtrain: rank 1: the job differs from rank 0's: train.epochs=3 \(rank 0: 2\)$" -- \
  "${MPMD[@]}" -np 1 $T --set output.dir=mpmd3 : -np 1 $T --set output.dir=mpmd3 --set train.epochs=3
[ ! -e mpmd2 ] && [ ! -e mpmd3 ] && ok || bad "a rank of a mismatched job created its run directory"
expect 64 "$diff_cmd 'dtrain eval --checkpoint $ck', rank 0 has 'dtrain generate --checkpoint $ck'$" -- \
  "${MPMD[@]}" -np 1 $DTRAIN generate job.yaml --checkpoint $ck --prompt x : -np 1 $DTRAIN eval job.yaml --checkpoint $ck
expect 64 "$diff_cmd 'dtrain bench allreduce --backend mpi --mode blocking .*', rank 0 has 'dtrain doctor --dir \.'$" -- \
  "${MPMD[@]}" -np 1 $DTRAIN doctor --dir . : -np 1 $DTRAIN bench allreduce --max-bytes 64
expect 64 "$diff_cmd 'dtrain bench allreduce .* --iters 3 --warmup 0', rank 0 has 'dtrain bench allreduce .* --iters 2 --warmup 0'$" -- \
  "${MPMD[@]}" -np 1 $DTRAIN bench allreduce --max-bytes 64 --iters 2 : -np 1 $DTRAIN bench allreduce --max-bytes 64 --iters 3
# a rank that ends without starting MPI (its usage, the resolved job, a
# command that never does) still meets the others' start-up check
expect 64 "$diff_cmd 'dtrain train --resume auto', rank 0 has 'dtrain train --help' \(which ended without starting MPI\)$" -- \
  "${MPMD[@]}" -np 1 $DTRAIN train --help : -np 1 $T --set output.dir=mpmd4
expect 64 "$diff_cmd 'dtrain train --resume auto', rank 0 has 'dtrain train job.yaml --print-config' \(which ended without starting MPI\)$" -- \
  "${MPMD[@]}" -np 1 $T --print-config : -np 1 $T --set output.dir=mpmd4
expect 64 "$diff_cmd 'dtrain doctor --dir \.', rank 0 has 'dtrain ckpt list empty' \(which ended without starting MPI\)$" -- \
  "${MPMD[@]}" -np 1 $DTRAIN ckpt list empty : -np 1 $DTRAIN doctor --dir .
[ ! -e mpmd4 ] && ok || bad "a rank of a mismatched job created its run directory"
# the same command on every rank runs as before
out=$("${MPMD[@]}" -np 2 $DTRAIN ckpt list empty 2>&1); rc=$?
[ "$rc" = 0 ] && [ "$(grep -c '^checkpoints in empty/checkpoints: ' <<<"$out")" = 2 ] && ok \
  || bad "ckpt list on 2 ranks exited $rc: $out"
expect 0 "final test accuracy" -- "${MPMD[@]}" -np 1 $T --set output.dir=mpmd5 : -np 1 $T --set output.dir=mpmd5
# and a script may still run several dtrain commands on each rank of one program
expect 0 "no problems found" -- "${MPMD[@]}" -np 2 bash -c '"$0" version > /dev/null && exec "$0" doctor --dir .' $DTRAIN

# --- what MPI needs before it starts --------------------------------------------------
# a umask that takes the owner's own permissions away, a temporary directory
# that cannot take files, or an unusable Open MPI session directory left by
# an earlier run: refused with one message (64) before MPI starts, so that
# nothing is left behind, for every command that starts MPI and for launch
umask_msg="^dtrain: the umask 0777 takes the owner's own read, write and search permissions away from every file and directory dtrain and Open MPI create.*such as 022 \(umask 022\), and run again$"
mkdir -p tmp-root
for cmd in "$T --set output.dir=u1" "$DTRAIN eval job.yaml --checkpoint $ck" "$DTRAIN doctor --dir ." \
           "$DTRAIN bench allreduce --max-bytes 64" "$DTRAIN find-batch job.yaml" \
           "$DTRAIN launch --launcher mpirun -- train job.yaml --set output.dir=u2"; do
  expect 64 "$umask_msg" -- env TMPDIR="$PWD/tmp-root" bash -c 'umask 777; exec "$@"' _ $cmd
done
[ ! -e u1 ] && [ ! -e u2 ] && [ -z "$(ls -A tmp-root)" ] && ok || bad "a refused umask left files: $(ls -A tmp-root u1 u2 2>&1)"
expect 0 "^dtrain [0-9]" -- bash -c 'umask 777; exec "$@"' _ $DTRAIN version   # starts no MPI
expect 64 "^dtrain: the temporary directory TMPDIR=$PWD/no-such-dir cannot take new files \(No such file or directory\): Open MPI creates its session directory there; point TMPDIR at a directory this user can write \(export TMPDIR=/tmp\) and run again$" -- \
  env TMPDIR="$PWD/no-such-dir" $T --set output.dir=u3
expect 64 "temporary directory TMPDIR=$PWD/afile cannot take new files \(it is not a directory\)" -- env TMPDIR="$PWD/afile" $DTRAIN doctor --dir .
[ ! -e no-such-dir ] && [ ! -e u3 ] && ok || bad "a refused TMPDIR was created or a run started"
# as an ordinary user, where permissions apply (skipped, saying so, where
# this cannot drop privileges)
NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups)
if [ "$(id -u)" = 0 ] && "${NOBODY[@]}" true 2>/dev/null && "${NOBODY[@]}" test -x "$DTRAIN" -a -r job.yaml -a -r data.h5; then
  mkdir -p nobody/tmp && chmod -R 777 nobody
  AS_NOBODY=(env HOME="$PWD/nobody" TMPDIR="$PWD/nobody/tmp" "${NOBODY[@]}" bash -c 'umask $0; exec "$@"')
  expect 64 "$umask_msg" -- "${AS_NOBODY[@]}" 777 $DTRAIN doctor --dir nobody
  expect 64 "$umask_msg" -- "${AS_NOBODY[@]}" 777 $DTRAIN launch -- train job.yaml --set output.dir=nobody/run
  [ -z "$(ls -A nobody/tmp)" ] && [ ! -e nobody/run ] && ok || bad "a refused umask left $(ls -lA nobody/tmp)"
  expect 0 "no problems found" -- "${AS_NOBODY[@]}" 022 $DTRAIN doctor --dir nobody
  # the session directory an older dtrain left under umask 777 is named, with its fix
  host=$(hostname); host=${host%%.*}
  mkdir -p nobody/tmp2/ompi.$host.65534 && chown -R 65534 nobody/tmp2 && chmod 000 nobody/tmp2/ompi.$host.65534
  expect 64 "^dtrain: Open MPI's session directory $PWD/nobody/tmp2/ompi.$host.65534, left by an earlier run, is not usable by this user \(mode 0000, owner uid 65534\): remove it \(chmod -R u\+rwx .*; rm -rf .*\) and run again$" -- \
    env HOME="$PWD/nobody" TMPDIR="$PWD/nobody/tmp2" "${NOBODY[@]}" $DTRAIN doctor --dir nobody
  expect 64 "temporary directory TMPDIR=$PWD/nobody/ro cannot take new files \(Permission denied\)" -- \
    bash -c 'mkdir -p nobody/ro && chmod 555 nobody/ro && exec env HOME="$PWD/nobody" TMPDIR="$PWD/nobody/ro" "$@"' _ "${NOBODY[@]}" $DTRAIN doctor --dir nobody
else
  echo "skipped: the checks as an ordinary user (this test cannot drop privileges with setpriv here)"
fi

echo "hardening: $pass passed, $fail failed"
[ "$fail" = 0 ]
