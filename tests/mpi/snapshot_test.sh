#!/usr/bin/env bash
# In-memory snapshots (checkpoint.memory_every_steps) with real processes
# and real files; "nodes" on this one machine by DTRAIN_RANKS_PER_NODE:
#   - kill -9 of a rank under `dtrain launch`, file checkpoints every 500
#     steps, snapshots every 10: the restart resumes from the newest
#     snapshot (at most 10 steps lost) and ends bit-identical to an
#     uninterrupted run; the run's snapshots are gone once it completes;
#   - one node's snapshots removed after the kill: its rank takes the copy
#     kept on the other node: bit-identical;
#   - a damaged snapshot with no copy (one node): the file checkpoint, with
#     a line saying why: bit-identical;
#   - the files: named by run, rank and step, mode 600;
#   - a checkpoint.memory_dir too small for them, and snapshots without
#     the background writer: refused at start.
#   snapshot_test.sh DTRAIN COMPARE_MODELS WORKDIR
set -uo pipefail
DTRAIN=$1 COMPARE=$2 W=$3
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/fault_lib.sh" "  every_steps: 500
  every_minutes: 0
  memory_every_steps: 10
  memory_dir: $W/shm"
mkdir -p shm
# 60 steps; file checkpoints only at the end, snapshots at 10, 20, ...

train 2 base --set checkpoint.memory_every_steps=0 > base.out 2>&1 || { cat base.out; exit 1; }
train 2 plain > plain.out 2>&1
grep -q "in-memory snapshots every 10 steps" plain.out && same base plain && ok \
  || bad "snapshots change the run: $(grep -E 'snapshot|error' plain.out | head -3)"
[ -z "$(ls shm)" ] && ok || bad "a completed run left snapshots: $(ls -R shm | head)"

# kill -9 under the supervisor: the restart resumes from step 20's snapshot.
# A snapshot whose step comes while the last one is still being written is
# left out (train_snap.c), so the kills' runs read each batch 40 ms slower
# (slowdata): ten steps then outlast a write on a loaded machine.
SLOW=0:slowdata:40,1:slowdata:40
export DTRAIN_RANKS_PER_NODE=1
DTRAIN_FAULT=1:kill:25,$SLOW launch 2 killed > killed.out 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -q "attempt 2" killed.out \
   && grep -q "resumed from the in-memory snapshot of step 20 .*20 steps after the start (no file checkpoint)" killed.out \
   && same base killed; then ok
else bad "kill -9 and a restart from memory: exit $rc: $(grep -E 'snapshot|resumed|error' killed.out | head -4)"; fi
[ -z "$(ls shm)" ] && ok || bad "the completed run left snapshots: $(ls -R shm | head)"

# a node lost: rank 1's own snapshots removed; rank 0 kept a copy of them
DTRAIN_FAULT=1:kill:28,$SLOW train 2 node > node1.out 2>&1
files=$(find shm -type f -name 'r*-s*.*' | sort)
modes=$(find shm -type f -name 'r*-s*.*' -printf '%m\n' | sort -u)
if echo "$files" | grep -q "/node0/r0-s0000000020.own" && echo "$files" | grep -q "/node0/r1-s0000000020.peer" \
   && echo "$files" | grep -q "/node1/r1-s0000000020.own" && echo "$files" | grep -q "/node1/r0-s0000000020.peer" \
   && [ "$modes" = 600 ] && ! echo "$files" | grep -q "s0000000010"; then ok
else bad "snapshot files after the kill (mode $modes): $files"; fi
rm -rf shm/dtrain-*/node1
train 2 node > node2.out 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -q "resumed from the in-memory snapshot of step 20 .*(1 rank took the copy kept on another node)" node2.out \
   && same base node; then ok
else bad "a lost node: exit $rc: $(grep -E 'snapshot|resumed|error' node2.out | head -4)"; fi
unset DTRAIN_RANKS_PER_NODE

# one node (no copies), rank 1's newest snapshot damaged: the file checkpoint
# (file checkpoints every 20 steps, snapshots every 5: the newest snapshot
# is one of 25, 30, 35, those the file write of step 20 left room for; a
# snapshot is left out while that write is in flight, so each batch read
# takes 20 ms longer, giving the write a few hundred ms on a loaded machine)
DTRAIN_FAULT=1:kill:39,0:slowdata:20,1:slowdata:20 train 2 damaged --set checkpoint.every_steps=20 \
  --set checkpoint.memory_every_steps=5 > damaged1.out 2>&1
snap=$(find shm -type f \( -name 'r1-s0000000025.own' -o -name 'r1-s0000000030.own' \
  -o -name 'r1-s0000000035.own' \) | sort | tail -1)
step=$(sed -n 's/.*r1-s0*\([0-9]*\)\.own$/\1/p' <<<"$snap")
if [ -n "$snap" ]; then
  "$PY" - "$snap" <<'PY'
import sys
p = sys.argv[1]
data = bytearray(open(p, "rb").read())
data[len(data) // 2] ^= 0x10
open(p, "wb").write(data)
PY
fi
train 2 damaged --set checkpoint.every_steps=20 --set checkpoint.memory_every_steps=5 > damaged2.out 2>&1
rc=$?
if [ -n "$snap" ] && [ "$rc" = 0 ] \
   && grep -q "the in-memory snapshot of step $step cannot be used (.*fails its checksum): resuming from the file checkpoint" damaged2.out \
   && grep -q "resumed from damaged/checkpoints/ckpt-0000000020.h5" damaged2.out && same base damaged \
   && [ -z "$(ls shm)" ]; then ok
else bad "a damaged snapshot ('$snap'): exit $rc: $(grep -E 'snapshot|resumed|error' damaged2.out | head -4)"; fi

# refusals at start
out=$(train 2 off --set checkpoint.async=off 2>&1)
[ $? = 64 ] && grep -q "checkpoint.memory_every_steps needs the background writer" <<<"$out" && ok \
  || bad "snapshots without the writer: $(grep dtrain: <<<"$out")"
mkdir -p tiny
if mount -t tmpfs -o size=1m dtrain-snap tiny 2>/dev/null; then
  trap 'umount "$W/tiny" 2>/dev/null' EXIT
  out=$(train 2 small --set 'model.hidden=[512]' --set checkpoint.memory_dir="$W/tiny" 2>&1)
  rc=$?
  [ "$rc" = 64 ] && grep -qE "checkpoint.memory_dir .*/tiny has [0-9.]+ [KM]iB free, but the in-memory snapshots of the 2 ranks on this node need about" <<<"$out" \
    && [ -z "$(ls tiny)" ] && ok || bad "a memory_dir too small: exit $rc: $(grep dtrain: <<<"$out")"
  umount tiny
  trap - EXIT
else
  echo "SKIP: a memory_dir too small (mounting a small tmpfs needs root)"
fi

echo "snapshot_test: $pass passed, $fail failed"
[ "$fail" = 0 ]
