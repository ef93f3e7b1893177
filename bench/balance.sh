#!/usr/bin/env bash
# Device-aware partitioning (X3, issue 32) on the CPU: a pipeline whose
# ranks differ in speed - rank SLOW_RANK (default 1) emulates a device
# SLOWDOWN (default 3) times slower with --slowdown - trained with the stages
# cut by FLOPs (--balance flops) and by each rank's measured device and link
# (--balance auto), against the fast device alone (one rank, no slowdown).
# Model config/models/gpt_tiny.pbtxt (whole ops, --no-split), RANKS ranks
# (default 2) on two daemons, STEPS steps (default 200), each figure the
# median of 3 runs. Prints balance_<how>_step_ms_median and
# balance_time_vs_flops_ratio (goal on the H200 with a GPU rank and three CPU
# ranks: <= 0.5, bench/gpu.sh) and balance_time_vs_fast_alone_ratio.
# Usage: bench/balance.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: bench/balance.sh BUILD_DIR}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ranks=${RANKS:-2} slow_rank=${SLOW_RANK:-1} slowdown=${SLOWDOWN:-3} steps=${STEPS:-200}
model=$top/config/models/gpt_tiny.pbtxt corpus=$top/tests/data/corpus.txt
export TIERMEM_CLUSTER_DIR=$(mktemp -d /tmp/tiermem-bench-XXXXXX)
export TIERMEM_BASE_PORT=$((21000 + RANDOM % 20000))
trap '"$top/tools/local-cluster.sh" stop >/dev/null 2>&1; rm -rf "$TIERMEM_CLUSTER_DIR"' EXIT
"$top/tools/local-cluster.sh" start "$build" 2 >/dev/null
median() { sed -n 's/^summary: .*(median \([0-9.]*\) ms).*/\1/p'; }
# job WORLD NAME [args for every rank]: the median step of one run.
job() {
  local world=$1 name=$2 r extra
  shift 2
  for ((r = 0; r < world; ++r)); do
    extra=()
    [ "$world" -gt 1 ] && [ "$r" -eq "$slow_rank" ] && extra=(--slowdown "$slowdown")
    TIERMEM_RANK=$r TIERMEM_WORLD_SIZE=$world TIERMEM_LOCAL_WORLD_SIZE=$world \
      TIERMEM_SOCKET=$TIERMEM_CLUSTER_DIR/node$((r % 2 + 1))/tiermemd.sock \
      "$build/executor/tiermem-exec" train "$model" --data "$corpus" --job "$name" --steps "$steps" --log-every 100000 \
      --no-split "${extra[@]}" "$@" >"$TIERMEM_CLUSTER_DIR/$name.rank$r.log" 2>&1 &
  done
  wait
  cat "$TIERMEM_CLUSTER_DIR/$name".rank*.log | median
}
median3() {
  local a b c
  a=$(job "$@"); b=$(job "$1" "$2-b" "${@:3}"); c=$(job "$1" "$2-c" "${@:3}")
  printf '%s\n%s\n%s\n' "$a" "$b" "$c" | sort -g | sed -n 2p
}
echo "# $ranks ranks of $(basename "$model" .pbtxt), rank $slow_rank slowed ${slowdown}x, $steps steps, medians of 3"
flops=$(median3 "$ranks" flops --balance flops)
by_time=$(median3 "$ranks" time --balance auto)
alone=$(median3 1 alone)
grep -h -E '^(partition by|  stage )' "$TIERMEM_CLUSTER_DIR"/time.rank0.log | sed 's/^/# /'
echo "balance_flops_step_ms_median $flops ms"
echo "balance_time_step_ms_median $by_time ms"
echo "balance_fast_alone_step_ms_median $alone ms"
awk -v t="$by_time" -v f="$flops" -v a="$alone" 'BEGIN {
  printf "balance_time_vs_flops_ratio %.3f\n", t / f
  printf "balance_time_vs_fast_alone_ratio %.3f\n", t / a }'
