#!/usr/bin/env bash
# comm.shard under real mpirun: the optimizer state split over the ranks
# (optimizer), and the gradients too (gradients).
# Buckets of 0.002 MiB cut the MLP's 2,272 parameters into 5, so each rank
# holds several ranges and tensors straddle them (3 at parameter
# boundaries with sharded gradients).
#   - AdamW with clipping on 2 ranks: comm.shard optimizer ends with the
#     parameters of comm.shard none bit for bit, and its checkpoint holds
#     the same optimizer state, bit for bit, though each rank wrote only
#     its own shard of it; on 4 ranks within 1e-5 (the replicated run sums
#     this small model's buckets with the MPI library's all-reduce, in its
#     own order: after 64 AdamW steps, 1.8e-6 apart in fc1's weights on an
#     AMD EPYC with OpenBLAS's Zen kernels, within 1e-6 with its Cooperlake
#     ones);
#   - each rank keeps about 1/N of the optimizer state (the start record's
#     optim_state_bytes, the largest rank's) and says so in the log;
#   - a checkpoint of 4 sharded ranks resumes on 1 rank (replicated) and on
#     2 (sharded), and one of 1 rank resumes on 4 sharded ranks, each ending
#     where the uninterrupted run ends (1e-5: another world size sums in
#     another order);
#   - a GPT (its embedding and output head one tied tensor) on 2 ranks:
#     sharded and replicated bit for bit;
#   - a NaN step is skipped alike; fp16 with an overflow (the loss scale
#     halved) gives the replicated run's bits; the out-of-memory fallback
#     (a smaller micro-batch) rebuilds the shard;
#   - a job whose memory fits only sharded is refused replicated with
#     comm.shard named, and runs sharded;
#   - sharded gradients: bit for bit the replicated run on 2 ranks (MLP,
#     GPT, GPT with recomputation, CNN with synchronised batch norm, NaN
#     step, fp16 overflow, a hung rank restarted), within 1e-5 on 4; with
#     accumulation (every micro-batch reduced: another order of the sums)
#     and a short last batch whose ranks have fewer micro-batches than a
#     full one, and not all as many (so each joins the others'
#     reductions), within 1e-5; each rank's model state under the
#     optimizer stage's; resumes across stages and world sizes; a job that
#     fits only with the gradients sharded too is told comm.shard:
#     gradients;
#   - sharded parameters (comm.shard: parameters): bit for bit the
#     sharded-gradients run on 2 and 4 ranks (the same sums; the gathered
#     parameters are exact copies), so bit for bit the replicated one on 2
#     (MLP, GPT with its tied tensor, with recomputation, CNN with
#     synchronised batch norm, NaN step, fp16 overflow, a hung rank
#     restarted, bf16) and its checkpoint's parameters and optimizer state
#     too; model.h5 written tensor by tensor from the gather slots, and a
#     model.h5 that cannot be written fails the run on every rank (exit
#     74, the final checkpoint kept);
#     a deeper MLP whose buckets outnumber the gather slots, so that
#     layers are gathered again in every pass: with accumulation and a
#     short last batch (a rank with fewer micro-batches replays the
#     others' gathers) and an evaluation whose last batch gives the ranks
#     different numbers of pieces (the same test loss); resumes across
#     stages and world sizes; each rank's model state under the gradient
#     stage's; the summary gives the gather slots' size; a job that fits
#     only with the parameters sharded too is told comm.shard: parameters;
#   - what cannot run is refused at start-up with the key and the reason.
#   shard_test.sh DTRAIN COMPARE_MODELS WORKDIR
set -uo pipefail
DTRAIN=$1 COMPARE=$2 W=$3
HERE=$(cd "$(dirname "$0")" && pwd)
MPIRUN="bash $HERE/mpirun.sh"
PY=$(command -v python3)
rm -rf "$W" && mkdir -p "$W/idx"
cd "$W" || exit 1
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# run NAME NP [args...]: one training run into NAME, output in NAME.out
run() {
  local name=$1 np=$2
  shift 2
  timeout -k 10 300 $MPIRUN "$np" "$DTRAIN" train "${JOB:-job.yaml}" --set output.dir="$name" \
    "$@" >"$name.out" 2>&1 || { bad "run $name ($np ranks): $(tail -3 "$name.out")"; return 1; }
}
same() { # A B TOL: final parameters
  "$COMPARE" "$1/model.h5" "$2/model.h5" "$3" >/dev/null && ok ||
    bad "$1 and $2 differ by more than $3: $("$COMPARE" "$1/model.h5" "$2/model.h5" "$3" | tail -2)"
}
start() { grep '"type":"start"' "$1/metrics.jsonl" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"; }
ckpt() { echo "$1/checkpoints/ckpt-$(printf %010d "$2").h5"; }
# resume NAME NP FROM STEP [args...]: NAME continues from FROM's checkpoint of STEP
resume() {
  local name=$1 np=$2 from=$3 step=$4
  shift 4
  mkdir -p "$name/checkpoints" && cp "$(ckpt "$from" "$step")" "$name/checkpoints/"
  run "$name" "$np" --set output.adopt=true --resume "$(ckpt "$name" "$step")" "$@" &&
    grep -q "resumed from .*ckpt-$(printf %010d "$step")" "$name/train.log" ||
    bad "$name did not resume from step $step"
}
# expect_fail CODE PATTERN NP [args...]: refused at start-up
expect_fail() {
  local code=$1 pat=$2 np=$3 out rc
  shift 3
  out=$(timeout -k 10 120 $MPIRUN "$np" "$DTRAIN" train job.yaml --set output.dir=refused "$@" 2>&1)
  rc=$?
  [ "$rc" = "$code" ] && grep -qE -- "$pat" <<<"$out" && ok ||
    bad "expected exit $code and /$pat/, got $rc: $out"
}

"$PY" "$HERE/../cli/make_idx.py" idx 1024 200 4 || exit 1
"$DTRAIN" data import idx idx -o tiny.h5 >/dev/null || exit 1
cat >job.yaml <<JOB
model:
  hidden: [32, 16]
  dropout: 0.1
data:
  path: tiny.h5
  workers: 1
train:
  epochs: 2
  global_batch: 32
  eval_batch: 64
  log_every: 1
  clip_norm: 0.05
  optimizer: {name: adamw, lr: 0.003, weight_decay: 0.1}
checkpoint: {every_steps: 16, every_minutes: 0, keep_last: 10}
comm: {bucket_mb: 0.002}
runtime:
  threads: 1
  progress: lines
JOB

# --- the same parameters and checkpoints, sharded or not ------------------------
run n2 2 --set comm.shard=none
run s2 2 --set comm.shard=optimizer
same n2 s2 0
h5diff "$(ckpt n2 64)" "$(ckpt s2 64)" /optim /optim >/dev/null && ok ||
  bad "2 ranks: the sharded checkpoint's optimizer state differs from the replicated one's"
h5diff "$(ckpt n2 64)" "$(ckpt s2 64)" /params /params >/dev/null && ok ||
  bad "2 ranks: the checkpoints' parameters differ"
"$DTRAIN" ckpt verify "$(ckpt s2 64)" >/dev/null && ok || bad "the sharded checkpoint does not verify"
run n4 4 --set comm.shard=none
run s4 4
same n4 s4 1e-5
[ "$(start s4 shard)" = optimizer ] && [ "$(start n4 shard)" = none ] && ok ||
  bad "start records say shard '$(start s4 shard)' and '$(start n4 shard)'"
grep -q "optimizer state .*each rank's shard" s4/train.log && ok || bad "the log does not say the state is sharded"
for p in "s2 n2 2" "s4 n4 4"; do
  set -- $p
  awk -v s="$(start "$1" optim_state_bytes)" -v n="$(start "$2" optim_state_bytes)" -v k="$3" \
    'BEGIN { r = s * k / n; exit !(n > 0 && r >= 0.9 && r <= 1.25) }' && ok ||
    bad "$1 keeps $(start "$1" optim_state_bytes) bytes of optimizer state, $2 $(start "$2" optim_state_bytes): not about 1/$3"
done

# --- resume across world sizes and stages --------------------------------------
resume r41 1 s4 32
same s4 r41 1e-5
resume r42 2 s4 32 --set comm.shard=optimizer
same s4 r42 1e-5
run n1 1
resume r14 4 n1 32 --set comm.shard=optimizer
same n1 r14 1e-5

# --- a GPT with tied embeddings -------------------------------------------------
"$PY" "$HERE/../common/corpus.py" 60000 >corpus.txt && "$DTRAIN" data import text corpus.txt \
  -o text.h5 >/dev/null || bad "cannot import the text"
cat >gpt.yaml <<'YEOF'
model: {type: gpt, n_layer: 2, n_head: 2, n_embd: 32, dropout: 0.1}
data: {path: text.h5, test_split: val, seq_len: 32, workers: 1}
train:
  steps: 12
  global_batch: 16
  eval_batch: 32
  log_every: 4
  clip_norm: 1.0
  optimizer: {name: adamw, lr: 0.003, weight_decay: 0.1}
  schedule: {name: constant}
checkpoint: {every_steps: 6, every_minutes: 0}
comm: {bucket_mb: 0.01}
runtime: {threads: 1, progress: lines}
YEOF
JOB=gpt.yaml run gn2 2 --set comm.shard=none
JOB=gpt.yaml run gs2 2 --set comm.shard=optimizer
same gn2 gs2 0
JOB=gpt.yaml resume gr1 1 gs2 6
same gs2 gr1 1e-4

# --- skipped steps, fp16 and the out-of-memory fallback ------------------------------
DTRAIN_FAULT=0:nan:5 run fn2 2 --set comm.shard=none
DTRAIN_FAULT=0:nan:5 run fs2 2 --set comm.shard=optimizer
same fn2 fs2 0
grep -q "not finite" fs2.out && ok || bad "the NaN step was not reported"
# fp16: the loss scale's overflow check from the ranks' shares, unscaling
# and clipping in the gate's order; an overflow at step 4 halves the scale
DTRAIN_FAULT=0:overflow:3 run hn2 2 --set comm.shard=none --set train.precision=fp16
DTRAIN_FAULT=0:overflow:3 run hs2 2 --set comm.shard=optimizer --set train.precision=fp16
same hn2 hs2 0
overflows() { grep '"type":"train"' "$1/metrics.jsonl" | sed -n 's/.*"overflow_steps":\([0-9]*\).*/\1/p' |
              awk '{ n += $1 } END { print n + 0 }'; }
[ "$(overflows hs2)" = 1 ] && [ "$(overflows hn2)" = 1 ] && ok ||
  bad "fp16 overflows: sharded $(overflows hs2), replicated $(overflows hn2), expected 1 each"
[ "$(start hs2 shard)" = optimizer ] && ok || bad "fp16 did not shard"
DTRAIN_FAULT=0:oom:4 run om2 2 --set train.micro_batch=8
run m42 2 --set train.micro_batch=4
grep -q "trying micro-batch 4" om2.out && ok || bad "no out-of-memory fallback in om2"
same om2 m42 0

# --- sharded gradients (comm.shard: gradients) ------------------------------------------
run g2 2 --set comm.shard=gradients
same n2 g2 0
h5diff "$(ckpt n2 64)" "$(ckpt g2 64)" /optim /optim >/dev/null && ok ||
  bad "2 ranks: the optimizer state with sharded gradients differs from the replicated one's"
run g4 4 --set comm.shard=gradients
same n4 g4 1e-5
[ "$(start g4 shard)" = gradients ] && ok || bad "g4's start record says shard '$(start g4 shard)'"
grep -q "gradients .*each rank's shard" g4/train.log && ok || bad "the log does not say the gradients are sharded"
awk -v g="$(start g4 model_state_bytes)" -v s="$(start s4 model_state_bytes)" 'BEGIN { exit !(g > 0 && g < s) }' &&
  ok || bad "g4 keeps $(start g4 model_state_bytes) bytes of model state, s4 $(start s4 model_state_bytes)"
# accumulation: each micro-batch reduced, then a short last batch of 17
# rows (1,025 samples): on 2 ranks one micro-batch on one rank and two on
# the other, against three in a full batch
mkdir -p odd && "$PY" "$HERE/../cli/make_idx.py" odd 1025 200 4 && "$DTRAIN" data import idx odd -o odd.h5 >/dev/null ||
  bad "cannot make the 1,025-sample dataset"
acc=(--set data.path=odd.h5 --set train.micro_batch=8 --set train.global_batch=48 --set data.drop_last=false)
run an2 2 --set comm.shard=none "${acc[@]}"
run ag2 2 --set comm.shard=gradients "${acc[@]}"
same an2 ag2 1e-5
grep -q "22 steps/epoch" ag2/train.log && ok || bad "ag2 has no short last batch"
run ag4 4 --set comm.shard=gradients --set data.path=odd.h5 --set train.micro_batch=4 \
  --set train.global_batch=48 --set data.drop_last=false
same an2 ag4 1e-5
# across_stages STAGE X FROM: FROM (4 ranks of STAGE) resumed on 1 rank
# and on 2 sharding the optimizer, and s2 (2 ranks sharding the
# optimizer) resumed on 4 ranks of STAGE, each within 1e-5 of the
# uninterrupted run (runs r{X}1, r{X}2, r{X}s)
across_stages() {
  local stage=$1 x=$2 from=$3
  resume "r${x}1" 1 "$from" 32
  same "$from" "r${x}1" 1e-5
  resume "r${x}2" 2 "$from" 32 --set comm.shard=optimizer
  same "$from" "r${x}2" 1e-5
  resume "r${x}s" 4 s2 32 --set comm.shard="$stage"
  same s2 "r${x}s" 1e-5
}
across_stages gradients g g4
JOB=gpt.yaml run gg2 2 --set comm.shard=gradients
same gn2 gg2 0
# activation recomputation (bit-identical gradients) and a CNN's batch norm
# with synchronised statistics
JOB=gpt.yaml run gq2 2 --set comm.shard=gradients --set model.recompute=all
same gn2 gq2 0
cnn=(--set model.type=cnn --set 'model.channels=[4, 8]' --set 'model.hidden=[16]' --set model.sync_bn=true
     --set train.epochs=1)
run cn2 2 --set comm.shard=none "${cnn[@]}"
# like_replicated STAGE X BASE: under comm.shard STAGE the CNN with
# synchronised batch norm, a NaN step and fp16 with an overflow (runs
# cX2, fX2, hX2) end bit for bit where the replicated runs do; a rank
# that hangs at step 34: the timeout ends the attempt, the supervisor
# restarts it from step 32's checkpoint, and the run ends where the
# uninterrupted one of that stage, BASE, does
like_replicated() {
  local stage=$1 x=$2 base=$3
  run "c${x}2" 2 --set comm.shard="$stage" "${cnn[@]}"
  same cn2 "c${x}2" 0
  DTRAIN_FAULT=0:nan:5 run "f${x}2" 2 --set comm.shard="$stage"
  same fn2 "f${x}2" 0
  DTRAIN_FAULT=0:overflow:3 run "h${x}2" 2 --set comm.shard="$stage" --set train.precision=fp16
  same hn2 "h${x}2" 0
  mkdir -p "hung$x" && DTRAIN_FAULT=1:hang:33 timeout -k 10 600 "$DTRAIN" launch -n 2 --launcher mpirun \
    --launcher-arg --oversubscribe --launcher-arg --bind-to --launcher-arg none --backoff 0 \
    --max-restarts 3 -- train job.yaml --set output.dir="hung$x/run" --set comm.shard="$stage" \
    --set runtime.timeout_s=3 >"hung$x.out" 2>&1 && grep -q "did not complete within 3 s" "hung$x.out" &&
    same "$base" "hung$x/run" 0 || bad "a hang with comm.shard $stage: $(grep -E 'did not complete|error' "hung$x.out" | head -3)"
}
like_replicated gradients g g2
DTRAIN_FAULT=0:oom:4 run og2 2 --set train.micro_batch=8 --set comm.shard=gradients
grep -q "trying micro-batch 4" og2.out && ok || bad "no out-of-memory fallback in og2"
same om2 og2 1e-5

# --- sharded parameters (comm.shard: parameters) ------------------------------------------
run p2 2 --set comm.shard=parameters
same n2 p2 0
h5diff "$(ckpt n2 64)" "$(ckpt p2 64)" /optim /optim >/dev/null &&
  h5diff "$(ckpt n2 64)" "$(ckpt p2 64)" /params /params >/dev/null && ok ||
  bad "2 ranks: the checkpoint with sharded parameters differs from the replicated one's"
"$DTRAIN" ckpt verify "$(ckpt p2 64)" >/dev/null && ok || bad "p2's checkpoint does not verify"
run p4 4 --set comm.shard=parameters
same g4 p4 0
same n4 p4 1e-5
[ "$(start p4 shard)" = parameters ] && ok || bad "p4's start record says shard '$(start p4 shard)'"
grep -q "parameters .*each rank's shard and the gather slots" p4/train.log && ok ||
  bad "the log does not say the parameters are sharded"
awk -v p="$(start p4 model_state_bytes)" -v g="$(start g4 model_state_bytes)" 'BEGIN { exit !(p > 0 && p < g) }' &&
  ok || bad "p4 keeps $(start p4 model_state_bytes) bytes of model state, g4 $(start g4 model_state_bytes)"
grep -q '"param_gather_bytes":[1-9]' p4/metrics.jsonl && ok || bad "p4's summary has no param_gather_bytes"
JOB=gpt.yaml run gp2 2 --set comm.shard=parameters
same gn2 gp2 0
JOB=gpt.yaml run gpq2 2 --set comm.shard=parameters --set model.recompute=all
same gn2 gpq2 0
JOB=gpt.yaml run gbn2 2 --set comm.shard=none --set train.precision=bf16
JOB=gpt.yaml run gbp2 2 --set comm.shard=parameters --set train.precision=bf16
same gbn2 gbp2 0
like_replicated parameters p p2
DTRAIN_FAULT=0:oom:4 run op2 2 --set train.micro_batch=8 --set comm.shard=parameters
grep -q "trying micro-batch 4" op2.out && ok || bad "no out-of-memory fallback in op2"
same om2 op2 1e-5
# a deeper MLP (5 buckets, more than the 3 gather slots): accumulation with
# a short last batch, where a rank with fewer micro-batches replays the
# gathers of the others' forward and backward
deep=(--set 'model.hidden=[32, 32, 16, 16]')
run dg2 2 --set comm.shard=gradients "${deep[@]}" "${acc[@]}"
run dp2 2 --set comm.shard=parameters "${deep[@]}" "${acc[@]}"
same dg2 dp2 0
run dp4 4 --set comm.shard=parameters "${deep[@]}" --set data.path=odd.h5 --set train.micro_batch=4 \
  --set train.global_batch=48 --set data.drop_last=false
run dg4 4 --set comm.shard=gradients "${deep[@]}" --set data.path=odd.h5 --set train.micro_batch=4 \
  --set train.global_batch=48 --set data.drop_last=false
same dg4 dp4 0
# an evaluation whose last batch (9 of 201 samples) gives one rank two
# pieces of 4 rows and the other one
mkdir -p ev && "$PY" "$HERE/../cli/make_idx.py" ev 1024 201 4 && "$DTRAIN" data import idx ev -o ev.h5 >/dev/null ||
  bad "cannot make the 201-sample test split"
ev=(--set data.path=ev.h5 --set train.micro_batch=4 --set train.epochs=1)
run eg2 2 --set comm.shard=gradients "${deep[@]}" "${ev[@]}"
run ep2 2 --set comm.shard=parameters "${deep[@]}" "${ev[@]}"
same eg2 ep2 0
tl() { grep -o '"test_loss":[0-9.e+-]*' "$1/metrics.jsonl" | tail -1; }
[ -n "$(tl ep2)" ] && [ "$(tl ep2)" = "$(tl eg2)" ] && ok || bad "test loss with sharded parameters $(tl ep2), sharded gradients $(tl eg2)"
# model.h5 that cannot be written at the end (a directory in its place):
# rank 0's failure reaches every rank, which have fetched the parameters
# with it, and the run exits 74 with the final checkpoint kept
mkdir -p mdir/model.h5
out=$(timeout -k 10 120 $MPIRUN 2 "$DTRAIN" train job.yaml --set output.dir=mdir --set output.adopt=true \
      --set comm.shard=parameters "${deep[@]}" --set runtime.timeout_s=20 2>&1)
rc=$?
[ "$rc" = 74 ] && grep -q "model mdir/model.h5: cannot rename" <<<"$out" && [ -f "$(ckpt mdir 64)" ] && ok ||
  bad "model.h5 unwritable with sharded parameters: exit $rc, $(grep 'dtrain:' <<<"$out" | head -2)"
across_stages parameters p p4

# --- refusals -------------------------------------------------------------------------
expect_fail 64 "comm.shard: parameters cannot run here: comm.grad_dtype is bf16" 2 \
  --set comm.shard=parameters --set comm.grad_dtype=bf16
expect_fail 64 "comm.shard: parameters and comm.sharded_update: false disagree" 2 \
  --set comm.shard=parameters --set comm.sharded_update=false
# a GPU backend (the build's host emulation of it, where it has one)
if grep -q "cuda backend is the host emulation" p2.out; then
  DTRAIN_CUDA_EMU=1 expect_fail 64 "comm.shard: parameters cannot run here: the gradients travel through host memory" 2 \
    --set comm.shard=parameters --set runtime.device=cuda --set runtime.share_gpus=true
fi
expect_fail 64 "comm.shard: gradients cannot run here: comm.grad_dtype is bf16" 2 \
  --set comm.shard=gradients --set comm.grad_dtype=bf16
expect_fail 64 "comm.shard: gradients and comm.sharded_update: false disagree" 2 \
  --set comm.shard=gradients --set comm.sharded_update=false
expect_fail 64 "comm.shard: optimizer cannot run here: comm.grad_dtype is bf16" 2 \
  --set comm.shard=optimizer --set comm.grad_dtype=bf16
expect_fail 64 "comm.shard: optimizer cannot run here: comm.mpi_allreduce is library" 2 \
  --set comm.shard=optimizer --set comm.mpi_allreduce=library
expect_fail 64 "comm.shard: optimizer and comm.sharded_update: false disagree" 2 \
  --set comm.shard=optimizer --set comm.sharded_update=false
# the memory check: a job that fits only sharded says which key to set, and
# fits with it (a limit between the two needs, read off the first refusal)
big=(--set 'model.hidden=[1024,1024]' --set train.epochs=1)
out=$(timeout -k 10 120 $MPIRUN 2 "$DTRAIN" train job.yaml --set output.dir=refused \
      --set comm.shard=none "${big[@]}" --set runtime.memory_limit=0.0001 2>&1)
limit=$(sed -n 's/.*needs about \([0-9.]*\) MiB .*optimizer state \([0-9.]*\) MiB.*/\1 \2/p' <<<"$out" |
        head -1 | awk '{ if (NF == 2) printf "%.6f", ($1 - $2 / 4) / 1024 }')
if [ -n "$limit" ]; then
  expect_fail 64 "set comm.shard: optimizer \(each rank then keeps its 1/N of the optimizer state" 2 \
    --set comm.shard=none "${big[@]}" --set runtime.memory_limit="$limit"
  run fits2 2 "${big[@]}" --set runtime.memory_limit="$limit" && ok
else
  bad "no memory figures in: $out"
fi
# ... and one that fits only with the gradients sharded too (a limit below
# the optimizer stage's need, which saves half the optimizer state, above
# the gradient stage's, which saves half the gradients too; a model 4
# times larger, so that a quarter of its gradients is well above how much
# the process's own size varies from run to run)
# (checkpoints written while training waits: a background write's
# snapshot, which sharding shrinks too, would change the arithmetic)
big2=(--set 'model.hidden=[2048,2048]' --set train.epochs=1 --set checkpoint.async=off)
out=$(timeout -k 10 120 $MPIRUN 2 "$DTRAIN" train job.yaml --set output.dir=refused \
      --set comm.shard=none "${big2[@]}" --set runtime.memory_limit=0.0001 2>&1)
# only_with STAGE LOWER LIMIT ADVICE: under runtime.memory_limit LIMIT
# (GiB) that job is refused replicated with ADVICE, and with comm.shard
# LOWER told to set STAGE, and it runs with STAGE
only_with() {
  local stage=$1 lower=$2 limit=$3 advice=$4
  [ -n "$limit" ] || { bad "no memory figures for $stage in: $out"; return; }
  expect_fail 64 "$advice" 2 --set comm.shard=none "${big2[@]}" --set runtime.memory_limit="$limit"
  expect_fail 64 "set comm.shard: $stage" 2 --set comm.shard="$lower" "${big2[@]}" \
    --set runtime.memory_limit="$limit"
  run "fits$stage" 2 "${big2[@]}" --set comm.shard="$stage" --set runtime.memory_limit="$limit" && ok
}
figures=$(sed -n 's/.*needs about \([0-9.]*\) MiB .*(parameters \([0-9.]*\) MiB, gradients \([0-9.]*\) MiB, optimizer state \([0-9.]*\) MiB.*/\1 \2 \3 \4/p' <<<"$out" | head -1)
only_with gradients optimizer "$(awk '{ if (NF == 4) printf "%.6f", ($1 - $4 / 2 - $3 / 4) / 1024 }' <<<"$figures")" \
  "set comm.shard: gradients \(each rank then keeps its 1/N of the optimizer state and of the gradients"
# ... and one that fits only with the parameters sharded too (a quarter of
# the parameters below the gradient stage's need)
only_with parameters gradients "$(awk '{ if (NF == 4) printf "%.6f", ($1 - $4 / 2 - $3 / 2 - $2 / 4) / 1024 }' <<<"$figures")" \
  "set comm.shard: parameters \(each rank then keeps its 1/N of the optimizer state, of the gradients and of the parameters"
# auto keeps the state whole where sharding cannot run
run auto2 2 --set comm.grad_dtype=bf16 && [ "$(start auto2 shard)" = none ] && ok ||
  bad "auto with a bf16 wire: shard '$(start auto2 shard)'"

echo "shard: $pass passed, $fail failed"
[ "$fail" = 0 ]
