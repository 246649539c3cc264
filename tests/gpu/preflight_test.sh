#!/usr/bin/env bash
# The GPU check's preflight (tests/gpu/check.sh) on any machine, GPU or not:
# each condition it must catch is faked, the check is run, and the test
# asserts its exit status, the one "preflight FAILED:" line, and that the
# stage table in summary.txt ends at the preflight (the early stop is read
# from the table, never from the clock). A failing case runs the whole
# check, so a preflight that let it through would show in the table; a
# passing case runs setup and the preflight alone (DTRAIN_CHECK_STAGES).
#   preflight_test.sh DTRAIN SOURCE_DIR [WORKDIR]
# The fakes, so that the check's own code paths run:
#   - PATH shims: getconf (an older glibc, FAKE_GLIBC), df (little space
#     under the folders FAKE_DF names), nvidia-smi (a GPU listed);
#   - a stand-in dtrain linked against a stand-in NCCL library,
#     libnccl_dtfake.so.2 (a name no machine has, so the real NCCL of the
#     machine cannot answer for it), put nowhere, in a pip-style nvidia.nccl
#     namespace package, in a torch/lib, or in a CUDA toolkit folder;
#   - a stand-in dtrain (a script) whose `dtrain version` names the cuDNN
#     and NCCL of FAKE_CUDNN and FAKE_NCCL;
#   - a bundle (.gpu-bundle with env, MANIFEST and the real dtrain) beside a
#     copy of check.sh;
#   - a sitecustomize.py that hides torch or h5py from the python, and empty
#     torch and h5py packages that stand in for them.
set -euo pipefail
DTRAIN=$(readlink -f "$1")
SRC=$(cd "$2" && pwd)
W=${3:-}
for t in cc python3 ldd; do
  command -v "$t" >/dev/null || { echo "SKIPPED: $t is not installed (launch/setup.sh)"; exit 77; }
done
if [ -z "$W" ]; then
  W=$(mktemp -d)
  trap 'rm -rf "$W"' EXIT
fi
rm -rf "${W:?}"/*
mkdir -p "$W"
W=$(cd "$W" && pwd)
CHECK=$SRC/tests/gpu/check.sh
FAILS=0
fail() {
  echo "FAILED: $*"
  FAILS=$((FAILS + 1))
}

# ---- fakes -----------------------------------------------------------------------------
mkdir -p "$W/shims" "$W/gpu-shims"
cat >"$W/shims/getconf" <<EOF
#!/bin/sh
if [ "\$1" = GNU_LIBC_VERSION ] && [ -n "\${FAKE_GLIBC:-}" ]; then echo "glibc \$FAKE_GLIBC"; exit 0; fi
exec $(command -v getconf) "\$@"
EOF
# FAKE_DF="FOLDER=MIB ...": a path at or under FOLDER has MIB MiB free (the
# first FOLDER that matches; "/" matches every path).
cat >"$W/shims/df" <<EOF
#!/bin/bash
for a in "\$@"; do p=\$a; done
for e in \${FAKE_DF:-}; do
  d=\${e%=*} m=\${e##*=}
  if [ "\$d" = / ] || [ "\$p" = "\$d" ] || [[ \$p == "\$d"/* ]]; then
    echo "Filesystem 1024-blocks Used Available Capacity Mounted on"
    echo "fake \$((m * 1024 + 1)) 1 \$((m * 1024)) 1% \$d"
    exit 0
  fi
done
exec $(command -v df) "\$@"
EOF
cat >"$W/gpu-shims/nvidia-smi" <<'EOF'
#!/bin/sh
case "$*" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  *--query-gpu*) echo "NVIDIA H200 (stand-in), 580.00" ;;
  *) echo "stand-in nvidia-smi: one NVIDIA H200" ;;
esac
EOF
# and, first on PATH unless the GPU one is, an nvidia-smi that lists no GPU
printf '%s\n' '#!/bin/sh' 'echo "NVIDIA-SMI has failed: no devices were found (stand-in)"' 'exit 6' \
  >"$W/shims/nvidia-smi"
chmod +x "$W"/shims/* "$W"/gpu-shims/*

# a stand-in NCCL and a dtrain that needs it
mkdir -p "$W/libsrc" "$W/fbuild"
echo 'int dt_fake_nccl(void) { return 0; }' >"$W/libsrc/nccl.c"
printf '%s\n' 'int dt_fake_nccl(void);' 'int main(void) { return dt_fake_nccl(); }' >"$W/libsrc/main.c"
LIB=libnccl_dtfake.so.2
cc -shared -fPIC -Wl,-soname,$LIB -o "$W/libsrc/$LIB" "$W/libsrc/nccl.c"
cc -o "$W/fbuild/dtrain" "$W/libsrc/main.c" "$W/libsrc/$LIB"
mkdir -p "$W/site/nvidia/nccl/lib" "$W/torchsite/torch/lib" "$W/cuda/lib64"
cp "$W/libsrc/$LIB" "$W/site/nvidia/nccl/lib/" # nvidia/ is a namespace package: no __init__.py
cp "$W/libsrc/$LIB" "$W/torchsite/torch/lib/"
touch "$W/torchsite/torch/__init__.py"
cp "$W/libsrc/$LIB" "$W/cuda/lib64/"
rm "$W/libsrc/$LIB"

# python: FAKE_HIDE="torch h5py" hides those modules; empty stand-ins for both
mkdir -p "$W/hide" "$W/pkgs/torch" "$W/pkgs/h5py"
cat >"$W/hide/sitecustomize.py" <<'EOF'
import os, sys
for name in os.environ.get("FAKE_HIDE", "").split():
    sys.modules[name] = None  # find_spec then answers None, import fails
EOF
touch "$W/pkgs/torch/__init__.py" "$W/pkgs/h5py/__init__.py"

# a bundle beside a copy of the check; the MANIFEST asks for this machine's glibc
HOST_GLIBC=$(getconf GNU_LIBC_VERSION | awk '{ print $2 }')
mkdir -p "$W/brepo/tests/gpu" "$W/brepo/.gpu-bundle/bin" "$W/brepo/.gpu-bundle/data"
cp "$CHECK" "$W/brepo/tests/gpu/check.sh"
cp "$DTRAIN" "$W/brepo/.gpu-bundle/bin/dtrain"
touch "$W/brepo/.gpu-bundle/data/fashion-mnist.h5"
cat >"$W/brepo/.gpu-bundle/env" <<'EOF'
DTRAIN_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export DTRAIN_BUNDLE
EOF
printf '%s\n' "dtrain GPU bundle" "made:    by tests/gpu/preflight_test.sh" \
  "glibc:   needs $HOST_GLIBC or newer" "" "./bin/dtrain" >"$W/brepo/.gpu-bundle/MANIFEST"
(cd "$W/brepo" && sha256sum tests/gpu/check.sh >.gpu-bundle/SOURCES.sha256)

# a dtrain whose version lines are FAKE_CUDNN and FAKE_NCCL (none when unset)
mkdir -p "$W/vbuild"
cat >"$W/vbuild/dtrain" <<'EOF'
#!/bin/sh
[ "$1" = version ] || exit 0
echo "dtrain 0.1.0 (backends: cpu cuda; stand-in)"
echo "gpu: none; stand-in"
[ -n "${FAKE_CUDNN:-}" ] && echo "cudnn: $FAKE_CUDNN"
[ -n "${FAKE_NCCL:-}" ] && echo "nccl: $FAKE_NCCL"
exit 0
EOF
chmod +x "$W/vbuild/dtrain"

touch "$W/data.h5" # setup asks only that the dataset exists

# ---- running the check ------------------------------------------------------------------
# check NAME SCRIPT [VAR=VALUE ...]: runs the check's part PART (none named
# when empty) in the folder RUN_IN (default the current one), output in
# $W/NAME.out, logs in $W/NAME/, exit status in RC.
TOP=$PWD
RUN_IN=$TOP
PART=""
check() {
  local name=$1 script=$2
  shift 2
  set +e
  # shellcheck disable=SC2086 # PART: none, one or two words
  cd "$RUN_IN" && env -u DTRAIN_CHECK_COMMAND_S -u DTRAIN_CHECK_COMPILE -u CUDA_HOME -u CUDA_PATH -u TMPDIR -u PYTHON -u DTRAIN_CHECK_STAGES -u PYTHONPATH -u DTRAIN_BUNDLE \
    -u DTRAIN_BUILD_DIR DTRAIN_DATA="$W/data.h5" PATH="$W/shims:$PATH" DTRAIN_CHECK_BUDGET_S=120 \
    "$@" bash "$script" $PART "$W/$name" >"$W/$name.out" 2>&1
  RC=$?
  cd - >/dev/null
  set -e
}
# rows NAME: the stage table of summary.txt as "stage VERDICT,..."
rows() {
  sed -n 's/^\([a-z_0-9]*\) \{1,\}\([A-Z][A-Z ]*[A-Z]\) \{1,\}[0-9]*s .*/\1 \2/p' "$W/$1/summary.txt" |
    paste -sd, -
}
row() { grep -E "^$2 " "$W/$1/summary.txt" || true; }

# expect_stop NAME PATTERN: the check ended at the preflight with one line matching PATTERN
expect_stop() {
  local name=$1 pattern=$2 lines
  lines=$(grep -c '^preflight FAILED: ' "$W/$name.out" || true)
  [ "$RC" = 1 ] || fail "$name: exit $RC, want 1"
  [ "$lines" = 1 ] || fail "$name: $lines 'preflight FAILED:' lines, want 1"
  grep -qE "^preflight FAILED: .*$pattern" "$W/$name.out" ||
    fail "$name: no 'preflight FAILED:' line matching '$pattern'"
  [ "$(rows "$name")" = "setup PASS,preflight FAIL" ] ||
    fail "$name: stage table '$(rows "$name")', want 'setup PASS,preflight FAIL' (an early stop)"
  grep -q '^dtrain GPU check, part [a-z]*: FAILED at preflight: ' "$W/$name/summary.txt" ||
    fail "$name: summary.txt's verdict does not name the preflight"
  echo "$name: exit $RC; $(grep '^preflight FAILED: ' "$W/$name.out" | cut -c1-160)..."
}
# expect_pass NAME PATTERN...: the preflight passed (exit 0) and said each PATTERN
expect_pass() {
  local name=$1 p
  shift
  [ "$RC" = 0 ] || fail "$name: exit $RC, want 0"
  ! grep -q '^preflight FAILED' "$W/$name.out" || fail "$name: $(grep '^preflight FAILED' "$W/$name.out")"
  [ -n "$(row "$name" 'preflight +PASS')" ] || fail "$name: no 'preflight PASS' row in summary.txt"
  for p in "$@"; do
    grep -qE "$p" "$W/$name.out" || fail "$name: the output does not say '$p'"
  done
  echo "$name: exit $RC; $(rows "$name")"
}
show_on_failure() { [ "$FAILS" = "$1" ] || { echo "---- $2.out:"; cat "$W/$2.out"; }; }

BUILD=$(dirname "$DTRAIN")
FB=$W/fbuild
run_case() { # NAME SCRIPT EXPECT [VAR=VALUE ...] -- ARGS FOR EXPECT
  local name=$1 script=$2 expect=$3 before=$FAILS vars=()
  shift 3
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  check "$name" "$script" "${vars[@]}"
  "$expect" "$name" "$@"
  show_on_failure "$before" "$name"
}

echo "== nothing faked"
run_case plain "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES=preflight -- \
  '^preflight: libraries: every library of dtrain found' '^preflight: scratch: '
[ "$(rows plain)" = "setup PASS,preflight PASS" ] || fail "plain: stage table '$(rows plain)'"

echo "== parts"
# no part named: correctness, whose stages do not include the benchmarks,
# under its own default budget, with a pointer to the other part
run_case default_part "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES="preflight bench" \
  DTRAIN_CHECK_BUDGET_S= -- '^dtrain GPU check, part correctness, .*budget 300s'
[ "$(rows default_part)" = "setup PASS,preflight PASS" ] || fail "default_part: stage table '$(rows default_part)'"
grep -q '^dtrain GPU check, part correctness: PASSED .* of a 300s budget' "$W/default_part/summary.txt" ||
  fail "default_part: verdict '$(head -1 "$W/default_part/summary.txt")'"
grep -q 'bash tests/gpu/check.sh bench' "$W/default_part/summary.txt" ||
  fail "default_part: summary.txt does not say how to run the bench part"
PART=bench
run_case bench_part "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES="preflight bench" \
  DTRAIN_CHECK_BUDGET_S= -- '^dtrain GPU check, part bench \(no torch.compile\), .*budget 300s'
[ "$(rows bench_part)" = "setup PASS,preflight PASS,bench SKIP" ] || fail "bench_part: stage table '$(rows bench_part)'"
! grep -q 'check.sh bench' "$W/bench_part/summary.txt" || fail "bench_part: points to itself"
# torch.compile when asked, by option or by variable
PART="bench --compile"
run_case compile_option "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES=preflight -- \
  '^dtrain GPU check, part bench \(torch.compile too\), '
PART=bench
run_case compile_env "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES=preflight \
  DTRAIN_CHECK_COMPILE=1 -- '^dtrain GPU check, part bench \(torch.compile too\), '
# refusals: exit 2 before anything runs (no summary.txt)
expect_refused() { # NAME PATTERN
  [ "$RC" = 2 ] || fail "$1: exit $RC, want 2"
  grep -qE "^check.sh: $2" "$W/$1.out" || fail "$1: no refusal matching '$2'"
  [ ! -e "$W/$1/summary.txt" ] || fail "$1: the check ran (a summary.txt) although refused"
  echo "$1: exit $RC; $(head -1 "$W/$1.out" | cut -c1-120)"
}
PART=benchmarks
run_case part_unknown "$CHECK" expect_refused DTRAIN_BUILD_DIR="$BUILD" -- \
  "unknown part 'benchmarks': the parts are correctness, bench"
PART=bench
run_case budget_over "$CHECK" expect_refused DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_BUDGET_S=601 -- \
  "a 601s budget for bench is over the 600s one command may run"
run_case budget_limit "$CHECK" expect_refused DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_COMMAND_S=250 \
  DTRAIN_CHECK_BUDGET_S= -- "a 300s budget for bench is over the 250s"
PART="correctness --compile"
run_case compile_correctness "$CHECK" expect_refused DTRAIN_BUILD_DIR="$BUILD" -- \
  "--compile belongs to the bench part"
PART=""

echo "== cuDNN and NCCL versions"
VB=$W/vbuild
run_case versions_same "$CHECK" expect_pass DTRAIN_BUILD_DIR="$VB" DTRAIN_CHECK_STAGES=preflight \
  FAKE_CUDNN=9.5.0 FAKE_NCCL=2.28.3 -- \
  "^preflight: versions: cuDNN 9\.5\.0, NCCL 2\.28\.3; none older than dtrain was built against$"
! grep -q WARNING "$W/versions_same.out" || fail "versions_same: a warning for the same versions"
run_case versions_older "$CHECK" expect_pass DTRAIN_BUILD_DIR="$VB" DTRAIN_CHECK_STAGES=preflight \
  FAKE_CUDNN="9.1.0 (built against 9.10.0)" FAKE_NCCL="2.21.5 (built with 2.28.3)" -- \
  "^preflight: versions: WARNING: cuDNN at run time is 9\.1\.0, older than the 9\.10\.0 dtrain was built against" \
  "^preflight: versions: WARNING: NCCL at run time is 2\.21\.5, older than the 2\.28\.3 dtrain was built against"
grep -q '^preflight: versions: cuDNN 9.1.0, NCCL 2.21.5; cuDNN and NCCL older than dtrain was built against' \
  "$W/versions_older.out" || fail "versions_older: the summing-up line: $(grep '^preflight: versions: [^W]' "$W/versions_older.out")"
row versions_older 'preflight +PASS' | grep -q 'cuDNN 9.1.0 older than the 9.10.0 built against.*NCCL 2.21.5 older' ||
  fail "versions_older: the preflight row does not carry the warnings: $(row versions_older preflight)"
# newer at run time, compared as versions (9.10 after 9.9), not as text
run_case versions_newer "$CHECK" expect_pass DTRAIN_BUILD_DIR="$VB" DTRAIN_CHECK_STAGES=preflight \
  FAKE_CUDNN="9.10.0 (built against 9.9.1)" FAKE_NCCL="2.28.3 (built with 2.21.5)" -- \
  "^preflight: versions: cuDNN 9\.10\.0 \(built against 9\.9\.1\), NCCL 2\.28\.3 \(built against 2\.21\.5\); none older"
! grep -q WARNING "$W/versions_newer.out" || fail "versions_newer: $(grep WARNING "$W/versions_newer.out")"
run_case versions_major "$CHECK" expect_stop DTRAIN_BUILD_DIR="$VB" FAKE_CUDNN="8.9.7 (built against 9.5.0)" -- \
  "cuDNN at run time is 8\.9\.7, of another major version than the 9\.5\.0 dtrain was built against"
run_case versions_none "$CHECK" expect_pass DTRAIN_BUILD_DIR="$VB" DTRAIN_CHECK_STAGES=preflight -- \
  "^preflight: versions: not compared"

echo "== NCCL"
run_case nccl_nowhere "$CHECK" expect_stop DTRAIN_BUILD_DIR="$FB" -- \
  "$LIB \(NCCL\), found neither by the loader.*pip install nvidia-nccl-cu13"
run_case nccl_pip "$CHECK" expect_pass DTRAIN_BUILD_DIR="$FB" PYTHONPATH="$W/site" \
  DTRAIN_CHECK_STAGES="preflight info" -- \
  "^preflight: libraries: $LIB is in $W/site/nvidia/nccl/lib \(the python3 package nvidia.nccl\)" \
  "added to LD_LIBRARY_PATH$"
# the info stage runs ldd and dtrain after the preflight: it sees the folder added
[ -n "$(row nccl_pip 'info +PASS')" ] || fail "nccl_pip: info did not pass with the folder the preflight added"
run_case nccl_torch "$CHECK" expect_pass DTRAIN_BUILD_DIR="$FB" PYTHONPATH="$W/torchsite" \
  DTRAIN_CHECK_STAGES=preflight -- \
  "^preflight: libraries: $LIB is in $W/torchsite/torch/lib \(the python3 package torch \(torch/lib\)\)"
run_case nccl_toolkit "$CHECK" expect_pass DTRAIN_BUILD_DIR="$FB" CUDA_HOME="$W/cuda" \
  DTRAIN_CHECK_STAGES=preflight -- "^preflight: libraries: $LIB is in $W/cuda/lib64 \(the CUDA toolkit in $W/cuda\)"

echo "== glibc (a bundle)"
BCHECK=$W/brepo/tests/gpu/check.sh
run_case bundle "$BCHECK" expect_pass DTRAIN_CHECK_STAGES=preflight -- \
  "^preflight: glibc: $HOST_GLIBC, the bundle needs $HOST_GLIBC or newer"
run_case glibc_old "$BCHECK" expect_stop FAKE_GLIBC=2.17 -- \
  "glibc is 2\.17, older than the $HOST_GLIBC the bundle's programs need \(its MANIFEST\).*bundle\.sh"
# a MANIFEST without the line: the GLIBC_ versions named in the bundle's files
sed -i '/^glibc:/d' "$W/brepo/.gpu-bundle/MANIFEST"
run_case glibc_scan "$BCHECK" expect_stop FAKE_GLIBC=2.17 -- \
  "glibc is 2\.17, older than the 2\.[0-9]+ the bundle's programs need \(the GLIBC_ versions"

echo "== space"
mkdir -p "$W/small"
run_case scratch_moved "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES=preflight \
  TMPDIR="$W/small" FAKE_DF="$W/small=10 /=100000" -- \
  "^preflight: scratch: $W/small has 10 MiB free, 1024 needed: using /tmp/dtrain-check\.[A-Za-z0-9]+ instead"
moved=$(sed -n 's/.*: using \(.*\) instead.*/\1/p' "$W/scratch_moved.out")
[ -n "$moved" ] && [ ! -e "$moved" ] || fail "scratch_moved: the scratch folder '$moved' was not removed at the end"
run_case no_room "$CHECK" expect_stop DTRAIN_BUILD_DIR="$BUILD" FAKE_DF="/=10" -- \
  "no folder has the 1056 MiB free that the check's scratch files need \(/tmp 10 MiB.*set TMPDIR"
run_case shm_short "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES=preflight \
  FAKE_DF="/dev/shm=8 /=100000" -- \
  "^preflight: /dev/shm: 8 MiB free, 32 needed: Open MPI's shared memory goes to .*" \
  "OMPI_MCA_btl_vader_backing_directory.*NCCL_SHM_DISABLE=1"
# a GPU and PyTorch: the benchmarks' run folders need /dev/shm room as well
PART=bench
run_case shm_bench "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES=preflight \
  PATH="$W/gpu-shims:$W/shims:$PATH" PYTHONPATH="$W/pkgs" FAKE_DF="/dev/shm=1000 /=100000" -- \
  "^preflight: /dev/shm: 1000 MiB free, 4640 needed with the benchmarks' run folders: those go to .*DTRAIN_BENCH_TMP" \
  "^preflight: scratch: .*, 5632 needed"
# the correctness part keeps no benchmark run folders
PART=""
run_case shm_correctness "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES=preflight \
  PATH="$W/gpu-shims:$W/shims:$PATH" PYTHONPATH="$W/pkgs" FAKE_DF="/dev/shm=1000 /=100000" -- \
  "^preflight: /dev/shm: 1000 MiB free, 32 needed$" "^preflight: scratch: .*, 1024 needed"

echo "== PyTorch and h5py (the bench part)"
PART=bench
# a GPU is listed, so a SKIP recorded as a GPU stage's would turn into FAIL
run_case no_torch "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES="preflight bench bench_gpt" \
  PATH="$W/gpu-shims:$W/shims:$PATH" PYTHONPATH="$W/hide:$W/pkgs" FAKE_HIDE="torch h5py" -- \
  "^preflight: python: PyTorch and h5py missing for python3"
[ "$(rows no_torch)" = "setup PASS,preflight PASS,bench SKIP,bench_gpt SKIP" ] ||
  fail "no_torch: stage table '$(rows no_torch)'"
row no_torch 'bench +SKIP' | grep -q 'PyTorch and h5py missing$' ||
  fail "no_torch: bench's reason: $(row no_torch bench)"
row no_torch 'bench_gpt +SKIP' | grep -q 'PyTorch missing$' ||
  fail "no_torch: bench_gpt's reason: $(row no_torch bench_gpt)"
grep -q '^dtrain GPU check, part bench: PASSED .*skipped: bench (PyTorch and h5py missing), bench_gpt (PyTorch missing)' \
  "$W/no_torch/summary.txt" || fail "no_torch: verdict '$(head -1 "$W/no_torch/summary.txt")'"
run_case no_h5py "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES="preflight bench" \
  PATH="$W/gpu-shims:$W/shims:$PATH" PYTHONPATH="$W/hide:$W/pkgs" FAKE_HIDE="h5py" -- \
  "^preflight: python: h5py missing for python3 .*: bench will be skipped"
[ "$(rows no_h5py)" = "setup PASS,preflight PASS,bench SKIP" ] || fail "no_h5py: stage table '$(rows no_h5py)'"
row no_h5py 'bench +SKIP' | grep -q 'h5py missing$' || fail "no_h5py: bench's reason: $(row no_h5py bench)"
# a python without site-packages (PYTHON), run from a folder that holds
# folders named torch and h5py: those are no packages
mkdir -p "$W/cwd/torch" "$W/cwd/h5py"
printf '%s\n' '#!/bin/sh' 'exec python3 -S "$@"' >"$W/python-nosite"
chmod +x "$W/python-nosite"
RUN_IN=$W/cwd
run_case nosite "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES=preflight \
  PYTHON="$W/python-nosite" -- "^preflight: python: PyTorch and h5py missing for $W/python-nosite "
RUN_IN=$TOP
# no GPU: the benchmarks skip for that, whatever the python has
run_case no_gpu "$CHECK" expect_pass DTRAIN_BUILD_DIR="$BUILD" DTRAIN_CHECK_STAGES="preflight bench bench_gpt" \
  PYTHONPATH="$W/pkgs" -- "^preflight: python: python3 has PyTorch and h5py"
[ "$(rows no_gpu)" = "setup PASS,preflight PASS,bench SKIP,bench_gpt SKIP" ] ||
  fail "no_gpu: stage table '$(rows no_gpu)'"
row no_gpu 'bench +SKIP' | grep -q 'no GPU$' || fail "no_gpu: bench's reason: $(row no_gpu bench)"
PART=""

if [ "$FAILS" = 0 ]; then echo "preflight_test: all passed"; else echo "preflight_test: $FAILS FAILED"; fi
[ "$FAILS" = 0 ]
