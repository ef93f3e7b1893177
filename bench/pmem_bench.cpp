// Local PMEM: a client writing (acknowledged once durable) and reading its own
// node's PMEM allocation through libtiermem at 4 KiB, 64 KiB, 1 MiB and 16 MiB,
// against raw libpmem2 in the same process: a file of the same file system
// (/dev/shm, where the test daemon keeps its PMEM pool) mapped with pmem2_map
// and PMEM2_GRANULARITY_PAGE, written with its memcpy function (no flush)
// followed by its persist function, read with memcpy. Starts its own tiermemd
// (path in $TIERMEMD).
//
// Steady state: both sides write and read memory their process has touched
// before (the page tables map it). Each round times every variant in turn, so
// drift of a noisy machine hits both alike; a batch of calls walks a 32 MiB
// range; caches are flushed out before each batch. Medians over the rounds:
//   pmem_{write,read}_SIZE_bandwidth        libtiermem, GB/s
//   pmem2_{write,read}_SIZE_bandwidth       raw libpmem2, GB/s
//   pmem_{write,read}_SIZE_vs_pmem2_ratio   libtiermem / raw (goal >= 0.9)
// First touch: each round a fresh allocation of 16 MiB (frames given storage
// by the daemon at alloc) and a fresh raw file of 16 MiB (fallocate'd, as
// the daemon does, and mapped anew), each written once through with calls of
// SIZE: every page is then touched for the first time by this process.
//   pmem_first_write_SIZE_bandwidth, pmem2_first_write_SIZE_bandwidth, and
//   pmem_first_write_SIZE_vs_pmem2_ratio (both first touch), and
//   pmem_first_write_SIZE_vs_steady_pmem2_ratio: the first touch of the
//   client against the raw file in steady state, which is what the figures of
//   issue 29 compared (0.11 at 4 KiB, 0.02 at 64 KiB).
#include <fcntl.h>
#include <libpmem2.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <tiermem/client.h>

#include "bench/bench_util.hpp"
#include "tests/support/test_daemon.hpp"

using namespace tiermem;

namespace {

constexpr size_t k_sizes[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20};
constexpr size_t k_span = 32 << 20;   // steady state: offsets walk this much
constexpr size_t k_fresh = 16 << 20;  // first touch: bytes written per round
constexpr int k_rounds = 11;
constexpr int k_first_rounds = 5;

std::string size_name(size_t size) {
  return size >= (1 << 20) ? std::to_string(size >> 20) + "MiB" : std::to_string(size >> 10) + "KiB";
}

// Calls per timed batch: about 64 MiB moved, at least 4 calls.
size_t calls_for(size_t size) { return std::max<size_t>(4, (64u << 20) / size); }

// A file on /dev/shm mapped with libpmem2 as the PMEM tier maps its pool.
class RawPmem2 {
 public:
  RawPmem2() = default;
  RawPmem2(const RawPmem2&) = delete;
  RawPmem2& operator=(const RawPmem2&) = delete;
  ~RawPmem2() {
    if (m_map != nullptr) pmem2_map_delete(&m_map);
    if (m_fd >= 0) ::close(m_fd);
  }
  // A new file of `bytes`, given storage (fallocate) and mapped.
  bool open(size_t bytes) {
    char path[] = "/dev/shm/tiermem-pmem-bench-XXXXXX";
    m_fd = ::mkstemp(path);
    if (m_fd < 0) return false;
    ::unlink(path);
    if (::fallocate(m_fd, 0, 0, static_cast<off_t>(bytes)) != 0) return false;
    pmem2_source* source = nullptr;
    pmem2_config* config = nullptr;
    const bool ok = pmem2_source_from_fd(&source, m_fd) == 0 && pmem2_config_new(&config) == 0 &&
                    pmem2_config_set_required_store_granularity(config, PMEM2_GRANULARITY_PAGE) == 0 &&
                    pmem2_map_new(&m_map, config, source) == 0;
    if (config != nullptr) pmem2_config_delete(&config);
    if (source != nullptr) pmem2_source_delete(&source);
    if (!ok) {
      std::fprintf(stderr, "pmem2_map: %s\n", pmem2_errormsg());
      return false;
    }
    m_base = static_cast<char*>(pmem2_map_get_address(m_map));
    m_memcpy = pmem2_get_memcpy_fn(m_map);
    m_persist = pmem2_get_persist_fn(m_map);
    return true;
  }
  void write(size_t offset, const char* src, size_t length) {
    m_memcpy(m_base + offset, src, length, PMEM2_F_MEM_NOFLUSH);
    m_persist(m_base + offset, length);
  }
  void read(size_t offset, char* dst, size_t length) const { std::memcpy(dst, m_base + offset, length); }

 private:
  int m_fd = -1;
  pmem2_map* m_map = nullptr;
  char* m_base = nullptr;
  pmem2_memcpy_fn m_memcpy = nullptr;
  pmem2_persist_fn m_persist = nullptr;
};

// GB/s of `calls` calls of `fn(offset)` of `size` bytes each, at offsets
// that walk `span` bytes.
template <typename Fn>
double bandwidth(size_t size, size_t calls, size_t span, Fn&& fn) {
  const double start = bench::now_seconds();
  for (size_t i = 0; i < calls; ++i) fn((i * size) % span);
  return static_cast<double>(size * calls) / 1e9 / (bench::now_seconds() - start);
}

// Pushes what a batch left in the CPU caches out, so that no variant reads
// or writes what another one left there.
void flush_caches(std::vector<char>& scratch) {
  std::memset(scratch.data(), static_cast<int>(scratch[0] + 1), scratch.size());
  bench::keep(scratch[0]);
}

int fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.to_string().c_str());
  return 1;
}

}  // namespace

int main() {
  test::TestDaemon daemon({.dram = "64MiB", .pmem = "256MiB"});
  if (!daemon.ready()) {
    std::fprintf(stderr, "tiermemd did not start:\n%s\n", daemon.log().c_str());
    return 1;
  }
  auto client = daemon.connect("pmem_bench");
  auto a = client->alloc(k_span + (16 << 20), {.tier = Tier::pmem, .strict = true});
  if (!a.ok()) return fail("alloc", a.status());
  RawPmem2 raw;
  if (!raw.open(k_span + (16 << 20))) return 1;

  std::vector<char> src(16 << 20), dst(16 << 20), scratch(64 << 20);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < src.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&src[i], &v, 8);
  }
  std::memset(dst.data(), 0, dst.size());
  // Steady state: every page of both is touched once before the timed runs.
  for (size_t at = 0; at < k_span + (16 << 20); at += src.size()) {
    if (Status s = client->write(a->gva.plus(at), src.data(), src.size()); !s.ok()) return fail("warm-up write", s);
    raw.write(at, src.data(), src.size());
  }
  if (Status s = client->read(a->gva, dst.data(), dst.size()); !s.ok()) return fail("read", s);
  if (std::memcmp(src.data(), dst.data(), dst.size()) != 0) {
    std::fprintf(stderr, "read back differs from what was written\n");
    return 1;
  }

  bench::note("steady state (pages mapped in both processes), median of " + std::to_string(k_rounds) +
              " rounds; baseline: pmem2_map of a /dev/shm file, PMEM2_GRANULARITY_PAGE, memcpy_fn (no flush) + "
              "persist_fn; reads: memcpy from that mapping");
  std::vector<double> steady_raw_write;  // by size, for the first-touch comparison below
  for (size_t size : k_sizes) {
    const size_t calls = calls_for(size);
    std::vector<double> w, w_raw, r, r_raw;
    Status failed;
    for (int round = 0; round < k_rounds; ++round) {
      flush_caches(scratch);
      w.push_back(bandwidth(size, calls, k_span, [&](size_t at) {
        if (Status s = client->write(a->gva.plus(at), src.data(), size); !s.ok()) failed = s;
      }));
      flush_caches(scratch);
      w_raw.push_back(bandwidth(size, calls, k_span, [&](size_t at) { raw.write(at, src.data(), size); }));
      flush_caches(scratch);
      r.push_back(bandwidth(size, calls, k_span, [&](size_t at) {
        if (Status s = client->read(a->gva.plus(at), dst.data(), size); !s.ok()) failed = s;
      }));
      flush_caches(scratch);
      r_raw.push_back(bandwidth(size, calls, k_span, [&](size_t at) { raw.read(at, dst.data(), size); }));
      bench::keep(dst[0]);
    }
    if (!failed.ok()) return fail("a call of " + size_name(size), failed);
    const std::string n = size_name(size);
    const double mw = bench::median(w), mw_raw = bench::median(w_raw);
    const double mr = bench::median(r), mr_raw = bench::median(r_raw);
    steady_raw_write.push_back(mw_raw);
    bench::figure("pmem_write_" + n + "_bandwidth", mw, "GB/s");
    bench::figure("pmem2_write_" + n + "_bandwidth", mw_raw, "GB/s");
    bench::ratio("pmem_write_" + n + "_vs_pmem2", mw / mw_raw);
    bench::figure("pmem_read_" + n + "_bandwidth", mr, "GB/s");
    bench::figure("pmem2_read_" + n + "_bandwidth", mr_raw, "GB/s");
    bench::ratio("pmem_read_" + n + "_vs_pmem2", mr / mr_raw);
  }

  bench::note("first touch: a fresh 16 MiB allocation against a fresh fallocate'd 16 MiB file mapped anew, each "
              "written through once; median of " + std::to_string(k_first_rounds) + " rounds");
  for (size_t i = 0; i < std::size(k_sizes); ++i) {
    const size_t size = k_sizes[i];
    std::vector<double> w, w_raw;
    for (int round = 0; round < k_first_rounds; ++round) {
      auto fresh = client->alloc(k_fresh, {.tier = Tier::pmem, .strict = true});
      if (!fresh.ok()) return fail("alloc", fresh.status());
      // Translated before the clock starts (8 bytes: one page of 4096 read).
      uint64_t word = 0;
      if (Status s = client->read(fresh->gva.plus(k_fresh - 8), &word, 8); !s.ok()) return fail("read", s);
      Status failed;
      flush_caches(scratch);
      w.push_back(bandwidth(size, k_fresh / size, k_fresh, [&](size_t at) {
        if (Status s = client->write(fresh->gva.plus(at), src.data(), size); !s.ok()) failed = s;
      }));
      if (!failed.ok()) return fail("a first write of " + size_name(size), failed);
      if (Status s = client->free(fresh->gva); !s.ok()) return fail("free", s);
      RawPmem2 file;
      if (!file.open(k_fresh)) return 1;
      flush_caches(scratch);
      w_raw.push_back(bandwidth(size, k_fresh / size, k_fresh, [&](size_t at) { file.write(at, src.data(), size); }));
    }
    const std::string n = size_name(size);
    const double mw = bench::median(w), mw_raw = bench::median(w_raw);
    bench::figure("pmem_first_write_" + n + "_bandwidth", mw, "GB/s");
    bench::figure("pmem2_first_write_" + n + "_bandwidth", mw_raw, "GB/s");
    bench::ratio("pmem_first_write_" + n + "_vs_pmem2", mw / mw_raw);
    bench::ratio("pmem_first_write_" + n + "_vs_steady_pmem2", mw / steady_raw_write[i]);
  }
  return 0;
}
