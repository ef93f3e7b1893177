#!/usr/bin/env bash
# Durability under SIGKILL (H5): tests/support/torture against a real tiermemd
# preloaded with PRELOAD named allocations (10,000 by default, so restart
# times are those of a daemon with that many records), three worker processes
# making random operations, and the daemon killed KILLS times (1,000 by
# default) at random moments and started again. Prints `name value [unit]`:
#   kills, acknowledged_ops, acknowledged_ops_lost (goal 0), bytes_mismatched,
#   ghosts, restart_ms_p50/p99 (SIGKILL to serving again),
#   recovery_ms_per_1000_records, pool_check_ok (pmempool check after a clean
#   stop), and restart_vs_cold_start_ratio against a daemon started on an
#   empty node in the same run (the baseline: what a start costs anyway).
# Usage: bench/torture.sh BUILD_DIR [--kills N] [--preload P] [--workers W] [--seed S]
set -euo pipefail
build=${1:?usage: bench/torture.sh BUILD_DIR [--kills N] [--preload P] [--workers W] [--seed S]}
shift
kills=1000
preload=10000
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --kills) kills=$2; shift 2 ;;
    --preload) preload=$2; shift 2 ;;
    *) extra+=("$1" "$2"); shift 2 ;;
  esac
done
build=$(cd "$build" && pwd)
export TIERMEMD=$build/daemon/tiermemd TIERMEMCTL=$build/tools/tiermemctl
# The baseline: kill and restart an empty daemon, same machine, same run.
echo "# baseline: restarts of an empty node (no records, no load)"
cold=$("$build/tests/support/torture" --kills 20 --workers 0 --preload 0 --seed 7 | awk '$1 == "restart_ms_p50" {print $2}')
echo "cold_restart_ms_p50 $cold ms"
echo "# torture: $kills kills, $preload preloaded allocations"
out=$("$build/tests/support/torture" --kills "$kills" --preload "$preload" "${extra[@]}")
echo "$out"
warm=$(echo "$out" | awk '$1 == "restart_ms_p50" {print $2}')
python3 -c "print('restart_vs_cold_start_ratio %.2f' % ($warm / $cold))"
