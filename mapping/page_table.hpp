// The three-level page table of one node's address range (M2, M3).
//
//   L1: global page number >> 9  ->  storage domain (an L2 table), a flat
//       array small enough to stay in cache (one pointer per 512 pages);
//   L2: domain offset (page & 511) -> PageEntry: tier, physical node, frame;
//   L3: per page, which sub-blocks (page_size / 64 bytes each, "cache-line
//       groups") have ever been written (valid) and since the last persist or
//       migration (dirty). Two words per page in a flat array that can live in
//       shared memory, so co-located clients writing directly set the bits
//       too (atomic OR).
//
// Entries are 16 bytes so a lookup costs one cache-line miss after the
// (cached) L1 load; translate_batch() prefetches ahead so independent misses
// overlap. Not thread-safe: the owner (AddressSpace) serialises changes and
// lookups with its lock.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/types.h>

#include "pages/sub_blocks.hpp"

namespace tiermem {

inline constexpr unsigned k_l2_shift = 9;
inline constexpr uint64_t k_l2_pages = uint64_t{1} << k_l2_shift;

// Entry flag bit beyond the public PageFlag bits: the entry maps a frame.
inline constexpr uint8_t k_entry_present = 1u << 7;

struct PageEntry {
  uint64_t frame_offset = 0;  // byte offset of the frame in its tier region
  uint32_t generation = 0;    // allocation generation; kept after free (tombstone)
  NodeId node = 0;            // node physically holding the frame
  Tier tier = Tier::automatic;
  uint8_t flags = 0;          // PageFlag bits (low 7) | k_entry_present

  bool present() const { return (flags & k_entry_present) != 0; }
  uint32_t page_flags() const { return flags & 0x7fu; }
};
static_assert(sizeof(PageEntry) == 16, "entries stay 16 bytes: 4 per cache line");

struct SubBlockBits {
  uint64_t valid = 0;
  uint64_t dirty = 0;
};

// One L2 table: k_l2_pages consecutive virtual pages.
struct StorageDomain {
  std::array<PageEntry, k_l2_pages> entries{};
  uint32_t present_pages = 0;
};

class PageTable {
 public:
  // Covers virtual pages [0, pages). page_size must be a power of two >= 4096.
  // `l3` holds k_l3_words_per_page words per page (e.g. in shared memory);
  // when empty the table keeps its own.
  PageTable(uint64_t pages, uint64_t page_size, std::span<uint64_t> l3 = {});

  uint64_t pages() const { return m_pages; }
  uint64_t page_size() const { return m_page_size; }
  unsigned page_shift() const { return m_page_shift; }
  uint64_t sub_block_size() const { return m_page_size / k_sub_blocks_per_page; }

  // The entry of a page (not present when never set), or nullptr when the page
  // is outside the table. Unpopulated L1 slots point at one shared empty
  // domain, so a lookup has no null check on its way.
  const PageEntry* find(uint64_t page) const {
    if (page >= m_pages) return nullptr;
    return &m_l1[page >> k_l2_shift]->entries[page & (k_l2_pages - 1)];
  }

  // Sets a page's entry (present or not), creating its domain on demand.
  void set(uint64_t page, const PageEntry& entry);
  // Marks a page not present, keeping its generation as a tombstone.
  void clear(uint64_t page);

  // Records a write of [offset, offset+length) inside `page` in the L3 bits;
  // `durable` writes (persisted before returning) do not make it dirty.
  void mark_written(uint64_t page, uint64_t offset, uint64_t length, bool durable = false);
  // Clears the dirty bits of a page (after persist or migration).
  void clean(uint64_t page);
  SubBlockBits sub_blocks(uint64_t page) const;

  // Looks up many pages at once, prefetching ahead so cache misses overlap.
  // out[i] is the entry of pages[i], or a default (not present) entry.
  void translate_batch(std::span<const uint64_t> pages, std::span<PageEntry> out) const;

  // Number of populated storage domains (L2 tables).
  size_t domains() const;

 private:
  StorageDomain* domain_for(uint64_t page);

  uint64_t m_pages;
  uint64_t m_page_size;
  unsigned m_page_shift;
  std::vector<StorageDomain*> m_l1;  // never null: &k_empty_domain when unpopulated
  std::vector<std::unique_ptr<StorageDomain>> m_domains;
  std::vector<uint64_t> m_own_l3;
  std::span<uint64_t> m_l3;
};

}  // namespace tiermem
