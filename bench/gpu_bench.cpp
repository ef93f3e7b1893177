// The GPU tier through libtiermem on a real GPU (bench/gpu.sh, run on the
// device machine): writes into and reads out of a VRAM allocation from
// pageable, pinned and device buffers at 4 KiB, 1 MiB and 64 MiB, against
// cudaMemcpy of the same kind and direction in the same process (pageable
// and pinned: host to device and back; device: device to device), medians.
// And device buffers into a DRAM allocation, against cudaMemcpy from the
// device into pinned memory.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <tiermem/client.h>

#include "bench/bench_util.hpp"
#include "tests/support/test_daemon.hpp"

using namespace tiermem;

namespace {

// Median GB/s of `reps` runs of `op` moving `bytes`; 0 when one fails.
double rate(size_t bytes, int reps, const std::function<bool()>& op) {
  std::vector<double> gbps;
  for (int i = 0; i < reps; ++i) {
    const double t0 = bench::now_seconds();
    if (!op()) return 0;
    gbps.push_back(static_cast<double>(bytes) / (bench::now_seconds() - t0) / 1e9);
  }
  return bench::median(gbps);
}

std::string size_name(size_t bytes) {
  return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + "MiB" : std::to_string(bytes >> 10) + "KiB";
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("# no CUDA device here: nothing measured\n");
    return 0;
  }
  test::TestDaemon daemon({.dram = "1GiB", .pmem = "64MiB", .vram = true, .vram_capacity = "1GiB"});
  if (!daemon.ready()) {
    std::fprintf(stderr, "tiermemd did not start:\n%s\n", daemon.log().c_str());
    return 1;
  }
  auto client = daemon.connect("gpu_bench");
  constexpr size_t k_max = 64 << 20;
  auto vram = client->alloc(k_max, {.tier = Tier::vram, .strict = true});
  auto dram = client->alloc(k_max, {.tier = Tier::dram, .strict = true});
  if (!vram.ok() || !dram.ok()) return 1;
  std::vector<char> pageable(k_max, 'p');
  void* pinned = nullptr;
  void* device = nullptr;
  void* device_peer = nullptr;  // the baseline's other end
  if (cudaMallocHost(&pinned, k_max) != cudaSuccess || cudaMalloc(&device, k_max) != cudaSuccess ||
      cudaMalloc(&device_peer, k_max) != cudaSuccess) {
    return 1;
  }
  std::memset(pinned, 'q', k_max);
  cudaMemset(device, 'd', k_max);
  cudaDeviceSynchronize();
  bench::note("VRAM allocation through libtiermem (a daemon on this GPU, the client beside it) against cudaMemcpy "
              "of the same kind in the same process; medians");
  struct Kind {
    const char* name;
    void* buffer;
    cudaMemcpyKind to_device, from_device;
  };
  const Kind kinds[] = {{"pageable", pageable.data(), cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost},
                        {"pinned", pinned, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost},
                        {"device", device, cudaMemcpyDeviceToDevice, cudaMemcpyDeviceToDevice}};
  for (size_t bytes : {size_t{4} << 10, size_t{1} << 20, k_max}) {
    const int reps = bytes <= (1 << 20) ? 50 : 7;
    for (const Kind& k : kinds) {
      const std::string name = std::string(k.name) + "_" + size_name(bytes);
      const double w = rate(bytes, reps, [&] { return client->write(vram->gva, k.buffer, bytes).ok(); });
      const double r = rate(bytes, reps, [&] { return client->read(vram->gva, k.buffer, bytes).ok(); });
      const double bw = rate(bytes, reps, [&] {
        // Device to device returns before the copy is done: wait for it.
        return cudaMemcpy(device_peer, k.buffer, bytes, k.to_device) == cudaSuccess &&
               cudaDeviceSynchronize() == cudaSuccess;
      });
      const double br = rate(bytes, reps, [&] {
        return cudaMemcpy(k.buffer, device_peer, bytes, k.from_device) == cudaSuccess &&
               cudaDeviceSynchronize() == cudaSuccess;
      });
      bench::figure("vram_write_" + name, w, "GB/s");
      bench::figure("vram_read_" + name, r, "GB/s");
      bench::figure("cudaMemcpy_to_device_" + name, bw, "GB/s");
      bench::figure("cudaMemcpy_from_device_" + name, br, "GB/s");
      bench::ratio("vram_write_" + name + "_vs_cudaMemcpy", bw > 0 ? w / bw : 0);
      bench::ratio("vram_read_" + name + "_vs_cudaMemcpy", br > 0 ? r / br : 0);
    }
  }
  bench::note("device buffers into a DRAM allocation (staged through host memory) against cudaMemcpy device to pinned");
  for (size_t bytes : {size_t{1} << 20, k_max}) {
    const int reps = bytes <= (1 << 20) ? 50 : 7;
    const std::string name = "device_" + size_name(bytes);
    const double w = rate(bytes, reps, [&] { return client->write(dram->gva, device, bytes).ok(); });
    const double r = rate(bytes, reps, [&] { return client->read(dram->gva, device, bytes).ok(); });
    const double b = rate(bytes, reps, [&] { return cudaMemcpy(pinned, device, bytes, cudaMemcpyDeviceToHost) == cudaSuccess; });
    bench::figure("dram_write_" + name, w, "GB/s");
    bench::figure("dram_read_" + name, r, "GB/s");
    bench::figure("cudaMemcpy_device_to_pinned_" + name, b, "GB/s");
    bench::ratio("dram_write_" + name + "_vs_cudaMemcpy", b > 0 ? w / b : 0);
  }
  cudaFree(device);
  cudaFree(device_peer);
  cudaFreeHost(pinned);
  return 0;
}
