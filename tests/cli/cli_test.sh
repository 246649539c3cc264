#!/usr/bin/env bash
# End-to-end checks of the dtrain command line on small generated data:
# exit codes and messages for bad input, the run directory, learning,
# determinism, and the fast kernels against the reference kernels.
#   cli_test.sh DTRAIN WORKDIR
set -uo pipefail
DTRAIN=$1
W=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=$(command -v python3)
rm -rf "$W" && mkdir -p "$W/idx" "$W/raw"
cd "$W"
pass=0 fail=0

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# expect CODE PATTERN -- command...: exit code and a pattern in stdout+stderr
expect() {
  local code=$1 pat=$2; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" != "$code" ]; then bad "'$*' exited $rc, expected $code: $out"; return; fi
  if ! grep -qE -- "$pat" <<<"$out"; then bad "'$*' output lacks /$pat/: $out"; return; fi
  ok
}
# close_to A B: |A - B| <= 1e-4 |A|
close_to() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-4 * a) }'; }
json_field() { grep "\"type\":\"$2\"" "$1" | tail -n 1 | sed "s/.*\"$3\":\([-0-9.e]*\).*/\1/"; }

"$PY" "$HERE/make_idx.py" idx 1024 256 4 || { echo "cannot generate data"; exit 1; }
"$PY" "$HERE/make_idx.py" raw 64 32 4 raw

# --- command line -----------------------------------------------------------
expect 0 "usage: dtrain" -- "$DTRAIN" --help
expect 64 "unknown command 'trian'" -- "$DTRAIN" trian
expect 64 "doctor: unknown option '--frobnicate'" -- "$DTRAIN" doctor --frobnicate
expect 0 "^dtrain [0-9]+\.[0-9]+\.[0-9]+ \(backends: cpu" -- "$DTRAIN" version
# every command and subcommand prints its own usage to stdout for -h and
# --help, anywhere among its arguments, and exits 0 without doing anything
help_of() { # help_of "ARGS" USAGE-PREFIX
  local args=$1 want=$2 flag out rc
  for flag in -h --help; do
    out=$("$DTRAIN" $args $flag 2>/dev/null); rc=$?
    [ "$rc" = 0 ] && [ "$(head -n 1 <<<"$out")" != "" ] && grep -q "^usage: dtrain $want" <<<"$out" && ok \
      || bad "'dtrain $args $flag' exited $rc, stdout: $(head -n 2 <<<"$out")"
  done
}
help_of "train" "train JOB.yaml"
help_of "train job.yaml --set train.steps=1" "train JOB.yaml"
help_of "eval" "eval JOB.yaml --checkpoint PATH"
help_of "eval job.yaml --checkpoint x.h5" "eval JOB.yaml --checkpoint PATH"
help_of "generate" "generate JOB.yaml"
help_of "launch" "launch"
help_of "ckpt" "ckpt list DIR"
help_of "ckpt list" "ckpt list DIR$"
help_of "ckpt info" "ckpt info PATH$"
help_of "ckpt verify" "ckpt verify PATH\|DIR$"
help_of "data" "data import FORMAT"
help_of "data import" "data import FORMAT"
for f in idx npy csv text tokens; do help_of "data import $f" "data import FORMAT"; done
help_of "data import csv --train x.csv -o y.h5" "data import FORMAT"
help_of "data info" "data info FILE.h5"
help_of "find-batch" "find-batch JOB.yaml"
help_of "bench" "bench allreduce"
help_of "bench allreduce" "bench allreduce"
help_of "bench allreduce --iters 3" "bench allreduce"
help_of "doctor" "doctor \[JOB.yaml\]"
help_of "doctor job.yaml --dir ." "doctor \[JOB.yaml\]"
help_of "config" "config reference"
help_of "config reference" "config reference"
help_of "version" "version$"
expect 0 "^usage: dtrain train JOB.yaml" -- "$DTRAIN" help train
expect 0 "^usage: dtrain ckpt list DIR$" -- "$DTRAIN" help ckpt list
expect 74 "^dtrain: cannot write to standard output: No space left on device$" -- bash -c 'exec "$@" > /dev/full' _ "$DTRAIN" train --help
[ ! -e x.h5 ] && [ ! -e y.h5 ] && ok || bad "a --help did something"
# options a command does not take are refused, not ignored
expect 64 "eval: unknown option '--print-config'" -- "$DTRAIN" eval job.yaml --checkpoint x.h5 --print-config
expect 64 "eval: unknown option '--resume'" -- "$DTRAIN" eval job.yaml --checkpoint x.h5 --resume never
expect 64 "eval: --checkpoint needs the path of a checkpoint" -- "$DTRAIN" eval job.yaml --checkpoint
expect 64 "generate: unknown option '--print-config'" -- "$DTRAIN" generate job.yaml --checkpoint x.h5 --prompt a --print-config
expect 64 "version: unexpected argument 'now'" -- "$DTRAIN" version now

# --- data import / info ------------------------------------------------------
expect 0 "" -- "$DTRAIN" data import idx idx -o tiny.h5 --classes "a,b,c,d"
expect 0 "" -- "$DTRAIN" data import idx raw -o raw.h5
expect 0 "train.*1024" -- "$DTRAIN" data info tiny.h5
expect 0 "test.*256" -- "$DTRAIN" data info tiny.h5
sum=$(md5sum tiny.h5)
expect 64 "exists" -- "$DTRAIN" data import idx idx -o tiny.h5
[ "$(md5sum tiny.h5)" = "$sum" ] && ok || bad "refused import changed tiny.h5"
printf 'not an idx file at all' > junk-images
expect 65 "junk-images" -- "$DTRAIN" data import idx --train-images junk-images \
  --train-labels idx/train-labels-idx1-ubyte.gz -o junk.h5
[ ! -e junk.h5 ] && ok || bad "failed import left junk.h5"
ls junk.h5* 2>/dev/null | grep -q . && bad "failed import left a temporary file" || ok
expect 66 "nope" -- "$DTRAIN" data import idx nope -o x.h5
# A damaged gzipped IDX file: every compressed file is read to its end and
# its CRC-32 and length checked, so damage the declared sizes cannot show
# is found (65, zlib's reason, nothing written), as are bytes after the
# data. The real Fashion-MNIST test images when installed, else ours.
no_output() {
  local left
  left=$(ls -d "$1" "$1".tmp.* 2>/dev/null) # what exists (ls fails when any is missing)
  if [ -n "$left" ]; then bad "output $1 left behind: $left"; else ok; fi
}
FM=/usr/share/datasets/fashion-mnist
if [ -f $FM/t10k-images-idx3-ubyte.gz ]; then
  cp $FM/t10k-images-idx3-ubyte.gz $FM/t10k-labels-idx1-ubyte.gz .
else
  cp idx/t10k-images-idx3-ubyte.gz idx/t10k-labels-idx1-ubyte.gz .
fi
IMG=t10k-images-idx3-ubyte.gz LAB=t10k-labels-idx1-ubyte.gz
idx_bad() { # FILE PATTERN: importing FILE as the images is 65 with PATTERN, nothing written
  expect 65 "$2" -- "$DTRAIN" data import idx --train-images "$1" --train-labels $LAB -o dmg.h5
  no_output dmg.h5
}
size=$(stat -c %s $IMG)
# four bytes overwritten in the middle, and at 1/3 and 3/4 (what the bytes
# decode to differs: a CRC-32 mismatch, more data, a bad code)
for at in $((size / 2)) $((size / 3)) $((size * 3 / 4)); do
  cp $IMG dmg.gz
  printf 'XXXX' | dd of=dmg.gz bs=1 seek=$at conv=notrunc 2>/dev/null
  gzip -t dmg.gz 2>/dev/null && bad "gzip -t accepts the damaged file" || ok
  idx_bad dmg.gz "file dmg.gz: (corrupt gzip data \(zlib: |[0-9]+ bytes? of data after .*damaged)"
done
cp $IMG dmg.gz && printf 'XXXX' | dd of=dmg.gz bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
expect 65 "file dmg.gz: corrupt gzip data \(zlib: incorrect data check: the data's CRC-32 is not the one its gzip trailer records\)" -- \
  "$DTRAIN" data import idx --train-images dmg.gz --train-labels $LAB -o dmg.h5
# the trailer damaged or cut off
cp $IMG dmg.gz && printf 'XXXX' | dd of=dmg.gz bs=1 seek=$((size - 8)) conv=notrunc 2>/dev/null
idx_bad dmg.gz "file dmg.gz: corrupt gzip data \(zlib: incorrect data check"
cp $IMG dmg.gz && printf 'XXXX' | dd of=dmg.gz bs=1 seek=$((size - 4)) conv=notrunc 2>/dev/null
idx_bad dmg.gz "file dmg.gz: corrupt gzip data \(zlib: incorrect length check"
head -c $((size - 4)) $IMG > dmg.gz
idx_bad dmg.gz "file dmg.gz: truncated: it ends inside its gzip data, after the [0-9]+ data bytes its header declares"
head -c $((size / 2)) $IMG > dmg.gz
idx_bad dmg.gz "file dmg.gz: truncated: .*the data ends after [0-9]+ bytes; the file ends inside its gzip data"
# bytes after the data: raw bytes after the gzip data, a second member
# with more data, more data in a raw file
{ cat $IMG; printf 'junk'; } > dmg.gz
idx_bad dmg.gz "file dmg.gz: 4 bytes after the end of its gzip data, not gzip data"
{ cat $IMG; printf 'more' | gzip; } > dmg.gz
idx_bad dmg.gz "file dmg.gz: 4 bytes of data after the [0-9]+ images of [0-9x]+ \([0-9]+ data bytes\) its IDX header declares"
{ gzip -dc $IMG; printf 'more'; } > dmg.raw
idx_bad dmg.raw "file dmg.raw: 4 bytes after the data its IDX header declares"
# the labels are checked the same way, before anything is written
{ cat $LAB; printf 'x'; } > dmg-labels.gz
expect 65 "file dmg-labels.gz: 1 byte after the end of its gzip data" -- \
  "$DTRAIN" data import idx --train-images $IMG --train-labels dmg-labels.gz -o dmg.h5
no_output dmg.h5
# a gzip file of two members, its data split between them, is whole (as
# for gzip); an empty member after it adds nothing
gzip -dc $IMG > whole.raw
{ head -c 1000 whole.raw | gzip; tail -c +1001 whole.raw | gzip; printf '' | gzip; } > two.gz
expect 0 "train: [0-9]+ images of" -- "$DTRAIN" data import idx --train-images two.gz --train-labels $LAB -o two.h5
expect 0 "train: [0-9]+ images of" -- "$DTRAIN" data import idx --train-images $IMG --train-labels $LAB -o one.h5
h5dump -d /train/x -b LE -o one.bin one.h5 >/dev/null 2>&1
h5dump -d /train/x -b LE -o two.bin two.h5 >/dev/null 2>&1
[ -s one.bin ] && cmp -s one.bin two.bin && ok || bad "two members imported other pixels"
expect 66 "missing.h5" -- "$DTRAIN" data info missing.h5
head -c 4000 tiny.h5 > cut.h5
expect 65 "cut.h5" -- "$DTRAIN" data info cut.h5

# --- job files ---------------------------------------------------------------
cat > job.yaml <<JOB
model:
  hidden: [32]
  dropout: 0.1
data:
  path: tiny.h5
train:
  epochs: 4
  global_batch: 32
  eval_batch: 64
  log_every: 8
  optimizer:
    lr: 0.003
runtime:
  threads: 1
output:
  dir: run1
JOB
printf 'train:\n  optimizer:\n    lrr: 0.1\n' > typo.yaml
expect 64 "typo.yaml:3:5.*did you mean 'train.optimizer.lr'" -- "$DTRAIN" train typo.yaml
expect 66 "nojob.yaml" -- "$DTRAIN" train nojob.yaml
expect 0 "global_batch: 64" -- "$DTRAIN" train job.yaml --set train.global_batch=64 --print-config
expect 64 "train.global_batch" -- "$DTRAIN" train job.yaml --set train.global_batch=abc
expect 64 "micro_batch" -- "$DTRAIN" train job.yaml --set train.micro_batch=5
expect 66 "absent.h5" -- "$DTRAIN" train job.yaml --set data.path=absent.h5 --set output.dir=r0
expect 65 "holdout" -- "$DTRAIN" train job.yaml --set data.test_split=holdout --set output.dir=r0
expect 64 "model.type" -- "$DTRAIN" train job.yaml --set model.type=gpt --set output.dir=r0
# a job file without keys is refused, never run as the default job: the
# empty file a --print-config into a full disk leaves, blanks, comments, a
# null document; every command that reads a job says so, and starts nothing
(ulimit -f 0; exec "$DTRAIN" train job.yaml --print-config > resolved.yaml) 2>/dev/null
[ "$?" = 74 ] && [ ! -s resolved.yaml ] && ok || bad "--print-config into a full file did not fail"
printf '\n  \n# train:\n#   epochs: 4\n' > comments.yaml
printf -- '--- ~\n...\n' > null.yaml
for f in resolved.yaml comments.yaml null.yaml; do
  expect 64 "^dtrain: job file $f is empty \(no keys: only blanks, comments or a null document\): .*\{\} for a job of defaults alone" -- "$DTRAIN" train $f
done
expect 64 "job file resolved.yaml is empty" -- "$DTRAIN" eval resolved.yaml --checkpoint none.h5
expect 64 "job file resolved.yaml is empty" -- "$DTRAIN" doctor resolved.yaml
expect 64 "job file resolved.yaml is empty" -- "$DTRAIN" find-batch resolved.yaml
[ ! -e runs ] && ok || bad "an empty job file started a run in $(ls -d runs/*)"
# other documents that are not a job: a scalar, a list
printf 'just text\n' > scalar.yaml
expect 64 "^dtrain: scalar.yaml:1:1: expected a mapping of sections \(model, data, .*\), got 'just text'$" -- "$DTRAIN" train scalar.yaml
printf -- '- model\n- data\n' > list.yaml
expect 64 "^dtrain: list.yaml:1:1: expected a mapping of sections \(model, data, .*\), got a sequence$" -- "$DTRAIN" train list.yaml
# numbers: one past a range, past 64 bits or past a double is refused
# naming the real range (not "not a number"); one too small for a double
# reads as 0, and says so when the range then refuses it
expect 64 "^dtrain: find-batch: -n needs a whole number from 1 to 1000000000, not '99999999999999999999'$" -- "$DTRAIN" find-batch job.yaml -n 99999999999999999999
expect 64 "^dtrain: find-batch: --margin needs a number from 0 to below 1 \(0.1 keeps 10% free\), not '1'$" -- "$DTRAIN" find-batch job.yaml --margin 1
expect 64 "^dtrain: launch: -n needs a whole number from 1 to 1000000, not '1000001'$" -- "$DTRAIN" launch -n 1000001 -- train job.yaml
expect 64 "^dtrain: launch: --backoff needs a number from 0 to 604800 seconds \(e.g. 1 or 0.5\), not '1e300'$" -- "$DTRAIN" launch --backoff 1e300 -- train job.yaml
expect 64 "^dtrain: launch: --max-backoff needs a number from 0 to 604800 seconds .*, not '1e999'$" -- "$DTRAIN" launch --max-backoff 1e999 -- train job.yaml
expect 64 "^dtrain: bench allreduce: --iters needs a whole number from 0 to 1000000000 \(0: about 0.2 s per size\), not '2000000000'$" -- "$DTRAIN" bench allreduce --iters 2000000000
expect 64 "^dtrain: bench allreduce: --max-bytes '99999999999999999999' is more than 18446744073709551615 bytes" -- "$DTRAIN" bench allreduce --max-bytes 99999999999999999999
expect 64 "^dtrain: bench allreduce: --max-bytes '64X' is not a size" -- "$DTRAIN" bench allreduce --max-bytes 64X
expect 64 "train.optimizer.lr: expected a number > 0, got '1e-400' \(below the smallest double, 4.9e-324: it reads as 0\)$" -- "$DTRAIN" train job.yaml --set train.optimizer.lr=1e-400
expect 64 "train.optimizer.lr: expected a number > 0, got '1e999' \(beyond the largest double, 1.8e\+308\)$" -- "$DTRAIN" train job.yaml --set train.optimizer.lr=1e999
expect 64 "train.steps: expected an integer from 0 to 1000000000000, got '99999999999999999999' \(beyond a 64-bit integer\)$" -- "$DTRAIN" train job.yaml --set train.steps=99999999999999999999
expect 0 "^  dropout: 1(\.0)?e-320$" -- "$DTRAIN" train job.yaml --set model.dropout=1e-320 --print-config
# a model's depth: the limit the reference states, the check and the
# message agree, in the key the user set (model.n_layer counts transformer
# blocks, model.blocks residual blocks); the deepest allowed ones expand
"$DTRAIN" config reference > reference.md
grep -qx '| `model.n_layer` | int | `4` | 1 to 50 | gpt: transformer blocks; at most 42 with model.dropout > 0 .*' reference.md \
  && ok || bad "the reference's model.n_layer: $(grep 'model.n_layer' reference.md)"
gpt="--set model.type=gpt --set data.seq_len=8 --set model.n_head=1 --set model.n_embd=4"
expect 64 "model.n_layer: expected an integer from 1 to 50, got '60' \(a deeper gpt is more than the 512 layers a model holds: 10 per block\)$" -- "$DTRAIN" train job.yaml $gpt --set model.n_layer=60
expect 64 "model.n_layer: a gpt of 43 transformer blocks with model.dropout 0.1 is 522 layers \(12 per block with dropout, 6 more\), more than the 512 a model holds: at most 42 blocks with dropout, 50 with model.dropout 0$" -- "$DTRAIN" train job.yaml $gpt --set model.n_layer=43 --set model.dropout=0.1
expect 0 "- \{name: h49.res2, kind: add" -- "$DTRAIN" train job.yaml $gpt --set model.n_layer=50 --set model.dropout=0 --print-config
expect 0 "- \{name: h41.res2, kind: add" -- "$DTRAIN" train job.yaml $gpt --set model.n_layer=42 --set model.dropout=0.1 --print-config
expect 64 "model.blocks: a resnet of 73 residual blocks in 2 stages is 519 layers \(7 per block, 2 more for each stage after the first, 6 more\), more than the 512 a model holds: at most 72 blocks in 2 stages$" -- "$DTRAIN" train job.yaml --set model.type=resnet --set model.blocks=[64,9]
# {} is the job of defaults alone
printf '{}\n' > defaults.yaml
expect 0 "^  dir: runs/fashion-mnist-mlp$" -- "$DTRAIN" train defaults.yaml --print-config

# --- training ----------------------------------------------------------------
expect 0 "final test accuracy" -- "$DTRAIN" train job.yaml
for f in config.yaml train.log metrics.jsonl; do
  [ -s "run1/$f" ] && ok || bad "run1/$f missing"
done
grep -q '"type":"eval"' run1/metrics.jsonl && ok || bad "no eval record"
grep -q '"data_wait_s"' run1/metrics.jsonl && ok || bad "no timing breakdown"
acc=$(json_field run1/metrics.jsonl summary test_acc)
awk -v a="$acc" 'BEGIN { exit !(a > 0.9) }' && ok || bad "tiny job reached only $acc"
"$DTRAIN" train run1/config.yaml --print-config > again.yaml 2>&1 && \
  "$DTRAIN" train job.yaml --print-config > first.yaml 2>&1
# config.yaml names the dataset by its absolute path (a requeued job may
# start elsewhere); everything else loads back as given
grep -qxF "  path: $PWD/tiny.h5" run1/config.yaml && ok || bad "config.yaml data.path is not absolute: $(grep 'path:' run1/config.yaml)"
diff -q <(grep -v -e '^#' -e '  path: ' again.yaml) <(grep -v -e '^#' -e '  path: ' first.yaml) >/dev/null && ok || bad "resolved config does not load back identically"
(cd / && "$DTRAIN" train "$W/run1/config.yaml" --set output.dir="$W/run1b" --set train.steps=2 >/dev/null 2>&1) \
  && ok || bad "config.yaml does not train from another directory"

# --- standard output that cannot be written -----------------------------------
# every command that prints exits 74 naming the cause, whether the write
# failed at once (/dev/full), after a part of it (a file-size limit), or
# on a closed descriptor; a command that prints nothing is not affected
ck=run1/checkpoints/$(ls run1/checkpoints | grep '^ckpt-' | tail -n 1)
nospace="^dtrain: cannot write to standard output: No space left on device$"
to_full() { expect 74 "$nospace" -- bash -c 'exec "$@" > /dev/full' _ "$@"; }
to_full "$DTRAIN" version
to_full "$DTRAIN" --help
to_full "$DTRAIN" config reference
to_full "$DTRAIN" config layers
to_full "$DTRAIN" config defaults
to_full "$DTRAIN" train job.yaml --print-config
to_full "$DTRAIN" data info tiny.h5
to_full "$DTRAIN" eval job.yaml --checkpoint "$ck"
to_full "$DTRAIN" ckpt list run1
to_full "$DTRAIN" ckpt info run1
to_full "$DTRAIN" ckpt verify run1
to_full "$DTRAIN" doctor --dir .
to_full "$DTRAIN" bench allreduce --max-bytes 64 --iters 1
to_full "$DTRAIN" launch --help
to_full "$DTRAIN" data import idx idx -o full.h5
[ -s full.h5 ] && "$DTRAIN" data info full.h5 >/dev/null && ok || bad "import with a full stdout lost its output file"
# training to a full stdout: the run is complete, then 74
to_full "$DTRAIN" train job.yaml --set output.dir=full1 --set train.steps=4
[ -s full1/model.h5 ] && grep -q '"type":"summary"' full1/metrics.jsonl && ok || bad "training with a full stdout did not finish its run"
# a long output cut short: 74, and what was written is the start of it
"$DTRAIN" config reference > ref-all.md
(ulimit -f 8; exec "$DTRAIN" config reference > ref-cut.md) 2> ref-cut.err; rc=$?
[ "$rc" = 74 ] && grep -qx "dtrain: cannot write to standard output: File too large" ref-cut.err && ok \
  || bad "a cut-short config reference exited $rc: $(cat ref-cut.err)"
[ "$(wc -c < ref-cut.md)" = 8192 ] && cmp -s ref-cut.md <(head -c 8192 ref-all.md) && ok \
  || bad "the cut-short reference is not the first 8 KiB: $(wc -c < ref-cut.md) bytes"
# a closed stdout: a write error for a command that prints...
expect 74 "^dtrain: cannot write to standard output: Bad file descriptor$" -- bash -c 'exec "$@" >&-' _ "$DTRAIN" version
expect 74 "Bad file descriptor" -- bash -c 'exec "$@" >&-' _ "$DTRAIN" train job.yaml --set output.dir=closed1 --set train.steps=4
# ... and nothing for one that does not; no file it opens takes descriptor 1
expect 0 "" -- bash -c 'exec "$@" >&-' _ env DTRAIN_LOG=error "$DTRAIN" train job.yaml --set output.dir=closed2 --set train.steps=4
grep -qx "dtrain run directory" closed2/.dtrain-run && python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' closed2/metrics.jsonl \
  && "$DTRAIN" ckpt verify closed2 >/dev/null && ok || bad "a run with a closed stdout damaged its files"
# under mpirun: rank 0's stdout full, rank 1's fine; both finish, rank 0 says why
expect 74 "$nospace" -- timeout 300 bash "$HERE/../mpi/mpirun.sh" 2 bash -c \
  'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exec "$@" > /dev/full; else exec "$@"; fi' _ \
  "$DTRAIN" eval job.yaml --checkpoint "$ck"

# --- under Slurm and launchers ------------------------------------------------
# the Slurm job and its requeue count reach train.log and the start record;
# an unbound task takes SLURM_CPUS_PER_TASK threads
env SLURM_JOB_ID=4242 SLURM_RESTART_COUNT=2 SLURM_NTASKS=1 SLURM_JOB_NUM_NODES=1 \
  SLURM_CPUS_PER_TASK=1 "$DTRAIN" train job.yaml --set output.dir=slurm1 --set train.steps=4 \
  --set runtime.threads=0 > slurm1.out 2>&1 || bad "run with Slurm variables failed: $(tail -2 slurm1.out)"
grep -q "Slurm job 4242, restart count 2 (SLURM_RESTART_COUNT), 1 task on 1 node" slurm1/train.log \
  && ok || bad "train.log lacks the Slurm job: $(grep -i slurm slurm1/train.log)"
grep '"type":"start"' slurm1/metrics.jsonl | grep -q '"slurm_job_id":"4242","slurm_restart_count":2' \
  && ok || bad "start record lacks the Slurm job: $(grep '"type":"start"' slurm1/metrics.jsonl)"
grep -qE "device cpu, fp32, 1 thread($|,)" slurm1.out && ok || bad "SLURM_CPUS_PER_TASK=1 not honoured: $(grep 'thread' slurm1.out)"
grep -q slurm_job_id run1/metrics.jsonl && bad "a run outside Slurm records a Slurm job" || ok
# a terminal gets the live bar; under mpirun whose output goes to a file the
# ranks' stdout is still a pseudo-terminal, but no carriage return reaches the file
if command -v script >/dev/null; then
  script -qec "'$DTRAIN' train job.yaml --set output.dir=bar1 --set train.steps=40" bar1.out >/dev/null 2>&1
  grep -q $'\r''Train epoch' bar1.out && ok || bad "no progress bar on a terminal"
  script -qec "bash '$HERE/../mpi/mpirun.sh' 1 '$DTRAIN' train job.yaml --set output.dir=bar2 --set train.steps=40 > '$W/bar2.out' 2>&1" /dev/null >/dev/null 2>&1
  grep -q "final test accuracy" bar2.out && ! grep -q $'\r' bar2.out && ok \
    || bad "mpirun into a file: carriage returns or no result: $(tail -c 300 bar2.out | cat -A | tail -3)"
  script -qec "bash '$HERE/../mpi/mpirun.sh' 1 '$DTRAIN' train job.yaml --set output.dir=bar3 --set train.steps=40" bar3.out >/dev/null 2>&1
  grep -q $'\r''Train epoch' bar3.out && ok || bad "no progress bar under mpirun on a terminal"
else
  bad "script (util-linux) is missing: cannot test the progress bar"
fi

# the same job twice: identical losses and accuracy
"$DTRAIN" train job.yaml --set output.dir=run2 >/dev/null 2>&1 || bad "second run failed"
# every field but times, speeds and what follows from them (utilisation,
# shares of the time, peak memory)
strip() { grep -v '"type":"start"' "$1" | sed -E 's/"(time|seconds|samples_per_s|gflops|accel_util|share_[a-z_]*|peak_[a-z_]*|[a-z_]*_s)":[0-9.e+-]*,?//g'; }
[ "$(strip run1/metrics.jsonl)" = "$(strip run2/metrics.jsonl)" ] && ok || bad "two runs differ"

# accumulation: micro-batch 8 (x4) gives the same losses as micro-batch 32
"$DTRAIN" train job.yaml --set output.dir=run3 --set train.micro_batch=8 >/dev/null 2>&1 \
  || bad "accumulation run failed"
l1=$(json_field run1/metrics.jsonl summary test_loss)
l3=$(json_field run3/metrics.jsonl summary test_loss)
close_to "$l1" "$l3" && ok || bad "accumulation changed the test loss: $l1 vs $l3"

# fast kernels against the reference kernels, end to end
"$DTRAIN" train job.yaml --set output.dir=run4 --set runtime.reference_kernels=true \
  --set train.epochs=1 >/dev/null 2>&1 || bad "reference run failed"
"$DTRAIN" train job.yaml --set output.dir=run5 --set train.epochs=1 >/dev/null 2>&1 \
  || bad "fast run failed"
l4=$(json_field run4/metrics.jsonl summary test_loss)
l5=$(json_field run5/metrics.jsonl summary test_loss)
close_to "$l4" "$l5" && ok || bad "reference and fast kernels disagree: $l4 vs $l5"

# --- precision ---------------------------------------------------------------
# bf16 on the cpu: matmul inputs rounded as on a GPU; it still learns
expect 0 "train.precision=bf16 on the cpu" -- "$DTRAIN" train job.yaml --set output.dir=bf16 \
  --set train.precision=bf16
grep -q '"precision":"bf16"' bf16/metrics.jsonl && ok || bad "bf16 run does not say bf16"
acc=$(json_field bf16/metrics.jsonl summary test_acc)
awk -v a="$acc" 'BEGIN { exit !(a > 0.85) }' && ok || bad "bf16 job reached only $acc"
l6=$(json_field bf16/metrics.jsonl summary test_loss)
[ "$l6" != "$l1" ] && ok || bad "bf16 gave exactly the fp32 loss: rounding did nothing"
# fp16: an overflow at step 5 (0-based) skips that step and halves the loss
# scale, without counting as a bad step; a later one keeps the halved scale
DTRAIN_FAULT=0:overflow:5 "$DTRAIN" train job.yaml --set output.dir=fp16 \
  --set train.precision=fp16 --set train.log_every=1 --set train.steps=20 > fp16.out 2>&1 \
  && ok || bad "fp16 run failed: $(tail -3 fp16.out)"
rec() { grep "\"type\":\"train\".*\"step\":$2," "$1" | sed "s/.*\"$3\":\([-0-9.e]*\).*/\1/"; }
[ "$(rec fp16/metrics.jsonl 5 loss_scale)" = 65536 ] && ok || bad "fp16 scale before the overflow: $(rec fp16/metrics.jsonl 5 loss_scale)"
[ "$(rec fp16/metrics.jsonl 6 overflow_steps)" = 1 ] && ok || bad "overflow not counted at step 6"
[ "$(rec fp16/metrics.jsonl 6 loss_scale)" = 32768 ] && ok || bad "scale not halved: $(rec fp16/metrics.jsonl 6 loss_scale)"
[ "$(rec fp16/metrics.jsonl 20 loss_scale)" = 32768 ] && ok || bad "scale did not stay halved"
grep -q "not finite" fp16.out && bad "an fp16 overflow counted as a bad step" || ok
# the skipped step left the optimizer's step count alone too (AdamW's bias
# corrections): 20 steps, 19 updates
"$DTRAIN" ckpt info fp16/checkpoints/ckpt-0000000020.h5 | grep -Eq '^  optim_t +19$' && ok \
  || bad "the skipped step counted as an update: $("$DTRAIN" ckpt info fp16/checkpoints/ckpt-0000000020.h5 | grep optim_t)"
# the same fault in fp32 is a bad step
DTRAIN_FAULT=0:overflow:5 "$DTRAIN" train job.yaml --set output.dir=fp32o --set train.steps=10 \
  > fp32o.out 2>&1 && grep -q "step 6: the loss .* not finite" fp32o.out && ok \
  || bad "fp32 overflow was not a skipped bad step: $(tail -3 fp32o.out)"
# overflowing every step: the scale falls to its floor and the run stops, saying why
expect 65 "overflow even at loss scale 1 " -- env DTRAIN_FAULT=0:overflow "$DTRAIN" train job.yaml \
  --set output.dir=fp16f --set train.precision=fp16
expect 64 "comm.backend=nccl all-reduces GPU memory" -- "$DTRAIN" train job.yaml \
  --set runtime.device=cpu --set comm.backend=nccl --set output.dir=r0
if "$DTRAIN" version | grep -q "^gpu: none"; then
  expect 64 "cuda backend is not usable" -- "$DTRAIN" train job.yaml --set runtime.device=cuda \
    --set output.dir=r0
fi

# a second Ctrl-C leaves at once (130), even from a step that does not end
DTRAIN_FAULT=0:hang:3 "$DTRAIN" train job.yaml --set output.dir=sig --set train.log_every=1 > sig.out 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "step 2/" sig.out 2>/dev/null && break; sleep 0.1; done
sleep 0.3
kill -INT "$pid"; sleep 0.3; kill -INT "$pid"
wait "$pid"; rc=$?
[ "$rc" = 130 ] && grep -q "second interrupt" sig.out && ok || bad "second SIGINT: exit $rc: $(tail -2 sig.out)"

# a stop names its signal: SIGUSR1 (a Slurm time-limit warning, or dtrain launch)
"$DTRAIN" train job.yaml --set output.dir=usr1 --set train.log_every=1 --set train.epochs=200 > usr1.out 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "step 3/" usr1.out 2>/dev/null && break; sleep 0.1; done
kill -USR1 "$pid"
wait "$pid"; rc=$?
[ "$rc" = 75 ] && grep -q "stop requested by SIGUSR1 on 1 of 1 rank after step" usr1.out \
  && grep -q "stopped by SIGUSR1 on 1 of 1 rank after step" usr1.out && ok \
  || bad "SIGUSR1 stop: exit $rc: $(tail -3 usr1.out)"

echo "cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
