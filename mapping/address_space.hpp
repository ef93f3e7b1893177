// AddressSpace: one node's share of the global address space (M1-M7).
//
// It hands out GVAs from the node's virtual page range, backs every page with a
// frame (of one of its own tiers, or, after migration, of another node's),
// keeps the page table and the version words, and copies data under the
// seqlock discipline of mapping/version.hpp.
//
// The page table is the only record of where a page is: extents, stats and
// frees are derived from it. Frames this node lends to pages homed elsewhere
// ("foreign" frames) are reserved and released by the home node.
//
// Virtual pages are handed out next-fit over a range several times larger than
// physical capacity, so the address of a freed allocation is not reused until
// the range has wrapped; each allocation also gets a fresh generation (seeded
// randomly per daemon start), which a GVA carries, so even a reused address is
// detected as stale.
//
// Thread-safe: structural changes take an exclusive lock, lookups a shared
// one; data copies run outside the lock, ordered by the page version words,
// which co-located clients and remote peers use too.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
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
#include "mapping/seqlock_copy.hpp"
#include "mapping/tier_backend.hpp"
#include "mapping/word_array.hpp"

namespace tiermem {

// Page lock waits of the daemon: clients hold a page lock for one copy only.
inline constexpr std::chrono::milliseconds k_page_lock_timeout{2000};

struct AddressSpaceOptions {
  NodeId node = 1;
  uint64_t page_size = 2 << 20;
  // Size of the virtual page range; 0 picks 16x the total frame count
  // (at least 4096 pages).
  uint64_t virtual_pages = 0;
  // First generation handed out; 0 picks a random one (so GVAs of an earlier
  // run of the daemon are detected as stale).
  uint32_t first_generation = 0;
  // Provides the memory of the version array (so the transport can hand out
  // memory it reaches fastest); null: a memfd.
  SharedMemoryFactory shared_memory;
};

// Frames of one of this node's tier backends (any tier, VRAM included).
class BackendFrameData final : public FrameData {
 public:
  explicit BackendFrameData(TierBackend& backend) : m_backend(backend) {}
  Status read(uint64_t frame_offset, void* dst, size_t length) override;
  Status write(uint64_t frame_offset, const void* src, size_t length) override;
  Status atomic(uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare,
                uint64_t* old) override;
  bool persistent() const override { return m_backend.persistent(); }

 private:
  TierBackend& m_backend;
};

using TierSet = std::array<std::unique_ptr<TierBackend>, 4>;  // indexed by Tier

struct AllocRequest {
  uint64_t size = 0;
  Tier tier = Tier::automatic;
  bool strict = false;
  std::string name;
  uint32_t owner_uid = 0;
  bool coherent = false;  // holds atomic words: never migrated
};

// What a client caches to reach an allocation directly: its info, physical
// layout and the version word of every page, all read under one lock.
struct AllocationLayout {
  AllocationInfo info;
  uint64_t first_page = 0;
  std::vector<Extent> extents;
  std::vector<uint64_t> page_versions;
  bool coherent = false;
};

// A page being moved (M7): its version word stays locked from begin_move to
// commit_move/abort_move.
struct PageMove {
  uint64_t page = 0;
  PageEntry from;
  uint64_t locked = 0;  // the locked (odd) version word
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
  // `gva` must be an allocation's first byte. Frames lent by other nodes are
  // appended to *remote_frames for the caller to give back. Errors:
  // not_allocated, stale_generation, invalid_argument (inside, not at the
  // start), failed_precondition (mapped by a client), busy (being migrated).
  Status free(Gva gva, std::vector<Extent>* remote_frames = nullptr);

  Result<AllocationInfo> lookup(std::string_view name) const;
  Result<Translation> translate(Gva gva) const;
  // The layout of the allocation holding `gva`. Errors as translate().
  Result<AllocationLayout> layout(Gva gva) const;

  // Copies into/out of the allocation holding `gva`. Pages on other nodes are
  // reached through `elsewhere` (null: they are not, and the copy fails with
  // not_supported). Errors: not_allocated, stale_generation, out_of_range,
  // busy (a page stayed locked past the lock timeout), io_error, and those of
  // `elsewhere`.
  Status write(Gva gva, const void* src, size_t length, MemoryAccess* elsewhere = nullptr);
  Status read(Gva gva, void* dst, size_t length, MemoryAccess* elsewhere = nullptr);
  // A 64-bit atomic on the 8-byte aligned word at `gva` (see
  // seqlocked_atomic); returns the old value.
  Result<uint64_t> atomic(Gva gva, WordOp op, uint64_t operand, uint64_t compare,
                          MemoryAccess* elsewhere = nullptr);
  // The frames of one of this node's tiers, or of another node's through
  // `elsewhere`; for migration, which copies pages whose lock it holds.
  Result<FrameData*> frames(NodeId node, Tier tier, MemoryAccess* elsewhere);

  // Pins the allocation holding `gva` for mapping by a client and returns its
  // layout; unpin() undoes one pin. Pinned pages are not migrated or freed.
  // Errors: not_supported when a page is not on this node.
  Result<AllocationLayout> pin(Gva gva);
  Status unpin(Gva gva);

  // --- frames lent to pages homed on other nodes -------------------------
  // Takes free frames of a tier: lent to another node's pages (`lend`), or
  // for a page of this node moving here. Errors: tier_unavailable,
  // tier_exhausted.
  Result<std::vector<Extent>> reserve_frames(Tier tier, uint64_t pages, bool lend = true);
  // Gives back frames taken with lend = false and never used.
  void return_frames(const std::vector<Extent>& frames);
  // Returns lent frames (and clears them). Errors: invalid_argument for
  // frames this node did not lend.
  Status release_frames(const std::vector<Extent>& frames);

  // --- migration (M7) -----------------------------------------------------
  // Marks the allocation holding `gva` as migrating and lists its pages.
  // Errors: as translate(), failed_precondition (mapped, or coherent: its
  // atomic words must stay where clients address them), busy (already
  // migrating).
  Result<std::vector<uint64_t>> begin_migration(Gva gva);
  void end_migration(Gva gva);
  // Locks one page's version word (waiting out writers, at most `timeout`)
  // and returns where it is.
  Result<PageMove> begin_move(uint64_t page, std::chrono::milliseconds timeout = k_page_lock_timeout);
  // Points the page at `to`, releases the lock into a new epoch (every cached
  // translation of the page is stale from here) and frees the old frame: a
  // local one directly, a lent one is appended to *remote_frames.
  Status commit_move(const PageMove& move, const PageEntry& to, std::vector<Extent>* remote_frames);
  void abort_move(const PageMove& move);

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
    Tier tier = Tier::automatic;  // where it was placed
    std::string name;
    uint32_t map_count = 0;
    uint64_t created_unix_ms = 0;
    uint32_t owner_uid = 0;
    bool coherent = false;
    bool migrating = false;
  };
  struct TierState {
    std::unique_ptr<TierBackend> backend;
    ExtentSet free_frames;
    uint64_t frames = 0;
    uint64_t allocations = 0;
    uint64_t lent_frames = 0;  // reserved for pages homed elsewhere
  };

  AddressSpace(const AddressSpaceOptions& options, uint64_t virtual_pages, TierSet tiers,
               VersionArray versions, WordArray l3);

  // Finds the allocation holding `gva` (caller holds the lock).
  Result<Allocation*> locate(Gva gva) const;
  Status not_allocated_error(Gva gva) const;
  AllocationInfo info_of(const Allocation& a) const;
  std::vector<Extent> extents_of(const Allocation& a) const;
  AllocationLayout layout_of(const Allocation& a) const;
  PageInfo page_info(uint64_t page) const;
  bool take_frames(TierState& tier, uint64_t pages, std::vector<UnitRange>* frames);
  Status exhausted_error(const AllocRequest& request, uint64_t pages,
                         const std::vector<Tier>& chain) const;
  void set_pinned(const Allocation& a, bool pinned);
  // Gives a frame of this node back to its tier (clearing it).
  void release_local_frame(Tier tier, uint64_t frame_offset);
  Status copy(Gva gva, std::byte* buffer, size_t length, bool to_memory, MemoryAccess* elsewhere);

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
  LocalVersionWords m_local_words;
  std::array<std::optional<BackendFrameData>, 4> m_local_frames;
};

}  // namespace tiermem
