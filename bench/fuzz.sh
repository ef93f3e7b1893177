#!/usr/bin/env bash
# Long fuzzing runs of the frame decoder and request handler.
#   bench/fuzz.sh BUILD_DIR [--execs N] [--seed S]
#       our structured fuzzer (any compiler), N executions (default 10 million)
#   bench/fuzz.sh BUILD_DIR --libfuzzer [--execs N] [--seconds S]
#       libFuzzer, coverage-guided: builds BUILD_DIR-libfuzzer with clang
#       (apt-get install clang), seeds a corpus from the structured fuzzer,
#       runs N executions or S seconds
# Prints `name value` lines: fuzz_execs, fuzz_execs_per_s, fuzz_crashes,
# fuzz_hangs (and libFuzzer's coverage: fuzz_coverage_edges).
set -euo pipefail
build=${1:?usage: bench/fuzz.sh BUILD_DIR [--libfuzzer] [--execs N] [--seconds S] [--seed S]}
shift
execs=10000000
seconds=0
seed=1
libfuzzer=0
while [ $# -gt 0 ]; do
  case $1 in
    --execs) execs=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --libfuzzer) libfuzzer=1; shift ;;
    *) echo "bench/fuzz.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "$libfuzzer" = 0 ]; then
  cd "$work"
  if [ "$seconds" != 0 ]; then
    exec "$build/fuzz/structured_fuzz" --seconds "$seconds" --seed "$seed"
  fi
  exec "$build/fuzz/structured_fuzz" --execs "$execs" --seed "$seed"
fi

command -v clang++ >/dev/null || { echo "bench/fuzz.sh: --libfuzzer needs clang (apt-get install clang)" >&2; exit 1; }
lf=$build-libfuzzer
if [ ! -d "$lf" ]; then
  CC=clang CXX=clang++ meson setup "$lf" "$src" -Dbuildtype=debugoptimized -Dfuzzing=libfuzzer \
    -Dcpp_args=-fsanitize=fuzzer-no-link -Dcpp_link_args=-fsanitize=fuzzer-no-link \
    -Dtests=true -Dbenchmarks=false >&2
fi
meson compile -C "$lf" -j 2 fuzz/request_libfuzzer fuzz/structured_fuzz >&2
mkdir -p "$work/corpus"
"$lf/fuzz/structured_fuzz" --write-corpus "$work/corpus" 2000 --seed "$seed" >/dev/null
cd "$work"
args=(-rss_limit_mb=4096 -timeout=2 -print_final_stats=1)
if [ "$seconds" != 0 ]; then args+=(-max_total_time="$seconds"); else args+=(-runs="$execs"); fi
set +e
"$lf/fuzz/request_libfuzzer" "${args[@]}" "$work/corpus" > "$work/log" 2>&1
rc=$?
set -e
tail -5 "$work/log" >&2
awk -v rc="$rc" '
  /stat::number_of_executed_units/ { execs = $2 }
  /stat::average_exec_per_sec/ { rate = $2 }
  /cov: / { for (i = 1; i <= NF; i++) if ($i == "cov:") cov = $(i + 1) }
  /ERROR: libFuzzer: timeout|==ERROR: libFuzzer: timeout/ { hangs++ }
  /ERROR: (AddressSanitizer|libFuzzer: deadly signal)/ { crashes++ }
  END {
    print "fuzz_execs", execs + 0
    print "fuzz_execs_per_s", rate + 0
    print "fuzz_coverage_edges", cov + 0
    print "fuzz_crashes", crashes + 0
    print "fuzz_hangs", hangs + 0
    print "fuzz_exit_status", rc
  }' "$work/log"
[ "$rc" = 0 ]
