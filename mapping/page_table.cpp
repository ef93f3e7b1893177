#include "mapping/page_table.hpp"

#include <bit>
#include <cassert>

namespace tiermem {

PageTable::PageTable(uint64_t pages, uint64_t page_size)
    : m_pages(pages),
      m_page_size(page_size),
      m_page_shift(static_cast<unsigned>(std::countr_zero(page_size))),
      m_l1((pages + k_l2_pages - 1) >> k_l2_shift) {
  assert(std::has_single_bit(page_size) && page_size >= 4096);
}

StorageDomain* PageTable::domain_for(uint64_t page) {
  auto& slot = m_l1[page >> k_l2_shift];
  if (!slot) slot = std::make_unique<StorageDomain>();
  return slot.get();
}

void PageTable::set(uint64_t page, const PageEntry& entry) {
  assert(page < m_pages);
  StorageDomain* d = domain_for(page);
  PageEntry& e = d->entries[page & (k_l2_pages - 1)];
  if (e.present() != entry.present()) {
    d->present_pages += entry.present() ? 1 : static_cast<uint32_t>(-1);
  }
  e = entry;
  if (!entry.present()) d->sub_blocks[page & (k_l2_pages - 1)] = {};
}

void PageTable::clear(uint64_t page) {
  const PageEntry* old = find(page);
  if (old == nullptr) return;
  PageEntry tombstone;
  tombstone.generation = old->generation;
  set(page, tombstone);
}

void PageTable::mark_written(uint64_t page, uint64_t offset, uint64_t length) {
  if (length == 0 || page >= m_pages) return;
  StorageDomain* d = domain_for(page);
  const uint64_t block = sub_block_size();
  const uint64_t first = offset / block;
  const uint64_t last = (offset + length - 1) / block;
  const uint64_t count = last - first + 1;
  const uint64_t bits = count >= 64 ? ~uint64_t{0} : ((uint64_t{1} << count) - 1) << first;
  SubBlockBits& sb = d->sub_blocks[page & (k_l2_pages - 1)];
  sb.valid |= bits;
  sb.dirty |= bits;
}

void PageTable::clean(uint64_t page) {
  if (page >= m_pages || !m_l1[page >> k_l2_shift]) return;
  m_l1[page >> k_l2_shift]->sub_blocks[page & (k_l2_pages - 1)].dirty = 0;
}

SubBlockBits PageTable::sub_blocks(uint64_t page) const {
  if (page >= m_pages || !m_l1[page >> k_l2_shift]) return {};
  return m_l1[page >> k_l2_shift]->sub_blocks[page & (k_l2_pages - 1)];
}

void PageTable::translate_batch(std::span<const uint64_t> pages, std::span<PageEntry> out) const {
  // Far enough ahead to cover a DRAM miss at the lookup rate, near enough that
  // the prefetched lines are still in L1 when used.
  constexpr size_t k_ahead = 16;
  const size_t n = pages.size() < out.size() ? pages.size() : out.size();
  static const PageEntry k_absent{};
  for (size_t i = 0; i < n; ++i) {
    if (i + k_ahead < n) {
      if (const PageEntry* ahead = find(pages[i + k_ahead])) __builtin_prefetch(ahead);
    }
    const PageEntry* e = find(pages[i]);
    out[i] = e != nullptr ? *e : k_absent;
  }
}

size_t PageTable::domains() const {
  size_t n = 0;
  for (const auto& d : m_l1) n += d != nullptr;
  return n;
}

}  // namespace tiermem
