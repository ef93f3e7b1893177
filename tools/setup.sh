#!/usr/bin/env bash
# tiermem set-up: installs the Debian packages that are missing, configures and
# builds, then runs what was asked for. Idempotent: a second run installs nothing
# and rebuilds only what changed.
#
#   tools/setup.sh demo    install, build, start a local cluster and run the demo
#   tools/setup.sh test    install, build, run the test suite (prints "N passed, N failed")
#   tools/setup.sh bench   install, build, run the benchmarks
#   tools/setup.sh build   install and build only
#   tools/setup.sh deps    install the missing packages only
set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${TIERMEM_BUILD_DIR:-$top/build}

# Everything the build, the tests and the demo need, from Debian 12.
packages=(
  build-essential meson ninja-build pkg-config cmake git
  libucx-dev ucx-utils libfabric-dev libfabric-bin
  libpmem2-dev libpmemobj-dev pmdk-tools libssl-dev
  libboost-dev libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libmetis-dev libopenblas-dev libsystemd-dev
  libtomlplusplus-dev libcli11-dev libxxhash-dev fortunes
  iproute2 procps python3-torch python3-sklearn dataset-fashion-mnist
  python3-dev pybind11-dev libdlpack-dev python3-numpy python3-pytest prometheus systemd
  hipcc libamdhip64-dev librocprim-dev
  debhelper dh-python lintian fakeroot python3-setuptools-whl python3-wheel-whl
)

log() { printf 'setup: %s\n' "$*" >&2; }

install_missing() {
  local missing=()
  local p
  for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "all ${#packages[@]} packages present"
    return
  fi
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  log "installing ${#missing[@]} missing packages: ${missing[*]}"
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}

configure_and_build() {
  if [ ! -f "$build_dir/build.ninja" ]; then
    log "configuring $build_dir"
    meson setup "$build_dir" "$top" --buildtype=debugoptimized -Db_ndebug=if-release
  fi
  local jobs
  jobs=$(nproc)
  log "building with $jobs jobs"
  meson compile -C "$build_dir" -j "$jobs"
}

# Prints the count line CI reads, from meson's own summary.
run_tests() {
  local out rc=0
  out=$(mktemp)
  meson test -C "$build_dir" --print-errorlogs --num-processes "${TIERMEM_TEST_JOBS:-2}" "$@" 2>&1 | tee "$out" || rc=$?
  local ok fail skip timeout xfail xpass
  ok=$(sed -n 's/^Ok:[[:space:]]*\([0-9]*\).*/\1/p' "$out" | tail -1)
  xfail=$(sed -n 's/^Expected Fail:[[:space:]]*\([0-9]*\).*/\1/p' "$out" | tail -1)
  fail=$(sed -n 's/^Fail:[[:space:]]*\([0-9]*\).*/\1/p' "$out" | tail -1)
  xpass=$(sed -n 's/^Unexpected Pass:[[:space:]]*\([0-9]*\).*/\1/p' "$out" | tail -1)
  skip=$(sed -n 's/^Skipped:[[:space:]]*\([0-9]*\).*/\1/p' "$out" | tail -1)
  timeout=$(sed -n 's/^Timeout:[[:space:]]*\([0-9]*\).*/\1/p' "$out" | tail -1)
  rm -f "$out"
  local passed=$(( ${ok:-0} + ${xfail:-0} ))
  local failed=$(( ${fail:-0} + ${xpass:-0} + ${timeout:-0} ))
  if [ -z "$ok" ] && [ "$rc" -ne 0 ]; then failed=$(( failed > 0 ? failed : 1 )); fi
  echo "$passed passed, $failed failed, ${skip:-0} skipped"
  return "$rc"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  deps)  install_missing ;;
  build) install_missing; configure_and_build ;;
  demo)  install_missing; configure_and_build; exec "$top/tools/local-cluster.sh" demo "$build_dir" "$@" ;;
  test)  install_missing; configure_and_build; run_tests "$@" ;;
  bench) install_missing; configure_and_build; exec "$top/bench/run.sh" "$build_dir" "$@" ;;
  *) echo "usage: tools/setup.sh {demo|test|bench|build|deps}" >&2; exit 2 ;;
esac
