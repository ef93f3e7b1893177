#!/usr/bin/env bash
# Packs what the GPU suite and bench/gpu.sh need onto a machine without this
# build's libraries (the device machine, MACHINE-NOTES.md): stripped
# binaries in DEST/build (laid out as the build tree, so tools/ and bench/
# scripts take it as BUILD_DIR), the shared libraries they load (ldd, less
# libc, libstdc++ and CUDA, which are there) in DEST/lib, UCX's transport
# modules in DEST/ucx, the datasets in DEST/data; all in DEST/pack.tar.xz
# (the carry limit), unpacked there by `tar xf`. Usage:
# tools/device-pack.sh BUILD_DIR DEST. There, in the repository's copy:
#   tar xf DEST/pack.tar.xz -C DEST; source DEST/env.sh
#   DEST/build/tests/gpu/vram_test; DEST/build/tests/gpu/exec_gpu_test; bench/gpu.sh DEST/build
# and for the Python part (DEST/py: the module's sources, built there for its
# python3 by DEST/py/build.sh, with the package and the CUDA tests):
#   DEST/py/build.sh && PYTHONPATH=DEST/py/pkg python3 DEST/py/tests/run_cuda.py
set -euo pipefail
build=${1:?usage: tools/device-pack.sh BUILD_DIR DEST}
dest=${2:?usage: tools/device-pack.sh BUILD_DIR DEST}
final=$dest
dest=$(mktemp -d /tmp/device-pack-XXXXXX)
trap 'rm -rf "$dest"' EXIT
mkdir -p "$dest/build" "$dest/lib" "$dest/ucx" "$dest/data/fashion"
for b in daemon/tiermemd tools/tiermemctl tests/gpu/vram_test tests/gpu/exec_gpu_test tests/gpu/kernels_gpu_test bench/gpu_bench \
         tests/support/tenant_probe executor/tiermem-exec executor/libtiermem-exec-cuda.so; do
  [ -e "$build/$b" ] || { echo "device-pack: $build/$b is not built" >&2; exit 1; }
  mkdir -p "$dest/build/$(dirname "$b")"
  strip -o "$dest/build/$b" "$build/$b"
done
# NCCL's test and raw bench, where this build has NCCL; the fault benches
# (detection, what copies cost a write, training RTO and the replicated step
# on the machine's cores);
# the host's Adam (bench/host_adam.sh).
for b in tests/gpu/nccl_gpu_test bench/nccl_bench bench/health_bench bench/replication_bench bench/training_bench \
  bench/host_adam_bench; do
  [ -e "$build/$b" ] || continue
  mkdir -p "$dest/build/$(dirname "$b")"
  strip -o "$dest/build/$b" "$build/$b"
done
cp -L "$build/client/libtiermem.so.0" "$dest/lib/"
strip "$dest/lib/libtiermem.so.0"
cp /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz "$dest/data/"
cp /usr/share/datasets/fashion-mnist/*.gz "$dest/data/fashion/"
cat >"$dest/env.sh" <<'ENV'
# source DEST/env.sh: the packed binaries, libraries and data (device-pack.sh)
d=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH=$d/lib UCX_MODULE_DIR=$d/ucx TIERMEMD=$d/build/daemon/tiermemd \
  TIERMEMCTL=$d/build/tools/tiermemctl TIERMEM_PROBE=$d/build/tests/support/tenant_probe \
  TIERMEM_EXEC=$d/build/executor/tiermem-exec TIERMEM_MODELS=$PWD/config/models TIERMEM_TEST_DATA=$PWD/tests/data TIERMEM_CORPUS=$PWD/tests/data/corpus.txt \
  TIERMEM_DIGITS=$d/data/digits.csv.gz TIERMEM_FASHION=$d/data/fashion NCCL_NVLS_ENABLE=0
# libnccl.so.2 (218 MB, more than a carry) from the machine: the CUDA
# toolkit's, else the one PyTorch's wheels bring (nvidia-nccl).
for n in /usr/local/cuda/lib64 $(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null); do
  if [ -e "$n/libnccl.so.2" ]; then export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$n; break; fi
done
ENV
for f in "$dest"/build/*/* "$dest"/build/tests/*/* /usr/lib/x86_64-linux-gnu/ucx/*.so; do
  [ -f "$f" ] || continue
  ldd "$f" | awk '/=> \// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libcuda|libcudart[^/]*|libcublas[^/]*|libnccl|libtiermem)\.so' |
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
rm -rf "$final"
mkdir -p "$final"
tar cf - -C "$dest" . | xz -T2 -6 >"$final/pack.tar.xz"
du -sh "$dest" "$final/pack.tar.xz" | awk '{print "device-pack: " $1 " " $2}'
