#!/usr/bin/env bash
# Failure detection (H1): build/bench/health_bench against three real daemons
# heartbeating every INTERVAL ms: time until node 1 sees node 3 UNREACHABLE
# after SIGSTOP and after SIGKILL, p50/p99 over TRIALS trials each, and the
# ratios to the heartbeat interval. RTO/RPO of a training job under faults
# needs replicated memory (issue 11's next part) and is not measured yet.
# Usage: bench/fault.sh BUILD_DIR [--trials N] [--interval-ms I] [--unreachable-ms U]
set -euo pipefail
build=${1:?usage: bench/fault.sh BUILD_DIR [--trials N] [--interval-ms I] [--unreachable-ms U]}
shift
build=$(cd "$build" && pwd)
export TIERMEMD=$build/daemon/tiermemd TIERMEMCTL=$build/tools/tiermemctl
"$build/bench/health_bench" --trials 20 "$@"
