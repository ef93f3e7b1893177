// Local translation rate (M9): lookups per second in a page table of 1M pages,
// uniformly random and over a hot set that fits in L2, one core, against the
// physical limit measured in the same process: a gather from a flat array with
// one 16-byte entry per page (one memory access per lookup), done the same
// way (batched, prefetching the same distance ahead).
#include <cstdint>
#include <algorithm>
#include <random>
#include <vector>

#include "bench/bench_util.hpp"
#include "mapping/page_table.hpp"

namespace {

using namespace tiermem;

constexpr uint64_t k_pages = 1u << 20;
constexpr size_t k_lookups = 1u << 24;
constexpr uint64_t k_hot_pages = 1u << 14;  // 256 KiB of entries: fits in L2
constexpr size_t k_batch = 4096;
constexpr int k_reps = 7;

// The baseline: one load per lookup from a flat array, with the same prefetch
// distance as PageTable::translate_batch.
void flat_gather(const std::vector<PageEntry>& flat, const uint64_t* pages, size_t n, PageEntry* out) {
  constexpr size_t k_ahead = 16;
  for (size_t i = 0; i < n; ++i) {
    if (i + k_ahead < n) __builtin_prefetch(&flat[pages[i + k_ahead]]);
    out[i] = flat[pages[i]];
  }
}

struct Rates {
  double table;
  double flat;
  double single;
};

// Page numbers from a xorshift generator, a batch at a time into a buffer that
// stays in L1: no index array streams through the caches, so the lookups
// themselves are what is measured. `mask` picks the pages: all 1M (random)
// or a window of k_hot_pages starting at `base` (hot set).
struct PageStream {
  uint64_t state;
  uint64_t base;
  uint64_t mask;
  void fill(uint64_t* out, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      out[i] = base + ((state >> 20) & mask);
    }
  }
};

Rates measure(const PageTable& table, const std::vector<PageEntry>& flat, PageStream stream) {
  std::vector<PageEntry> out(k_batch);
  std::vector<uint64_t> pages(k_batch);
  uint64_t sink = 0;
  auto run = [&](auto&& lookup_batch) {
    return bench::median_time(k_reps, [&] {
      PageStream s = stream;
      for (size_t i = 0; i < k_lookups; i += k_batch) {
        s.fill(pages.data(), k_batch);
        lookup_batch();
        sink += out[k_batch - 1].frame_offset;
      }
    });
  };
  // The generator alone, to subtract: it is not part of a lookup.
  const double t_gen = run([] {});
  const double t_table = run([&] { table.translate_batch(pages, out); }) - t_gen;
  const double t_flat = run([&] { flat_gather(flat, pages.data(), k_batch, out.data()); }) - t_gen;
  // One lookup at a time through find(), no batching: what a caller that
  // translates a single address sees (the CPU still overlaps independent ones).
  const double t_single = run([&] {
    for (size_t i = 0; i < k_batch; ++i) out[i] = *table.find(pages[i]);
  }) - t_gen;
  bench::keep(sink);
  const double n = static_cast<double>(k_lookups);
  return {n / t_table, n / t_flat, n / t_single};
}

}  // namespace

int main() {
  PageTable table(k_pages, 2 << 20);
  std::vector<PageEntry> flat(k_pages);
  std::mt19937_64 rng(42);
  // Frames shuffled so neighbouring pages are not neighbouring frames.
  std::vector<uint64_t> frames(k_pages);
  for (uint64_t i = 0; i < k_pages; ++i) frames[i] = i;
  std::shuffle(frames.begin(), frames.end(), rng);
  for (uint64_t p = 0; p < k_pages; ++p) {
    PageEntry e;
    e.frame_offset = frames[p] << 21;
    e.generation = 1;
    e.node = 1;
    e.tier = Tier::dram;
    e.flags = k_page_read | k_page_write | k_entry_present;
    table.set(p, e);
    flat[p] = e;
  }
  const PageStream random{0x9e3779b97f4a7c15ULL, 0, k_pages - 1};
  const PageStream hot{0x2545f4914f6cdd1dULL, 123457 % (k_pages - k_hot_pages), k_hot_pages - 1};
  bench::note("page table of 1M pages (16 MiB of L2 entries), " + std::to_string(k_lookups) +
              " lookups per run, median of " + std::to_string(k_reps) +
              "; hot set: " + std::to_string(k_hot_pages) + " pages (256 KiB of entries)");
  const Rates r = measure(table, flat, random);
  bench::figure("translate_random_rate", r.table / 1e6, "Mops/s");
  bench::figure("flat_gather_random_rate", r.flat / 1e6, "Mops/s");
  bench::figure("translate_random_unbatched_rate", r.single / 1e6, "Mops/s");
  bench::ratio("translate_random_vs_flat_gather", r.table / r.flat);
  bench::ratio("translate_random_vs_seed_claim_12_4_mops", r.table / 12.4e6);
  const Rates h = measure(table, flat, hot);
  bench::figure("translate_hot_rate", h.table / 1e6, "Mops/s");
  bench::figure("flat_gather_hot_rate", h.flat / 1e6, "Mops/s");
  bench::figure("translate_hot_unbatched_rate", h.single / 1e6, "Mops/s");
  bench::ratio("translate_hot_vs_flat_gather", h.table / h.flat);
  bench::ratio("translate_hot_vs_seed_claim_12_4_mops", h.table / 12.4e6);
  return 0;
}
