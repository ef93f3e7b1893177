#!/usr/bin/env bash
# Runs every benchmark and prints its figures: `name value unit` per figure,
# `name_ratio value` per ratio against the baseline named in the comments
# (lines starting with #). Usage: bench/run.sh BUILD_DIR [NAME...]
#   names: translate local_copy control_plane sub_page partition pmem exec_vs_torch remote same_host batch python
#   (remote is bench/remote.sh: UCX over TCP and shared memory vs ucx_perftest;
#   pmem: a client's durable writes and reads of its node's PMEM vs raw libpmem2)
#   compare: bench/compare.sh, this build against the parent commit (or
#   COMPARE_REV) in the same run, for translate, local_copy, control_plane
set -euo pipefail
build=${1:?usage: bench/run.sh BUILD_DIR [NAME...]}
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TIERMEMD=$build/daemon/tiermemd
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(translate local_copy control_plane sub_page partition pmem exec_vs_torch same_host python)
for name in "${names[@]}"; do
  echo "# --- $name"
  case $name in
    exec_vs_torch) "$here/exec_vs_torch.sh" "$build" ;;
    remote) "$here/remote.sh" "$build" ;;
    python) "$here/python.sh" "$build" ;;
    compare) "$here/compare.sh" "$build" --rev "${COMPARE_REV:-HEAD~1}" ;;
    *) "$build/bench/${name}_bench" ;;
  esac
done
