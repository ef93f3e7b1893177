#!/usr/bin/env bash
# The GPU tier on a real GPU (run where one is: the device machine; prints a
# note and nothing else elsewhere): build/bench/gpu_bench. Usage:
# bench/gpu.sh BUILD_DIR. Binaries carried to a machine without the build's
# libraries need LD_LIBRARY_PATH (and UCX_MODULE_DIR) set by the caller.
set -euo pipefail
build=${1:?usage: bench/gpu.sh BUILD_DIR}
build=$(cd "$build" && pwd)
export TIERMEMD=${TIERMEMD:-$build/daemon/tiermemd}
if [ ! -x "$build/bench/gpu_bench" ]; then
  echo "# gpu: not built (no CUDA found at configure time)"
  exit 0
fi
"$build/bench/gpu_bench"
