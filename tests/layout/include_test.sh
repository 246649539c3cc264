#!/usr/bin/env bash
# The layering check (include_check.py): the tree passes it, and a copy of
# the tree with one include planted that reaches up (one per rule), or with
# a library that links one above it, fails it, naming the file and line.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
check=$here/include_check.py
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! python3 "$check" "$root"; then
  echo "FAIL: the source tree breaks its layering (above)"
  fail=1
fi

# planted FILE INCLUDE WHAT: a fresh copy with `#include "INCLUDE"` added to
# FILE must fail the check with FILE's name in the report.
planted() {
  local file=$1 inc=$2 what=$3 copy=$tmp/tree out
  rm -rf "$copy"
  mkdir -p "$copy"
  (cd "$root" && cp -r core kernels collectives io runtime launch CMakeLists.txt "$copy"/)
  printf '#include "%s"\n' "$inc" >>"$copy/$file"
  out=$(python3 "$check" "$copy" 2>&1)
  local rc=$?
  if [ "$rc" -ne 1 ] || ! grep -q "^$file:[0-9]*: includes $inc" <<<"$out"; then
    echo "FAIL: $what was not caught (exit $rc):"
    echo "$out"
    fail=1
  else
    echo "ok: $what is caught: $(grep "^$file:" <<<"$out" | head -1)"
  fi
}

planted kernels/backend.c runtime/train/train.h "kernels/ including runtime/"
planted io/dataset.c launch/cli.h "io/ including launch/"
planted core/util.c kernels/ops.h "core/ including kernels/"
planted collectives/comm.c io/checkpoint.h "collectives/ including io/"
planted runtime/model/model.c runtime/train/train.h "the model room including the train room"
planted runtime/config/config.c runtime/monitor/metrics.h "the config room including the monitor room"
planted runtime/generate/generate.c runtime/doctor/doctor.h "a room including a room of its own level"
planted runtime/train/train.c kernels/cpu/cpu_ops.h "the engine including a backend's own header"
planted kernels/cpu/conv.c kernels/cuda/cuda_impl.h "one backend including another's header"
planted launch/main.c collectives/comm_impl.h "a folder including another folder's *_impl.h"
# and a library that links one above it
rm -rf "$tmp/tree" && mkdir -p "$tmp/tree"
(cd "$root" && cp -r core kernels collectives io runtime launch CMakeLists.txt "$tmp/tree"/)
sed -i 's/^target_link_libraries(dt_kernels PUBLIC dt_core)$/target_link_libraries(dt_kernels PUBLIC dt_core dt_io)/' \
  "$tmp/tree/CMakeLists.txt"
out=$(python3 "$check" "$tmp/tree" 2>&1)
if [ $? -ne 1 ] || ! grep -q "^CMakeLists.txt:[0-9]*: dt_kernels links dt_io" <<<"$out"; then
  echo "FAIL: dt_kernels linking dt_io was not caught:"
  echo "$out"
  fail=1
else
  echo "ok: a library linking one above it is caught: $(grep '^CMakeLists' <<<"$out")"
fi
exit $fail
