#!/usr/bin/env bash
# Runs every benchmark and prints its figures: `name value unit` per figure,
# `name_ratio value` per ratio against the baseline named in the comments
# (lines starting with #). Usage: bench/run.sh BUILD_DIR [NAME...]
set -euo pipefail
build=${1:?usage: bench/run.sh BUILD_DIR [NAME...]}
shift
export TIERMEMD=$build/daemon/tiermemd
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(translate local_copy control_plane)
for name in "${names[@]}"; do
  echo "# --- $name"
  "$build/bench/${name}_bench"
done
