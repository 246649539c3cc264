#!/usr/bin/env bash
# Tests of `dtrain doctor`: alone (one row, this host, the GPU or why there
# is none, the live checks passing, exit 0), under real mpirun -np 2 (two
# rows, the all-reduce over 2 ranks), a job's output.dir that does not
# exist yet (its parent is checked, the directory is not made), a --dir
# that is missing or read-only (a problem, exit 69), Slurm's task count
# without a launcher (the "not started by a launcher" problem), a run
# directory not shared between hosts (DTRAIN_FAULT=1:otherhost: rank 1
# acts as another node and writes its file into a private directory), and
# usage errors. On a machine with one GPU, two ranks on it are reported
# as sharing it. After every run the directory checked holds what it held
# before: the doctor leaves nothing behind.
#   doctor_test.sh DTRAIN SOURCE_DIR WORKDIR
set -uo pipefail
DTRAIN=$(realpath "$1")
SRC=$(realpath "$2")
W=$3
LIMIT=120 # seconds any one doctor may run
rm -rf "$W" && mkdir -p "$W/here" "$W/tmp"
cd "$W/here" || exit 1
export TMPDIR=$W/tmp
export OMPI_MCA_btl=self,vader # one node: shared memory, no interface probing
unset DTRAIN_LOG DTRAIN_FAULT SLURM_JOB_ID SLURM_NTASKS SLURM_STEP_NUM_TASKS SLURM_PROCID
unset SLURM_LOCALID PMI_SIZE OMPI_COMM_WORLD_SIZE
MPIRUN=(mpirun --oversubscribe --allow-run-as-root -x OMPI_MCA_btl -x TMPDIR)
HOST=$(uname -n)
pass=0 fail=0

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { if [ "$2" == "$3" ]; then ok; else bad "$1: got '$2', want '$3'"; fi; }
# has NAME PATTERN: run NAME's stdout matches PATTERN (extended regex)
has() { if grep -qE -- "$2" "$1.out"; then ok; else bad "$1: output lacks /$2/:" && cat "$1.out" "$1.err"; fi; }
hasnt() { if grep -qE -- "$2" "$1.out"; then bad "$1: output has /$2/:" && cat "$1.out"; else ok; fi; }
# rows NAME: the table rows (lines that start with a rank number)
rows() { grep -cE '^[0-9]+ +[^ ]' "$1.out"; }
# doctor NAME [args...] / mdoctor NAME NP [args...]: runs it, sets rc
doctor() {
  local name=$1
  shift
  timeout -k 5 "$LIMIT" "$DTRAIN" doctor "$@" >"$W/$name.out" 2>"$W/$name.err"
  rc=$?
}
mdoctor() {
  local name=$1 np=$2
  shift 2
  local fwd=()
  [ -n "${DTRAIN_FAULT:-}" ] && fwd=(-x DTRAIN_FAULT)
  [ -n "${CUDA_VISIBLE_DEVICES+set}" ] && fwd+=(-x CUDA_VISIBLE_DEVICES)
  timeout -k 5 "$LIMIT" "${MPIRUN[@]}" "${fwd[@]}" -np "$np" "$DTRAIN" doctor "$@" \
    >"$W/$name.out" 2>"$W/$name.err"
  rc=$?
}
# unchanged DESC DIR BEFORE: DIR lists as it did (nothing left behind)
unchanged() {
  local now
  now=$(ls -A "$2" | sort | tr '\n' ' ')
  check "$1 leaves nothing in $2" "$now" "$3"
}
listing() { ls -A "$1" | sort | tr '\n' ' '; }
cd "$W" || exit 1

# ---- alone, in the working directory --------------------------------------------
touch here/keep.txt
before=$(listing here)
(cd here && timeout -k 5 "$LIMIT" "$DTRAIN" doctor >"$W/alone.out" 2>"$W/alone.err")
rc=$?
check "doctor alone: exit" "$rc" 0
check "doctor alone: rows" "$(rows alone)" 1
has alone "^0 +$HOST "
has alone "ok +CPU GEMM 64x96x80 with BLAS matches the C reference"
has alone "ok +MPI all-reduce of 4 MiB over 1 rank on 1 host: exact"
has alone "ok +HDF5 file written, read back and removed in $W/here "
has alone "^no problems found"
hasnt alone "PROBLEM"
has alone "^  MPI +Open MPI|^  MPI +MPICH|^  MPI +[A-Za-z]"
has alone "^  HDF5 +HDF5 [0-9]"
has alone "parallel \(MPI-IO\): yes"
has alone "^  BLAS +[A-Za-z]"
if "$DTRAIN" version | grep -q '^gpu: none'; then
  # no GPU: said plainly, on one line, with the reason; the GPU checks skip
  check "doctor alone: one 'gpu: none' line" "$(grep -c '^gpu: none' alone.out)" 1
  why=$("$DTRAIN" version | sed -n 's/^gpu: none; //p')
  has alone "^gpu: none: .*${why:0:20}"
  has alone "skip +GPU kernel and GEMM against the CPU: no usable GPU"
else
  has alone "ok +GPU kernel \(ReLU, exact\) and GEMM 64x96x80 \(cuBLAS, fp32\) match the CPU"
  has alone "^0 +$HOST +0/1 +[0-9]+ +[^ ]+ +0:"
  hasnt alone "^gpu: none"
fi
unchanged "doctor alone" here "$before"

# ---- two ranks under mpirun ------------------------------------------------------
mdoctor two 2 --dir "$W/here"
if grep -q "would share one GPU" two.out; then
  # a machine with one GPU: two ranks on it is the problem to report
  check "doctor -np 2 on one GPU: exit" "$rc" 69
  has two "^PROBLEM: ranks 0 and 1 on $HOST would share one GPU .*Fix: start one rank per GPU"
  has two "^1 problem found"
else
  check "doctor -np 2: exit" "$rc" 0
  has two "^no problems found"
fi
check "doctor -np 2: rows" "$(rows two)" 2
has two "^0 +$HOST +0/2 "
has two "^1 +$HOST +1/2 "
has two "^dtrain doctor .*: 2 ranks on 1 host"
has two "ok +MPI all-reduce of 4 MiB over 2 ranks on 1 host: exact on every rank; bus bandwidth [0-9.]+ GB/s"
has two "skip +run directory shared between hosts: every rank is on one host"
unchanged "doctor -np 2" here "$before"

# ---- a job whose output.dir does not exist yet: its parent is checked ------------
mkdir -p runs
doctor job "$SRC/configs/fashion-mnist-mlp.yaml" --set "output.dir=$W/runs/new/deeper"
check "doctor JOB: exit" "$rc" 0
has job "ok +HDF5 file written, read back and removed in $W/runs \(the nearest existing parent of output.dir $W/runs/new/deeper\)"
check "doctor JOB: output.dir not made" "$(listing runs)" ""

# ---- a missing --dir --------------------------------------------------------------
doctor missing --dir "$W/no/such/dir"
check "doctor --dir missing: exit" "$rc" 69
has missing "^PROBLEM: rank 0 \($HOST\): --dir $W/no/such/dir does not exist. Fix: create it"
has missing "^1 problem found"
[ -e "$W/no" ] && bad "doctor --dir missing made $W/no"

# ---- a read-only --dir ---------------------------------------------------------------
# Root writes through permissions: an immutable directory (chattr +i) where
# the file system has that, else /proc/1, where no file can be created.
mkdir -p ro
ro_dir=$W/ro ro_how=""
if [ "$(id -u)" != 0 ]; then
  chmod 555 ro && ro_how="chmod 555"
elif chattr +i ro 2>/dev/null; then
  ro_how="chattr +i"
fi
if [ -z "$ro_how" ] || touch ro/probe 2>/dev/null; then
  rm -f ro/probe
  ro_dir=/proc/1 ro_how="procfs"
fi
before_ro=$(listing "$ro_dir")
doctor readonly --dir "$ro_dir"
check "doctor --dir read-only ($ro_how): exit" "$rc" 69
has readonly "^PROBLEM: rank 0 \($HOST\) cannot write and read an HDF5 file in $ro_dir: .*cannot create it"
has readonly "Fix: make $ro_dir writable"
unchanged "doctor --dir read-only ($ro_how)" "$ro_dir" "$before_ro"
[ "$ro_how" = "chattr +i" ] && chattr -i ro
[ "$ro_how" = "chmod 555" ] && chmod 755 ro

# ---- Slurm announces 2 tasks, but no launcher started MPI --------------------------
(cd here && SLURM_JOB_ID=4242 SLURM_NTASKS=2 SLURM_PROCID=0 SLURM_LOCALID=0 \
  timeout -k 5 "$LIMIT" "$DTRAIN" doctor >"$W/slurm.out" 2>"$W/slurm.err")
rc=$?
check "doctor SLURM_NTASKS=2 alone: exit" "$rc" 69
has slurm "^0 +$HOST +0/1 +[0-9]+ +4242/0\.0 "
has slurm "^PROBLEM: MPI was not started by a launcher: SLURM_NTASKS=2 on rank 0 \($HOST\) announces 2 tasks, but this MPI world has 1 rank"
has slurm "Fix: start dtrain with srun --mpi=pmix"
unchanged "doctor under SLURM_NTASKS=2" here "$before"

# ---- a run directory not shared between hosts (rank 1 acts as another node) ----------
# (GPUs hidden: the two "nodes" would otherwise share this machine's GPU)
CUDA_VISIBLE_DEVICES= DTRAIN_FAULT=1:otherhost mdoctor private 2 --dir "$W/here"
check "doctor otherhost: exit" "$rc" 69
has private "^1 +$HOST-otherhost "
has private "^dtrain doctor .*: 2 ranks on 2 hosts"
has private "^PROBLEM: the run directory's file system \($W/here\) is not shared between hosts: rank 0 on $HOST does not see the file rank 1 on $HOST-otherhost wrote there"
has private "^1 problem found"
unchanged "doctor otherhost" here "$before"
check "doctor otherhost: private directory removed" "$(listing tmp)" ""

# ---- usage ---------------------------------------------------------------------------
doctor usage1 --frobnicate
check "doctor --frobnicate: exit" "$rc" 64
doctor usage2 a.yaml b.yaml
check "doctor two job files: exit" "$rc" 64
doctor usage3 "$SRC/configs/fashion-mnist-mlp.yaml" --set train.nonsense=1
check "doctor --set unknown key: exit" "$rc" 64
DTRAIN_FAULT=0:bogus doctor usage4
check "doctor DTRAIN_FAULT=0:bogus: exit" "$rc" 64
"$DTRAIN" doctor --help | grep -q '^usage: dtrain doctor' && ok || bad "doctor --help"
"$DTRAIN" --help | grep -q '^  doctor ' && ok || bad "dtrain --help lacks doctor"

echo "doctor tests: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
