#!/usr/bin/env bash
# The GPU check: the one script to run on a machine with an NVIDIA GPU. It
# runs dtrain's GPU test suites, the GPU training test and the GPU
# benchmark against PyTorch, each stage under its own timeout and all of it
# within a hard time budget (DTRAIN_CHECK_BUDGET_S, default 600 s), and
# writes what it saw to a log folder. Root or not.
#
#   bash tests/gpu/check.sh [LOGDIR]          (default ./gpu-check-out)
#
# Where dtrain comes from, first that applies:
#   1. DTRAIN_BUILD_DIR=DIR: a build made there (dtrain, tests/, tests/gpu/);
#   2. the bundle made by tests/gpu/bundle.sh on a build machine, for a GPU
#      machine without dtrain's other dependencies: .gpu-bundle.tar.xz in the
#      repository root is unpacked to .gpu-bundle/ (an unpacked .gpu-bundle/
#      is used as it is) and its env sourced;
#   3. build-gpu/ when it holds a dtrain;
#   4. a CUDA build into build-gpu/ for this machine's GPU, when cmake and
#      every dependency are installed (launch/setup.sh's packages).
# Stages, in order: setup, info (nvidia-smi, dtrain version, libraries),
# doctor and doctor_mpi (`dtrain doctor` alone and under mpirun -np 1: no
# problem found, and its GPU checks ran where nvidia-smi lists a GPU),
# doctor_test (tests/cli/doctor_test.sh),
# unit (the CPU unit suites: does this build run here at all), the GPU
# suites test_gpu_ops, test_gpu_op_table (every case of the shared op
# table, convolution and pooling through cuDNN included, against the CPU),
# test_gpu_attention, test_gpu_comm and test_cuda_host (each when built),
# gpu_train (tests/gpu/gpu_train.sh), bench (bench/gpu_vs_torch.sh), bench_gpt
# (bench/gpu_gpt_vs_torch.sh: GPT-2 small in bf16 against PyTorch).
# LOGDIR gets summary.txt (stage table and verdict), check.log (everything
# printed), bench.txt (the benchmark's table and BENCH lines) and
# runs.tar.gz (metrics and logs of gpu_train's runs).
# Exit status: 0 every stage passed; 1 a stage failed, timed out or did not
# fit the budget, or a GPU stage skipped although nvidia-smi lists a GPU;
# 77 no GPU is visible (the GPU stages skipped, nothing else failed).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
LOG=${1:-./gpu-check-out}
mkdir -p "$LOG"
LOG=$(cd "$LOG" && pwd)
BUDGET=${DTRAIN_CHECK_BUDGET_S:-600}
RESERVE_S=10 # kept back for packing the logs
START=$(date +%s)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
rm -f "$LOG"/summary.txt "$LOG"/check.log "$LOG"/bench.txt "$LOG"/runs.tar.gz

RESULTS=()
STALE=""
FAILED=0
GPU_SEEN=0

left() { echo $((START + BUDGET - RESERVE_S - $(date +%s))); }

# stage NAME LIMIT_S COMMAND...: runs COMMAND under timeout (LIMIT_S or what
# is left of the budget), prints its time, records PASS/SKIP/FAIL/TIMEOUT.
stage() {
  local name=$1 limit=$2 rc t0 dt verdict
  shift 2
  local avail
  avail=$(left)
  [ "$avail" -lt "$limit" ] && limit=$avail
  if [ "$limit" -lt 5 ]; then
    record "$name" "NOT RUN" 0 "the ${BUDGET}s budget is spent"
    return 0
  fi
  echo
  echo "==== $name (limit ${limit}s, $(($(date +%s) - START))s into the check)"
  t0=$(date +%s)
  set +e
  timeout -k 5 "$limit" "$@"
  rc=$?
  set -e
  dt=$(($(date +%s) - t0))
  case $rc in
    0) verdict=PASS ;;
    77) verdict=SKIP ;;
    124 | 137) verdict=TIMEOUT ;;
    *) verdict=FAIL ;;
  esac
  record "$name" "$verdict" "$dt" "exit $rc"
  echo "==== $name: $verdict in ${dt}s"
}

record() { # NAME VERDICT SECONDS NOTE
  local verdict=$2 note=$4
  if [ "$verdict" = SKIP ] && [ "$GPU_SEEN" = 1 ]; then
    verdict=FAIL
    note="$note: skipped although nvidia-smi lists a GPU"
  fi
  case $verdict in PASS | SKIP | ABSENT) ;; *) FAILED=1 ;; esac
  RESULTS+=("$(printf '%-16s %-8s %5ss  %s' "$1" "$verdict" "$3" "$note")")
}

# ---- setup: find or make dtrain ---------------------------------------------------
unpack() {
  rm -rf "$REPO/.gpu-bundle"
  if ! timeout 120 tar -xJf "$REPO/.gpu-bundle.tar.xz" -C "$REPO" 2>"$WORK/tar.err"; then
    echo "tar could not unpack it ($(head -1 "$WORK/tar.err")); trying python3's tarfile"
    timeout 120 python3 -c '
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    if hasattr(tarfile, "tar_filter"):
        t.extractall(sys.argv[2], filter="tar")
    else:
        t.extractall(sys.argv[2])' "$REPO/.gpu-bundle.tar.xz" "$REPO"
  fi
}

build_here() {
  local missing=""
  for t in cmake nvcc mpicc pkg-config; do command -v "$t" >/dev/null || missing="$missing $t"; done
  if [ -z "$missing" ]; then
    for m in yaml-0.1 cunit hdf5-openmpi zlib; do pkg-config --exists "$m" || missing="$missing $m"; done
  fi
  if [ -n "$missing" ]; then
    echo "no dtrain: no bundle, no build, and cannot build here (missing:$missing);"
    echo "make the bundle with tests/gpu/bundle.sh on a build machine and carry .gpu-bundle.tar.xz"
    return 1
  fi
  cmake -S "$REPO" -B "$REPO/build-gpu" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=native >/dev/null &&
    timeout "$(left)" cmake --build "$REPO/build-gpu" -j"$(nproc)" >"$WORK/build.log" 2>&1 ||
    { tail -30 "$WORK/build.log"; return 1; }
}

setup() {
  if [ -n "${DTRAIN_BUILD_DIR:-}" ]; then
    BUILD=$(cd "$DTRAIN_BUILD_DIR" && pwd)
    FROM="build $BUILD"
  elif [ -f "$REPO/.gpu-bundle.tar.xz" ] || [ -f "$REPO/.gpu-bundle/env" ]; then
    if [ -f "$REPO/.gpu-bundle.tar.xz" ]; then
      echo "unpacking .gpu-bundle.tar.xz"
      unpack || return 1
    fi
    # shellcheck source=/dev/null
    . "$REPO/.gpu-bundle/env"
    BUILD=$DTRAIN_BUNDLE
    FROM="bundle $DTRAIN_BUNDLE"
    export DTRAIN_DATA=${DTRAIN_DATA:-$DTRAIN_BUNDLE/data/fashion-mnist.h5}
    sed -n '1,/^$/p' "$DTRAIN_BUNDLE/MANIFEST"
    if ! (cd "$REPO" && sha256sum -c --quiet "$DTRAIN_BUNDLE/SOURCES.sha256") >"$WORK/sources" 2>&1; then
      STALE="bundle built from other sources than this tree"
      echo "WARNING: the $STALE; differing files:"
      sed 's/^/  /' "$WORK/sources"
    fi
  elif [ -x "$REPO/build-gpu/dtrain" ]; then
    BUILD=$REPO/build-gpu
    FROM="build $BUILD"
  else
    echo "building dtrain into build-gpu/"
    build_here || return 1
    BUILD=$REPO/build-gpu
    FROM="build $BUILD (made by this check)"
  fi
  if [ -x "$BUILD/bin/dtrain" ]; then DTRAIN=$BUILD/bin/dtrain; else DTRAIN=$BUILD/dtrain; fi
  export DTRAIN_DATA=${DTRAIN_DATA:-$REPO/data/fashion-mnist.h5}
  if [ ! -f "$DTRAIN_DATA" ] && [ -d /usr/share/datasets/fashion-mnist ]; then
    mkdir -p "$(dirname "$DTRAIN_DATA")"
    "$DTRAIN" data import idx /usr/share/datasets/fashion-mnist -o "$DTRAIN_DATA" \
      --classes "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot"
  fi
  echo "dtrain: $DTRAIN ($FROM)"
  echo "data:   $DTRAIN_DATA"
  [ -x "$DTRAIN" ] && [ -f "$DTRAIN_DATA" ]
}

info() {
  local ok=0
  echo "host: $(uname -n), $(nproc) cores, $(id -un), glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | cut -d' ' -f2)"
  if command -v nvidia-smi >/dev/null && timeout 30 nvidia-smi; then
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
  else
    echo "nvidia-smi: not available"
  fi
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}"
  echo "libraries of dtrain:"
  local libs
  libs=$(ldd "$DTRAIN")
  sed 's/^/  /' <<<"$libs"
  if grep -q 'not found' <<<"$libs"; then
    echo "some libraries of dtrain are not found"
    ok=1
  fi
  timeout 60 "$DTRAIN" version || ok=1
  return $ok
}

main() {
  echo "dtrain GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${BUDGET}s, logs in $LOG"
  if command -v nvidia-smi >/dev/null && timeout 30 nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    GPU_SEEN=1
  fi
  local t0
  t0=$(date +%s)
  if setup; then
    record setup PASS $(($(date +%s) - t0)) "$FROM${STALE:+; WARNING: $STALE}"
  else
    record setup FAIL $(($(date +%s) - t0)) "no usable dtrain"
    return
  fi
  export DTRAIN_TEST_TMP=$WORK/tmp
  mkdir -p "$DTRAIN_TEST_TMP"
  cd "$REPO" # suites built by bundle.sh find source files from here

  t0=$(date +%s)
  if info; then record info PASS $(($(date +%s) - t0)) "$("$DTRAIN" version | tail -1)"; else
    record info FAIL $(($(date +%s) - t0)) "dtrain does not start or lacks libraries"
  fi

  # dtrain doctor alone and as one rank under mpirun: exit 0 means no
  # problem found; where nvidia-smi lists a GPU, its GPU checks must have run
  # (and the NCCL all-reduce under mpirun).
  local want="skip"
  [ "$GPU_SEEN" = 1 ] && want="ok"
  stage doctor 60 bash -c '"$1" doctor --dir "$2" | tee "$2/doctor.out"; rc=${PIPESTATUS[0]}
      [ "$rc" = 0 ] || exit "$rc"
      grep -qE "^  $3 +GPU kernel" "$2/doctor.out" || { echo "doctor: GPU check not $3"; exit 1; }' \
    _ "$DTRAIN" "$DTRAIN_TEST_TMP" "$want"
  stage doctor_mpi 60 bash -c 'mpirun --oversubscribe --allow-run-as-root -np 1 "$1" doctor \
        --dir "$2" | tee "$2/doctor_mpi.out"; rc=${PIPESTATUS[0]}
      [ "$rc" = 0 ] || exit "$rc"
      grep -qE "^  $3 +GPU kernel" "$2/doctor_mpi.out" || { echo "doctor: GPU check not $3"; exit 1; }
      [ "$3" = skip ] || grep -qE "^  ok +NCCL all-reduce" "$2/doctor_mpi.out" ||
        { echo "doctor: the NCCL all-reduce did not run"; exit 1; }' \
    _ "$DTRAIN" "$DTRAIN_TEST_TMP" "$want"
  stage doctor_test 120 bash "$REPO/tests/cli/doctor_test.sh" "$DTRAIN" "$REPO" "$WORK/doctor_test"

  local units=("$BUILD"/tests/test_*)
  if [ -e "${units[0]}" ]; then
    stage unit 90 bash -c 'for t in "$@"; do
        [ -x "$t" ] || continue
        if "$t" >"$DTRAIN_TEST_TMP/unit.log" 2>&1; then echo "$(basename "$t"): passed"
        else cat "$DTRAIN_TEST_TMP/unit.log"; echo "$(basename "$t"): FAILED"; fail=1; fi
      done; exit ${fail:-0}' _ "${units[@]}"
  else
    record unit ABSENT 0 "no unit suites in $BUILD/tests"
  fi

  local t
  for t in test_gpu_ops test_gpu_op_table test_gpu_attention test_gpu_comm test_cuda_host; do
    if [ -x "$BUILD/tests/gpu/$t" ]; then
      stage "$t" 150 "$BUILD/tests/gpu/$t"
    else
      record "$t" ABSENT 0 "not built into $BUILD/tests/gpu"
    fi
  done

  stage gpu_train 240 bash "$REPO/tests/gpu/gpu_train.sh" "$DTRAIN" "$REPO" "$WORK/gpu_train"

  if [ "$GPU_SEEN" = 1 ]; then
    stage bench 200 bash -c 'DTRAIN=$1 bash "$2" | tee "$3"; exit "${PIPESTATUS[0]}"' _ \
      "$DTRAIN" "$REPO/bench/gpu_vs_torch.sh" "$LOG/bench.txt"
    stage bench_gpt 200 bash -c 'DTRAIN=$1 bash "$2" | tee -a "$3"; exit "${PIPESTATUS[0]}"' _ \
      "$DTRAIN" "$REPO/bench/gpu_gpt_vs_torch.sh" "$LOG/bench.txt"
  else
    record bench SKIP 0 "no GPU"
    record bench_gpt SKIP 0 "no GPU"
  fi
}

finish() {
  if [ -d "$WORK/gpu_train" ]; then
    tar -czf "$LOG/runs.tar.gz" -C "$WORK" --exclude='*.h5' --exclude=checkpoints gpu_train || true
  fi
  local verdict
  if [ "$FAILED" = 1 ]; then
    verdict="FAILED"
  elif [ "$GPU_SEEN" = 0 ]; then
    verdict="NO GPU: nothing on a GPU was checked"
  else
    verdict="PASSED"
  fi
  {
    echo "dtrain GPU check: $verdict ($(($(date +%s) - START))s of a ${BUDGET}s budget)"
    echo "dtrain: ${DTRAIN:-none} ($(timeout 60 "${DTRAIN:-false}" version 2>/dev/null | paste -sd';' - || echo '?'))"
    echo "gpu: $(timeout 30 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo none)"
    echo
    printf '%s\n' "${RESULTS[@]}"
    grep '^BENCH ' "$LOG/bench.txt" 2>/dev/null || true
  } >"$LOG/summary.txt"
  echo
  cat "$LOG/summary.txt"
  if [ "$FAILED" = 1 ]; then return 1; elif [ "$GPU_SEEN" = 0 ]; then return 77; fi
}

# main keeps going past a failed stage; finish writes the summary.
{
  main || true
  finish
} 2>&1 | tee "$LOG/check.log"
exit "${PIPESTATUS[0]}"
