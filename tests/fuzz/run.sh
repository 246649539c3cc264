#!/usr/bin/env bash
# Coverage-guided fuzzing of dtrain's input parsers with libFuzzer.
#
#   tests/fuzz/run.sh [SECONDS]        (default 60 seconds per target)
#
# Builds the fuzz targets with clang (ASan + UBSan, libFuzzer) in
# build-fuzz/ (DTRAIN_FUZZ_BUILD overrides), then fuzzes each target for
# SECONDS, starting from a temporary copy of its seed corpus and its
# regression inputs, so the committed corpus never grows. libFuzzer runs in
# fork mode and keeps going after a crash, so one bug does not hide the
# next. Every crash, leak, timeout or out-of-memory it saved is replayed
# once to find where it happened (the kind of failure and the first frames
# in dtrain's code); one that happens where an input listed in
# tests/fuzz/known_open.txt also does is a known open bug and is only
# named. Any other fails the run: the target and the input (copied to
# build-fuzz/crashes/<target>/) are named, with the sanitizer's report.
# DTRAIN_FUZZ_TARGETS="config idx" picks targets; they run side by side,
# DTRAIN_FUZZ_JOBS at a time (default: one per core).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
seconds=${1:-60}
build=${DTRAIN_FUZZ_BUILD:-build-fuzz}
targets=${DTRAIN_FUZZ_TARGETS:-config idx dataset ckpt lmimport safetensors bpe}

# Limits per target. A well-formed input runs in milliseconds, so 10 s is
# a hang; 2 GiB covers ASan and HDF5, and a larger allocation is reported
# as out-of-memory at the malloc that asks for it. The job-file target's
# inputs stay small: libyaml's time grows steeply with nesting depth, and a
# few kilobytes cover every construct.
timeout_s=10
rss_mb=2048
max_len() {
  case $1 in
    config) echo 4096 ;;
    idx | lmimport) echo 16384 ;;
    safetensors | bpe) echo 8192 ;;
    *) echo 2048 ;;
  esac
}

# clang with its libFuzzer and sanitizer runtimes, and a symbolizer (the
# signatures below read function names and source lines from reports).
if ! command -v clang >/dev/null ||
  ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
  clang -x c -fsanitize=fuzzer,address,undefined -o /dev/null - 2>/dev/null; then
  echo "fuzz: needs clang with libFuzzer (Debian: clang libclang-rt-14-dev)" >&2
  exit 1
fi
symbolizer=$(command -v llvm-symbolizer || command -v llvm-symbolizer-14 || true)
if [ -z "$symbolizer" ]; then
  echo "fuzz: needs llvm-symbolizer (Debian: llvm)" >&2
  exit 1
fi
export ASAN_SYMBOLIZER_PATH=$symbolizer

echo "== fuzz build ($build: clang, ASan + UBSan, libFuzzer)"
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DDTRAIN_CUDA=OFF -DDTRAIN_FUZZ=ON \
  -DDTRAIN_SANITIZE=ON -DDTRAIN_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fuzz_bins=()
for t in $targets; do fuzz_bins+=("fuzz_$t"); done
cmake --build "$build" -j2 --target "${fuzz_bins[@]}"

work=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-fuzz-run.XXXXXX")
trap 'rm -rf "$work"' EXIT
export TMPDIR=$work # the targets' scratch folders, crashed ones included
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:dedup_token_length=3"
export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

# Where an input fails: the kind of failure, then the first two frames in
# dtrain's own sources (for a broken promise: the target's check and the
# last part of its message, numbers masked). Empty when it does not fail.
signature() { # BINARY INPUT
  { "$1" -timeout="$timeout_s" -rss_limit_mb="$rss_mb" "$2" 2>&1 || true; } | awk -v root="$root/" '
    function set(k, w) { if (!kind) { kind = k; where = w } }
    /^fuzz: .* does not hold/ {
      split($2, p, ":"); n = split($0, m, ": "); gsub(/[0-9]+/, "N", m[n])
      set("promise", substr(p[1], length(root) + 1) ":" p[2] " " m[n]) }
    /runtime error:/ { set("undefined-behavior", substr($1, length(root) + 1)) }
    /ERROR: libFuzzer: out-of-memory \(malloc/ { set("malloc-limit") }
    /ERROR: libFuzzer: out-of-memory/ { set("out-of-memory") }
    /ERROR: libFuzzer: timeout/ { set("timeout") }
    /ERROR: LeakSanitizer/ { set("leak") }
    /^SUMMARY: AddressSanitizer: / { set($3) }
    /ERROR: libFuzzer: deadly signal/ { set("deadly-signal") }
    / #[0-9]+ 0x[0-9a-f]+ in / && nf < 2 && index($5, root) == 1 && $5 ~ /\.c:[0-9]+/ &&
      index($5, root "tests/fuzz/") != 1 { frames = frames " " $4 " " substr($5, length(root) + 1); nf++ }
    END { if (kind) print kind " " where frames }'
}

# known_open.txt entries of one target: "path cause" lines.
known_inputs() { # TARGET
  [ -f tests/fuzz/known_open.txt ] || return 0
  awk -v t="regressions/$1/" '$1 !~ /^#/ && index($1, t) == 1' tests/fuzz/known_open.txt
}

# One target's libFuzzer run, into $work/TARGET (its log, its artifacts).
fuzz_one() { # TARGET
  local t=$1 bin="$build/tests/fuzz/fuzz_$1" dir="$work/$1" skip f dict=() rc=0
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp tests/fuzz/corpus/"$t"/* "$dir/corpus/"
  skip=$(known_inputs "$t" | awk '{print $1}')
  if [ -d "tests/fuzz/regressions/$t" ]; then
    for f in tests/fuzz/regressions/"$t"/*; do
      [ -f "$f" ] || continue
      grep -qxF "${f#tests/fuzz/}" <<<"$skip" || cp "$f" "$dir/corpus/regression-$(basename "$f")"
    done
  fi
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  "$bin" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
    -max_total_time="$seconds" -max_len="$(max_len "$t")" -timeout="$timeout_s" \
    -rss_limit_mb="$rss_mb" -artifact_prefix="$dir/artifacts/" "${dict[@]}" \
    "$dir/corpus" >"$dir/log" 2>&1 || rc=$?
  echo "$rc" >"$dir/rc"
}

# The targets run side by side, one per core (each libFuzzer run in fork
# mode keeps one worker busy), so every target still gets its SECONDS of
# one core; their results are read in order afterwards.
slots=${DTRAIN_FUZZ_JOBS:-$(nproc)}
echo "== fuzzing $targets: ${seconds}s each, $slots at a time"
running=0
for t in $targets; do
  if [ "$running" -ge "$slots" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait

failed=()
for t in $targets; do
  bin="$build/tests/fuzz/fuzz_$t"
  dir="$work/$t"
  echo "== fuzz_$t: ${seconds}s, max_len $(max_len "$t")"
  rc=$(cat "$dir/rc" 2>/dev/null || echo "none")
  stats=$(grep -E '^#[0-9]+: cov:' "$dir/log" | tail -1 || true)
  echo "fuzz_$t: ${stats:-no statistics}"
  if ! grep -q "INFO: exiting" "$dir/log"; then
    echo "fuzz_$t: libFuzzer stopped abnormally (exit $rc):"
    tail -20 "$dir/log"
    failed+=("fuzz_$t")
    continue
  fi

  # Known open bugs of this target, by where they happen.
  known_sigs=()
  known_causes=()
  while read -r path cause; do
    [ -n "$path" ] || continue
    sig=$(signature "$bin" "tests/fuzz/$path")
    [ -n "$sig" ] || echo "fuzz_$t: $path no longer fails: take it out of known_open.txt"
    known_sigs+=("$sig")
    known_causes+=("$cause")
  done < <(known_inputs "$t")

  declare -A known_hits=()
  for a in "$dir"/artifacts/*; do
    [ -f "$a" ] || continue
    case $(basename "$a") in slow-unit-*) continue ;; esac
    sig=$(signature "$bin" "$a")
    [ -n "$sig" ] || sig="no-failure-on-replay"
    match=""
    for i in "${!known_sigs[@]}"; do
      [ "$sig" = "${known_sigs[$i]}" ] && match=${known_causes[$i]}
    done
    if [ -n "$match" ]; then
      known_hits[$match]=$((${known_hits[$match]:-0} + 1))
      continue
    fi
    mkdir -p "$build/crashes/$t"
    cp "$a" "$build/crashes/$t/"
    echo "fuzz_$t: FAILED: $build/crashes/$t/$(basename "$a") ($sig)"
    { "$bin" -timeout="$timeout_s" -rss_limit_mb="$rss_mb" "$a" 2>&1 || true; } | grep -v '^INFO:' | awk 'NR <= 40'
    failed+=("fuzz_$t:$build/crashes/$t/$(basename "$a")")
  done
  for cause in "${!known_hits[@]}"; do
    echo "fuzz_$t: ${known_hits[$cause]} input(s) hit a known open bug: $cause"
  done
  unset known_hits
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "== fuzzing found new failures: ${failed[*]}"
  echo "   minimise one with: $build/tests/fuzz/fuzz_TARGET -minimize_crash=1 -runs=10000 INPUT"
  exit 1
fi
echo "== fuzzing: no new failures"
