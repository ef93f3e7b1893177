#!/usr/bin/env bash
# Runtime repartitioning (X11, issue 32) on the CPU: a pipeline of RANKS
# ranks (default 4) on two daemons trains config/models/gpt_tiny.pbtxt (whole
# ops) with --replan; from step SLOW_FROM (default 150) rank 1 turns SLOWDOWN
# (default 3) times slower (--slowdown-from: every kernel it runs). From the
# progress lines (every 10 steps) it prints the median step time before the
# slowdown, while slowed before the re-plan, and after the move;
# replan_after_vs_slowed_ratio (goal <= 0.6), the move's time (the slowest
# rank's) and the steps the move took to pay for itself (its time over the
# step time saved). The look thresholds are this machine's (its steps take
# milliseconds, the seed's P99 of 200 ms is for real jobs): REPLAN_ARGS.
# Usage: bench/replan.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: bench/replan.sh BUILD_DIR}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ranks=${RANKS:-4} slowdown=${SLOWDOWN:-3} slow_from=${SLOW_FROM:-150} steps=${STEPS:-800}
read -r -a replan <<<"${REPLAN_ARGS:---replan --replan-every-ms 300 --replan-p99-ms 0 --replan-cpu-percent 0}"
model=$top/config/models/gpt_tiny.pbtxt corpus=$top/tests/data/corpus.txt
export TIERMEM_CLUSTER_DIR=$(mktemp -d /tmp/tiermem-bench-XXXXXX)
export TIERMEM_BASE_PORT=$((21000 + RANDOM % 20000))
trap '"$top/tools/local-cluster.sh" stop >/dev/null 2>&1; rm -rf "$TIERMEM_CLUSTER_DIR"' EXIT
"$top/tools/local-cluster.sh" start "$build" 2 >/dev/null
for ((r = 0; r < ranks; ++r)); do
  extra=()
  [ "$r" -eq 1 ] && extra=(--slowdown "$slowdown" --slowdown-from "$slow_from")
  TIERMEM_RANK=$r TIERMEM_WORLD_SIZE=$ranks TIERMEM_LOCAL_WORLD_SIZE=$ranks \
    TIERMEM_SOCKET=$TIERMEM_CLUSTER_DIR/node$((r % 2 + 1))/tiermemd.sock \
    "$build/executor/tiermem-exec" train "$model" --data "$corpus" --job replan --steps "$steps" --log-every 10 \
    --no-split "${replan[@]}" "${extra[@]}" >"$TIERMEM_CLUSTER_DIR/rank$r.log" 2>&1 &
done
wait
logs=$(cat "$TIERMEM_CLUSTER_DIR"/rank*.log)
grep -h -E '^re-plan decided|moved to generation' <<<"$logs" | sed 's/^/# /'
decided=$(sed -n 's/^re-plan decided at step \([0-9]*\):.*/\1/p' <<<"$logs" | head -1)
if [ -z "$decided" ]; then
  echo "# no re-plan happened"
  exit 0
fi
move_ms=$(sed -n 's/.*moved to generation 1 at step [0-9]* in \([0-9.]*\) ms.*/\1/p' <<<"$logs" | sort -g | tail -1)
# Each progress line: the step it ends at and the window's mean step time.
windows=$(sed -n 's/^epoch .*  step \([0-9]*\)  .*  step \([0-9.]*\) ms (communication.*/\1 \2/p' <<<"$logs" | sort -n -u -k1,1)
median_between() {  # median step ms of the windows ending in (FROM, TO]
  awk -v a="$1" -v b="$2" '$1 > a && $1 <= b { print $2 }' <<<"$windows" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print 0 }'
}
# Windows of 10 steps: slowed ones end after the slowdown and by the
# decision (the move is at the boundary after it); after-move ones start
# 20 steps past it.
before=$(median_between 30 "$slow_from")
slowed=$(median_between $((slow_from + 9)) "$decided")
after=$(median_between $((decided + 30)) "$steps")
echo "replan_before_slowdown_step_ms_median $before ms"
echo "replan_slowed_step_ms_median $slowed ms"
echo "replan_after_step_ms_median $after ms"
echo "replan_move_ms $move_ms ms"
echo "replan_decided_steps_after_slowdown $((decided - slow_from)) steps"
awk -v s="$slowed" -v a="$after" -v m="$move_ms" 'BEGIN {
  if (s <= 0 || a <= 0) { print "# no whole window of 10 steps between the slowdown and the move"; exit }
  printf "replan_after_vs_slowed_ratio %.3f\n", a / s
  if (s > a) printf "replan_payback_steps %.1f steps\n", m / (s - a) }'
