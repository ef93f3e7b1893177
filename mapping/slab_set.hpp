// The pages shared by sub-page allocations (M10) of one address space: each
// a slab of slots of one size class, of one tenant's domain, one tier and
// one kind (coherent or not), and an index of those with a free slot.
//
// It keeps the slots' bookkeeping only: which slots are taken, which were
// freed and must be zeroed before they are handed out again, and which slabs
// can take another allocation. Frames, records, version words and the lock
// are the AddressSpace's (address_space_sub_page.cpp), which holds it and
// calls it under its exclusive lock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include <tiermem/types.h>

#include "mapping/allocation.hpp"

namespace tiermem {

class SlabSet {
 public:
  // A page shared by sub-page allocations: `page` is it as a one-page
  // allocation (its record, pins, migration state; its size is the slot
  // size); one bit per slot.
  struct Slab {
    AllocationEntry page;
    std::vector<uint64_t> used;   // taken (the bits past the last slot are set)
    std::vector<uint64_t> dirty;  // freed: zeroed when taken again
    uint32_t in_use = 0;
    uint32_t slots = 0;

    bool slot_used(uint64_t page_offset) const;
    // The first free slot; nullopt when the slab is full.
    std::optional<uint64_t> first_free() const;
    bool slot_dirty(uint64_t index) const;
    void clear_dirty(uint64_t index);
    // Every free slot's old bytes are unknown (after a restart).
    void dirty_free_slots();
  };

  // `pages_per_domain`: of the address space (a slab's domain is its page's).
  SlabSet(uint64_t page_size, uint64_t pages_per_domain)
      : m_page_size(page_size), m_pages_per_domain(pages_per_domain) {}

  // A slab of `slot_bytes` slots with none taken (its page not set).
  Slab empty(uint64_t slot_bytes) const;
  // Keeps `slab` (by its page; a slab of that page already kept stays, and
  // is returned), open for allocations when `open`.
  Slab& add(Slab slab, bool open = true);
  // Forgets the slab of `page` (its page is the caller's to give back).
  void remove(uint64_t page);
  Slab* find(uint64_t page);
  const Slab* find(uint64_t page) const;
  bool contains(uint64_t page) const { return m_slabs.count(page) != 0; }
  // A slab of that domain, tier, size class and kind with a free slot.
  Slab* open_slab(uint32_t domain, Tier tier, uint32_t slot_bytes, bool coherent);
  // Opens the slab for allocations, or closes it.
  void set_open(const Slab& slab, bool open);
  // Takes or frees the slot at `page_offset` (a freed one is dirty).
  // `usable`: the slab may take new allocations (its page is not lost).
  void mark(Slab& slab, uint64_t page_offset, bool used, bool usable);

  size_t size() const { return m_slabs.size(); }
  // Allocations in slabs.
  uint64_t allocations() const;
  // Every slab's page, in order (for a caller that gives some back).
  std::vector<uint64_t> pages() const;

 private:
  using Kind = std::tuple<uint32_t, uint8_t, uint32_t, bool>;  // domain, tier, class, coherent
  Kind kind_of(const Slab& slab) const;

  uint64_t m_page_size;
  uint64_t m_pages_per_domain;
  std::map<uint64_t, Slab> m_slabs;             // by page
  std::map<Kind, std::set<uint64_t>> m_open;    // pages of slabs with a free slot
};

}  // namespace tiermem
