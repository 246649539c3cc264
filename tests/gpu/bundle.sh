#!/usr/bin/env bash
# Prepares a GPU check on a machine that has the GPU but none of dtrain's
# other dependencies (no Open MPI, HDF5, libyaml, OpenBLAS or CUnit, no
# package registry), such as a lent H200 with only the CUDA toolkit and
# PyTorch on it. Run it here, on the build machine (Debian, launch/setup.sh
# done), before the GPU session:
#
#   bash tests/gpu/bundle.sh
#
# It builds dtrain with CUDA for Hopper into build-gpu/ (tests included),
# then collects into .gpu-bundle/ what those programs need at run time and
# the GPU machine lacks, and packs that folder into .gpu-bundle.tar.xz, the
# one file to carry there (tests/gpu/check.sh unpacks and uses it):
#   bin/dtrain, tests/test_* (CPU unit suites), tests/compare_models,
#   tests/gpu/test_* (GPU suites)
#   lib/            every shared library they load that is neither glibc nor
#                   CUDA (cuBLAS, cuDNN, NCCL and the driver come from the GPU
#                   machine's toolkit or PyTorch's nvidia-* wheels)
#   lib/cudnn/      libcudnn.so.9 alone (its 130 KiB front, without the
#                   hundreds of MiB of sub-libraries it loads), used only
#                   where the host has no cuDNN: dtrain then starts and
#                   everything but convolution and pooling on the GPU works,
#                   while those fail with cuDNN's own "sub-library" error
#   lib/fallback/   libstdc++ and libgcc_s, used only where the host has none
#   lib/hwloc/      empty: hwloc's optional plugins are left out
#   mpi/            an Open MPI prefix (orterun, orted, plugins, help files,
#                   MCA defaults) relocated with OPAL_PREFIX; pmix/ likewise
#                   for PMIx (PMIX_INSTALL_PREFIX)
#   data/fashion-mnist.h5, MANIFEST (what and from which commit),
#                   SOURCES.sha256 (the sources built), env (source it: sets
#                   PATH, LD_LIBRARY_PATH, OPAL_PREFIX, ...)
# The configs and scripts are not copied: they travel with the working tree,
# so the check always runs the scripts of the tree it was sent with.
#
# Prebuilt binaries rather than a build there: a build there would need the
# same libraries plus the -dev packages' headers, static libraries and
# pkg-config files (about 10 MiB more, packed), CMake finding a relocated
# MPI, and compile time out of a short GPU lease. Open MPI plugins for
# network fabrics (UCX, libfabric, PSM, verbs) and OpenSHMEM are left out:
# the check runs on one node over shared memory, and they would add their
# libraries for nothing. The host glibc must be 2.36 or newer (libevent):
# the newest GLIBC_ symbol version the bundled files need goes into
# MANIFEST, and check.sh stops at once, with one line, on an older glibc.
#
# Then, as root (it needs `unshare -m`), it proves the bundle does not lean
# on this machine's copies: in a private mount namespace it hides every
# system file of Open MPI, PMIx, hwloc's plugins, HDF5, libyaml, OpenBLAS
# and CUnit, every system copy of a bundled library, and ssh; checks with
# ldd that each program resolves into the bundle; runs `dtrain train` on the
# CPU as a singleton and under `mpirun -np 2` with LD_DEBUG=libs and checks
# that every library any process loaded came from the bundle, glibc or CUDA;
# and runs the CPU unit suites and starts the GPU suites (skipped here).
#
#   BUILD_DIR=build-gpu        build folder
#   DTRAIN_BUNDLE_BUILD=0      use BUILD_DIR as it is (no configure/build)
#   DTRAIN_BUNDLE_VERIFY=0     skip the namespace proof
#   CMAKE_ARGS="..."           more configure arguments; JOBS=2 build jobs
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-2}
B=.gpu-bundle
ARCHIVE=.gpu-bundle.tar.xz
LIMIT_MIB=55
MULTIARCH=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
SYSLIB=/usr/lib/$MULTIARCH
# Debian's Open MPI layout, which OPAL_PREFIX relocates as a whole.
OMPI_LIBDIR_REL=lib/$MULTIARCH/openmpi/lib
OMPI_PLUGINS=$SYSLIB/openmpi/lib/openmpi3
PMIX_PREFIX=$SYSLIB/pmix2

say() { echo "bundle: $*"; }
die() { echo "bundle: error: $*" >&2; exit 1; }

# ---- build ------------------------------------------------------------------
# The sources as they are when the build starts, for check.sh to compare
# with the tree it runs in.
SOURCES=$(mktemp)
trap 'rm -f "$SOURCES"' EXIT
git ls-files --cached --others --exclude-standard -- '*.c' '*.h' '*.cu' '*.cuh' '*CMakeLists.txt' \
  'cmake/*' docs/config.md | while read -r f; do [ -f "$f" ] && echo "$f"; done |
  xargs -d '\n' sha256sum >"$SOURCES"
if [ "${DTRAIN_BUNDLE_BUILD:-1}" != 0 ]; then
  say "configuring $BUILD_DIR (CUDA on, sm_90 + compute_90 PTX)"
  # -fmacro-prefix-map: __FILE__ relative to the source root, so a suite that
  # finds a source file from its own path (test_config's docs/config.md)
  # works from the repository root on any machine.
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" -DDTRAIN_BUILD_TESTS=ON \
    -DCMAKE_C_FLAGS="-fmacro-prefix-map=$ROOT/=" ${CMAKE_ARGS:-} >/dev/null
  say "building $BUILD_DIR with -j$JOBS"
  cmake --build "$BUILD_DIR" -j"$JOBS"
fi
[ -x "$BUILD_DIR/dtrain" ] || die "$BUILD_DIR/dtrain is missing"
version=$("$BUILD_DIR/dtrain" version)
[[ $version == *cuda* ]] || say "warning: $BUILD_DIR/dtrain has no cuda backend ($version)"

if [ ! -f data/fashion-mnist.h5 ]; then
  say "importing Fashion-MNIST (launch/setup.sh, with $BUILD_DIR)"
  BUILD_DIR=$BUILD_DIR bash launch/setup.sh
fi

# ---- programs ---------------------------------------------------------------
rm -rf "$B" "$ARCHIVE"
mkdir -p "$B"/bin "$B"/tests/gpu "$B"/lib/fallback "$B"/lib/hwloc "$B"/data "$B"/mpi/bin
strip_to() { strip --strip-debug -o "$2" "$1"; }
strip_to "$BUILD_DIR/dtrain" "$B/bin/dtrain"
progs=("$B/bin/dtrain")
for f in "$BUILD_DIR"/tests/test_* "$BUILD_DIR"/tests/gpu/test_*; do
  [ -f "$f" ] && [ -x "$f" ] || continue
  case $f in */gpu/*) dest=$B/tests/gpu ;; *) dest=$B/tests ;; esac
  strip_to "$f" "$dest/$(basename "$f")"
  progs+=("$dest/$(basename "$f")")
done
# the model comparison gpu_train.sh holds cpu and cuda parameters to
if [ -x "$BUILD_DIR/tests/mpi/compare_models" ]; then
  strip_to "$BUILD_DIR/tests/mpi/compare_models" "$B/tests/compare_models"
  progs+=("$B/tests/compare_models")
fi
say "programs: $(for p in "${progs[@]}"; do printf '%s ' "${p#"$B"/}"; done)"

# ---- Open MPI and PMIx prefixes ----------------------------------------------
for t in orterun orted; do
  cp -L "/usr/bin/$t" "$B/mpi/bin/$t"
done
ln -s orterun "$B/mpi/bin/mpirun"
ln -s orterun "$B/mpi/bin/mpiexec"
mkdir -p "$B/mpi/$OMPI_LIBDIR_REL/openmpi3" "$B/mpi/share" "$B/mpi/etc"
cp -r /usr/share/openmpi "$B/mpi/share/openmpi"
cp /etc/openmpi/openmpi-mca-params.conf /etc/openmpi/openmpi-default-hostfile "$B/mpi/etc/" 2>/dev/null || true
# Plugins that need a fabric library or OpenSHMEM stay behind (one node).
SKIP_DEPS='liboshmem|libuc[pstm]\.|libfabric|libpsm|libinfinipath|libibverbs|librdmacm|libefa|libnl-'
kept=0 left=0
for p in "$OMPI_PLUGINS"/*.so; do
  deps=$(ldd "$p")
  if grep -qE "^[[:space:]]+($SKIP_DEPS)" <<<"$deps"; then
    left=$((left + 1))
  else
    cp "$p" "$B/mpi/$OMPI_LIBDIR_REL/openmpi3/"
    kept=$((kept + 1))
  fi
done
say "Open MPI plugins: $kept kept, $left left out (fabrics, OpenSHMEM)"
mkdir -p "$B/pmix/lib" "$B/pmix/share"
cp -r "$PMIX_PREFIX/lib/pmix" "$B/pmix/lib/pmix"
cp -r "$PMIX_PREFIX/share/." "$B/pmix/share/"

# ---- shared libraries ----------------------------------------------------------
# glibc's own libraries come from the host; so do CUDA's (the toolkit there).
GLIBC='^(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libmvec\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libnss_.*)$'
CUDA='^(libcuda\.so|libcudart\.so|libcublas|libcublasLt|libcudnn|libnccl\.so|libnvidia-|libnvrtc|libnvJitLink)'
FALLBACK='^(libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'
elfs=("${progs[@]}" "$B"/mpi/bin/orterun "$B"/mpi/bin/orted "$B/mpi/$OMPI_LIBDIR_REL"/openmpi3/*.so
      "$B"/pmix/lib/pmix/*.so)
missing=$(ldd "${elfs[@]}" 2>/dev/null | grep 'not found' | grep -vE "$CUDA" | sort -u || true)
[ -z "$missing" ] || die "unresolved libraries on this machine:"$'\n'"$missing"
ldd "${elfs[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
  while read -r name path; do
    if [ "$name" = libcudnn.so.9 ]; then
      mkdir -p "$B/lib/cudnn"
      cp -L "$path" "$B/lib/cudnn/$name"
    elif [[ $name =~ $GLIBC || $name =~ $CUDA ]]; then
      continue
    elif [[ $name =~ $FALLBACK ]]; then
      cp -L "$path" "$B/lib/fallback/$name"
    else
      cp -L "$path" "$B/lib/$name"
    fi
  done
chmod -R u+w "$B"

# ---- data, environment, manifest ----------------------------------------------
cp -L data/fashion-mnist.h5 "$B/data/fashion-mnist.h5"

elfs_all=("${elfs[@]}" "$B"/lib/*.so* "$B"/lib/fallback/*.so* "$B"/lib/cudnn/*.so*)
glibc_min=$(for f in "${elfs_all[@]}"; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -1 | sed 's/GLIBC_//')
# check.sh's preflight compares this (MANIFEST's "glibc:" line) with the
# GPU machine's glibc and stops at once where that is older.
[ -n "$glibc_min" ] || die "could not read which glibc the bundle's programs need (objdump -T: binutils)"

cat >"$B/env" <<'EOF'
# Sourced by bash to run the dtrain GPU bundle this file sits in (made by
# tests/gpu/bundle.sh): puts its programs and Open MPI first on PATH and its
# libraries first on LD_LIBRARY_PATH, relocates Open MPI (OPAL_PREFIX) and
# PMIx (PMIX_INSTALL_PREFIX) into it, and adds the folders of cuBLAS and NCCL
# when the system loader does not know them (CUDA toolkit, or PyTorch's
# nvidia-* wheels). DTRAIN_HOST_LD_LIBRARY_PATH keeps the value from before,
# for programs that must not see the bundle's libraries (python3).
DTRAIN_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export DTRAIN_BUNDLE
if [ -z "${DTRAIN_HOST_LD_LIBRARY_PATH+set}" ]; then
  export DTRAIN_HOST_LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}
fi

_dt_cache=$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null || true)
# Folders to add so that each library named resolves: none for one the
# system loader knows, else the first folder that holds it.
_dt_libdirs() {
  local lib d found
  for lib in "$@"; do
    found=
    grep -q "^[[:space:]]$lib " <<<"$_dt_cache" && continue
    for d in ${DTRAIN_HOST_LD_LIBRARY_PATH//:/ } ${CUDA_HOME:+$CUDA_HOME/lib64 $CUDA_HOME/lib} \
      /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
      /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \
      /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
      if [ -e "$d/$lib" ]; then found=$d; break; fi
    done
    if [ -n "$found" ]; then echo "$found"; else echo "env: $lib not found" >&2; fi
  done | awk '!seen[$0]++' | paste -sd: -
}
_dt_extra=$(_dt_libdirs libcublas.so.13 libcublasLt.so.13 libnccl.so.2)
_dt_path=$DTRAIN_BUNDLE/lib
# cuDNN from the host (system loader, toolkit or PyTorch's wheels); where
# there is none, the bundle's front library lets dtrain start and the
# convolution and pooling ops report that cuDNN's sub-libraries are missing.
if ! grep -q '^[[:space:]]libcudnn\.so\.9 ' <<<"$_dt_cache"; then
  _dt_cudnn=$(_dt_libdirs libcudnn.so.9 2>/dev/null)
  if [ -n "$_dt_cudnn" ]; then
    _dt_extra=$_dt_extra${_dt_extra:+:}$_dt_cudnn
  elif [ -f "$DTRAIN_BUNDLE/lib/cudnn/libcudnn.so.9" ]; then
    echo "env: no cuDNN on this machine: convolution and pooling on the GPU will fail" >&2
    _dt_path=$_dt_path:$DTRAIN_BUNDLE/lib/cudnn
  fi
  unset _dt_cudnn
fi
# The bundle's libstdc++ only where the host has none (the host's CUDA
# libraries may need a newer one).
grep -q '^[[:space:]]libstdc++\.so\.6 ' <<<"$_dt_cache" || _dt_path=$_dt_path:$DTRAIN_BUNDLE/lib/fallback
export LD_LIBRARY_PATH=$_dt_path${_dt_extra:+:$_dt_extra}${DTRAIN_HOST_LD_LIBRARY_PATH:+:$DTRAIN_HOST_LD_LIBRARY_PATH}
unset _dt_extra _dt_path _dt_cache
unset -f _dt_libdirs
_dt_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
if [ -n "$_dt_glibc" ] && [ "$(printf '%s\n' @GLIBC_MIN@ "$_dt_glibc" | sort -V | head -1)" != @GLIBC_MIN@ ]; then
  echo "env: this bundle needs glibc @GLIBC_MIN@ or newer, this machine has $_dt_glibc" >&2
fi
unset _dt_glibc
case ":$PATH:" in
  *":$DTRAIN_BUNDLE/bin:"*) ;;
  *) export PATH=$DTRAIN_BUNDLE/bin:$DTRAIN_BUNDLE/mpi/bin:$PATH ;;
esac
export OPAL_PREFIX=$DTRAIN_BUNDLE/mpi
export OPAL_SYSCONFDIR=$DTRAIN_BUNDLE/mpi/etc
export PMIX_INSTALL_PREFIX=$DTRAIN_BUNDLE/pmix
# hwloc's optional plugins (PCI, OpenCL, GL, XML) are left out: an empty folder.
export HWLOC_PLUGINS_PATH=$DTRAIN_BUNDLE/lib/hwloc
# One node, shared memory only; no ssh needed to start local daemons.
export OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_plm=isolated
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
EOF
sed -i "s/@GLIBC_MIN@/$glibc_min/g" "$B/env"

mv "$SOURCES" "$B/SOURCES.sha256"
chmod 644 "$B/SOURCES.sha256"

{
  echo "dtrain GPU bundle"
  echo "made:    $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "commit:  $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes')"
  echo "dtrain:  $("$BUILD_DIR/dtrain" version | head -1)"
  echo "cuda:    $(grep -o 'CMAKE_CUDA_ARCHITECTURES:[A-Z]*=.*' "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2) ($(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'nvcc ?'))"
  echo "glibc:   needs $glibc_min or newer"
  echo "needs from the host: $(ldd "${elfs[@]}" 2>/dev/null | awk '{print $1}' | grep -E "$CUDA" | sort -u | paste -sd' ' -)"
  echo
  (cd "$B" && find . -type f ! -name MANIFEST ! -name SOURCES.sha256 | sort)
} >"$B/MANIFEST"

# ---- proof: no system copies -------------------------------------------------
verify() {
  local hide=() d f
  for d in "$SYSLIB/openmpi" /usr/share/openmpi /etc/openmpi "$PMIX_PREFIX" "$SYSLIB/hdf5" "$SYSLIB/hwloc" \
    "$SYSLIB/openblas-pthread" "$SYSLIB/blas" "$SYSLIB/lapack"; do
    [ -d "$d" ] && hide+=("$d")
  done
  # Every system copy of a bundled library, and Open MPI's programs.
  local files=()
  for f in "$B"/lib/*; do
    [ -f "$f" ] || continue
    for d in "$SYSLIB" /lib/"$MULTIARCH"; do
      [ -e "$d/$(basename "$f")" ] && files+=("$(readlink -f "$d/$(basename "$f")")")
    done
  done
  for f in "$SYSLIB"/libcunit* "$SYSLIB"/libhdf5* "$SYSLIB"/libyaml* "$SYSLIB"/libopenblas* \
    "$SYSLIB"/libmpi* "$SYSLIB"/libopen-* "$SYSLIB"/libpmix*; do
    [ -e "$f" ] && files+=("$(readlink -f "$f")")
  done
  for f in orterun orted ompi_info ssh rsh; do
    [ -e "/usr/bin/$f" ] && files+=("$(readlink -f /usr/bin/$f)")
  done
  mapfile -t files < <(printf '%s\n' "${files[@]}" | sort -u)
  say "proof: hiding ${#hide[@]} folders and ${#files[@]} files in a private mount namespace"
  local script
  script=$(mktemp)
  # A file, not stdin: mpirun passes its stdin on to rank 0.
  cat >"$script" <<'PROOF'
set -euo pipefail
B=$(cd "$1" && pwd) dirs=$2
shift 2
for f in "$@"; do mount --bind /dev/null "$f"; done
for d in $dirs; do mount -t tmpfs none "$d"; done
. "$B/env"
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
echo "proof: libraries outside the bundle, glibc and CUDA (none expected):"
bad=$(for p in "$B"/bin/dtrain "$B"/tests/test_* "$B"/tests/compare_models "$B"/tests/gpu/test_* "$B"/mpi/bin/orte*; do
        [ -f "$p" ] && ldd "$p"; done | awk '$2 == "=>" { print $1, $3 }' | sort -u |
      while read -r name path; do
        case $path in "$B"/*) continue ;; esac
        [[ $name =~ $GLIBC || $name =~ $CUDA || $name =~ $FALLBACK ]] || echo "  $name => $path"
      done)
if [ -n "$bad" ]; then echo "$bad"; exit 1; fi
echo "  none"
echo "proof: Open MPI from PATH"
which mpirun orted | sed 's/^/  /'
ompi=$(dirname "$(which orted)")
[ "$ompi" = "$B/mpi/bin" ] || { echo "orted is $ompi, not the bundle's"; exit 1; }
common=(--set data.path="$B/data/fashion-mnist.h5" --set runtime.device=cpu --set train.steps=50
        --set train.schedule.warmup_steps=10
        --set train.log_every=25 --set runtime.progress=off --set checkpoint.every_steps=25 --resume never)
echo "proof: singleton dtrain train (50 steps, checkpoints through parallel HDF5)"
mkdir -p "$w/ld"
LD_DEBUG=libs LD_DEBUG_OUTPUT=$w/ld/one dtrain train configs/fashion-mnist-mlp.yaml "${common[@]}" \
  --set output.dir="$w/one" >"$w/one.log" 2>&1 ||
  { cat "$w/one.log"; exit 1; }
grep -h '"type":"summary"' "$w/one/metrics.jsonl" | cut -c1-160 | sed 's/^/  /'
echo "proof: mpirun -np 2 dtrain train"
LD_DEBUG=libs LD_DEBUG_OUTPUT=$w/ld/two mpirun --oversubscribe --allow-run-as-root -np 2 \
  dtrain train configs/fashion-mnist-mlp.yaml "${common[@]}" --set output.dir="$w/two" >"$w/two.log" 2>&1 ||
  { cat "$w/two.log"; exit 1; }
grep -h '"type":"summary"' "$w/two/metrics.jsonl" | cut -c1-160 | sed 's/^/  /'
grep -q '"world":2' "$w/two/metrics.jsonl" || { echo "not 2 ranks"; exit 1; }
echo "proof: every library those runs loaded (LD_DEBUG=libs, all processes: dtrain, orted, mpirun)"
loaded=$(cat "$w"/ld/* | sed -n 's/.*calling init: //p' | sort -u)
outside=$(while read -r path; do
            case $path in "$B"/*) continue ;; esac
            name=${path##*/}
            [[ $name =~ $GLIBC || $name =~ $CUDA || $name =~ $FALLBACK ]] || echo "$path"
          done <<<"$loaded")
echo "  $(ls "$w"/ld | wc -l) processes, $(wc -l <<<"$loaded") libraries:" \
  "$(grep -c "^$B/" <<<"$loaded") from the bundle ($(grep -c "^$B/mpi/" <<<"$loaded") Open MPI plugins)," \
  "the rest glibc, libstdc++/libgcc_s and CUDA:"
grep -v "^$B/" <<<"$loaded" | sed 's/^/    /'
if [ -n "$outside" ]; then echo "  loaded from outside the bundle:"; echo "$outside"; exit 1; fi
echo "proof: CPU unit suites (from the repository root)"
mkdir -p "$w/tmp"
for t in "$B"/tests/test_*; do
  if DTRAIN_TEST_TMP=$w/tmp "$t" >"$w/unit.log" 2>&1; then
    echo "  $(basename "$t"): passed"
  else
    cat "$w/unit.log"; echo "  $(basename "$t"): FAILED"; exit 1
  fi
done
echo "proof: GPU suites start (77: no GPU here, so skipped)"
for t in "$B"/tests/gpu/test_*; do
  [ -f "$t" ] || continue
  rc=0
  DTRAIN_TEST_TMP=$w/tmp "$t" >"$w/gpu.log" 2>&1 || rc=$?
  echo "  $(basename "$t"): exit $rc"
  if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then cat "$w/gpu.log"; exit 1; fi
done
PROOF
  GLIBC=$GLIBC CUDA=$CUDA FALLBACK=$FALLBACK unshare -m bash "$script" "$B" "${hide[*]}" "${files[@]}" \
    </dev/null || { rm -f "$script"; die "proof failed"; }
  rm -f "$script"
  say "proof: passed"
}

if [ "${DTRAIN_BUNDLE_VERIFY:-1}" = 0 ]; then
  say "proof skipped (DTRAIN_BUNDLE_VERIFY=0)"
elif [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  say "proof skipped: it needs root and unshare -m"
else
  verify
fi

# ---- archive ------------------------------------------------------------------
say "packing $ARCHIVE"
XZ_OPT="-6 -T$JOBS" tar -cJf "$ARCHIVE" "$B"
tree_mib=$(du -sm "$B" | cut -f1)
arch_bytes=$(stat -c %s "$ARCHIVE")
arch_mib=$(awk -v b="$arch_bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
say "size: $B/ $tree_mib MiB unpacked; $ARCHIVE $arch_mib MiB (limit ${LIMIT_MIB} MiB)"
awk -v b="$arch_bytes" -v l="$LIMIT_MIB" 'BEGIN { exit !(b <= l * 1048576) }' ||
  die "$ARCHIVE is over ${LIMIT_MIB} MiB"
say "done: carry $ARCHIVE and run bash tests/gpu/check.sh on the GPU machine"
