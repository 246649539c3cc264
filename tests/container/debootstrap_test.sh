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
# where one of them is missing. /proc, /sys, /dev and /dev/shm are mounted
# into each root and always unmounted on exit. DTRAIN_DEBIAN_MIRROR picks
# the mirror (default http://deb.debian.org/debian).
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

# Everything mounted here, innermost last; unmounted in reverse on any exit.
MOUNTS=()
cleanup() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}" ||
      echo "WARNING: could not unmount ${MOUNTS[i]}"
  done
  MOUNTS=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# A previous run's mounts (killed before its trap ran) would make rm -rf
# reach the host's /dev: unmount whatever is still mounted under W first.
if [ -d "$W" ]; then
  W=$(cd "$W" && pwd)
  for m in $(awk -v w="$W/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
  awk -v w="$W/" 'index($2, w) == 1 { found = 1 } END { exit !found }' /proc/mounts &&
    fail "something is still mounted under $W; not removing it"
  rm -rf --one-file-system "$W"
fi
mkdir -p "$W/stages" && W=$(cd "$W" && pwd)
mount -t tmpfs none "$W/stages" 2>/dev/null || skip "cannot mount here (no CAP_SYS_ADMIN?)"
umount "$W/stages"

echo "== debootstrap --variant=minbase bookworm ($MIRROR)"
debootstrap --variant=minbase bookworm "$W/base" "$MIRROR" >"$W/debootstrap.log" 2>&1 || {
  tail -20 "$W/debootstrap.log"
  fail "debootstrap failed (log: $W/debootstrap.log)"
}
echo "   done after $(elapsed)"

stage_root() { echo "$W/stages/$1"; }
mount_root() { # ROOT
  local r=$1
  mount -t proc proc "$r/proc" && MOUNTS+=("$r/proc") || fail "mount proc in $r"
  mount -t sysfs -o ro sysfs "$r/sys" && MOUNTS+=("$r/sys") || fail "mount sysfs in $r"
  mount --bind /dev "$r/dev" && MOUNTS+=("$r/dev") || fail "bind /dev in $r"
  mount -t tmpfs -o mode=1777,size=50% shm "$r/dev/shm" && MOUNTS+=("$r/dev/shm") ||
    fail "mount /dev/shm in $r"
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
  cp -a "$(stage_root "$2")" "$(stage_root "$1")" || fail "copy stage $2"
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
  chroot "$root" /usr/bin/env -i --chdir="$wd" "${envs[@]}" "$@" || fail "RUN failed in stage $(basename "$root")"
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
chroot "$root" /usr/bin/env -i --chdir="$FINAL_WORKDIR" "${FINAL_ENV[@]}" "${FINAL_ARGV[@]}" \
  </dev/null >"$W/train.log" 2>&1
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
