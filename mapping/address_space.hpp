// AddressSpace: one node's share of the global address space (M1-M6).
//
// It hands out GVAs from the node's virtual page range, backs every page with a
// frame of one tier, keeps the page table and the version words, and copies
// data in and out under the seqlock discipline of mapping/version.hpp.
//
// Virtual pages are handed out next-fit over a range several times larger than
// physical capacity, so the address of a freed allocation is not reused until
// the range has wrapped; each allocation also gets a fresh generation, which
// a GVA carries, so even a reused address is detected as stale.
//
// Thread-safe: structural changes take an exclusive lock, lookups and data
// copies a shared one; data copies on the same page are ordered by its
// version word, which co-located clients and remote peers use too.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>
#include <tiermem/types.h>

#include "mapping/extent_set.hpp"
#include "mapping/page_table.hpp"
#include "mapping/tier_backend.hpp"
#include "mapping/word_array.hpp"

namespace tiermem {

struct AddressSpaceOptions {
  NodeId node = 1;
  uint64_t page_size = 2 << 20;
  // Size of the virtual page range; 0 picks 16x the total frame count
  // (at least 4096 pages).
  uint64_t virtual_pages = 0;
};

using TierSet = std::array<std::unique_ptr<TierBackend>, 4>;  // indexed by Tier

struct AllocRequest {
  uint64_t size = 0;
  Tier tier = Tier::automatic;
  bool strict = false;
  std::string name;
  uint32_t owner_uid = 0;
};

// What a client needs to map an allocation: its info and physical layout.
// What a client caches to reach an allocation directly: its info, physical
// layout and the version word of every page, all read under one lock.
struct AllocationLayout {
  AllocationInfo info;
  uint64_t first_page = 0;
  std::vector<Extent> extents;
  std::vector<uint64_t> page_versions;
};

class AddressSpace {
 public:
  // Errors: invalid_argument (page size not a power of two >= 4096, a tier
  // smaller than one page), io_error (version array).
  static Result<std::unique_ptr<AddressSpace>> create(const AddressSpaceOptions& options,
                                                      TierSet tiers);

  NodeId node() const { return m_node; }
  uint64_t page_size() const { return m_table.page_size(); }
  uint64_t virtual_pages() const { return m_table.pages(); }

  // Errors: invalid_argument (size 0 or too large), already_exists (name),
  // tier_unavailable (strict request for a tier this node lacks),
  // tier_exhausted (no tier in the chain has room; says what each has).
  Result<AllocationInfo> allocate(const AllocRequest& request);
  // `gva` must be an allocation's first byte. Errors: not_allocated,
  // stale_generation, invalid_argument (inside, not at the start),
  // failed_precondition (mapped by a client).
  Status free(Gva gva);

  Result<AllocationInfo> lookup(std::string_view name) const;
  Result<Translation> translate(Gva gva) const;
  // The layout of the allocation holding `gva`. Errors as translate().
  Result<AllocationLayout> layout(Gva gva) const;

  // Copies into/out of the allocation holding `gva`; the range must lie inside
  // it. Errors: not_allocated, stale_generation, out_of_range, busy (a page
  // stayed locked by a writer past the lock timeout), io_error (tier copy).
  Status write(Gva gva, const void* src, size_t length);
  Status read(Gva gva, void* dst, size_t length);

  // Pins the allocation holding `gva` for mapping by a client and returns its
  // layout; unpin() undoes one pin. Pinned pages are not migrated or freed.
  Result<AllocationLayout> pin(Gva gva);
  Status unpin(Gva gva);

  std::vector<TierStat> tier_stats() const;
  size_t allocation_count() const;
  std::vector<AllocationInfo> list() const;
  MappingDump dump() const;

  VersionArray& versions() { return m_versions; }
  // The L3 sub-block bits, k_l3_words_per_page words per virtual page.
  WordArray& sub_block_words() { return m_l3; }
  // The backend of a tier, or nullptr when this node has no such tier.
  TierBackend* backend(Tier tier) const { return m_tiers[static_cast<size_t>(tier)].backend.get(); }

 private:
  struct Allocation {
    uint64_t first_page = 0;
    uint64_t pages = 0;
    uint64_t size = 0;
    uint32_t generation = 0;
    Tier tier = Tier::automatic;
    std::string name;
    std::vector<UnitRange> frames;  // in frames of `tier`, in GVA order
    uint32_t map_count = 0;
    uint64_t created_unix_ms = 0;
    uint32_t owner_uid = 0;
  };
  struct TierState {
    std::unique_ptr<TierBackend> backend;
    ExtentSet free_frames;
    uint64_t frames = 0;
    uint64_t allocations = 0;
  };

  AddressSpace(const AddressSpaceOptions& options, uint64_t virtual_pages, TierSet tiers,
               VersionArray versions, WordArray l3);

  // Finds the allocation holding `gva` (caller holds the lock).
  Result<const Allocation*> locate(Gva gva) const;
  Result<const Allocation*> locate_range(Gva gva, size_t length, const char* op) const;
  Status not_allocated_error(Gva gva) const;
  AllocationInfo info_of(const Allocation& a) const;
  std::vector<Extent> extents_of(const Allocation& a) const;
  AllocationLayout layout_of(const Allocation& a) const;
  PageInfo page_info(uint64_t page) const;
  bool take_frames(TierState& tier, uint64_t pages, std::vector<UnitRange>* frames);
  Status exhausted_error(const AllocRequest& request, uint64_t pages,
                         const std::vector<Tier>& chain) const;
  void set_pinned(const Allocation& a, bool pinned);

  NodeId m_node;
  mutable std::shared_mutex m_mutex;
  VersionArray m_versions;
  WordArray m_l3;
  PageTable m_table;
  std::array<TierState, 4> m_tiers;
  ExtentSet m_virtual;
  uint64_t m_virtual_cursor = 1;
  uint32_t m_next_generation = 1;
  std::map<uint64_t, Allocation> m_allocations;  // by first page
  std::unordered_map<std::string, uint64_t> m_names;
};

}  // namespace tiermem
