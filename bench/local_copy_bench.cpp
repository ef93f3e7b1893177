// Local copy: 64 MiB written and read through libtiermem into a DRAM tier
// mapped in this process, against plain memcpy of the same size in the same
// process. Starts its own tiermemd (path in $TIERMEMD).
#include <cstring>
#include <random>
#include <vector>

#include <tiermem/client.h>

#include "bench/bench_util.hpp"
#include "tests/support/test_daemon.hpp"

using namespace tiermem;

int main() {
  constexpr size_t k_size = 64 << 20;
  constexpr int k_reps = 15;
  test::TestDaemon daemon({.dram = "256MiB", .pmem = "8MiB"});
  if (!daemon.ready()) {
    std::fprintf(stderr, "tiermemd did not start:\n%s\n", daemon.log().c_str());
    return 1;
  }
  auto client = daemon.connect("local_copy_bench");
  auto a = client->alloc(k_size, {.tier = Tier::dram, .strict = true});
  if (!a.ok()) {
    std::fprintf(stderr, "alloc: %s\n", a.status().to_string().c_str());
    return 1;
  }
  std::vector<char> src(k_size), dst(k_size);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < k_size; i += 8) {
    const uint64_t v = rng();
    std::memcpy(&src[i], &v, 8);
  }
  std::memset(dst.data(), 0, k_size);  // fault in
  // First touch of the tier's pages happens here, not in the timed runs.
  if (!client->write(a->gva, src.data(), k_size).ok() || !client->read(a->gva, dst.data(), k_size).ok()) {
    std::fprintf(stderr, "warm-up copy failed\n");
    return 1;
  }
  if (std::memcmp(src.data(), dst.data(), k_size) != 0) {
    std::fprintf(stderr, "read back differs from what was written\n");
    return 1;
  }
  bench::note("64 MiB copies, median of " + std::to_string(k_reps) + "; baseline: memcpy between two heap buffers");
  auto mapping = client->map(a->gva);
  if (!mapping.ok()) {
    std::fprintf(stderr, "map: %s\n", mapping.status().to_string().c_str());
    return 1;
  }
  // Round-robin so that drift of a noisy machine hits every variant alike.
  std::vector<double> memcpy_t, write_t, read_t, map_t, map_read_t;
  auto time = [](std::vector<double>& into, auto&& fn) {
    const double start = bench::now_seconds();
    fn();
    into.push_back(bench::now_seconds() - start);
  };
  for (int rep = 0; rep < k_reps; ++rep) {
    time(memcpy_t, [&] {
      std::memcpy(dst.data(), src.data(), k_size);
      bench::keep(dst[0]);
    });
    time(write_t, [&] { (void)client->write(a->gva, src.data(), k_size); });
    time(read_t, [&] { (void)client->read(a->gva, dst.data(), k_size); });
    time(map_t, [&] {
      std::memcpy(mapping->data(), src.data(), k_size);
      bench::keep(mapping->data()[0]);
    });
    time(map_read_t, [&] {
      std::memcpy(dst.data(), mapping->data(), k_size);
      bench::keep(dst[0]);
    });
  }
  const double t_memcpy = bench::median(memcpy_t), t_write = bench::median(write_t);
  const double t_read = bench::median(read_t), t_map = bench::median(map_t);
  const double t_map_read = bench::median(map_read_t);
  const double gb = static_cast<double>(k_size) / 1e9;
  bench::figure("memcpy_64MiB_bandwidth", gb / t_memcpy, "GB/s");
  bench::figure("client_write_64MiB_bandwidth", gb / t_write, "GB/s");
  bench::figure("client_read_64MiB_bandwidth", gb / t_read, "GB/s");
  bench::figure("mapped_write_memcpy_64MiB_bandwidth", gb / t_map, "GB/s");
  bench::figure("mapped_read_memcpy_64MiB_bandwidth", gb / t_map_read, "GB/s");
  bench::ratio("client_write_vs_memcpy", t_memcpy / t_write);
  bench::ratio("client_read_vs_memcpy", t_memcpy / t_read);
  // The same copies straight through a Mapping: what the tier's memory itself
  // allows, i.e. the overhead of the versioned path alone.
  bench::ratio("client_write_vs_mapped_memcpy", t_map / t_write);
  bench::ratio("client_read_vs_mapped_memcpy", t_map_read / t_read);
  return 0;
}
