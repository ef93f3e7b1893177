#!/usr/bin/env bash
# Builds the Python module where it runs (the device machine: its python3),
# from what tools/device-pack.sh put beside this script, into pkg/.
set -e
cd "$(dirname "$0")"
suffix=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
pyinc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
ls "$pyinc/Python.h" > /dev/null
objs=()
for f in src/client/python/tiermem/*.cpp; do
  o=/tmp/$(basename "$f").o
  g++ -O2 -std=c++20 -fPIC -fvisibility=hidden -c -I"$pyinc" -Ipybind11 -Isrc -Isrc/include "$f" -o "$o" &
  objs+=("$o")
done
wait
g++ -shared -o "pkg/tiermem/_tiermem$suffix" "${objs[@]}" -L../lib -l:libtiermem.so.0 -Wl,-rpath,'$ORIGIN/../../../lib'
echo "built pkg/tiermem/_tiermem$suffix"
