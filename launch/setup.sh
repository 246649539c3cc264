#!/usr/bin/env bash
# Sets dtrain up on a Debian/Ubuntu machine: installs the Debian packages it
# needs (when missing), builds into build/ and imports Fashion-MNIST into
# data/fashion-mnist.h5. Safe to run again: each step is skipped when done.
#   BUILD_DIR=build  CMAKE_ARGS="..."  DTRAIN_SKIP_APT=1
#   DTRAIN_WITH_TORCH=1 (PyTorch and h5py, for the comparisons with PyTorch)
#   DTRAIN_WITH_FUZZ=1 (clang with libFuzzer and llvm-symbolizer, for tests/fuzz)
#   DTRAIN_WITH_TENSORBOARD=1 (the tensorboard package in a virtual environment,
#     $BUILD_DIR/tb-venv, for the monitoring test's reader; from PyPI with pip)
#   DTRAIN_WITH_HF=1 (transformers, tokenizers and safetensors in a virtual environment,
#     $BUILD_DIR/hf-venv, that also sees Debian's PyTorch and numpy, for the tests
#     against the Hugging Face libraries; from PyPI with pip, at pinned versions)
#   DTRAIN_WITH_DEBOOTSTRAP=1 (debootstrap and python3, for tests/container)
#   DTRAIN_WITH_SLURM=1 (Slurm and munge, for tests/slurm, which starts its own
#                        one-node Slurm; the daemons are not enabled or started here)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
PKGS="build-essential cmake pkg-config libopenmpi-dev openmpi-bin libhdf5-openmpi-dev hdf5-tools
      libcunit1-dev libopenblas-dev libyaml-dev zlib1g-dev libjansson-dev libutf8proc-dev
      dataset-fashion-mnist"
if [ "${DTRAIN_WITH_TORCH:-0}" = 1 ]; then
  PKGS="$PKGS python3 python3-numpy python3-torch python3-h5py"
fi
if [ "${DTRAIN_WITH_FUZZ:-0}" = 1 ]; then
  PKGS="$PKGS clang libclang-rt-14-dev llvm"
fi
if [ "${DTRAIN_WITH_TENSORBOARD:-0}" = 1 ]; then
  PKGS="$PKGS python3 python3-venv"
fi
if [ "${DTRAIN_WITH_HF:-0}" = 1 ]; then
  PKGS="$PKGS python3 python3-venv python3-numpy python3-torch"
fi
if [ "${DTRAIN_WITH_SLURM:-0}" = 1 ]; then
  PKGS="$PKGS slurm-wlm munge libpmix-dev" # srun --mpi=pmix loads libpmix.so
fi
if [ "${DTRAIN_WITH_DEBOOTSTRAP:-0}" = 1 ]; then
  PKGS="$PKGS debootstrap python3"
fi

missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ] && [ "${DTRAIN_SKIP_APT:-0}" != 1 ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
fi

echo "setup: building in $BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"

# Debian's python3 refuses system-wide pip installs (PEP 668), so the
# tensorboard package goes into a virtual environment of its own.
if [ "${DTRAIN_WITH_TENSORBOARD:-0}" = 1 ] &&
  ! "$BUILD_DIR/tb-venv/bin/python" -c "import tensorboard" 2>/dev/null; then
  echo "setup: installing tensorboard into $BUILD_DIR/tb-venv"
  /usr/bin/python3 -m venv "$BUILD_DIR/tb-venv"
  "$BUILD_DIR/tb-venv/bin/python" -m pip install -q --disable-pip-version-check tensorboard
fi

# transformers 4.38 is the last line that supports Debian's PyTorch 1.13
HF_PKGS="transformers==4.38.2 tokenizers==0.15.2 safetensors==0.4.2"
if [ "${DTRAIN_WITH_HF:-0}" = 1 ] &&
  ! "$BUILD_DIR/hf-venv/bin/python" -c "import transformers, tokenizers, safetensors, torch" 2>/dev/null; then
  echo "setup: installing $HF_PKGS into $BUILD_DIR/hf-venv"
  /usr/bin/python3 -m venv --system-site-packages "$BUILD_DIR/hf-venv"
  "$BUILD_DIR/hf-venv/bin/python" -m pip install -q --disable-pip-version-check $HF_PKGS
fi

if [ ! -f data/fashion-mnist.h5 ]; then
  echo "setup: importing Fashion-MNIST"
  mkdir -p data
  "$BUILD_DIR"/dtrain data import idx /usr/share/datasets/fashion-mnist -o data/fashion-mnist.h5 \
    --classes "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot"
fi
echo "setup: done"
