// The GPU tier through libtiermem on a real GPU (bench/gpu.sh, run on the
// device machine): writes into and reads out of a VRAM allocation from
// pageable, pinned and device buffers at 4 KiB, 1 MiB, 64 MiB and 1 GiB,
// against cudaMemcpy of the same kind and direction in the same process
// (pageable and pinned: host to device and back; device: device to device),
// medians. Device buffers into a DRAM allocation, against cudaMemcpy from the
// device into pinned memory. Migration of 1 GiB VRAM <-> DRAM against
// cudaMemcpy of pinned memory.
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

// Median GB/s of each of `ops`, run in turns (one of each per round), so a
// GPU still raising its clocks, or anything else that drifts, weighs on all
// of them alike; 0 for one that fails.
std::vector<double> rates(size_t bytes, int reps, const std::vector<std::function<bool()>>& ops) {
  std::vector<std::vector<double>> gbps(ops.size());
  std::vector<bool> failed(ops.size(), false);
  for (int i = 0; i < reps; ++i) {
    for (size_t k = 0; k < ops.size(); ++k) {
      if (failed[k]) continue;
      const double t0 = bench::now_seconds();
      failed[k] = !ops[k]();
      gbps[k].push_back(static_cast<double>(bytes) / (bench::now_seconds() - t0) / 1e9);
    }
  }
  std::vector<double> out;
  for (size_t k = 0; k < ops.size(); ++k) out.push_back(failed[k] ? 0 : bench::median(gbps[k]));
  return out;
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
  test::TestDaemon daemon({.dram = "2GiB", .pmem = "64MiB", .vram = true, .vram_capacity = "3GiB"});
  if (!daemon.ready()) {
    std::fprintf(stderr, "tiermemd did not start:\n%s\n", daemon.log().c_str());
    return 1;
  }
  auto client = daemon.connect("gpu_bench");
  constexpr size_t k_max = size_t{1} << 30;
  constexpr size_t k_dram = 64 << 20;
  auto vram = client->alloc(k_max, {.tier = Tier::vram, .strict = true});
  auto dram = client->alloc(k_dram, {.tier = Tier::dram, .strict = true});
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
  for (size_t bytes : {size_t{4} << 10, size_t{1} << 20, size_t{64} << 20, k_max}) {
    const int reps = bytes <= (1 << 20) ? 50 : bytes < k_max ? 9 : 5;
    for (const Kind& k : kinds) {
      const std::string name = std::string(k.name) + "_" + size_name(bytes);
      const auto r4 = rates(bytes, reps,
                            {[&] { return client->write(vram->gva, k.buffer, bytes).ok(); },
                             [&] { return client->read(vram->gva, k.buffer, bytes).ok(); },
                             [&] {
                               // Device to device returns before the copy is done: wait for it.
                               return cudaMemcpy(device_peer, k.buffer, bytes, k.to_device) == cudaSuccess &&
                                      cudaDeviceSynchronize() == cudaSuccess;
                             },
                             [&] {
                               return cudaMemcpy(k.buffer, device_peer, bytes, k.from_device) == cudaSuccess &&
                                      cudaDeviceSynchronize() == cudaSuccess;
                             }});
      const double w = r4[0], r = r4[1], bw = r4[2], br = r4[3];
      bench::figure("vram_write_" + name, w, "GB/s");
      bench::figure("vram_read_" + name, r, "GB/s");
      bench::figure("cudaMemcpy_to_device_" + name, bw, "GB/s");
      bench::figure("cudaMemcpy_from_device_" + name, br, "GB/s");
      bench::ratio("vram_write_" + name + "_vs_cudaMemcpy", bw > 0 ? w / bw : 0);
      bench::ratio("vram_read_" + name + "_vs_cudaMemcpy", br > 0 ? r / br : 0);
    }
  }
  {
    // The memory's own speed: cudaMemcpy from a device buffer into map()'s
    // device pointer of the same allocation, no page protocol around it (what
    // a kernel or a copy on a mapped allocation gets).
    auto m = client->map(vram->gva);
    if (!m.ok()) return 1;
    for (size_t bytes : {size_t{1} << 20, size_t{64} << 20, k_max}) {
      const int reps = bytes <= (1 << 20) ? 50 : 9;
      const std::string name = "device_" + size_name(bytes);
      const auto r2 = rates(bytes, reps,
                            {[&] {
                               return cudaMemcpy(m->data(), device, bytes, cudaMemcpyDeviceToDevice) == cudaSuccess &&
                                      cudaDeviceSynchronize() == cudaSuccess;
                             },
                             [&] {
                               return cudaMemcpy(device_peer, device, bytes, cudaMemcpyDeviceToDevice) == cudaSuccess &&
                                      cudaDeviceSynchronize() == cudaSuccess;
                             }});
      const double w = r2[0], b = r2[1];
      bench::figure("vram_mapped_cudaMemcpy_" + name, w, "GB/s");
      bench::ratio("vram_mapped_cudaMemcpy_" + name + "_vs_cudaMemcpy", b > 0 ? w / b : 0);
    }
  }
  bench::note("device buffers into a DRAM allocation (staged through host memory) against cudaMemcpy device to pinned");
  for (size_t bytes : {size_t{1} << 20, k_dram}) {
    const int reps = bytes <= (1 << 20) ? 50 : 7;
    const std::string name = "device_" + size_name(bytes);
    const auto r3 = rates(bytes, reps,
                          {[&] { return client->write(dram->gva, device, bytes).ok(); },
                           [&] { return client->read(dram->gva, device, bytes).ok(); },
                           [&] { return cudaMemcpy(pinned, device, bytes, cudaMemcpyDeviceToHost) == cudaSuccess; }});
    const double w = r3[0], r = r3[1], b = r3[2];
    bench::figure("dram_write_" + name, w, "GB/s");
    bench::figure("dram_read_" + name, r, "GB/s");
    bench::figure("cudaMemcpy_device_to_pinned_" + name, b, "GB/s");
    bench::ratio("dram_write_" + name + "_vs_cudaMemcpy", b > 0 ? w / b : 0);
  }
  {
    // Where a device buffer's write into DRAM spends its time: the same write
    // from pinned host memory (the staged half: the page protocol's copy
    // into the mapped frames), and a plain memcpy from pinned memory into a
    // mapping of the same allocation (the memory's own speed from the host).
    auto m = client->map(dram->gva);
    if (!m.ok()) return 1;
    const auto r2 = rates(k_dram, 7,
                          {[&] { return client->write(dram->gva, pinned, k_dram).ok(); },
                           [&] {
                             std::memcpy(m->data(), pinned, k_dram);
                             return true;
                           }});
    bench::figure("dram_write_pinned_" + size_name(k_dram), r2[0], "GB/s");
    bench::figure("dram_mapped_memcpy_from_pinned_" + size_name(k_dram), r2[1], "GB/s");
  }
  bench::note("migration of a 1 GiB allocation VRAM <-> DRAM (tiermemctl migrate's path) against cudaMemcpy of "
              "pinned memory, the same bytes");
  {
    const size_t bytes = k_max;
    auto moving = client->alloc(bytes, {.tier = Tier::vram, .strict = true});
    if (!moving.ok()) return 1;
    (void)client->write(moving->gva, pageable.data(), bytes);
    // The first round also pins the DRAM frames it lands on (once per
    // daemon): one round before the measured ones.
    if (!client->migrate(moving->gva, Tier::dram).ok() || !client->migrate(moving->gva, Tier::vram).ok()) return 1;
    const auto r4 = rates(bytes, 5,
                          {[&] { return client->migrate(moving->gva, Tier::dram).ok(); },
                           [&] { return client->migrate(moving->gva, Tier::vram).ok(); },
                           [&] { return cudaMemcpy(pinned, device_peer, bytes, cudaMemcpyDeviceToHost) == cudaSuccess; },
                           [&] { return cudaMemcpy(device_peer, pinned, bytes, cudaMemcpyHostToDevice) == cudaSuccess; }});
    const double down = r4[0], up = r4[1], d2h = r4[2], h2d = r4[3];
    bench::figure("migrate_vram_to_dram_1GiB", down, "GB/s");
    bench::figure("migrate_dram_to_vram_1GiB", up, "GB/s");
    bench::figure("cudaMemcpy_pinned_d2h_1GiB", d2h, "GB/s");
    bench::figure("cudaMemcpy_pinned_h2d_1GiB", h2d, "GB/s");
    bench::ratio("migrate_vram_to_dram_vs_cudaMemcpy_pinned", d2h > 0 ? down / d2h : 0);
    bench::ratio("migrate_dram_to_vram_vs_cudaMemcpy_pinned", h2d > 0 ? up / h2d : 0);
  }
  cudaFree(device);
  cudaFree(device_peer);
  cudaFreeHost(pinned);
  return 0;
}
