#!/usr/bin/env bash
# The remote data plane against physical anchors measured in the same run:
# remote_bench (two tiermemd, a client on one reading and writing memory
# homed on the other) with a TCP loopback request/reply of the same sizes in
# the same process (bench/loopback_anchor.hpp), ROUNDS times with nothing
# beside it and ROUNDS times with a busy loop on every core (a trainer
# computing). Prints, per figure, the median over the rounds and the spread
# between rounds (max / min), then the goals of issues 29 and 52, met or
# missed.
# Over shared memory it also prints ucx_perftest's figures as the ceiling.
# With UCX_TLS=rc (InfiniBand) the same figures print; the anchor stays TCP.
# ofi-tcp and ofi-shm run the daemons' data plane over libfabric instead
# ([transport] fabric = "libfabric", provider "tcp;ofi_rxm" or "shm") and
# set it against bench/ofi_raw_bench, bare fi_read/fi_write on the same
# provider in the same rounds: ofi_<p>_<op>_bw_<size>_vs_raw_ratio is
# tiermem's median over raw's, for the sizes both hold.
# Usage: bench/remote.sh BUILD_DIR [--rounds N] [TLS...]   (default: tcp)
#   TLS: a UCX_TLS value (tcp, sm, rc, ...), ofi-tcp or ofi-shm
set -euo pipefail
build=${1:?usage: bench/remote.sh BUILD_DIR [--rounds N] [TLS...]}
shift
rounds=3
tls_list=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    *) tls_list+=("$1"); shift ;;
  esac
done
[ ${#tls_list[@]} -gt 0 ] || tls_list=(tcp)
export TIERMEMD=$build/daemon/tiermemd
cores=$(nproc)

port=$((20000 + RANDOM % 20000))
# perftest TLS TEST SIZE ITERS [extra...] -> "latency_us bandwidth_MBps rate" of its Final line
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

for tls in "${tls_list[@]}"; do
  out=$(mktemp)
  raw=$(mktemp)
  # label: the prefix of every figure; provider: libfabric's, or none for UCX.
  case $tls in
    ofi-tcp) label=ofi_tcp provider="tcp;ofi_rxm" ;;
    ofi-shm) label=ofi_shm provider=shm ;;
    *) label=$tls provider= ;;
  esac
  if [ -n "$provider" ]; then
    # remote_bench keeps TIERMEM_MAP_SAME_HOST=0 for every fabric, as for tcp and sm.
    args=(--fabric libfabric --provider "$provider")
    echo "# === libfabric provider $provider: $rounds round(s) idle and with $cores busy loop(s), alternating; raw fi_read/fi_write idle"
  else
    args=("$tls")
    echo "# === UCX_TLS=$tls: $rounds round(s) idle and with $cores busy loop(s), alternating"
  fi
  for ((r = 1; r <= rounds; r++)); do
    echo "# round $r/$rounds" >&2
    "$build/bench/remote_bench" "${args[@]}" | grep -v '^#' >> "$out" || echo "# remote_bench $tls failed" >&2
    "$build/bench/remote_bench" "${args[@]}" --busy "$cores" | grep -v '^#' >> "$out" ||
      echo "# remote_bench $tls --busy failed" >&2
    if [ -n "$provider" ]; then
      if [ -x "$build/bench/ofi_raw_bench" ]; then
        "$build/bench/ofi_raw_bench" --provider "$provider" | grep -v '^#' >> "$raw" ||
          echo "# ofi_raw_bench $provider failed" >&2
      else
        echo "# $build/bench/ofi_raw_bench is not built (libfabric not found): no raw figures" >&2
      fi
    fi
  done
  python3 - "$out" "$label" "$rounds" "$raw" <<'EOF'
import re, statistics, sys
path, tls, rounds, raw_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def read(path):
    values, units, order = {}, {}, []
    for line in open(path):
        parts = line.split()
        if len(parts) < 2:
            continue
        name, value, unit = parts[0], parts[1], (parts[2] if len(parts) > 2 else "")
        try:
            v = float(value)
        except ValueError:
            continue
        if name not in order:
            order.append(name)
        values.setdefault(name, []).append(v)
        units[name] = unit
    return values, units, order
def medians(values, units, order, prefix):
    med = {}
    for name in order:
        vs = values[name]
        m = statistics.median(vs)
        med[name] = m
        unit = (" " + units[name]) if units[name] else ""
        print(f"{prefix}{name} {m:.4g}{unit}")
        if len(vs) > 1 and min(vs) > 0 and not name.endswith("_ratio"):
            print(f"{prefix}{name}_spread_ratio {max(vs) / min(vs):.2f}")
    return med
values, units, order = read(path)
med = medians(values, units, order, f"{tls}_")
# The goals of issue 29 (TCP path), on the medians.
goals = [
    ("client_get_8B_latency_vs_loopback_ratio", "<=", 1.5),
    ("client_put_bw_64KiB_vs_loopback_ratio", ">=", 0.6),
    ("client_get_bw_64KiB_vs_loopback_ratio", ">=", 0.6),
    ("client_put_bw_1024KiB_vs_loopback_ratio", ">=", 0.8),
    ("client_get_bw_1024KiB_vs_loopback_ratio", ">=", 0.8),
    ("client_put_bw_16384KiB_vs_loopback_ratio", ">=", 0.8),
    ("client_get_bw_16384KiB_vs_loopback_ratio", ">=", 0.8),
    ("client_fadd_rate_coherent_vs_loopback_ratio", ">=", 0.7),
    ("busy_client_put_bw_4KiB_vs_loopback_ratio", ">=", 0.3),
    ("busy_client_get_bw_4KiB_vs_loopback_ratio", ">=", 0.3),
    ("busy_client_put_bw_64KiB_vs_loopback_ratio", ">=", 0.3),
    ("busy_client_get_bw_64KiB_vs_loopback_ratio", ">=", 0.3),
]
# The goals of issue 52 (the TCP path without same-host mapping, idle):
# every size from 64 KiB to 16 MiB at 0.9 of the anchor both ways, an 8-byte
# read within 1.2x of the anchor's round trip.
if not tls.startswith("ofi_"):
    goals += [("client_get_8B_latency_vs_loopback_ratio", "<=", 1.2)]
    goals += [(f"client_{op}_bw_{size}KiB_vs_loopback_ratio", ">=", 0.9)
              for size in (64, 1024, 16384) for op in ("put", "get")]
for name, op, bound in goals:
    if name not in med:
        print(f"# goal {tls}_{name} {op} {bound}: not measured")
        continue
    v = med[name]
    met = v <= bound if op == "<=" else v >= bound
    print(f"# goal {tls}_{name} {op} {bound}: {'met' if met else 'MISSED'} ({v:.3f})")
spreads = [(name, max(values[name]) / min(values[name])) for name in order
           if not name.endswith("_ratio") and len(values[name]) > 1 and min(values[name]) > 0
           and (name.startswith("client_") or name.startswith("busy_client_"))]
worst = max(spreads, key=lambda x: x[1]) if spreads else None
if worst:
    verdict = "met" if worst[1] <= 2 else "MISSED"
    print(f"# goal {tls} spread between runs of our figures <= 2x: {verdict} (widest: {worst[0]} {worst[1]:.2f}x)")
if not tls.startswith("ofi_"):
    sys.exit(0)
# libfabric: tiermem (one call at a time) over raw fi_read/fi_write (one in
# flight too; the _16deep figures are printed beside, not divided), by name:
# client_<op>_bw_<size> over ofi_raw_<p>_<op>_bw_<size>.
p = tls[len("ofi_"):]
raw = medians(*read(raw_path), "")
def kib(size):
    return int(size[:-3]) if size.endswith("KiB") else int(size[:-1]) / 1024
held = []
for name in raw:
    m = re.fullmatch(rf"ofi_raw_{p}_(get|put)_bw_(\d+(?:B|KiB))", name)
    if m and f"client_{m[1]}_bw_{m[2]}" in med and raw[name] > 0:
        held.append((m[1], m[2]))
        print(f"{tls}_{m[1]}_bw_{m[2]}_vs_raw_ratio {med[f'client_{m[1]}_bw_{m[2]}'] / raw[name]:.3f}")
lat, raw_lat = "client_get_8B_latency_p50", f"ofi_raw_{p}_get_8B_latency_p50"
if lat in med and raw.get(raw_lat, 0) > 0:
    print(f"{tls}_get_8B_latency_vs_raw_ratio {med[lat] / raw[raw_lat]:.3f}")
# The goal of issue 24: >= 0.8 of raw at 64 KiB and above.
goal_sizes = [(op, s) for op, s in held if kib(s) >= 64]
for op, s in sorted(goal_sizes, key=lambda x: (x[0], kib(x[1]))):
    v = med[f"client_{op}_bw_{s}"] / raw[f"ofi_raw_{p}_{op}_bw_{s}"]
    print(f"# goal {tls}_{op}_bw_{s}_vs_raw_ratio >= 0.8: {'met' if v >= 0.8 else 'MISSED'} ({v:.3f})")
if not goal_sizes:
    print(f"# goal {tls} get and put >= 0.8 of raw fi_read/fi_write at >= 64 KiB: not measured")
EOF
  rm -f "$out" "$raw"
  if [ "$tls" = sm ] && command -v ucx_perftest >/dev/null; then
    # The ceiling of shared memory: UCX's own one-sided operations.
    for size in 4096 65536 1048576; do
      iters=$(( size >= 1048576 ? 500 : 5000 ))
      read -r _ put_bw _ < <(perftest sm ucp_put_bw "$size" "$iters")
      read -r _ get_bw _ < <(perftest sm ucp_get "$size" "$iters")
      echo "sm_perftest_put_bw_$((size / 1024))KiB $put_bw MB/s"
      echo "sm_perftest_get_bw_$((size / 1024))KiB $get_bw MB/s"
    done
    read -r putlat _ _ < <(perftest sm ucp_put_lat 8 5000)
    read -r _ _ rate < <(perftest sm ucp_fadd 8 20000)
    echo "sm_perftest_put_lat_8B_one_way $putlat us"
    echo "sm_perftest_fadd_rate $rate ops/s"
  fi
done
