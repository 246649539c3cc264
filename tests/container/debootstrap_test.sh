#!/usr/bin/env bash
# Builds the Dockerfile's image without a container engine and trains the
# quick-start job in it: debootstrap makes a fresh Debian bookworm root
# (minbase), every FROM gets its own copy of it, and the Dockerfile's own
# instructions (read from the real file by dockerfile_steps.py) run there
# through chroot, the build context being the source tree as .dockerignore
# filters it. The CUDA parts are off (DTRAIN_CUDA=OFF, Debian in place of
# the CUDA base images, as `docker build --build-arg` would give them), so
# this checks README's set-up on a bare system, the multi-stage split (the
# final root has only what the runtime stage installs) and the image's
# default command: exit 0 and at least 88.5% test accuracy, as
# tests/cli/accuracy_test.sh asks of the same job.
#   debootstrap_test.sh SOURCE_DIR WORKDIR
# Needs root, debootstrap, python3, mount and the network; exits 77 (skip)
# where one of them is missing. /proc, /sys, /dev (a tmpfs with its own
# device nodes) and /dev/shm are mounted into each root and unmounted on any
# exit. DTRAIN_DEBIAN_MIRROR picks the mirror (default
# http://deb.debian.org/debian).
set -uo pipefail
SRC=$(cd "$1" && pwd) W=$2
MIRROR=${DTRAIN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
start=$(date +%s)

skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  exit 1
}
elapsed() { echo "$(($(date +%s) - start)) s"; }

[ "$(id -u)" = 0 ] || skip "debootstrap, mount and chroot need root"
command -v debootstrap >/dev/null || skip "no debootstrap (DTRAIN_WITH_DEBOOTSTRAP=1 bash launch/setup.sh)"
command -v python3 >/dev/null || skip "no python3 (DTRAIN_WITH_DEBOOTSTRAP=1 bash launch/setup.sh)"
host=$(sed -E 's#^[a-z]+://([^/:]+).*#\1#' <<<"$MIRROR")
timeout 20 bash -c "exec 3<>/dev/tcp/$host/80" 2>/dev/null || skip "cannot reach $host (no network)"

# Long steps run in their own session (run_bg), so that a signal reaches the
# trap at once and the trap can stop the whole step before it unmounts.
# On any exit everything mounted under W (by this test or by debootstrap) is
# unmounted, innermost first. /dev in a root is a small tmpfs with its own
# device nodes, never the host's /dev, so even a run killed with SIGKILL
# (whose mounts the next run removes) leaves nothing that rm -rf could
# harm on the host.
CHILD=""
run_bg() {
  setsid "$@" &
  CHILD=$!
  wait "$CHILD"
  local rc=$?
  CHILD=""
  return "$rc"
}
mounts_under() { awk -v w="$1/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r; }
unmount_under() {
  local m
  for m in $(mounts_under "$1"); do
    umount "$m" 2>/dev/null || umount -l "$m" || echo "WARNING: could not unmount $m"
  done
}
cleanup() {
  if [ -n "$CHILD" ]; then
    kill -TERM -- -"$CHILD" 2>/dev/null
    sleep 2
    kill -KILL -- -"$CHILD" 2>/dev/null
    wait "$CHILD" 2>/dev/null
  fi
  [ -d "${W:-}" ] && unmount_under "$W"
  return 0
}
trap cleanup EXIT
trap 'echo "stopped by a signal"; exit 130' INT TERM HUP

# Leftovers of a run killed before its trap ran: unmount, then remove.
if [ -d "$W" ]; then
  W=$(cd "$W" && pwd)
  unmount_under "$W"
  [ -z "$(mounts_under "$W")" ] || fail "something is still mounted under $W; not removing it"
  rm -rf --one-file-system "$W"
fi
mkdir -p "$W/stages" && W=$(cd "$W" && pwd)
mount -t tmpfs none "$W/stages" 2>/dev/null || skip "cannot mount here (no CAP_SYS_ADMIN?)"
umount "$W/stages"

echo "== debootstrap --variant=minbase bookworm ($MIRROR)"
run_bg debootstrap --variant=minbase bookworm "$W/base" "$MIRROR" >"$W/debootstrap.log" 2>&1 || {
  tail -20 "$W/debootstrap.log"
  fail "debootstrap failed (log: $W/debootstrap.log)"
}
echo "   done after $(elapsed)"

stage_root() { echo "$W/stages/$1"; }
mount_root() { # ROOT
  local r=$1
  mount -t proc proc "$r/proc" || fail "mount proc in $r"
  mount -t sysfs -o ro sysfs "$r/sys" || fail "mount sysfs in $r"
  mount -t tmpfs -o mode=755,size=1m dev "$r/dev" || fail "mount /dev in $r"
  mknod -m 666 "$r/dev/null" c 1 3 && mknod -m 666 "$r/dev/zero" c 1 5 &&
    mknod -m 666 "$r/dev/full" c 1 7 && mknod -m 666 "$r/dev/random" c 1 8 &&
    mknod -m 666 "$r/dev/urandom" c 1 9 && mknod -m 666 "$r/dev/tty" c 5 0 &&
    ln -s /proc/self/fd "$r/dev/fd" && ln -s /proc/self/fd/0 "$r/dev/stdin" &&
    ln -s /proc/self/fd/1 "$r/dev/stdout" && ln -s /proc/self/fd/2 "$r/dev/stderr" &&
    mkdir "$r/dev/shm" "$r/dev/pts" || fail "device nodes in $r/dev"
  mount -t tmpfs -o mode=1777,size=50% shm "$r/dev/shm" || fail "mount /dev/shm in $r"
  cp -L /etc/resolv.conf "$r/etc/resolv.conf" 2>/dev/null || true
}

# The functions dockerfile_steps.py's script calls, one per instruction.
stage_new() { # NAME IMAGE
  case $2 in
  debian:bookworm | debian:bookworm-slim | debian:12 | debian:12-slim) ;;
  *) fail "FROM $2: the test stands in Debian bookworm for a base image; pass it as a build-arg" ;;
  esac
  echo "== FROM $2 AS $1 (a fresh copy of the bookworm root) after $(elapsed)"
  cp -a "$W/base" "$(stage_root "$1")" || fail "copy the base root"
  mount_root "$(stage_root "$1")"
}
stage_copy() { # NAME PARENT
  echo "== FROM $2 AS $1"
  cp -ax "$(stage_root "$2")" "$(stage_root "$1")" || fail "copy stage $2"
  mount_root "$(stage_root "$1")"
}
copy_context() { # STAGE SRC DST LIST
  local dst
  dst="$(stage_root "$1")$3"
  echo "== COPY $2 $3 ($(tr -cd '\0' <"$4" | wc -c) files, .dockerignore applied)"
  mkdir -p "$dst" && tar -C "$2" --null -T "$4" -cf - | tar -C "$dst" -xf - || fail "COPY $2 $3"
}
copy_stage() { # FROM SRC TO DST
  local src dst
  src="$(stage_root "$1")$2" dst="$(stage_root "$3")$4"
  echo "== COPY --from=$1 $2 $4"
  if [ -d "$src" ]; then
    mkdir -p "$dst" && cp -a "$src/." "$dst/" || fail "COPY --from=$1 $2"
  else
    mkdir -p "$(dirname "$dst")" && cp -a "$src" "$dst" || fail "COPY --from=$1 $2"
  fi
}
mkdir_in() { mkdir -p "$(stage_root "$1")$2"; }
run_in() { # STAGE WORKDIR ENV... -- ARGV...
  local root wd envs=()
  root=$(stage_root "$1") wd=$2
  shift 2
  while [ "$1" != -- ]; do
    envs+=("$1")
    shift
  done
  shift
  echo "== RUN in $(basename "$root") after $(elapsed): ${*: -1}" | cut -c1-200
  mkdir -p "$root$wd"
  run_bg chroot "$root" /usr/bin/env -i --chdir="$wd" "${envs[@]}" "$@" ||
    fail "RUN failed in stage $(basename "$root")"
}

echo "== reading $SRC/Dockerfile"
python3 "$SRC/tests/container/dockerfile_steps.py" "$SRC/Dockerfile" "$SRC" "$W" \
  DTRAIN_CUDA=OFF BUILD_IMAGE=debian:bookworm RUNTIME_IMAGE=debian:bookworm ||
  fail "could not turn the Dockerfile into steps"
# shellcheck source=/dev/null
source "$W/steps.sh"

root=$(stage_root "$FINAL_STAGE")
# The final root must not have what only the build stage installed.
[ ! -e "$root/usr/bin/cmake" ] || fail "the final stage has cmake: it is not a separate stage"
[ ! -e "$root/src" ] || fail "the final stage has the source tree"

echo "== the image's default command, after $(elapsed): ${FINAL_ARGV[*]}"
mkdir -p "$root$FINAL_WORKDIR"
run_bg chroot "$root" /usr/bin/env -i --chdir="$FINAL_WORKDIR" "${FINAL_ENV[@]}" "${FINAL_ARGV[@]}" \
  >"$W/train.log" 2>&1
rc=$?
tr '\r' '\n' <"$W/train.log" | grep -v '^ *$' | tail -15
[ "$rc" = 0 ] || fail "the default command exited $rc (log: $W/train.log)"
metrics=$(find "$root$FINAL_WORKDIR" -name metrics.jsonl | head -1)
[ -n "$metrics" ] || fail "no metrics.jsonl under $FINAL_WORKDIR in the final root"
acc=$(grep '"type":"summary"' "$metrics" | sed 's/.*"test_acc":\([0-9.]*\).*/\1/')
[ -n "$acc" ] || fail "no summary record with test_acc in $metrics"
echo "final test accuracy: $acc (required: 0.885); whole test: $(elapsed)"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.885) }' || fail "accuracy $acc below 0.885"

cleanup
rm -rf --one-file-system "$W/stages" "$W/base"
echo "PASS after $(elapsed)"
