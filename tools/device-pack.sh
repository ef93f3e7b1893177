#!/usr/bin/env bash
# Packs what the GPU suite and bench/gpu.sh need onto a machine without this
# build's libraries (the device machine, MACHINE-NOTES.md): stripped
# binaries in DEST/bin, the shared libraries they load (ldd, less libc,
# libstdc++ and CUDA, which are there) in DEST/lib, UCX's transport modules
# in DEST/ucx. Usage: tools/device-pack.sh BUILD_DIR DEST. There:
#   export LD_LIBRARY_PATH=DEST/lib UCX_MODULE_DIR=DEST/ucx TIERMEMD=DEST/bin/tiermemd \
#          TIERMEMCTL=DEST/bin/tiermemctl TIERMEM_PROBE=DEST/bin/tenant_probe
#   DEST/bin/vram_test; DEST/bin/gpu_bench
# and for the Python part (DEST/py: the module's sources, built there for its
# python3 by DEST/py/build.sh, with the package and the CUDA tests):
#   DEST/py/build.sh && PYTHONPATH=DEST/py/pkg python3 DEST/py/tests/run_cuda.py
set -euo pipefail
build=${1:?usage: tools/device-pack.sh BUILD_DIR DEST}
dest=${2:?usage: tools/device-pack.sh BUILD_DIR DEST}
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/ucx"
for b in daemon/tiermemd tools/tiermemctl tests/gpu/vram_test bench/gpu_bench tests/support/tenant_probe; do
  [ -x "$build/$b" ] || { echo "device-pack: $build/$b is not built" >&2; exit 1; }
  strip -o "$dest/bin/$(basename "$b")" "$build/$b"
done
cp -L "$build/client/libtiermem.so.0" "$dest/lib/"
strip "$dest/lib/libtiermem.so.0"
for f in "$dest"/bin/* /usr/lib/x86_64-linux-gnu/ucx/*.so; do
  ldd "$f" | awk '/=> \// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libcuda|libcudart[^/]*|libtiermem)\.so' |
  while read -r lib; do cp -L "$lib" "$dest/lib/"; done
for m in /usr/lib/x86_64-linux-gnu/ucx/libuct_*.so /usr/lib/x86_64-linux-gnu/ucx/libucm_*.so; do
  [ -e "$m" ] && cp -L "$m" "$dest/ucx/$(basename "$m").0"
done
src=$(cd "$(dirname "$0")/.." && pwd)
py=$dest/py
mkdir -p "$py/src/client/python/tiermem" "$py/src/include/tiermem" "$py/src/dlpack" "$py/pkg/tiermem" "$py/tests" "$py/pybind11"
cp "$src"/client/python/tiermem/*.cpp "$src"/client/python/tiermem/*.hpp "$py/src/client/python/tiermem/"
cp "$src"/include/tiermem/*.h "$py/src/include/tiermem/"
cp "$build/tiermem_config.h" "$py/src/"
cp /usr/include/dlpack/dlpack.h "$py/src/dlpack/"
cp -r /usr/include/pybind11 "$py/pybind11/"
cp "$build"/client/python/tiermem/*.py "$build"/client/python/tiermem/*.pyi "$py/pkg/tiermem/"
cp "$src"/tests/python/conftest.py "$src"/tests/python/test_cuda.py "$src"/tests/python/run_cuda.py "$py/tests/"
cp "$src/tools/device/build-python.sh" "$py/build.sh"
du -sh "$dest" | awk '{print "device-pack: " $1 " in " $2}'
