# Shared by the fault suites (fault_test.sh, snapshot_test.sh): sourced with
# DTRAIN, COMPARE, W and HERE set. Makes W the working directory with a tiny
# IDX dataset (tiny.h5) and job.yaml (an MLP, 2 epochs of 30 steps), the
# job's checkpoint section given as the first argument; defines the
# pass/fail counters and the helpers to run the job.
MPIRUN="bash $HERE/mpirun.sh"
PY=$(command -v python3)
rm -rf "$W" && mkdir -p "$W/idx"
cd "$W" || exit 1
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
same() { "$COMPARE" "$1/model.h5" "$2/model.h5" "${3:-0}" >/dev/null; }
train() { # NP DIR [args]: one mpirun training run
  local np=$1 dir=$2
  shift 2
  timeout -k 10 300 $MPIRUN "$np" "$DTRAIN" train job.yaml --set output.dir="$dir" "$@"
}
launch() { # NP DIR [args]: through the restart supervisor
  local np=$1 dir=$2
  shift 2
  timeout -k 10 600 "$DTRAIN" launch -n "$np" --launcher mpirun --launcher-arg --oversubscribe \
    --launcher-arg --bind-to --launcher-arg none --backoff 0 --max-restarts 3 \
    -- train job.yaml --set output.dir="$dir" "$@"
}
export OMPI_MCA_btl=self,vader

"$PY" "$HERE/../cli/make_idx.py" idx 960 200 4 || exit 1
"$DTRAIN" data import idx idx -o tiny.h5 >/dev/null || exit 1
cat > job.yaml <<JOB
model:
  hidden: [32]
  dropout: 0.1
data:
  path: tiny.h5
  workers: 1
train:
  epochs: 2
  global_batch: 32
  eval_batch: 64
  log_every: 10
runtime:
  threads: 1
  progress: lines
  timeout_s: 20
checkpoint:
$1
JOB
