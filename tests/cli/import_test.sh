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
expect 0 "label: column 1\)" -- $CSV --train d/train.csv --test d/test.csv -o c.h5
expect 0 "d/train.csv: header line 1 taken: label,a,b,c,d,e$" -- \
  $CSV --train d/train.csv --test d/test.csv -o c2.h5
expect 0 "d/test.csv: header line 1 taken: label,a,b,c,d,e$" -- \
  $CSV --train d/train.csv --test d/test.csv -o c3.h5
expect 0 "split train: 600 samples of 5, x f32, y i32" -- $DTRAIN data info c.h5
expect 0 "split test: 150 samples of 5, x f32" -- $DTRAIN data info c.h5
expect 0 "classes \(3\)" -- $DTRAIN data info c.h5
expect 0 "train: 50 samples of 5 f32" -- $CSV --train d/lastcol.csv -o last.h5 --label-column 6 --header no
expect 0 "lastcol.csv: no header line: line 1 is data \(--header no\)" -- \
  $CSV --train d/lastcol.csv -o last2.h5 --label-column 6 --header no
expect 0 "lastcol.csv: no header line: line 1 is data \(every field of it is a number\)" -- \
  $CSV --train d/lastcol.csv -o last3.h5 --label-column 6
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
csv_bad overflow "bad_overflow.csv: line 5, column 3: value '1e39' is outside float32's range \(features are stored as float32, whose largest magnitude is 3.4028235e\+38\)"
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

# ---- csv: what spreadsheets and other tools write ----------------------------
# xvals FILE: /train/x's values, one line
xvals() { h5dump -d /train/x -y -w 0 -m '%.9g' "$1" | sed -n '/DATA {/,/}/p' | tr -d ' ,\n{}DAT'; }
# a UTF-8 byte-order mark: skipped, so the first row stays data (20 rows, not 19)
expect 0 "bom.csv: no header line: line 1 is data \(every field of it is a number\) \(its UTF-8 byte-order mark skipped\)" -- \
  $CSV --train d/bom.csv -o bom.h5
expect 0 "split train: 20 samples of 5" -- $DTRAIN data info bom.h5
# ... and a header name behind it is found
expect 0 "bom_header.csv: header line 1 taken \(its UTF-8 byte-order mark skipped\): a,label,b,c,d,e" -- \
  $CSV --train d/bom_header.csv -o bomh.h5 --label-column label
expect 0 "label: column 2\)" -- $CSV --train d/bom_header.csv -o bomh2.h5 --label-column label
expect 0 "split train: 20 samples of 5" -- $DTRAIN data info bomh.h5
expect 65 "utf16.csv: UTF-16 text .*save it as UTF-8" -- $CSV --train d/utf16.csv -o bad.h5
no_output bad.h5
gzip -c d/train.csv > d/train.csv.gz
expect 65 "train.csv.gz: gzip-compressed .*decompress it first" -- $CSV --train d/train.csv.gz -o bad.h5
no_output bad.h5
# a name two columns have is refused, naming both
expect 64 "twice.csv: --label-column 'y' is ambiguous: 2 header fields have that name \(columns 1, 2\); give the column's number" -- \
  $CSV --train d/twice.csv -o bad.h5 --label-column y
no_output bad.h5
expect 0 "split train: 20 samples of 2" -- bash -c "$CSV --train d/twice.csv -o twice.h5 --label-column 1 && $DTRAIN data info twice.h5"
# lone CR line ends (old Mac tools) and all three kinds in one file
expect 0 "cr.csv: header line 1 taken: label,a,b,c,d,e$" -- $CSV --train d/cr.csv -o cr.h5
expect 0 "split train: 20 samples of 5" -- $DTRAIN data info cr.h5
expect 0 "split train: 20 samples of 5" -- bash -c "$CSV --train d/mixed.csv -o mixed.h5 && $DTRAIN data info mixed.h5"
[ "$(xvals cr.h5)" = "$(xvals bom.h5)" ] && [ "$(xvals mixed.h5)" = "$(xvals bom.h5)" ] && ok || \
  bad "cr.csv or mixed.csv imported other values than bom.csv: $(xvals cr.h5 | head -c 80)"
# numbers of 200 digits and more: read whole; beyond float32's range said as such
expect 0 "train: 2 samples of 1 f32" -- $CSV --train d/long_ok.csv -o long.h5
[ "$(xvals long.h5)" = "10" ] && ok || bad "long_ok.csv imported as '$(xvals long.h5)', expected 1 and 0"
expect 65 "long_big.csv: line 3, column 2: value '1111111111.*\.\.\.' is outside float32's range" -- \
  $CSV --train d/long_big.csv -o bad.h5
expect 65 "long_huge.csv: line 3, column 2: value '9999999999.*' is outside float32's range" -- \
  $CSV --train d/long_huge.csv -o bad.h5
expect 64 "train.csv: --label-column 100000000000000000000000000000: the file has columns 1 to 6" -- \
  $CSV --train d/train.csv -o bad.h5 --label-column 100000000000000000000000000000
no_output bad.h5
# the summary shows a long header's start only
expect 0 "wide_header.csv: header line 1 taken: label,feature_000,.*,feature_005,fe\.\.\.$" -- \
  $CSV --train d/wide_header.csv -o wide.h5

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

# ---- interrupted imports and the temporaries they leave -------------------------
# Inputs of 256 MiB (sparse files: quick to make, and the output is written
# for real) so that an import runs long enough to be interrupted while its
# temporary "<out>.tmp.<host>.<pid>" exists: for each of the three writers
# (the .npy/CSV one, IDX's, the token streams'), a signal removes it and
# ends dtrain as the signal does (128 + its number).
HOST=$(hostname | tr -c 'A-Za-z0-9._\n-' '_')
python3 - <<'PY'
import struct
def npy(path, descr, shape, total):
    h = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, ", ".join(map(str, shape)) + ("," if len(shape) == 1 else ""))
    h = h.encode()
    h += b" " * (64 - (10 + len(h) + 1) % 64) + b"\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h)
        f.truncate(10 + len(h) + total)
npy("d/big_x.npy", "|u1", (4096, 65536), 4096 * 65536)
npy("d/big_y.npy", "|u1", (4096,), 4096)
with open("d/big-images", "wb") as f:
    f.write(struct.pack(">IIII", 0x803, 4096, 256, 256))
    f.truncate(16 + 4096 * 65536)
with open("d/big-labels", "wb") as f:
    f.write(struct.pack(">II", 0x801, 4096))
    f.truncate(8 + 4096)
open("d/big.bin", "wb").truncate(256 << 20)
PY
# start_bg COMMAND...: in the background, its signals at their defaults (a
# script's background job would ignore SIGINT); its pid in $bg
start_bg() {
  python3 -c 'import os, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(s, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])' "$@" > bg.out 2>&1 &
  bg=$!
}
# wait_file PATH: until it exists (at most 60 s); 1 if it never did
wait_file() {
  local i
  for i in $(seq 6000); do [ -e "$1" ] && return 0; kill -0 "$bg" 2>/dev/null || break; sleep 0.01; done
  [ -e "$1" ]
}
# interrupt SIGNAL OUT COMMAND...: the import, stopped by SIGNAL while its
# temporary exists, leaves neither it nor OUT, and exits 128 + the signal
interrupt() {
  local sig=$1 out=$2 rc; shift 2
  start_bg "$@"
  local tmp="$out.tmp.$HOST.$bg"
  if ! wait_file "$tmp"; then
    wait "$bg"; bad "$*: no temporary $tmp seen before it ended ($(ls "$out"* 2>&1)): $(cat bg.out)"; return
  fi
  kill -s "$sig" "$bg"; wait "$bg"; rc=$?
  [ "$rc" = $((128 + $(kill -l "$sig"))) ] && ok || bad "$*: exit $rc after SIG$sig: $(cat bg.out)"
  no_output "$out"
}
interrupt INT big_n.h5 $NPY --train-x d/big_x.npy --train-y d/big_y.npy -o big_n.h5
interrupt TERM big_i.h5 $DTRAIN data import idx --train-images d/big-images --train-labels d/big-labels -o big_i.h5
interrupt HUP big_t.h5 $DTRAIN data import tokens --train d/big.bin -o big_t.h5
interrupt INT big_t.h5 $DTRAIN data import tokens --train d/big.bin -o big_t.h5
# a second import of the same output while one runs is refused (75), and
# the first one completes
start_bg $DTRAIN data import tokens --train d/big.bin -o big_t.h5
if wait_file "big_t.h5.tmp.$HOST.$bg"; then
  expect 75 "dataset big_t.h5 is being written by another import \(pid $bg on this host, into big_t.h5.tmp.$HOST.$bg\); wait for it" -- \
    $DTRAIN data import tokens --train d/big.bin -o big_t.h5
  wait "$bg" && ok || bad "the first import failed: $(cat bg.out)"
  expect 0 "train: 134217728 tokens" -- $DTRAIN data info big_t.h5
else
  wait "$bg"; bad "no temporary seen: $(cat bg.out)"
fi
rm -f big_t.h5 d/big*
# what a killed import left (SIGKILL cannot be caught): its pid is not
# running on this host, so the next import of that output removes it
sh -c 'exit 0' & dead=$!; wait $dead
printf 'half a dataset' > "s.h5.tmp.$HOST.$dead"
expect 0 "removed s.h5.tmp.$HOST.$dead \([^)]*\), left by an import that is no longer running \(pid $dead on this host\)" -- \
  $CSV --train d/train.csv -o s.h5
[ -e "s.h5.tmp.$HOST.$dead" ] && bad "stale s.h5.tmp.$HOST.$dead left" || ok
# ... one of a running process is never touched, and the import is refused
sleep 100 & live=$!
printf 'being written' > "s2.h5.tmp.$HOST.$live"
expect 75 "dataset s2.h5 is being written by another import \(pid $live on this host" -- \
  $CSV --train d/train.csv -o s2.h5
[ "$(cat "s2.h5.tmp.$HOST.$live")" = "being written" ] && [ ! -e s2.h5 ] && ok || bad "live temporary touched"
kill $live; wait $live 2>/dev/null
# ... nor one that is held locked though its pid is not running here
# (HDF5 locks what it writes: a writer in another pid namespace)
if command -v flock >/dev/null; then
  printf 'x' > "s2.h5.tmp.$HOST.$dead"
  # the lock's holder is the sleep itself (its fd 9), so killing it frees the lock
  (exec 9<"s2.h5.tmp.$HOST.$dead" && flock -x 9 && exec sleep 100) >/dev/null 2>&1 & holder=$!
  for i in $(seq 100); do grep -q "FLOCK .* $holder " /proc/locks 2>/dev/null && break; sleep 0.05; done
  expect 75 "dataset s2.h5 is being written by another import \(pid $dead on this host, into s2.h5.tmp.$HOST.$dead, which is held locked\)" -- \
    $CSV --train d/train.csv -o s2.h5
  [ -e "s2.h5.tmp.$HOST.$dead" ] && ok || bad "locked temporary removed"
  kill $holder; wait $holder 2>/dev/null
  rm -f "s2.h5.tmp.$HOST.$dead"
fi
# ... nor one of another host, nor an older dtrain's "<out>.tmp.<pid>":
# whether their writers run cannot be told here; they are named and left
printf 'x' > s3.h5.tmp.some-other-node.42
printf 'x' > s3.h5.tmp.$dead
expect 0 "note: leaving s3.h5.tmp.some-other-node.42 \([^)]*\), the temporary of an import on host some-other-node \(pid 42\)" -- \
  $CSV --train d/train.csv -o s3.h5
expect 0 "note: leaving s3.h5.tmp.$dead .*by an older dtrain" -- $CSV --train d/train.csv -o s3.h5 --force
[ -e s3.h5.tmp.some-other-node.42 ] && [ -e s3.h5.tmp.$dead ] && ok || bad "another host's temporary removed"
rm -f s3.h5.tmp.*

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
