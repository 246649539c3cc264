#!/usr/bin/env bash
# The ctest fuzz_replay: runs each fuzz target's replay build over its seed
# corpus and its regression inputs, skipping the inputs known_open.txt
# lists. Usage: replay.sh BINDIR TARGET...
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bindir=$1
shift
for t in "$@"; do
  echo "== fuzz_$t"
  "$bindir/fuzz_$t" -k "$here/known_open.txt" "$here/corpus/$t" "$here/regressions/$t"
done
