#!/usr/bin/env bash
# The client-only build (issue 30): `-Ddaemon=disabled -Dexecutor=disabled
# -Dpmem=disabled` configures and builds libtiermem, its Python module and
# tiermemctl from UCX, protobuf and CLI11 alone (nlohmann_json's headers for
# tiermemctl --json, gtest for its tests), and its tests pass.
#
# What it checks, beyond "it compiled":
#   - meson found no dependency of the daemon or the executor (it did not
#     even look for them: a login node need not install them);
#   - libtiermem.so and tiermemctl link none of their libraries;
#   - the summary says what was left out, and why;
#   - the floors' own tests pass in that build.
# Usage: client_only.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
unset LD_LIBRARY_PATH  # the libraries found are the ones the binaries name (their rpath)
src=$1
build=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

rm -rf "$build"
meson setup "$build" "$src" --buildtype=debugoptimized -Db_ndebug=if-release \
  -Ddaemon=disabled -Dexecutor=disabled -Dpmem=disabled -Dbenchmarks=false > "$build.setup.log" 2>&1 ||
  { cat "$build.setup.log"; fail "configuring the client-only build"; }

# Every dependency meson looked up, found or not ("Run-time dependency X found: YES/NO").
looked=$(sed -n 's/^\(Run-time dependency\|Dependency\|Library\) \([^ ]*\) found: .*/\2/p' "$build/meson-logs/meson-log.txt" | sort -u | tr '\n' ' ')
echo "dependencies looked up: $looked"
for d in libpmem2 libpmemobj openblas metis boost spdlog fmt tomlplusplus libsystemd libcrypto zlib libxxhash openmp cuda cudart cublas; do
  case " $looked " in *" $d "*) fail "the client-only build looked for $d" ;; esac
done
for d in ucx protobuf CLI11; do
  case " ${looked,,} " in *" ${d,,} "*) ;; *) fail "the client-only build did not use $d" ;; esac
done
grep -q "daemon (tiermemd) *: disabled" "$build.setup.log" || fail "the summary does not say the daemon was disabled"
grep -q "executor (tiermem-exec) *: disabled" "$build.setup.log" || fail "the summary does not say the executor was disabled"

jobs=$(nproc)
meson compile -C "$build" -j "$jobs" > "$build.compile.log" 2>&1 || { tail -50 "$build.compile.log"; fail "building"; }
for f in client/libtiermem.so tools/tiermemctl; do
  [ -e "$build/$f" ] || fail "$f was not built"
done
for f in daemon/tiermemd executor/tiermem-exec; do
  [ ! -e "$build/$f" ] || fail "$f was built in a client-only build"
done
for f in client/libtiermem.so tools/tiermemctl; do
  libs=$(ldd "$build/$f" | awk '{print $1}' | tr '\n' ' ')
  for l in libpmem2 libpmemobj libopenblas libmetis libspdlog libsystemd libcrypto libboost libgomp; do
    case "$libs" in *"$l"*) fail "$f links $l: $libs" ;; esac
  done
done
"$build/tools/tiermemctl" --help > /dev/null || fail "tiermemctl --help"
if [ -e "$build/client/python/tiermem" ]; then
  PYTHONPATH="$build/client/python" /usr/bin/python3 -c 'import tiermem; print("python module", tiermem.__name__)' ||
    fail "the Python module of the client-only build does not import"
fi
meson test -C "$build" --num-processes 1 --print-errorlogs > "$build.test.log" 2>&1 || { tail -60 "$build.test.log"; fail "its tests"; }
grep -E '^(Ok|Fail|Skipped):' "$build.test.log"
echo "client-only build: libtiermem.so, tiermemctl and the Python module built; its tests passed"
