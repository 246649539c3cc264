#!/usr/bin/env bash
# The whole test suite, from a fresh machine: sets everything up (packages,
# build with warnings as errors, dataset), runs every ctest suite, then
# builds the CPU path again with AddressSanitizer + UBSan and runs the CPU
# suites there. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export DTRAIN_WITH_TORCH=1
BUILD_DIR=build CMAKE_ARGS="-DDTRAIN_WERROR=ON ${CMAKE_ARGS:-}" bash launch/setup.sh

echo "== ctest, main build ($(./build/dtrain version))"
(cd build && ctest --output-on-failure -j2 --timeout 900)

echo "== sanitizer build (CPU only, ASan + UBSan)"
cmake -S . -B build-asan -DDTRAIN_CUDA=OFF -DDTRAIN_SANITIZE=ON -DDTRAIN_WERROR=ON \
  -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$(nproc)"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
(cd build-asan && ctest --output-on-failure -j2 -L cpu --timeout 1800)
echo "== all tests passed"
