#!/usr/bin/env bash
# The data plane against ucx_perftest on the same transport, side by side:
# for each of TCP and shared memory, ucx_perftest (server and client on this
# machine) then remote_bench (two tiermemd, a client on one reading and
# writing memory homed on the other), and the ratios ours / perftest.
# Usage: bench/remote.sh BUILD_DIR [TLS...]   (default: tcp sm)
set -euo pipefail
build=${1:?usage: bench/remote.sh BUILD_DIR [TLS...]}
shift
tls_list=("$@")
[ ${#tls_list[@]} -gt 0 ] || tls_list=(tcp sm)
export TIERMEMD=$build/daemon/tiermemd
command -v ucx_perftest >/dev/null || { echo "ucx_perftest missing (Debian package ucx-utils)" >&2; exit 1; }

port=$((20000 + RANDOM % 20000))
# perftest TEST SIZE ITERS [extra...] -> prints "latency_us bandwidth_MBps rate" of its Final line
perftest() {
  local tls=$1 test=$2 size=$3 iters=$4
  shift 4
  port=$((port + 1))
  UCX_TLS=$tls ucx_perftest -t "$test" -s "$size" -n "$iters" -p "$port" "$@" >/dev/null 2>&1 &
  local server=$!
  sleep 0.3
  local line
  line=$(UCX_TLS=$tls ucx_perftest 127.0.0.1 -t "$test" -s "$size" -n "$iters" -p "$port" "$@" 2>/dev/null | grep '^Final' || true)
  wait "$server" 2>/dev/null || true
  # Final: iters p50 avg overall bw_avg bw_overall rate_avg rate_overall (bandwidth in MiB/s)
  echo "$line" | awk '{printf "%s %.2f %s\n", $3, $7 * 1.048576, $9}'
}

value() { grep "^$1 " "$2" | awk '{print $2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "n/a" }'; }

for tls in "${tls_list[@]}"; do
  out=$(mktemp)
  echo "# === UCX_TLS=$tls"
  "$build/bench/remote_bench" "$tls" | tee "$out"
  for size in 4096 65536 1048576 16777216; do
    iters=$(( size >= 1048576 ? 500 : 5000 ))
    name=$((size / 1024))KiB
    read -r _ put_bw _ < <(perftest "$tls" ucp_put_bw "$size" "$iters")
    read -r _ get_bw _ < <(perftest "$tls" ucp_get "$size" "$iters")
    echo "perftest_put_bw_$name $put_bw MB/s"
    echo "perftest_get_bw_$name $get_bw MB/s"
    echo "${tls}_client_put_bw_${name}_vs_perftest_ratio $(ratio "$(value client_put_bw_$name "$out")" "$put_bw")"
    echo "${tls}_client_get_bw_${name}_vs_perftest_ratio $(ratio "$(value client_get_bw_$name "$out")" "$get_bw")"
    echo "${tls}_transport_get_bw_${name}_vs_perftest_ratio $(ratio "$(value transport_get_bw_$name "$out")" "$get_bw")"
  done
  # perftest's ucp_get keeps many gets in flight, so its "latency" is the cost
  # per get in a stream; ucp_put_lat is its ping-pong latency (one way). Both
  # are printed; a read of ours is a full round trip (three, with the page
  # versions), the bare transport's one.
  read -r lat _ _ < <(perftest "$tls" ucp_get 8 5000)
  read -r putlat _ _ < <(perftest "$tls" ucp_put_lat 8 5000)
  echo "perftest_get_8B_per_op $lat us"
  echo "perftest_put_lat_8B_one_way $putlat us"
  echo "${tls}_client_get_8B_latency_vs_perftest_get_ratio $(ratio "$(value client_get_8B_latency_p50 "$out")" "$lat")"
  echo "${tls}_client_get_8B_latency_vs_perftest_put_lat_ratio $(ratio "$(value client_get_8B_latency_p50 "$out")" "$putlat")"
  echo "${tls}_transport_get_8B_latency_vs_perftest_put_lat_ratio $(ratio "$(value transport_get_8B_latency_p50 "$out")" "$putlat")"
  read -r _ _ rate < <(perftest "$tls" ucp_fadd 8 20000)
  read -r _ _ rate1 < <(perftest "$tls" ucp_fadd 8 20000 -O 1)
  echo "perftest_fadd_rate $rate ops/s"
  echo "perftest_fadd_rate_one_outstanding $rate1 ops/s"
  echo "${tls}_client_fadd_coherent_vs_perftest_ratio $(ratio "$(value client_fadd_rate_coherent "$out")" "$rate")"
  echo "${tls}_client_fadd_coherent_vs_perftest_one_outstanding_ratio $(ratio "$(value client_fadd_rate_coherent "$out")" "$rate1")"
  rm -f "$out"
done
