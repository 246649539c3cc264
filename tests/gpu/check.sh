#!/usr/bin/env bash
# The GPU check: the one script to run on a machine with an NVIDIA GPU. It
# runs in two parts, each sized to fit well inside one command on a machine
# that limits a command to 600 s, each with its own time budget, log folder
# and report:
#   bash tests/gpu/check.sh [correctness|bench] [LOGDIR]
#   correctness  (the default) dtrain's GPU test suites and the GPU training
#                test; budget DTRAIN_CHECK_BUDGET_S, default 300 s;
#   bench        the GPU benchmarks against PyTorch; budget
#                DTRAIN_CHECK_BUDGET_S, default 300 s. torch.compile is
#                skipped unless asked: --compile after the part's name, or
#                DTRAIN_CHECK_COMPILE=1 (bench/gpu_gpt_vs_torch.sh's COMPILE=1).
# LOGDIR defaults to ./gpu-check-out/PART. A first argument with a "/" in it
# is a LOGDIR (the form `check.sh LOGDIR` runs correctness). An unknown part,
# or a budget over the machine's limit for one command
# (DTRAIN_CHECK_COMMAND_S, default 600 s), is refused with exit 2 before
# anything runs. Root or not.
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
# Stages, in order. Both parts: setup, preflight (below), info (nvidia-smi,
# dtrain version, libraries). correctness: doctor and doctor_mpi (`dtrain
# doctor` alone and under mpirun -np 1: no problem found, and its GPU checks
# ran where nvidia-smi lists a GPU), doctor_test (tests/cli/doctor_test.sh),
# unit (the CPU unit suites: does this build run here at all), the GPU
# suites test_gpu_ops, test_gpu_op_table (every case of the shared op
# table, convolution and pooling through cuDNN included, against the CPU),
# test_gpu_attention, test_gpu_comm and test_cuda_host (each when built),
# gpu_train (tests/gpu/gpu_train.sh). bench: bench (bench/gpu_vs_torch.sh),
# bench_gpt (bench/gpu_gpt_vs_torch.sh: GPT-2 small in bf16 against PyTorch).
#
# preflight, in the check's first seconds, looks for what would make a later
# stage fail for the machine's sake rather than dtrain's. The first such
# problem is printed as one line, "preflight FAILED: what; what to do", is
# recorded in summary.txt, and ends the check (exit 1):
#   glibc      (bundle only) this machine's glibc is older than the one the
#              bundle's programs need (its MANIFEST's "glibc:" line);
#   libraries  a library of dtrain that the loader does not find (ldd) and
#              that is in none of: the CUDA toolkit (CUDA_HOME, CUDA_PATH,
#              nvcc's, /usr/local/cuda: lib64, lib, targets/*/lib), the
#              python's nvidia.* packages (pip's nvidia-nccl-cu13 and the
#              like: nvidia/*/lib), torch/lib. Where one of those holds it,
#              its folder is added to LD_LIBRARY_PATH and the check goes on;
#   versions   (not a stop) a cuDNN or NCCL found at run time older than
#              the one dtrain was built against (`dtrain version`'s "cudnn:"
#              and "nccl:" lines, "RUN (built against BUILT)") is a warning
#              that names both: within a major version (one soname) an
#              older library keeps the interface, a function it lacks fails
#              when called, and the GPU suites that follow show whether this
#              pair works. A different major version is a stop: its
#              interface is not the one dtrain was compiled for;
#   space      no folder has room for the scratch files: the mktemp folder,
#              else $TMPDIR, /tmp, /var/tmp, the repository, $HOME (the first
#              with room is taken, and TMPDIR with it). Where /dev/shm is
#              short, the benchmarks' run folders go to the scratch folder
#              (DTRAIN_BENCH_TMP), and where it cannot even hold Open MPI's
#              and NCCL's shared memory, those go there too
#              (OMPI_MCA_btl_vader_backing_directory, NCCL_SHM_DISABLE=1).
# A python (PYTHON, default python3) without PyTorch or h5py is no failure:
# the stages that compare with PyTorch (bench: torch and h5py; bench_gpt:
# torch) are recorded as SKIP with "PyTorch missing" or "h5py missing".
# Needs in MiB, measured for this check's runs (see the constants below):
#   DTRAIN_CHECK_SCRATCH_MB (1024), DTRAIN_CHECK_SHM_MB (32),
#   DTRAIN_CHECK_BENCH_MB (4608, the bench part only).
# DTRAIN_CHECK_STAGES="preflight bench ..." runs setup, preflight and only the
# stages named of the part (a partial check: exit 0 or 1, never 77).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
# the parts and their default budgets, in seconds
PARTS="correctness bench"
CORRECTNESS_BUDGET_S=300
BENCH_BUDGET_S=300
COMMAND_S=${DTRAIN_CHECK_COMMAND_S:-600} # the most one command may run on the GPU machine
refuse() { # MESSAGE: a usage error, before anything runs
  echo "check.sh: $*" >&2
  echo "usage: bash tests/gpu/check.sh [correctness|bench [--compile]] [LOGDIR]" >&2
  exit 2
}
PART=correctness
if [ $# -gt 0 ] && [[ $1 != */* ]]; then
  case " $PARTS " in
    *" $1 "*) PART=$1 ;;
    *) refuse "unknown part '$1': the parts are ${PARTS// /, }" ;;
  esac
  shift
fi
COMPILE=${DTRAIN_CHECK_COMPILE:-0}
if [ "${1:-}" = --compile ]; then
  [ "$PART" = bench ] || refuse "--compile belongs to the bench part"
  COMPILE=1
  shift
fi
[ $# -le 1 ] || refuse "too many arguments: $*"
case $PART in
  correctness) BUDGET=${DTRAIN_CHECK_BUDGET_S:-$CORRECTNESS_BUDGET_S} ;;
  bench) BUDGET=${DTRAIN_CHECK_BUDGET_S:-$BENCH_BUDGET_S} ;;
esac
[[ $BUDGET =~ ^[0-9]+$ ]] && [[ $COMMAND_S =~ ^[0-9]+$ ]] ||
  refuse "DTRAIN_CHECK_BUDGET_S ($BUDGET) and DTRAIN_CHECK_COMMAND_S ($COMMAND_S) must be whole seconds"
[ "$BUDGET" -le "$COMMAND_S" ] ||
  refuse "a ${BUDGET}s budget for $PART is over the ${COMMAND_S}s one command may run" \
    "(DTRAIN_CHECK_COMMAND_S); the machine would end the check before it wrote its report"
LOG=${1:-./gpu-check-out/$PART}
mkdir -p "$LOG"
LOG=$(cd "$LOG" && pwd)
RESERVE_S=10 # kept back for packing the logs
START=$(date +%s)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
rm -f "$LOG"/summary.txt "$LOG"/check.log "$LOG"/bench.txt "$LOG"/runs.tar.gz

RESULTS=()
STALE=""
FAILED=0
GPU_SEEN=0
FROM_BUNDLE=0
ONLY=${DTRAIN_CHECK_STAGES:-}
PY=${PYTHON:-python3}
# What the runs need, in MiB. Scratch (the mktemp folder): the CPU unit
# suites leave about 150 in DTRAIN_TEST_TMP, gpu_train's runs about 76
# (measured with the CPU build; 7.8 a 20-step run), doctor_test under 1, and PyTorch's compile
# cache goes to TMPDIR; twice that, and some. /dev/shm: Open MPI's vader
# segment is 4 MiB a rank (two ranks at most here), NCCL's one-rank
# communicator adds little. The benchmarks' run folders (DTRAIN_BENCH_TMP,
# default /dev/shm): bench_gpt keeps two GPT-2 124M runs, each a model.h5
# and a checkpoint with AdamW's moments, 16 bytes a parameter, 2.0 GB a run
# (measured 16.0 bytes a parameter on a 6.8M-parameter GPT); bench's
# largest configuration keeps two 37M-parameter runs, 1.2 GB.
SCRATCH_MB=${DTRAIN_CHECK_SCRATCH_MB:-1024}
SHM_MB=${DTRAIN_CHECK_SHM_MB:-32}
BENCH_MB=${DTRAIN_CHECK_BENCH_MB:-4608}
# set by the preflight
PF_ERR=""
PF_NOTES=()
BENCH_SKIP="" # why bench (PyTorch and h5py) cannot run, if it cannot
GPT_SKIP=""   # why bench_gpt (PyTorch) cannot run, if it cannot
SKIP_NOTES=""

left() { echo $((START + BUDGET - RESERVE_S - $(date +%s))); }

# wanted NAME: whether DTRAIN_CHECK_STAGES (when set) names the stage.
wanted() {
  [ -z "$ONLY" ] && return 0
  [[ " ${ONLY//,/ } " == *" $1 "* ]]
}

# stage NAME LIMIT_S COMMAND...: runs COMMAND under timeout (LIMIT_S or what
# is left of the budget), prints its time, records PASS/SKIP/FAIL/TIMEOUT.
stage() {
  local name=$1 limit=$2 rc t0 dt verdict
  shift 2
  wanted "$name" || return 0
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

# record NAME VERDICT SECONDS NOTE: a stage's result. A GPU stage that
# skipped (exit 77: no usable GPU) although nvidia-smi lists one failed.
record() {
  local verdict=$2 note=$4
  case $1 in setup | preflight) ;; *) wanted "$1" || return 0 ;; esac
  if [ "$verdict" = SKIP ] && [ "$GPU_SEEN" = 1 ]; then
    verdict=FAIL
    note="$note: skipped although nvidia-smi lists a GPU"
  fi
  case $verdict in PASS | SKIP | ABSENT) ;; *) FAILED=1 ;; esac
  RESULTS+=("$(printf '%-16s %-8s %5ss  %s' "$1" "$verdict" "$3" "$note")")
}

# skip NAME REASON: a stage not run for a reason the preflight found (no
# PyTorch for a comparison with it): SKIP, with or without a GPU.
skip() {
  wanted "$1" || return 0
  RESULTS+=("$(printf '%-16s %-8s %5ss  %s' "$1" SKIP 0 "$2")")
  SKIP_NOTES="$SKIP_NOTES${SKIP_NOTES:+, }$1 ($2)"
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
    FROM_BUNDLE=1
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

# ---- preflight: what would fail later for the machine's sake -------------------------
pf_say() { echo "preflight: $*"; }
pf_stop() { # MESSAGE: the one line that ends the check
  PF_ERR=$*
  echo "preflight FAILED: $*"
  return 1
}

free_mib() { # DIR: MiB free there (0 where df cannot tell)
  local k
  k=$(df -Pk "$1" 2>/dev/null | awk 'NR == 2 { print $4 }')
  [[ $k =~ ^[0-9]+$ ]] || k=0
  echo $((k / 1024))
}

pf_glibc() {
  [ "$FROM_BUNDLE" = 1 ] || return 0 # a build made for this machine
  local have need src="its MANIFEST"
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
  [ -n "$have" ] || have=$(ldd --version 2>/dev/null | awk 'NR == 1 { print $NF }')
  need=$(sed -n 's/^glibc: *needs \([0-9][0-9.]*\) or newer.*/\1/p' "$DTRAIN_BUNDLE/MANIFEST" 2>/dev/null |
    head -1)
  if [ -z "$need" ]; then # a bundle from before the MANIFEST said it
    src="the GLIBC_ versions its programs and libraries name"
    need=$(find "$DTRAIN_BUNDLE" -type f \( -name '*.so*' -o -perm -u+x \) -exec grep -aoh 'GLIBC_2\.[0-9]*' {} + \
      2>/dev/null | sed 's/^GLIBC_//' | sort -uV | tail -1)
  fi
  if [ -z "$have" ] || [ -z "$need" ]; then
    pf_say "glibc: not compared (this machine: ${have:-unknown}; the bundle needs: ${need:-unknown})"
    return 0
  fi
  if [ "$(printf '%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    pf_stop "this machine's glibc is $have, older than the $need the bundle's programs need ($src);" \
      "make the bundle (tests/gpu/bundle.sh) on a build machine whose glibc is $have or older"
    return 1
  fi
  pf_say "glibc: $have, the bundle needs $need or newer"
}

# py_run ARGS...: the python (PYTHON) with the host's library path, as the
# benchmarks run it, from / (a folder named torch in the current one would
# pass for the package).
py_run() {
  local py
  py=$(command -v "$PY") || return 1
  [[ $py == /* ]] || py=$PWD/$py
  (cd / && timeout 60 env LD_LIBRARY_PATH="${DTRAIN_HOST_LD_LIBRARY_PATH-${LD_LIBRARY_PATH-}}" "$py" "$@")
}

# lib_dirs: folders that can hold a CUDA library the loader does not search,
# one a line as "FOLDER<tab>WHAT IT IS": the CUDA toolkit's, the python's
# nvidia.* packages (pip's wheels: nvidia/nccl/lib, nvidia/cu13/lib, ...) and
# torch/lib. The python is asked where its packages are, without importing
# them; the usual virtual-environment folders are listed too.
lib_dirs() {
  local roots=() root d nvcc
  [ -n "${CUDA_HOME:-}" ] && roots+=("$CUDA_HOME")
  [ -n "${CUDA_PATH:-}" ] && roots+=("$CUDA_PATH")
  nvcc=$(command -v nvcc 2>/dev/null || true)
  [ -n "$nvcc" ] && roots+=("$(dirname "$(dirname "$(readlink -f "$nvcc")")")")
  roots+=(/usr/local/cuda)
  for root in "${roots[@]}"; do
    for d in "$root"/lib64 "$root"/lib "$root"/targets/*/lib; do
      [ -d "$d" ] && printf '%s\t%s\n' "$d" "the CUDA toolkit in $root"
    done
  done
  if command -v "$PY" >/dev/null 2>&1; then
    py_run -c '
import importlib.util, os, sys
def spec(name):
    try:
        return importlib.util.find_spec(name)
    except Exception:
        return None
py = os.path.basename(sys.argv[1])
s = spec("nvidia")  # a namespace package: its folders are in __path__
for root in list(s.submodule_search_locations or []) if s else []:
    for sub in sorted(os.listdir(root)):
        d = os.path.join(root, sub, "lib")
        if os.path.isdir(d):
            print("%s\tthe %s package nvidia.%s" % (d, py, sub))
s = spec("torch")
if s and s.submodule_search_locations:
    d = os.path.join(list(s.submodule_search_locations)[0], "lib")
    if os.path.isdir(d):
        print("%s\tthe %s package torch (torch/lib)" % (d, py))
' "$PY" 2>/dev/null || true
  fi
  for d in /opt/*/.venv/lib/python3*/site-packages/{nvidia/*,torch}/lib \
    /usr/local/lib/python3*/dist-packages/{nvidia/*,torch}/lib /usr/lib/python3/dist-packages/{nvidia/*,torch}/lib; do
    [ -d "$d" ] && printf '%s\t%s\n' "$d" "a python package folder"
  done
  return 0
}

not_found() { awk '$2 == "=>" && $3 == "not" { print $1 }' | sort -u; }

pf_libraries() {
  if ! command -v ldd >/dev/null; then
    pf_say "libraries: not checked (no ldd here)"
    return 0
  fi
  local out missing lib dir what dirs
  out=$(ldd "$DTRAIN" 2>&1 || true)
  missing=$(not_found <<<"$out")
  if [ -n "$missing" ]; then
    dirs=$(lib_dirs)
    for lib in $missing; do
      while IFS=$'\t' read -r dir what; do
        [ -n "$dir" ] && [ -e "$dir/$lib" ] || continue
        case ":${LD_LIBRARY_PATH-}:" in
          *":$dir:"*) ;;
          *) export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$dir ;;
        esac
        pf_say "libraries: $lib is in $dir ($what), where the loader does not look: added to LD_LIBRARY_PATH"
        PF_NOTES+=("$lib from $what")
        break
      done <<<"$dirs"
    done
    out=$(ldd "$DTRAIN" 2>&1 || true)
  fi
  missing=$(not_found <<<"$out")
  if [ -n "$missing" ]; then
    local names="" todo
    todo="add the folder that holds it to LD_LIBRARY_PATH (CUDA 13's libraries come with the toolkit"
    todo="$todo or pip's nvidia-* wheels)"
    for lib in $missing; do
      case $lib in
        libnccl*)
          names="$names${names:+, }$lib (NCCL)"
          todo="install NCCL for CUDA 13 (pip install nvidia-nccl-cu13, or the toolkit's libnccl2)"
          todo="$todo or add the folder that holds $lib to LD_LIBRARY_PATH"
          ;;
        *) names="$names${names:+, }$lib" ;;
      esac
    done
    pf_stop "dtrain needs $names, found neither by the loader (ldconfig -p, LD_LIBRARY_PATH) nor in the" \
      "CUDA toolkit, $PY's nvidia.* packages or torch/lib; $todo"
    return 1
  fi
  local versions
  versions=$(grep -o "version \`[^']*' not found" <<<"$out" | cut -d"\`" -f2 | cut -d"'" -f1 | sort -uV |
    paste -sd' ' -)
  if [ -n "$versions" ]; then
    pf_stop "dtrain or its libraries need $versions, which this machine's libraries lack (glibc" \
      "$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')); build dtrain, or make the bundle, on a" \
      "machine with older system libraries"
    return 1
  fi
  pf_say "libraries: every library of dtrain found (ldd)"
}

pf_python() {
  local has=""
  if command -v "$PY" >/dev/null 2>&1; then
    has=$(py_run -c '
import importlib.util
for m in ("torch", "h5py"):
    try:
        s = importlib.util.find_spec(m)
    except Exception:
        s = None
    if s is not None and s.origin not in (None, "namespace"):  # a package, not a bare folder
        print(m)' 2>/dev/null || true)
  fi
  local lack=()
  grep -qx torch <<<"$has" || lack+=(PyTorch)
  grep -qx h5py <<<"$has" || lack+=(h5py)
  case "${lack[*]}" in
    "") pf_say "python: $PY has PyTorch and h5py for the comparisons"; return 0 ;;
    "PyTorch h5py") BENCH_SKIP="PyTorch and h5py missing" GPT_SKIP="PyTorch missing" ;;
    PyTorch) BENCH_SKIP="PyTorch missing" GPT_SKIP="PyTorch missing" ;;
    h5py) BENCH_SKIP="h5py missing" ;;
  esac
  local which
  which=$(command -v "$PY" 2>/dev/null || echo "not found")
  pf_say "python: $BENCH_SKIP for $PY ($which): bench${GPT_SKIP:+ and bench_gpt} will be skipped," \
    "not failed; set PYTHON to a python with torch and h5py to run them"
  PF_NOTES+=("$BENCH_SKIP for $PY")
}

# pf_versions: cuDNN's and NCCL's versions at run time against those dtrain
# was built against, from `dtrain version`'s "cudnn:" and "nccl:" lines
# ("RUN" alone when the two are the same, "RUN (built against BUILT)" or
# "RUN (built with BUILT)" when not). An older run-time library is a
# warning naming both; it does not stop the check (see the top of the file).
pf_versions() {
  local out lib line run built compared="" older=""
  out=$(timeout 60 "$DTRAIN" version 2>/dev/null) || out=""
  for lib in cudnn:cuDNN nccl:NCCL; do
    line=$(sed -n "s/^${lib%%:*}: *//p" <<<"$out" | head -1)
    run=$(grep -oE '^[0-9]+\.[0-9]+\.[0-9]+' <<<"$line" || true)
    [ -n "$run" ] || continue
    built=$(grep -oE 'built (against|with) [0-9]+\.[0-9]+\.[0-9]+' <<<"$line" | grep -oE '[0-9.]+$' || true)
    built=${built:-$run}
    compared="$compared${compared:+, }${lib#*:} $run"
    if [ "$run" = "$built" ]; then
      continue
    elif [ "${run%%.*}" != "${built%%.*}" ]; then
      pf_stop "${lib#*:} at run time is $run, of another major version than the $built dtrain was built" \
        "against; put ${lib#*:} ${built%%.*}.x on the library path (LD_LIBRARY_PATH), or rebuild dtrain here"
      return 1
    elif [ "$(printf '%s\n' "$run" "$built" | sort -V | head -1)" = "$run" ]; then
      pf_say "versions: WARNING: ${lib#*:} at run time is $run, older than the $built dtrain was built" \
        "against; a GPU stage that fails may fail for that: put ${lib#*:} $built or newer on the library" \
        "path (LD_LIBRARY_PATH)"
      PF_NOTES+=("WARNING: ${lib#*:} $run older than the $built built against")
      older="$older${older:+ and }${lib#*:}"
    else
      compared="$compared (built against $built)"
    fi
  done
  if [ -z "$compared" ]; then
    pf_say "versions: not compared (dtrain version names no cuDNN or NCCL: a build without them)"
  elif [ -n "$older" ]; then
    pf_say "versions: $compared; $older older than dtrain was built against (the warning above)"
  else
    pf_say "versions: $compared; none older than dtrain was built against"
  fi
}

# pf_space: room for the scratch folder, and for what goes to /dev/shm.
pf_space() {
  local bench=0 shm_free=0 shm_plan=ok need=$SCRATCH_MB
  # the benchmarks run in the bench part, where there is a GPU and PyTorch
  if [ "$PART" = bench ] && [ "$GPU_SEEN" = 1 ] && [ -z "$GPT_SKIP" ]; then bench=$BENCH_MB; fi
  [ -d /dev/shm ] && [ -w /dev/shm ] && shm_free=$(free_mib /dev/shm)
  if [ "$shm_free" -ge $((SHM_MB + bench)) ]; then
    pf_say "/dev/shm: $shm_free MiB free, $((SHM_MB + bench)) needed"
  elif [ "$bench" -gt 0 ] && [ "$shm_free" -ge "$SHM_MB" ]; then
    shm_plan=bench
    need=$((need + bench))
  else
    shm_plan=none
    need=$((need + bench + SHM_MB))
  fi

  local cur cur_free d f chosen="" tried
  cur=$(dirname "$WORK")
  cur_free=$(free_mib "$cur")
  if [ "$cur_free" -ge "$need" ]; then
    pf_say "scratch: $WORK, $cur_free MiB free in $cur, $need needed"
  else
    tried="$cur $cur_free MiB"
    for d in "${TMPDIR:-}" /tmp /var/tmp "$REPO" "${HOME:-}"; do
      [ -n "$d" ] && [ -d "$d" ] && [ -w "$d" ] || continue
      [ "$(cd "$d" && pwd -P)" = "$(cd "$cur" && pwd -P)" ] && continue
      f=$(free_mib "$d")
      if [ "$f" -ge "$need" ]; then
        chosen=$d
        break
      fi
      tried="$tried, $d $f MiB"
    done
    if [ -z "$chosen" ]; then
      pf_stop "no folder has the $need MiB free that the check's scratch files need ($tried);" \
        "free some space, or set TMPDIR to a folder with room"
      return 1
    fi
    local new
    new=$(mktemp -d -p "$chosen" dtrain-check.XXXXXX) ||
      { pf_stop "cannot make a scratch folder in $chosen; set TMPDIR to a folder with room"; return 1; }
    rm -rf "$WORK"
    WORK=$new
    mkdir -p "$WORK/tmpdir"
    export TMPDIR=$WORK/tmpdir
    pf_say "scratch: $cur has $cur_free MiB free, $need needed: using $WORK instead (and TMPDIR=$TMPDIR)"
    PF_NOTES+=("scratch in $chosen")
  fi

  case $shm_plan in
    bench)
      export DTRAIN_BENCH_TMP=$WORK
      pf_say "/dev/shm: $shm_free MiB free, $((SHM_MB + bench)) needed with the benchmarks' run folders:" \
        "those go to $WORK instead (DTRAIN_BENCH_TMP)"
      PF_NOTES+=("benchmark runs off /dev/shm")
      ;;
    none)
      export OMPI_MCA_btl_vader_backing_directory=$WORK NCCL_SHM_DISABLE=1
      local also=""
      if [ "$bench" -gt 0 ]; then
        export DTRAIN_BENCH_TMP=$WORK
        also=", and the benchmarks' run folders go there too (DTRAIN_BENCH_TMP)"
      fi
      local have="not writable here"
      [ -d /dev/shm ] && [ -w /dev/shm ] && have="$shm_free MiB free"
      pf_say "/dev/shm: $have," \
        "$SHM_MB needed: Open MPI's shared memory goes to $WORK (OMPI_MCA_btl_vader_backing_directory)," \
        "NCCL's shared-memory transport is off (NCCL_SHM_DISABLE=1)$also"
      PF_NOTES+=("/dev/shm short: MPI and NCCL off it")
      ;;
  esac
}

# preflight: the checks above, in order; the first failure ends the check.
# PyTorch and h5py matter to the bench part alone.
preflight() {
  pf_glibc && pf_libraries && pf_versions && { [ "$PART" != bench ] || pf_python; } && pf_space
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
  local what=$PART
  if [ "$PART" = bench ]; then
    if [ "$COMPILE" = 1 ]; then what="$PART (torch.compile too)"; else what="$PART (no torch.compile)"; fi
  fi
  echo "dtrain GPU check, part $what, $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${BUDGET}s, logs in $LOG"
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

  echo
  echo "==== preflight ($(($(date +%s) - START))s into the check)"
  t0=$(date +%s)
  if preflight; then
    local notes
    notes=$(printf '%s; ' "${PF_NOTES[@]}")
    record preflight PASS $(($(date +%s) - t0)) "${notes%; }"
    echo "==== preflight: PASS in $(($(date +%s) - t0))s"
  else
    record preflight FAIL $(($(date +%s) - t0)) "$PF_ERR"
    echo "==== preflight: FAIL; the check stops here"
    return
  fi
  export DTRAIN_TEST_TMP=$WORK/tmp
  mkdir -p "$DTRAIN_TEST_TMP"
  cd "$REPO" # suites built by bundle.sh find source files from here

  if wanted info; then
    t0=$(date +%s)
    if info; then record info PASS $(($(date +%s) - t0)) "$("$DTRAIN" version | grep '^gpu:' | head -1)"; else
      record info FAIL $(($(date +%s) - t0)) "dtrain does not start or lacks libraries"
    fi
  fi

  if [ "$PART" = bench ]; then
    bench_part
  else
    correctness_part
  fi
}

# correctness_part: the doctor, the unit suites, the GPU suites, gpu_train.
correctness_part() {
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
}

# bench_part: the benchmarks against PyTorch, torch.compile only when asked.
# Their limits share the part's budget: about two minutes each on an H200
# without torch.compile.
bench_part() {
  if [ "$GPU_SEEN" = 0 ]; then
    record bench SKIP 0 "no GPU${BENCH_SKIP:+; $BENCH_SKIP}"
    record bench_gpt SKIP 0 "no GPU${GPT_SKIP:+; $GPT_SKIP}"
    return
  fi
  if [ -n "$BENCH_SKIP" ]; then
    skip bench "$BENCH_SKIP"
  else
    stage bench 130 bash -c 'DTRAIN=$1 bash "$2" | tee "$3"; exit "${PIPESTATUS[0]}"' _ \
      "$DTRAIN" "$REPO/bench/gpu_vs_torch.sh" "$LOG/bench.txt"
  fi
  if [ -n "$GPT_SKIP" ]; then
    skip bench_gpt "$GPT_SKIP"
  else
    stage bench_gpt 150 bash -c 'DTRAIN=$1 COMPILE=$4 bash "$2" | tee -a "$3"; exit "${PIPESTATUS[0]}"' _ \
      "$DTRAIN" "$REPO/bench/gpu_gpt_vs_torch.sh" "$LOG/bench.txt" "$COMPILE"
  fi
}

finish() {
  if [ -d "$WORK/gpu_train" ]; then
    tar -czf "$LOG/runs.tar.gz" -C "$WORK" --exclude='*.h5' --exclude=checkpoints gpu_train || true
  fi
  local verdict
  if [ -n "$PF_ERR" ]; then
    verdict="FAILED at preflight: $PF_ERR"
  elif [ "$FAILED" = 1 ]; then
    verdict="FAILED"
  elif [ -n "$ONLY" ]; then
    verdict="PASSED the stages asked for (DTRAIN_CHECK_STAGES=$ONLY)"
    [ "$GPU_SEEN" = 1 ] || verdict="$verdict; no GPU seen"
  elif [ "$GPU_SEEN" = 0 ]; then
    verdict="NO GPU: nothing on a GPU was checked"
  else
    verdict="PASSED"
  fi
  [ -n "$SKIP_NOTES" ] && verdict="$verdict; skipped: $SKIP_NOTES"
  {
    echo "dtrain GPU check, part $PART: $verdict ($(($(date +%s) - START))s of a ${BUDGET}s budget)"
    echo "dtrain: ${DTRAIN:-none} ($(timeout 60 "${DTRAIN:-false}" version 2>/dev/null | paste -sd';' - || echo '?'))"
    if [ "$GPU_SEEN" = 1 ]; then
      echo "gpu: $(timeout 30 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo '?')"
    else
      echo "gpu: none"
    fi
    echo
    printf '%s\n' "${RESULTS[@]}"
    grep '^BENCH ' "$LOG/bench.txt" 2>/dev/null || true
    if [ "$PART" = correctness ] && [ -z "$PF_ERR" ]; then
      echo
      echo "the benchmarks are a part of their own: bash tests/gpu/check.sh bench [--compile] (about ${BENCH_BUDGET_S}s)"
    fi
  } >"$LOG/summary.txt"
  echo
  cat "$LOG/summary.txt"
  if [ "$FAILED" = 1 ]; then return 1; elif [ "$GPU_SEEN" = 0 ] && [ -z "$ONLY" ]; then return 77; fi
}

# main keeps going past a failed stage (not past a failed preflight); finish
# writes the summary.
{
  # this group runs in a subshell of its own, and the preflight may move WORK
  trap 'rm -rf "$WORK"' EXIT
  main || true
  finish
} 2>&1 | tee "$LOG/check.log"
exit "${PIPESTATUS[0]}"
