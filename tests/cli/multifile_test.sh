#!/usr/bin/env bash
# A dataset of several HDF5 files (data.path as a list or a glob): data
# info shows each file and the totals; training on the parts gives the
# same losses and bit-identical parameters as training on one file holding
# the same rows (on 1 and 2 ranks); under 2 ranks each rank reads half the
# bytes; files that do not match, a pattern matching nothing and a missing
# list entry are refused with 65, 66 and 66.
#   multifile_test.sh DTRAIN MAKE_H5 COMPARE_MODELS WORKDIR
set -uo pipefail
DTRAIN=$1
MAKE_H5=$2
COMPARE=$3
W=$4
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/../mpi/mpirun.sh"
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
source "$HERE/lib.sh"
losses() { grep -o '"[a-z_]*loss":[-0-9.e]*' "$1/metrics.jsonl"; }
same_run() { # same_run A B: identical losses and bit-identical parameters
  if [ -z "$(losses "$1")" ]; then bad "$1: no losses in metrics.jsonl"; return; fi
  diff <(losses "$1") <(losses "$2") >/dev/null && ok || bad "$1 and $2: losses differ"
  "$COMPARE" "$1/model.h5" "$2/model.h5" 0 >/dev/null && ok || bad "$1 and $2: parameters differ"
}

# One file of 1000 + 200 rows, and the same rows cut into three files.
"$MAKE_H5" all.h5 1000 200 64 4 &&
  "$MAKE_H5" part-1.h5 400 80 64 4 from=0,0 &&
  "$MAKE_H5" part-2.h5 250 40 64 4 from=400,80 &&
  "$MAKE_H5" part-3.h5 350 80 64 4 from=650,120 &&
  "$MAKE_H5" classes5.h5 100 20 64 5 &&
  "$MAKE_H5" dim32.h5 100 20 32 4 || { echo "cannot generate data"; exit 1; }

# --- data info ---------------------------------------------------------------
expect 0 "files \(3" -- "$DTRAIN" data info 'part-*.h5'
expect 0 "part-2.h5: .*test 40 rows \(from 80\), train 250 rows \(from 400\)" -- "$DTRAIN" data info 'part-*.h5'
expect 0 "split train: 1000 samples of 64" -- "$DTRAIN" data info 'part-*.h5'
expect 0 "split test: 200 samples of 64" -- "$DTRAIN" data info part-1.h5 part-2.h5 part-3.h5
expect 0 "part-3.h5: .*train 350 rows \(from 0\)" -- "$DTRAIN" data info part-3.h5 part-1.h5
# the class counts of the whole equal those of the combined file
diff <("$DTRAIN" data info all.h5 | grep "per class") \
     <("$DTRAIN" data info 'part-*.h5' | grep "per class") >/dev/null && ok ||
  bad "per-class counts of the parts differ from the combined file's"

# --- refusals ------------------------------------------------------------------
expect 65 "part-1.h5 and classes5.h5 differ in the number of classes" -- \
  "$DTRAIN" data info part-1.h5 classes5.h5
expect 65 "part-1.h5 and dim32.h5 differ in the sample shape" -- \
  "$DTRAIN" data info part-1.h5 dim32.h5
expect 66 "nomatch-\*.h5: the pattern matches no file" -- "$DTRAIN" data info 'nomatch-*.h5'
expect 66 "absent.h5" -- "$DTRAIN" data info part-1.h5 absent.h5

# --- training ------------------------------------------------------------------
cat > job.yaml <<JOB
model:
  hidden: [32]
  dropout: 0.1
data:
  path: all.h5
train:
  epochs: 2
  global_batch: 32
  eval_batch: 64
  log_every: 8
  optimizer:
    lr: 0.003
runtime:
  threads: 1
output:
  dir: r_all
JOB
sed 's|  path: all.h5|  path:\n    - part-1.h5\n    - ./part-2.h5\n    - part-3.h5|' job.yaml > list.yaml
sed 's|  path: all.h5|  path: "part-*.h5"|' job.yaml > glob.yaml
expect 0 "" -- "$DTRAIN" train job.yaml
expect 0 "" -- "$DTRAIN" train list.yaml --set output.dir=r_list
expect 0 "" -- "$DTRAIN" train glob.yaml --set output.dir=r_glob
same_run r_all r_list
same_run r_all r_glob
expect 65 "part-1.h5 and dim32.h5 differ in the sample shape" -- \
  "$DTRAIN" train job.yaml --set "data.path=[part-1.h5, dim32.h5]" --set output.dir=r_bad
expect 66 "nomatch-\*.h5: the pattern matches no file" -- \
  "$DTRAIN" train job.yaml --set "data.path=nomatch-*.h5" --set output.dir=r_bad
expect 66 "absent.h5" -- \
  "$DTRAIN" train job.yaml --set "data.path=[part-1.h5, absent.h5]" --set output.dir=r_bad
expect 64 "data.path" -- "$DTRAIN" train job.yaml --set "data.path=[]" --set output.dir=r_bad

# config.yaml records the list with absolute paths, and reads back
grep -qxF "  path: [$PWD/part-1.h5, $PWD/part-2.h5, $PWD/part-3.h5]" r_list/config.yaml && ok ||
  bad "config.yaml data.path: $(grep 'path:' r_list/config.yaml)"
expect 0 "part-3.h5" -- "$DTRAIN" train r_list/config.yaml --print-config

# --- two ranks: the same result, each rank reads half of the bytes --------------
expect 0 "" -- $MPIRUN 2 "$DTRAIN" train job.yaml --set output.dir=r2_all
expect 0 "" -- $MPIRUN 2 "$DTRAIN" train glob.yaml --set output.dir=r2_glob
same_run r2_all r2_glob
bytes() { grep -o '"train_bytes_read_per_rank":\[[0-9,]*\]' "$1/metrics.jsonl" | tail -n 1 |
            sed 's/.*\[\(.*\)\]/\1/'; }
one=$(bytes r_list) two=$(bytes r2_glob)
a=${two%,*} b=${two#*,}
if [ -n "$one" ] && [ -n "$a" ] && [ "$a" != "$two" ] && [ $((a + b)) = "$one" ] &&
   [ $((a - b)) -le $((one / 100)) ] && [ $((b - a)) -le $((one / 100)) ]; then ok
else bad "bytes read per rank on 2 ranks ($two) are not half of 1 rank's ($one)"; fi

echo "multifile: $pass passed, $fail failed"
[ "$fail" = 0 ]
