// Sub-page allocations (M10): how many small allocations a MiB of tier memory
// holds, and how fast they are made and freed over the daemon's socket,
// against whole-page allocations of a daemon with sub_page_max = 0 in the
// same run (2 MiB pages, durable metadata on both, as by default). And the
// cost of sharing a page: direct 8-byte writes to neighbours in one page
// against writes to allocations of their own pages.
#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include <tiermem/client.h>

#include "bench/bench_util.hpp"
#include "tests/support/test_daemon.hpp"

using namespace tiermem;

namespace {

uint64_t dram_used(Client& c) {
  auto s = c.stat();
  if (!s.ok()) return 0;
  for (const TierStat& t : s->tiers) {
    if (t.tier == Tier::dram) return t.used_bytes;
  }
  return 0;
}

struct Round {
  double alloc_per_s = 0;
  double free_per_s = 0;
  double per_mib = 0;  // allocations per MiB of DRAM used
};

// `n` allocations of `size` bytes, then their frees; 0s on failure.
Round round_of(Client& c, uint64_t size, int n) {
  Round r;
  std::vector<Gva> made;
  made.reserve(static_cast<size_t>(n));
  const uint64_t before = dram_used(c);
  double t0 = bench::now_seconds();
  for (int i = 0; i < n; ++i) {
    auto a = c.alloc(size, {.tier = Tier::dram});
    if (!a.ok()) {
      std::fprintf(stderr, "alloc of %llu bytes: %s\n", static_cast<unsigned long long>(size),
                   a.status().to_string().c_str());
      return {};
    }
    made.push_back(a->gva);
  }
  r.alloc_per_s = n / (bench::now_seconds() - t0);
  const uint64_t used = dram_used(c) - before;
  r.per_mib = used == 0 ? 0 : n / (static_cast<double>(used) / (1 << 20));
  t0 = bench::now_seconds();
  for (const Gva& g : made) {
    if (!c.free(g).ok()) return {};
  }
  r.free_per_s = n / (bench::now_seconds() - t0);
  return r;
}

double median_of(const std::vector<Round>& rounds, double Round::*field) {
  std::vector<double> v;
  for (const Round& r : rounds) v.push_back(r.*field);
  return bench::percentile(v, 0.5);
}

// Direct 8-byte writes per second over `targets`, round robin.
double write_rate(Client& c, const std::vector<Gva>& targets, int n) {
  uint64_t word = 1;
  const double t0 = bench::now_seconds();
  for (int i = 0; i < n; ++i) {
    if (!c.write(targets[static_cast<size_t>(i) % targets.size()], &word, sizeof word).ok()) return 0;
    ++word;
  }
  return n / (bench::now_seconds() - t0);
}

}  // namespace

int main() {
  test::TestDaemon shared({.dram = "1GiB", .pmem = "8MiB"});
  test::TestDaemon whole({.dram = "1GiB", .pmem = "8MiB", .mapping_toml = "sub_page_max = \"0\"\n"});
  for (test::TestDaemon* d : {&shared, &whole}) {
    if (!d->ready()) {
      std::fprintf(stderr, "tiermemd did not start:\n%s\n", d->log().c_str());
      return 1;
    }
  }
  auto sc = shared.connect("sub_page_bench");
  auto wc = whole.connect("sub_page_bench");
  constexpr int k_rounds = 5;
  constexpr int k_small = 4000;  // per round
  constexpr int k_pages = 200;   // whole-page allocations per round (400 MiB)
  (void)round_of(*sc, 8, 500);   // warm up
  (void)round_of(*wc, 8, 50);

  std::vector<Round> small, pages;
  for (int r = 0; r < k_rounds; ++r) {  // alternating
    small.push_back(round_of(*sc, 8, k_small));
    pages.push_back(round_of(*wc, 8, k_pages));
    if (small.back().alloc_per_s == 0 || pages.back().alloc_per_s == 0) return 1;
  }
  bench::note("2 MiB pages, durable metadata; medians of " + std::to_string(k_rounds) + " rounds of " +
              std::to_string(k_small) + " allocations of 8 bytes then their frees; baseline: the same on a daemon "
              "with sub_page_max = 0 (" + std::to_string(k_pages) + " whole-page allocations per round)");
  const double sub_alloc = median_of(small, &Round::alloc_per_s), page_alloc = median_of(pages, &Round::alloc_per_s);
  const double sub_free = median_of(small, &Round::free_per_s), page_free = median_of(pages, &Round::free_per_s);
  const double page_density = median_of(pages, &Round::per_mib);
  bench::figure("sub_page_alloc_rate_8B", sub_alloc, "allocs/s");
  bench::figure("sub_page_free_rate_8B", sub_free, "frees/s");
  bench::figure("whole_page_alloc_rate_8B", page_alloc, "allocs/s");
  bench::figure("whole_page_free_rate_8B", page_free, "frees/s");
  bench::ratio("sub_page_alloc_rate_vs_whole_page", sub_alloc / page_alloc);
  bench::ratio("sub_page_free_rate_vs_whole_page", sub_free / page_free);
  bench::figure("whole_page_density_8B", page_density, "allocations/MiB");
  // Density by size class, over whole pages (2 MiB / slot allocations each;
  // a page holds up to 32,768 of 64 bytes).
  bench::note("density: allocations per MiB of DRAM taken, filling 1-4 whole pages of each size class");
  double dense = 0;
  for (uint64_t size : {8u, 100u, 1000u, 16000u, 200000u}) {
    const uint64_t slot = std::max<uint64_t>(64, std::bit_ceil(size));
    const uint64_t pages = slot >= 4096 ? 4 : 1;
    const Round r = round_of(*sc, size, static_cast<int>(pages * (2 << 20) / slot));
    if (r.alloc_per_s == 0) return 1;
    if (size == 8) dense = r.per_mib;
    bench::figure("sub_page_density_" + std::to_string(size) + "B", r.per_mib, "allocations/MiB");
  }
  bench::ratio("sub_page_density_8B_vs_whole_page", dense / page_density);

  // Neighbours in one page share its version word: direct writes to 16 of
  // them, against 16 allocations of their own pages.
  std::vector<Gva> neighbours, own;
  for (int i = 0; i < 16; ++i) {
    auto a = sc->alloc(8, {.tier = Tier::dram});
    auto b = wc->alloc(8, {.tier = Tier::dram});
    if (!a.ok() || !b.ok()) return 1;
    neighbours.push_back(a->gva);
    own.push_back(b->gva);
  }
  std::vector<double> shared_rate, own_rate;
  for (int r = 0; r < k_rounds; ++r) {
    shared_rate.push_back(write_rate(*sc, neighbours, 200000));
    own_rate.push_back(write_rate(*wc, own, 200000));
    if (shared_rate.back() == 0 || own_rate.back() == 0) return 1;
  }
  bench::note("direct 8-byte writes from one thread, round robin over 16 allocations; baseline: 16 whole-page ones");
  bench::figure("sub_page_write_rate_8B", bench::percentile(shared_rate, 0.5), "writes/s");
  bench::figure("whole_page_write_rate_8B", bench::percentile(own_rate, 0.5), "writes/s");
  bench::ratio("sub_page_write_rate_vs_whole_page",
               bench::percentile(shared_rate, 0.5) / bench::percentile(own_rate, 0.5));
  return 0;
}
