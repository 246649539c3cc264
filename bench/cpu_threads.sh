#!/usr/bin/env bash
# CPU threads: each job of the CPU comparison at 1 and 2 threads, dtrain
# against PyTorch at the same thread count, in one command, the runs
# alternating (1 thread, then 2, then again) so that load on a shared
# machine falls on both. For each job and thread count: both speeds and
# their ratio per round, and the spread over the rounds; then dtrain's
# and PyTorch's speed at 2 threads over 1.
#   bash bench/cpu_threads.sh [ROUNDS] [JOBS...]
# JOBS (default all): mlp (the quick-start MLP, bench/mlp_vs_torch.sh),
# gpt (the tiny GPT, bench/gpt_vs_torch.sh), cnn (configs/fashion-mnist-cnn.yaml)
# and resnet (configs/fashion-mnist-resnet.yaml, bench/cnn_vs_torch.sh).
# Needs what those scripts need: build/ (BUILD_DIR for another),
# data/fashion-mnist.h5, python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
shift || true
JOBS=${*:-mlp gpt cnn resnet}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

one() { # job threads -> "dtrain torch"
  case $1 in
  mlp) bash bench/mlp_vs_torch.sh 300 "$2" | awk '/^dtrain \(/ {d=$NF} /^PyTorch \(/ {t=$NF} END {print d, t}' ;;
  gpt) bash bench/gpt_vs_torch.sh configs/text-gpt-tiny.yaml 40 "$2" |
         awk '/^dtrain \(/ {d=$NF} /^PyTorch \(/ {t=$NF} END {print d, t}' ;;
  cnn) bash bench/cnn_vs_torch.sh configs/fashion-mnist-cnn.yaml 200 "$2" |
         awk '/^dtrain \(/ {d=$NF} /^PyTorch \(/ {t=$NF} END {print d, t}' ;;
  resnet) bash bench/cnn_vs_torch.sh configs/fashion-mnist-resnet.yaml 60 "$2" |
         awk '/^dtrain \(/ {d=$NF} /^PyTorch \(/ {t=$NF} END {print d, t}' ;;
  *) echo "cpu_threads: unknown job '$1' (mlp, gpt, cnn, resnet)" >&2; exit 64 ;;
  esac
}

for r in $(seq 1 "$ROUNDS"); do
  for job in $JOBS; do
    for t in 1 2; do
      echo "$job $t $r $(one "$job" "$t")" >> "$out/runs"
    done
  done
done

printf '%-7s %7s %12s %12s %7s %14s\n' job threads dtrain PyTorch ratio "ratio range"
awk '
  { k = $1 " " $2; d[k] += $4; p[k] += $5; n[k]++; r = $4 / $5
    if (n[k] == 1 || r < lo[k]) lo[k] = r
    if (n[k] == 1 || r > hi[k]) hi[k] = r
    if (!(k in seen)) { order[++m] = k; seen[k] = 1 } }
  END {
    for (i = 1; i <= m; i++) { k = order[i]; split(k, a, " ")
      printf "%-7s %7s %12.0f %12.0f %7.2f %6.2f-%-6.2f\n", a[1], a[2], d[k] / n[k], p[k] / n[k],
             d[k] / p[k], lo[k], hi[k] }
    print ""
    printf "%-7s %18s %18s\n", "job", "dtrain 2t/1t", "PyTorch 2t/1t"
    for (i = 1; i <= m; i++) { k = order[i]; split(k, a, " ")
      if (a[2] != 2) continue; k1 = a[1] " 1"
      printf "%-7s %18.2f %18.2f\n", a[1], (d[k] / n[k]) / (d[k1] / n[k1]), (p[k] / n[k]) / (p[k1] / n[k1]) } }
' "$out/runs"
echo
echo "(speeds: samples/s, tokens/s for gpt; mean of $ROUNDS rounds; ratio = dtrain / PyTorch)"
