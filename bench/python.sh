#!/usr/bin/env bash
# The Python module against the C++ client in the same run: 64 MiB written
# and read through libtiermem from C++ (build/bench/local_copy_bench) and from
# Python (bench/python_bench.py: torch tensors and numpy arrays), each with
# its own real tiermemd of the same configuration; ratios Python / C++
# (goal >= 0.9); then what torch.from_dlpack(map(...)) costs.
# Usage: bench/python.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: bench/python.sh BUILD_DIR}
build=$(cd "$build" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIERMEMD=$build/daemon/tiermemd TIERMEMCTL=$build/tools/tiermemctl
export PYTHONPATH=$build/client/python PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
cxx=$("$build/bench/local_copy_bench")
echo "$cxx"
value() { awk -v n="$1" '$1 == n { print $2 }' <<<"$cxx"; }
/usr/bin/python3 "$here/python_bench.py" --cxx-write "$(value client_write_64MiB_bandwidth)" \
  --cxx-read "$(value client_read_64MiB_bandwidth)"
