#!/usr/bin/env bash
# Failure detection (H1): build/bench/health_bench against three real daemons
# heartbeating every INTERVAL ms: time until node 1 sees node 3 UNREACHABLE
# after SIGSTOP and after SIGKILL, p50/p99 over TRIALS trials each, and the
# ratios to the heartbeat interval; then build/bench/replication_bench: what
# copies cost a write (against the same write without them, direct and
# through the daemon) and how long reads and writes take to resume after
# the home or a copy's node is killed; then build/bench/training_bench: a
# data-parallel tiermem-exec job of three ranks with --replicas 1 whose rank
# 1, its daemon, or its whole node dies mid-run (RTO and RPO in steps for
# each, and the step time against the same job without copies).
# Usage: bench/fault.sh BUILD_DIR [--trials N] [--interval-ms I] [--unreachable-ms U]
set -euo pipefail
build=${1:?usage: bench/fault.sh BUILD_DIR [--trials N] [--interval-ms I] [--unreachable-ms U]}
shift
build=$(cd "$build" && pwd)
export TIERMEMD=$build/daemon/tiermemd TIERMEMCTL=$build/tools/tiermemctl TIERMEM_EXEC=$build/executor/tiermem-exec
"$build/bench/health_bench" --trials 20 "$@"
"$build/bench/replication_bench"
"$build/bench/training_bench"
