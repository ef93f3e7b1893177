#include "mapping/page_table.hpp"

#include <atomic>
#include <bit>
#include <cassert>

namespace tiermem {

namespace {
// Stands in for every storage domain that was never populated: all absent.
const StorageDomain k_empty_domain{};
}  // namespace

PageTable::PageTable(uint64_t pages, uint64_t page_size, std::span<uint64_t> l3)
    : m_pages(pages),
      m_page_size(page_size),
      m_page_shift(static_cast<unsigned>(std::countr_zero(page_size))),
      m_l1((pages + k_l2_pages - 1) >> k_l2_shift, const_cast<StorageDomain*>(&k_empty_domain)) {
  assert(std::has_single_bit(page_size) && page_size >= 4096);
  if (l3.size() < pages * k_l3_words_per_page) {
    m_own_l3.assign(pages * k_l3_words_per_page, 0);
    m_l3 = m_own_l3;
  } else {
    m_l3 = l3;
  }
}

StorageDomain* PageTable::domain_for(uint64_t page) {
  StorageDomain*& slot = m_l1[page >> k_l2_shift];
  if (slot == &k_empty_domain) {
    m_domains.push_back(std::make_unique<StorageDomain>());
    slot = m_domains.back().get();
  }
  return slot;
}

void PageTable::set(uint64_t page, const PageEntry& entry) {
  assert(page < m_pages);
  StorageDomain* d = domain_for(page);
  PageEntry& e = d->entries[page & (k_l2_pages - 1)];
  if (e.present() != entry.present()) {
    d->present_pages += entry.present() ? 1 : static_cast<uint32_t>(-1);
  }
  e = entry;
  if (!entry.present()) {
    std::atomic_ref<uint64_t>(m_l3[page * k_l3_words_per_page]).store(0, std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(m_l3[page * k_l3_words_per_page + 1]).store(0, std::memory_order_relaxed);
  }
}

void PageTable::clear(uint64_t page) {
  const PageEntry* old = find(page);
  if (old == nullptr || !old->present()) return;
  PageEntry tombstone;
  tombstone.generation = old->generation;
  set(page, tombstone);
}

void PageTable::mark_written(uint64_t page, uint64_t offset, uint64_t length, bool durable) {
  if (page >= m_pages) return;
  mark_sub_blocks(&m_l3[page * k_l3_words_per_page], m_page_size, offset, length, !durable);
}

void PageTable::clean(uint64_t page) {
  if (page >= m_pages) return;
  std::atomic_ref<uint64_t>(m_l3[page * k_l3_words_per_page + 1]).store(0, std::memory_order_relaxed);
}

SubBlockBits PageTable::sub_blocks(uint64_t page) const {
  if (page >= m_pages) return {};
  SubBlockBits bits;
  bits.valid = std::atomic_ref<uint64_t>(m_l3[page * k_l3_words_per_page]).load(std::memory_order_relaxed);
  bits.dirty = std::atomic_ref<uint64_t>(m_l3[page * k_l3_words_per_page + 1]).load(std::memory_order_relaxed);
  return bits;
}

void PageTable::translate_batch(std::span<const uint64_t> pages, std::span<PageEntry> out) const {
  // Far enough ahead to cover a DRAM miss at the lookup rate, near enough that
  // the prefetched lines are still in L1 when used. Each entry's address is
  // found once: it is prefetched when found and read k_ahead steps later from
  // a small ring, so a lookup costs one L1 walk, not two.
  constexpr size_t k_ahead = 16;
  static const PageEntry k_absent{};
  const size_t n = pages.size() < out.size() ? pages.size() : out.size();
  const PageEntry* ring[k_ahead];
  const size_t warm = n < k_ahead ? n : k_ahead;
  for (size_t i = 0; i < warm; ++i) {
    const PageEntry* e = find(pages[i]);
    ring[i] = e != nullptr ? e : &k_absent;
    __builtin_prefetch(ring[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    const PageEntry* e = ring[i % k_ahead];
    out[i] = *e;
    if (i + k_ahead < n) {
      const PageEntry* next = find(pages[i + k_ahead]);
      ring[i % k_ahead] = next != nullptr ? next : &k_absent;
      __builtin_prefetch(ring[i % k_ahead]);
    }
  }
}

size_t PageTable::domains() const { return m_domains.size(); }

}  // namespace tiermem
