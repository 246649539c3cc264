#!/usr/bin/env bash
# dtrain data import npy and csv, end to end: every accepted dtype and
# header version, a round trip through `data info` and a short training
# run that must learn, every bad input with its exit code and message,
# no output left behind by a failed import, and --force.
#   import_test.sh DTRAIN WORKDIR
set -uo pipefail
DTRAIN=$1
W=$2
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$W" && mkdir -p "$W/d"
cd "$W"
source "$HERE/lib.sh"
# nothing by the output's name or its temporary name
no_output() {
  local left
  left=$(ls -d "$1" "$1".tmp.* 2>/dev/null) # what exists (ls fails when any is missing)
  if [ -n "$left" ]; then bad "output $1 left behind: $left"; else ok; fi
}
# the summary's test accuracy is at least $2
acc_at_least() {
  local acc
  acc=$(grep '"type":"summary"' "$1/metrics.jsonl" | sed 's/.*"test_acc":\([0-9.]*\).*/\1/')
  if python3 -c "import sys; sys.exit(0 if float('$acc') >= $2 else 1)" 2>/dev/null; then ok
  else bad "$1: test accuracy '$acc' below $2"; fi
}

python3 "$HERE/make_import_data.py" d || { echo "cannot make data"; exit 1; }
NPY="$DTRAIN data import npy"
CSV="$DTRAIN data import csv"

# ---- npy: good inputs -------------------------------------------------------
expect 0 "train: 400 samples of 6x6 u8" -- $NPY --train-x d/train_x.npy --train-y d/train_y.npy \
  --test-x d/test_x.npy --test-y d/test_y.npy -o u8.h5 --classes a,b,c,d
expect 0 "classes \(4\): 0=a, 1=b, 2=c, 3=d" -- $DTRAIN data info u8.h5
expect 0 "split test: 100 samples of 6x6, x u8, y i32" -- $DTRAIN data info u8.h5
expect 0 "split train: 400 samples of 6x6, x u8" -- $DTRAIN data info u8.h5
expect 0 "train: 400 samples of 6x6 f32" -- $NPY --train-x d/train_x_f32.npy \
  --train-y d/train_y_i4.npy --test-x d/test_x_f32.npy --test-y d/test_y.npy -o f32.h5
expect 0 "x f32" -- $DTRAIN data info f32.h5
expect 0 "x f16" -- bash -c "$NPY --train-x d/train_x_f16.npy --train-y d/train_y_u1.npy -o f16.h5 && $DTRAIN data info f16.h5"
# float64 (format 2.0) and int16 (format 3.0) become float32
expect 0 "x f32" -- bash -c "$NPY --train-x d/train_x_f64.npy --train-y d/train_y.npy -o f64.h5 && $DTRAIN data info f64.h5"
expect 0 "x f32" -- bash -c "$NPY --train-x d/train_x_i16.npy --train-y d/train_y.npy -o i16.h5 && $DTRAIN data info i16.h5"

# ---- npy: bad inputs, each 65 (66: not a file) and nothing written -----------
npy_bad() { # FILE PATTERN [as labels]
  if [ "${3:-}" = y ]; then
    expect 65 "$2" -- $NPY --train-x d/train_x.npy --train-y "d/$1" -o bad.h5
  else
    expect 65 "$2" -- $NPY --train-x "d/$1" --train-y d/train_y.npy -o bad.h5
  fi
  no_output bad.h5
}
npy_bad fortran.npy "fortran.npy: the array is in Fortran \(column-major\) order"
npy_bad bigend.npy "bigend.npy: dtype '>f4' is big-endian"
npy_bad complex.npy "complex.npy: dtype '<c8' is not supported"
npy_bad baddict.npy "baddict.npy: the .npy header does not parse"
npy_bad evil.npy "evil.npy: the .npy header does not parse: expected '\{'"
npy_bad huge.npy "huge.npy: the .npy header declares shape .*more data than any file holds"
npy_bad bigshape.npy "bigshape.npy: truncated: the header declares shape \(1048576, 1048576\)"
npy_bad truncated.npy "truncated.npy: truncated: .*14400 data bytes.*holds 1000"
npy_bad nan.npy "nan.npy: row 5, element 3: <f4 value nan"
npy_bad notnpy.npy "notnpy.npy: not a .npy file"
npy_bad v9.npy "v9.npy: .npy format version 9.0 is not supported"
npy_bad hugehdr.npy "hugehdr.npy: the .npy header claims 4294967280 bytes"
npy_bad x_1d.npy "x_1d.npy: inputs of shape \(400,\); expected \(N, ...\)"
npy_bad y_range.npy "y_range.npy: row 10: label -1 is outside" y
npy_bad y_float.npy "y_float.npy: labels of dtype '<f4'; labels must be an integer dtype" y
npy_bad y_short.npy "train_x.npy holds 400 samples but d/y_short.npy holds 399 labels" y
expect 65 "train_y.npy: row [0-9]+: label 3 is outside \[0, 3\) \(the class names given\)" -- \
  $NPY --train-x d/train_x.npy --train-y d/train_y.npy -o bad.h5 --classes a,b,c
expect 65 "test_x.npy: test samples are \(6, 6\) u8 but the train samples .* are \(6, 6\) f32" -- \
  $NPY --train-x d/train_x_f32.npy --train-y d/train_y.npy --test-x d/test_x.npy \
  --test-y d/test_y.npy -o bad.h5
no_output bad.h5
expect 66 "missing.npy: no such file" -- $NPY --train-x d/missing.npy --train-y d/train_y.npy -o bad.h5
mkfifo d/fifo.npy
expect 66 "fifo.npy: not a regular file" -- $NPY --train-x d/fifo.npy --train-y d/train_y.npy -o bad.h5
no_output bad.h5
expect 64 "--test-x and --test-y go together" -- $NPY --train-x d/train_x.npy --train-y d/train_y.npy \
  --test-x d/test_x.npy -o bad.h5
expect 64 "unknown argument '--bogus'" -- $NPY --bogus -o bad.h5

# ---- csv: good inputs -------------------------------------------------------
expect 0 "label: column 1, header line skipped" -- $CSV --train d/train.csv --test d/test.csv -o c.h5
expect 0 "split train: 600 samples of 5, x f32, y i32" -- $DTRAIN data info c.h5
expect 0 "split test: 150 samples of 5, x f32" -- $DTRAIN data info c.h5
expect 0 "classes \(3\)" -- $DTRAIN data info c.h5
expect 0 "train: 50 samples of 5 f32" -- $CSV --train d/lastcol.csv -o last.h5 --label-column 6 --header no
expect 0 "label: column 1" -- $CSV --train d/train.csv -o named.h5 --label-column label
expect 64 "lastcol.csv: --label-column 'e': the file has no header line" -- \
  $CSV --train d/lastcol.csv -o bad.h5 --label-column e
expect 64 "train.csv: --label-column 9: the file has columns 1 to 6" -- \
  $CSV --train d/train.csv -o bad.h5 --label-column 9
# a header line read as data is a bad label
expect 65 "train.csv: line 1, column 1: label 'label' is not a whole number" -- \
  $CSV --train d/train.csv -o bad.h5 --header no

# ---- csv: bad inputs --------------------------------------------------------
csv_bad() { # NAME PATTERN
  expect 65 "$2" -- $CSV --train "d/bad_$1.csv" -o bad.h5 --classes x,y,z
  no_output bad.h5
}
csv_bad cols "bad_cols.csv: line 8 has 3 columns; expected 6"
csv_bad nonnum "bad_nonnum.csv: line 5, column 3: 'abc' is not a number"
csv_bad nonfinite "bad_nonfinite.csv: line 5, column 3: value 'inf' is not finite"
csv_bad nan "bad_nan.csv: line 5, column 4: value 'nan' is not finite"
csv_bad neglabel "bad_neglabel.csv: line 5, column 1: label -1 is outside \[0, 3\)"
csv_bad fraclabel "bad_fraclabel.csv: line 5, column 1: label '1.5' is not a whole number"
csv_bad biglabel "bad_biglabel.csv: line 5, column 1: label 7 is outside \[0, 3\)"
csv_bad overflow "bad_overflow.csv: line 5, column 3: value '1e39' is not finite in float32"
expect 65 "empty.csv: holds no rows" -- $CSV --train d/empty.csv -o bad.h5
expect 65 "headeronly.csv: holds a header line but no data rows" -- $CSV --train d/headeronly.csv -o bad.h5
# a wide first line over many short ones: refused at the first short line,
# before the arrays are sized
python3 -c "import sys; sys.stdout.write('0' + ',1' * 100000 + '\n' + '1,2\n' * 200000)" > d/wide.csv
expect 65 "wide.csv: line 2 has 2 columns; expected 100001" -- $CSV --train d/wide.csv -o bad.h5
printf '0,1.0,2.0\n1,3.0,4.0\n' > d/narrow.csv
expect 65 "narrow.csv: 3 columns but the train file d/train.csv has 6" -- \
  $CSV --train d/train.csv --test d/narrow.csv -o bad.h5
expect 66 "CSV file d/nope.csv: no such file" -- $CSV --train d/nope.csv -o bad.h5
expect 66 "CSV file d: not a regular file" -- $CSV --train d -o bad.h5
expect 64 "--header 'maybe': expected auto, yes or no" -- $CSV --train d/train.csv -o bad.h5 --header maybe
no_output bad.h5

# ---- --force -----------------------------------------------------------------
before=$(cksum < c.h5)
expect 64 "output c.h5 already exists; pass --force" -- $CSV --train d/train.csv -o c.h5
[ "$(cksum < c.h5)" = "$before" ] && ok || bad "c.h5 changed without --force"
# a failed import with --force leaves the old file as it was
expect 65 "bad_nan.csv" -- $CSV --train d/bad_nan.csv -o c.h5 --force
[ "$(cksum < c.h5)" = "$before" ] && ok || bad "c.h5 changed by a failed --force import"
expect 0 "wrote c.h5" -- $CSV --train d/train.csv --test d/test.csv -o c.h5 --force
expect 0 "wrote u8.h5" -- $NPY --train-x d/train_x.npy --train-y d/train_y.npy \
  --test-x d/test_x.npy --test-y d/test_y.npy -o u8.h5 --force
expect 64 "output u8.h5 already exists; pass --force" -- $NPY --train-x d/train_x.npy \
  --train-y d/train_y.npy -o u8.h5

# ---- training on what was imported learns --------------------------------------
train() { # DATA RUNDIR
  cat > job.yaml <<JOB
model:
  hidden: [16]
  dropout: 0
data:
  path: $1
  workers: 1
train:
  epochs: 8
  global_batch: 32
  optimizer:
    name: adamw
    lr: 0.01
JOB
  expect 0 "final test accuracy" -- $DTRAIN train job.yaml --set "output.dir=$W/$2"
}
train c.h5 run_csv
acc_at_least run_csv 0.95
train u8.h5 run_npy
acc_at_least run_npy 0.95

echo "import tests: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
