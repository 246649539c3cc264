#!/usr/bin/env bash
# The whole test suite, from a fresh machine: sets everything up (packages,
# build with warnings as errors, dataset), runs every ctest suite, then
# builds again with AddressSanitizer + UBSan (the CUDA backend on the host
# emulation) and runs the CPU and emulated GPU suites there, and last
# fuzzes each input parser for 60 s (tests/fuzz/run.sh). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export DTRAIN_WITH_TORCH=1 DTRAIN_WITH_FUZZ=1 DTRAIN_WITH_DEBOOTSTRAP=1 DTRAIN_WITH_TENSORBOARD=1
export DTRAIN_WITH_SLURM=1 DTRAIN_WITH_HF=1
# the monitoring test of both builds reads TensorBoard files with this one
export DTRAIN_TB_PYTHON=$PWD/build/tb-venv/bin/python
# the tests against transformers, tokenizers and safetensors use this one
export DTRAIN_HF_PYTHON=$PWD/build/hf-venv/bin/python
BUILD_DIR=build CMAKE_ARGS="-DDTRAIN_WERROR=ON ${CMAKE_ARGS:-}" bash launch/setup.sh

# A suite that skips is reported by name, and fails the run unless it is
# one that needs what this machine lacks: the GPU suites (label gpu) where
# nvidia-smi lists no GPU. Everything else (PyTorch, the dataset, mpirun)
# this script has just installed, so a skip there is a failure.
SKIPPED=""
run_ctest() { # BUILD_DIR ctest-args...
  local dir=$1 log allowed=""
  shift
  log=$(mktemp)
  if ! nvidia-smi -L >/dev/null 2>&1; then
    allowed=$(cd "$dir" && ctest -N -L gpu | sed -n 's/^ *Test *#[0-9]*: *//p')
  fi
  set +e
  (cd "$dir" && ctest "$@") 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  local t
  for t in $(sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\) (Skipped)$/\1/p' "$log"); do
    if grep -qxF "$t" <<<"$allowed"; then
      SKIPPED="$SKIPPED $t"
    else
      echo "== $t skipped, but this run was meant to have it (see its output above)"
      rc=1
    fi
  done
  rm -f "$log"
  return "$rc"
}

echo "== ctest, main build ($(./build/dtrain version))"
run_ctest build --output-on-failure -j2 --timeout 900

# The sanitizer build compiles the CUDA backend for the host emulation
# (docs/testing.md), so its GPU suites (label emu) run here on every
# machine, under AddressSanitizer too.
echo "== sanitizer build (ASan + UBSan; the CUDA backend on the host emulation)"
# Debug keeps the assertions; -O1, as the sanitizers' documentation
# advises, makes the C suites about twice as fast as -O0 under them.
cmake -S . -B build-asan -DDTRAIN_CUDA=EMU -DDTRAIN_SANITIZE=ON -DDTRAIN_WERROR=ON \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" \
  >/dev/null
cmake --build build-asan -j"$(nproc)"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
rm -f build-asan/emu_coverage.txt
run_ctest build-asan --output-on-failure -j2 -L 'cpu|emu' --timeout 1800
if [ -s build-asan/emu_coverage.txt ]; then
  echo "== kernels the emulated GPU suites launched (site, launches, blocks with and without barriers):"
  sort build-asan/emu_coverage.txt | awk '{ split($3, l, "="); n[$1 " " $2] += l[2]; s[$1 " " $2] += substr($4, 13); p[$1 " " $2] += substr($5, 14) }
    END { for (k in n) printf "  %s launches=%d sync_blocks=%d plain_blocks=%d\n", k, n[k], s[k], p[k] }' | sort
fi
if [ -n "$SKIPPED" ]; then
  echo "== skipped, no GPU on this machine:$SKIPPED"
fi
bash tests/fuzz/run.sh
echo "== all tests passed"
