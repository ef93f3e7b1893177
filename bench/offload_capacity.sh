#!/usr/bin/env bash
# The largest model a VRAM budget trains, with and without offload (issue
# 27), from tiermem-exec's plans (no GPU needed: the plan is what a rank
# allocates). GPTs of bench/models/make_gpt.py: width 1024, 16 heads,
# context 128, 2 sequences per micro-batch, 4 micro-batches, BLOCKS grown
# until the plan no longer fits the budget: all in VRAM, then offloaded
# (parameters, gradients and Adam's state in DRAM, streamed through a window).
# Prints, per budget: the most blocks and parameters of each, their ratio,
# and the DRAM the offloaded one keeps (the home tier must hold it).
# The planner's first-fit is quadratic in the work instances: 16 GiB (226
# blocks) takes some 3 minutes on two cores.
# Usage: bench/offload_capacity.sh BUILD_DIR [BUDGET...]   (default 4GiB 8GiB 16GiB)
set -euo pipefail
build=${1:?usage: bench/offload_capacity.sh BUILD_DIR [BUDGET...]}
shift
[ $# -gt 0 ] || set -- 4GiB 8GiB 16GiB
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
exec=${TIERMEM_EXEC:-$build/executor/tiermem-exec}
tmp=$(mktemp -d /tmp/tiermem-capacity-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
model() {  # model BLOCKS: its file
  local f=$tmp/gpt_$1.pbtxt
  [ -e "$f" ] || python3 "$top/bench/models/make_gpt.py" "$1" 1024 16 128 2 "gpt_$1" "GPT $1 x 1024" >"$f"
  echo "$f"
}
fits() {  # fits BLOCKS BUDGET [offload]: whether the plan fits
  local args=(plan "$(model "$1")" --device cuda --micro-batches 4)
  if [ "${3:-}" = offload ]; then
    "$exec" "${args[@]}" --vram-budget "$2" >/dev/null 2>&1
  else
    # All in VRAM: what the plan puts there, against the budget.
    local bytes
    bytes=$("$exec" "${args[@]}" | awk '/^  arena / && $3 == "vram" { v = $4; u = $5; m = $6; sub("x", "", m)
      f = (u == "GiB" ? 2^30 : u == "MiB" ? 2^20 : u == "KiB" ? 2^10 : 1); s += v * f * m } END { printf "%.0f", s }')
    [ "$bytes" -le "$(numfmt --from=iec-i "${2%B}")" ]
  fi
}
largest() {  # largest BUDGET [offload]: the most blocks that fit (doubling, then bisection)
  local lo=0 hi=1
  while fits "$hi" "$1" "${2:-}"; do lo=$hi; hi=$((hi * 2)); [ $hi -le 4096 ] || break; done
  while [ $((hi - lo)) -gt 1 ]; do
    local mid=$(((lo + hi) / 2))
    if fits "$mid" "$1" "${2:-}"; then lo=$mid; else hi=$mid; fi
  done
  echo "$lo"
}
params() { [ "$1" -gt 0 ] && "$exec" plan "$(model "$1")" | sed -n 's/.*ops.*, \([0-9]*\) parameters/\1/p' || echo 0; }
echo "# GPT 1024 wide, 16 heads, context 128, 2 sequences x 4 micro-batches, Adam, fp32"
for budget in "$@"; do
  tag=$(echo "$budget" | tr 'A-Z' 'a-z')
  whole=$(largest "$budget")
  off=$(largest "$budget" offload)
  pw=$(params "$whole")
  po=$(params "$off")
  home=$("$exec" plan "$(model "$off")" --device cuda --micro-batches 4 --vram-budget "$budget" |
    awk '/^  arena / && $3 == "dram" { v = $4; u = $5; m = $6; sub("x", "", m)
      f = (u == "GiB" ? 1 : u == "MiB" ? 1 / 1024 : 1 / 1048576); s += v * f * m } END { printf "%.1f", s }')
  echo "capacity_${tag}_all_in_vram_blocks $whole blocks"
  echo "capacity_${tag}_all_in_vram_params $pw parameters"
  echo "capacity_${tag}_offloaded_blocks $off blocks"
  echo "capacity_${tag}_offloaded_params $po parameters"
  echo "capacity_${tag}_offloaded_home_dram $home GiB"
  awk -v a="$po" -v b="$pw" -v t="$tag" 'BEGIN { printf "capacity_%s_offloaded_vs_all_in_vram_ratio %.2f\n", t, (b > 0 ? a / b : 0) }'
done
