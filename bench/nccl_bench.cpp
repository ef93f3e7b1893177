// The raw ceiling that the executor's NCCL all-reduce is set against
// (bench/gpu.sh, section 7): ncclAllReduce of fp32 in place over every
// visible GPU from one process (ncclCommInitAll), each size timed over 20
// calls after 5 warm-ups. Prints, per size,
//   nccl_allreduce_<bytes>_busbw <GB/s> GB/s
// (bus bandwidth: bytes / time x 2(n-1)/n, what nccl-tests report), and
//   nccl_allreduce_gpus <n>
// Usage: nccl_bench [BYTES...] (default 1 MiB to 256 MiB by 4x).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "nccl_bench: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}
bool ok(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return true;
  std::fprintf(stderr, "nccl_bench: %s: %s\n", what, ncclGetErrorString(r));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  if (!ok(cudaGetDeviceCount(&n), "cudaGetDeviceCount") || n < 2) {
    std::printf("# nccl_bench: fewer than two GPUs (%d), nothing measured\n", n);
    return 0;
  }
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  if (sizes.empty()) {
    for (size_t s = size_t{1} << 20; s <= size_t{256} << 20; s *= 4) sizes.push_back(s);
  }
  size_t most = 0;
  for (size_t s : sizes) most = std::max(most, s);
  std::vector<int> devs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) devs[static_cast<size_t>(i)] = i;
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  if (!ok(ncclCommInitAll(comms.data(), n, devs.data()), "ncclCommInitAll")) return 1;
  std::vector<float*> bufs(static_cast<size_t>(n));
  std::vector<cudaStream_t> streams(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(i);
    if (!ok(cudaMalloc(&bufs[static_cast<size_t>(i)], most), "cudaMalloc") ||
        !ok(cudaMemset(bufs[static_cast<size_t>(i)], 0, most), "cudaMemset") ||
        !ok(cudaStreamCreate(&streams[static_cast<size_t>(i)]), "cudaStreamCreate")) {
      return 1;
    }
  }
  auto once = [&](size_t bytes) {
    ncclGroupStart();
    for (int i = 0; i < n; ++i) {
      const auto u = static_cast<size_t>(i);
      ncclAllReduce(bufs[u], bufs[u], bytes / 4, ncclFloat32, ncclSum, comms[u], streams[u]);
    }
    return ok(ncclGroupEnd(), "ncclAllReduce");
  };
  auto sync = [&] {
    for (int i = 0; i < n; ++i) {
      cudaSetDevice(i);
      cudaStreamSynchronize(streams[static_cast<size_t>(i)]);
    }
  };
  std::printf("nccl_allreduce_gpus %d\n", n);
  for (size_t bytes : sizes) {
    for (int w = 0; w < 5; ++w) {
      if (!once(bytes)) return 1;
    }
    sync();
    constexpr int k_iterations = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < k_iterations; ++it) {
      if (!once(bytes)) return 1;
    }
    sync();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / k_iterations;
    const double busbw = static_cast<double>(bytes) / seconds / 1e9 * 2.0 * (n - 1) / n;
    std::printf("nccl_allreduce_%zu_busbw %.2f GB/s\n", bytes, busbw);
  }
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(i);
    cudaFree(bufs[static_cast<size_t>(i)]);
    cudaStreamDestroy(streams[static_cast<size_t>(i)]);
    ncclCommDestroy(comms[static_cast<size_t>(i)]);
  }
  return 0;
}
