// AddressSpace: one node's share of the global address space (M1-M7).
//
// It hands out GVAs from the node's virtual page range, backs every page with a
// frame (of one of its own tiers, or, after migration, of another node's),
// keeps the page table and the version words, and copies data under the
// seqlock discipline of pages/version.hpp.
//
// Tenants (O5). Every allocation belongs to a tenant, and every tenant has a
// domain on the node: a slice of the virtual range (its pages' version words
// are a file of their own, see VersionSegments) and, in DRAM and PMEM, files
// of their own for its frames (TierBackend domains), sized by its quota. A
// co-located client is given the descriptors of its own tenant's domain
// only. Quotas are counted per tenant and tier; all tenants together are
// bounded by the tier's capacity.
//
// The page table is the only record of where a page is: extents, stats and
// frees are derived from it. Frames this node lends to pages homed elsewhere
// ("foreign" frames) are reserved and released by the home node.
//
// Sub-page allocations (M10, address_space_sub_page.cpp): an allocation of
// at most sub_page_max bytes takes a slot of a page shared with other small
// allocations of its tenant, tier and kind (a slab); it keeps a GVA,
// generation, bounds and record of its own and shares the page's version
// word. m_allocations holds both kinds, by start byte; slabs are kept apart.
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
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>
#include <tiermem/types.h>

#include "mapping/allocation.hpp"
#include "mapping/domain_table.hpp"
#include "mapping/extent_set.hpp"
#include "mapping/frame_loans.hpp"
#include "mapping/metadata_store.hpp"
#include "mapping/page_table.hpp"
#include "mapping/slab_set.hpp"
#include "pages/seqlock_copy.hpp"
#include "tiers/tier_backend.hpp"
#include "mapping/version_segments.hpp"

namespace tiermem {

// Page lock waits of the daemon: clients hold a page lock for one copy only.
inline constexpr std::chrono::milliseconds k_page_lock_timeout{2000};

struct AddressSpaceOptions {
  NodeId node = 1;
  uint64_t page_size = 2 << 20;
  // Tenants the node can hold at once (each a domain).
  uint32_t domains = 1;
  // Virtual pages of each domain; 0 picks 16x the frames of the largest tier
  // (at least 4096), so the address of a freed allocation comes back only
  // after the range has wrapped. Rounded up to k_pages_per_domain_unit.
  uint64_t pages_per_domain = 0;
  // First generation handed out; 0 picks a random one (so GVAs of an earlier
  // run of the daemon are detected as stale).
  uint32_t first_generation = 0;
  // Sub-page allocations (M10): allocations of at most this many bytes share
  // pages with other small allocations of their tenant, tier and kind, in
  // power-of-two size classes of at least k_min_slot_bytes; 0: every
  // allocation takes whole pages. At most page_size / 2.
  uint64_t sub_page_max = 0;
  // The directory of the version segments (the node's shared memory), held
  // locked by the caller.
  std::string versions_dir;
  uint64_t incarnation = 0;  // of this daemon, in every segment header
  // Durable metadata (H5): when set, the pool is opened (made when there is
  // none), the space rebuilt from it, and every change recorded in it before
  // it is visible. Each domain's shared memory (version segments, DRAM file)
  // left by the daemon before is then re-adopted when it is still the one
  // the pool knows and whole; else that domain's is made anew and what lived
  // only there is lost, and no other domain's.
  std::optional<MetadataOptions> metadata;
};

// One line of a recovery report about one tenant (a client is shown its
// own tenant's only).
struct TenantNote {
  std::string tenant;
  std::string text;
};

// What a start on durable metadata found (tiermemctl status, the log).
struct RecoveryReport {
  bool from_metadata = false;    // a pool was opened (false: no durable metadata)
  bool pool_created = false;     // it was new: nothing to recover
  bool memory_adopted = false;   // every domain's shared memory of the daemon before was taken over
  uint64_t starts = 0;           // daemon starts on the pool
  uint64_t allocations = 0;      // recovered (lost ones included)
  uint64_t pages = 0;
  uint64_t lost_allocations = 0;  // with pages whose memory did not survive (DRAM after a reboot)
  uint64_t lost_pages = 0;
  uint64_t dropped = 0;           // records that did not fit the tiers (see the log)
  uint64_t lent_frames = 0;       // frames lent to other nodes, still lent
  uint64_t locks_broken = 0;      // pages still locked by a dead writer: flagged torn
  double elapsed_ms = 0;
  std::vector<TenantNote> lost;  // "'name' gva of tenant 't': why" of lost allocations, the first 100
  // Domains of a tenant whose shared memory was made anew, and why: "domain
  // 3 (tenant 'x'): its version words ... are 0 bytes long ...".
  std::vector<TenantNote> domains_made_anew;
  std::vector<std::string> dropped_reasons;  // one line per dropped record
  std::string pool;               // the metadata pool's path
};

// Per-tier byte limits of a tenant (0: the tier's capacity).
struct TenantLimits {
  std::array<uint64_t, 4> bytes{};  // indexed by Tier
  uint64_t of(Tier t) const { return bytes[static_cast<size_t>(t)]; }
};

using TierSet = std::array<std::unique_ptr<TierBackend>, 4>;  // indexed by Tier

struct AllocRequest {
  uint64_t size = 0;
  Tier tier = Tier::automatic;
  bool strict = false;
  std::string name;
  uint32_t owner_uid = 0;
  bool coherent = false;  // holds atomic words: never migrated
  // Session lifetime: not recorded in the durable metadata (freed with its
  // session by the daemon; never recovered after a restart).
  bool session = false;
  std::string tenant;     // the owner; empty: the default tenant ""
  TenantLimits limits;    // the tenant's quotas
  // Copies its home wants (the home daemon places them), or, for a copy,
  // the allocation it copies and whether it starts filled; its QoS class.
  // `replicas` is empty: they are placed after.
  AllocationPolicy policy;
};

// The files a tenant's domain consists of, for a co-located client.
struct DomainFiles {
  uint32_t domain = 0;
  uint64_t first_page = 0;  // of the domain's virtual pages
  uint64_t pages = 0;
  int versions_fd = -1;     // version words, L3 words (VersionSegments), read-write
  uint64_t versions_bytes = 0;
  int header_fd = -1;       // the segment header, a read-only descriptor
  struct TierFile {
    Tier tier = Tier::automatic;
    int fd = -1;
    uint64_t frame_offset = 0;  // of the file's first byte in the tier's frames
    uint64_t bytes = 0;
    bool persistent = false;
  };
  std::vector<TierFile> tiers;
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
// commit_moves/abort_move.
struct PageMove {
  uint64_t page = 0;
  PageEntry from;
  uint64_t locked = 0;  // the locked (odd) version word
};

// The smallest size class of sub-page allocations: a cache line, so that
// neighbours' atomic words never share one.
inline constexpr uint64_t k_min_slot_bytes = 64;

class AddressSpace {
 public:
  // Errors: invalid_argument (page size not a power of two >= 4096, a tier
  // smaller than one page), io_error (version segments).
  static Result<std::unique_ptr<AddressSpace>> create(const AddressSpaceOptions& options,
                                                      TierSet tiers);

  NodeId node() const { return m_node; }
  uint64_t page_size() const { return m_table.page_size(); }
  uint64_t virtual_pages() const { return m_table.pages(); }
  uint64_t pages_per_domain() const { return m_versions->pages_per_domain(); }
  uint32_t domains() const { return m_versions->domains(); }
  uint64_t sub_page_max() const { return m_sub_page_max; }
  // Pages shared by sub-page allocations now, and the allocations in them.
  struct SlabStats {
    uint64_t slabs = 0;
    uint64_t allocations = 0;
  };
  SlabStats slab_stats() const;

  // The domain of `tenant`, given to it now (its files opened, sized by its
  // limits) when it has none yet. *fresh says so, for the caller to register
  // the new files with the transport. Errors: tier_exhausted (every domain
  // is taken), io_error.
  Result<uint32_t> domain_for(const std::string& tenant, const TenantLimits& limits, bool* fresh = nullptr);
  // The domain of `tenant`, if it has one.
  std::optional<uint32_t> find_domain(const std::string& tenant) const;
  // The tenant owning a domain ("" while unassigned).
  std::string tenant_of_domain(uint32_t domain) const;
  // What a client of the domain maps.
  DomainFiles domain_files(uint32_t domain) const;
  // Bytes of `tier` a tenant uses here.
  uint64_t usage(const std::string& tenant, Tier tier) const;

  // Errors: invalid_argument (size 0 or too large), already_exists (name),
  // tier_unavailable (strict request for a tier this node lacks),
  // tier_exhausted (no tier in the chain has room; says what each has),
  // quota_exceeded (the tenant's quota would be passed; says the figures).
  Result<AllocationInfo> allocate(const AllocRequest& request);
  // `gva` must be an allocation's first byte. Frames lent by other nodes are
  // appended to *remote_frames for the caller to give back. Errors:
  // not_allocated, stale_generation, invalid_argument (inside, not at the
  // start), failed_precondition (mapped by a client), busy (being migrated).
  Status free(Gva gva, std::vector<Extent>* remote_frames = nullptr);

  Result<AllocationInfo> lookup(std::string_view name) const;

  // --- policy (allocation_policy.hpp; the daemon decides, this records) ---
  // Changes the policy of the allocation at `base` with `change` and records
  // it durably (undone when that fails). Errors: not_allocated,
  // stale_generation, those of the metadata store.
  Status change_policy(Gva base, const std::function<void(AllocationPolicy&)>& change);
  // The copy held here of the allocation `home` (any offset inside it).
  // Errors: not_found.
  Result<AllocationInfo> find_replica(Gva home) const;
  // Of an allocation homed here whose memory did not survive a restart:
  // writes `bytes` (the whole allocation, read from a copy) into its lost
  // pages that have their frames here, and clears their flag L (durably).
  // Returns how many pages were refilled. Errors: as locate(),
  // invalid_argument (not the allocation's size).
  Result<uint64_t> refill_lost(Gva base, std::span<const std::byte> bytes);
  // Every allocation here that has copies elsewhere, or is one.
  std::vector<AllocationInfo> replicated() const;
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
  // Takes free frames of a tier in `tenant`'s domain: lent to a page of node
  // `borrower` (not this node), or for a page of this node moving here.
  // Errors: tier_unavailable, tier_exhausted, quota_exceeded,
  // invalid_argument (more pages than the tier has).
  Result<std::vector<Extent>> reserve_frames(Tier tier, uint64_t pages, const std::string& tenant,
                                             const TenantLimits& limits, NodeId borrower);
  // Gives back frames reserved for this node and never used.
  void return_frames(const std::vector<Extent>& frames);
  // Returns frames lent to `borrower` (and clears them). Every frame must be
  // one this node lent to it and has not been given back: anything else is
  // refused (invalid_argument naming the frame) and nothing is released.
  Status release_frames(const std::vector<Extent>& frames, NodeId borrower);
  // Frames lent to `borrower`, now.
  size_t lent_to(NodeId borrower) const;
  // The memory generation of `tenant`'s domain on `node` as of the frames it
  // lent us (a lender takes them from the domain of the allocation's
  // tenant): extents on it carry it, so a client reaching them checks the
  // domain's memory is the same.
  void note_lender(NodeId node, const std::string& tenant, uint64_t memory_generation);
  // `node`'s domains are now of `generations` (by tenant): frames lent from
  // a domain whose generation is not the one they were lent from (or that
  // it no longer has) are gone, and every page on them is lost (flag L;
  // reads and writes of their allocations fail with data_lost, free still
  // works). Returns how many pages were lost.
  size_t lose_frames_of(NodeId node, const std::map<std::string, uint64_t>& generations);

  // --- locks of dead writers (S3, pages/lock_intents.hpp) ----------------
  // Breaks the lock a writer that died held on `page`, when its word still
  // has exactly the value `locked` and the page is allocated in the domain of
  // `tenant` (any, for an operator); the page is then flagged torn (T): it may
  // hold part of a write that was never acknowledged. True when broken.
  bool break_dead_lock(uint64_t page, uint64_t locked, const std::string& tenant, bool is_operator);

  // --- migration (M7) -----------------------------------------------------
  // Marks the allocation holding `gva` as migrating and lists its pages.
  // Errors: as translate(), failed_precondition (mapped, or coherent: its
  // atomic words must stay where clients address them), busy (already
  // migrating).
  Result<std::vector<uint64_t>> begin_migration(Gva gva);
  void end_migration(Gva gva);
  // What demotion (daemon/demoter.hpp) may move off `tier` of this node
  // now: per allocation homed here that was asked demotable and that
  // begin_migration() would take (not mapped, coherent, sub-page, a copy,
  // migrating or with lost pages), its pages on that tier's frames with
  // their version words (a change between two looks is a write).
  struct DemotableAllocation {
    Gva base;  // its first byte
    std::string tenant;
    std::vector<std::pair<uint64_t, uint64_t>> pages;  // (page, version word)
  };
  std::vector<DemotableAllocation> demotable_allocations(Tier tier) const;
  // Where `page` is now. Errors: not_allocated (no page there).
  Result<PageEntry> page_entry(uint64_t page) const;
  // Locks one page's version word (waiting out writers, at most `timeout`)
  // and returns where it is.
  Result<PageMove> begin_move(uint64_t page, std::chrono::milliseconds timeout = k_page_lock_timeout);
  // Points each locked page of `moves` (all of one allocation) at to[i] with
  // one durable record for all of them, releases their locks into a new
  // epoch (every cached translation of them is stale from here) and frees
  // the old frames: local ones directly, lent ones appended to
  // *remote_frames. Every page moves or none does (then the caller aborts
  // each move). Errors: those of the metadata store; internal for pages of
  // several allocations.
  Status commit_moves(std::span<const PageMove> moves, std::span<const PageEntry> to,
                      std::vector<Extent>* remote_frames);
  void abort_move(const PageMove& move);

  // A tenant's file found grown past its size and cut back.
  struct FileTrim {
    std::string tenant;
    std::string path;
    uint64_t size = 0;           // what the daemon gave the file
    uint64_t found_bytes = 0;    // its length as found
    uint64_t storage_freed = 0;  // storage the file system got back
    Status error;                // the file could not be cut back
  };
  // Cuts the DRAM, PMEM and version-word files of every tenant's domain back
  // to their sizes (trim_segment): a tenant holds their descriptors and can
  // grow them (ftruncate, fallocate) past its quota. Returns each file it
  // cut (or could not cut) since the last call, this one's and those an
  // allocation cut when the file system was full, for the caller to
  // report. Cheap when nothing grew: one fstat per file.
  std::vector<FileTrim> trim_tenant_files();

  std::vector<TierStat> tier_stats() const;
  size_t allocation_count() const;
  std::vector<AllocationInfo> list() const;
  MappingDump dump() const;

  VersionSegments& versions() { return *m_versions; }
  const RecoveryReport& recovery() const { return m_recovery; }
  // Whether changes are recorded in durable metadata.
  bool durable() const { return m_meta != nullptr; }
  // The backend of a tier, or nullptr when this node has no such tier.
  TierBackend* backend(Tier tier) const { return m_tiers[static_cast<size_t>(tier)].backend.get(); }

 private:
  friend class SpaceRecovery;  // rebuilds a new space at a start (space_recovery.hpp)
  using Allocation = AllocationEntry;
  using Domain = DomainTable::Domain;
  using Slab = SlabSet::Slab;
  struct TierState {
    std::unique_ptr<TierBackend> backend;
    ExtentSet shared_free;  // a tier without domains (VRAM): its free frames
    uint64_t frames = 0;    // the capacity, in pages
    uint64_t used = 0;      // frames in use by every domain
    uint64_t allocations = 0;
  };

  AddressSpace(const AddressSpaceOptions& options, uint64_t pages_per_domain, TierSet tiers,
               std::unique_ptr<VersionSegments> versions);

  // --- durable metadata (address_space_records.cpp; a start: SpaceRecovery) -
  // The record of an allocation as its page entries are now.
  AllocationRecord record_of(const Allocation& a) const;
  // Records the allocation (a no-op without metadata or for a session one).
  Status record(const Allocation& a);
  Status record_lent(Tier tier, const std::vector<UnitRange>& frames, NodeId borrower, uint32_t domain);

  // --- sub-page allocations (address_space_sub_page.cpp) ------------------
  // The size class of a request, 0 when it takes whole pages.
  uint32_t slot_class(const AllocRequest& request) const;
  Result<AllocationInfo> allocate_in_slab(const AllocRequest& request, uint32_t slot_bytes);
  // A new slab of `tier`, or nullptr when the tier has no room for a page.
  Result<Slab*> new_slab(const AllocRequest& request, uint32_t domain, Tier tier, uint32_t slot_bytes);
  Status free_in_slab(Allocation& a);
  // Takes or frees a slot (a slab whose page is lost takes no more).
  void mark_slot(Slab& slab, uint64_t page_offset, bool used);
  // The allocation the page belongs to: a whole one, or a slab's page.
  Allocation* owner_of_page(uint64_t page);
  // Where an allocation starts, in bytes of the node's range (its key).
  uint64_t start_of(const Allocation& a) const { return a.first_page * page_size() + a.page_offset; }

  // Finds the allocation holding `gva` (caller holds the lock).
  Result<Allocation*> locate(Gva gva) const;
  // locate(), and data_lost when some of the allocation's pages are lost.
  Result<Allocation*> locate_usable(Gva gva) const;
  Status not_allocated_error(Gva gva) const;
  AllocationInfo info_of(const Allocation& a) const;
  std::vector<Extent> extents_of(const Allocation& a) const;
  AllocationLayout layout_of(const Allocation& a) const;
  PageInfo page_info(uint64_t page) const;
  Result<uint32_t> assign_domain(const std::string& tenant, const TenantLimits& limits);
  Status open_domain_files(uint32_t domain, const TenantLimits& limits);
  // Opens a domain's files for `limit_pages` frames per tier.
  Status open_domain_frames(uint32_t domain, const std::array<uint64_t, 4>& limit_pages);
  // Takes `pages` frames of `tier` for `domain`; false when the tier, the
  // domain's files or its quota have no room.
  bool take_frames(Tier tier, uint32_t domain, uint64_t pages, std::vector<UnitRange>* frames);
  // Zeroes frames just taken and gives them storage (TierBackend::commit).
  // `overwritten`: the caller fills every byte before anyone reads them
  // (frames for pages moving here), so they are not cleared first.
  Status prepare_frames(Tier tier, const std::vector<UnitRange>& frames, bool overwritten = false);
  Status exhausted_error(const AllocRequest& request, uint64_t pages, const std::vector<Tier>& chain,
                         uint32_t domain) const;
  void set_pinned(const Allocation& a, bool pinned);
  // Gives a frame of this node back to its tier (clearing it); `domain` is
  // the one whose frames and quota it counts in.
  void release_local_frame(Tier tier, uint64_t frame_offset, uint32_t domain);
  void release_local_frames(Tier tier, const std::vector<UnitRange>& frames, uint32_t domain);
  // A new allocation of `request` on `tier`: a fresh generation, its
  // creation time; where it is (pages, slot) is the caller's to set.
  Allocation new_allocation(const AllocRequest& request, Tier tier);
  // Points a new allocation's pages at `frames` of `tier` (a new epoch each).
  void map_new_pages(const Allocation& a, Tier tier, const std::vector<UnitRange>& frames);
  Status copy(Gva gva, std::byte* buffer, size_t length, bool to_memory, MemoryAccess* elsewhere);
  uint64_t frame_pages_of(Tier tier, uint32_t domain, const TenantLimits& limits) const;
  // trim_tenant_files under m_mutex (shared or exclusive); what it cut goes
  // to m_trims. True when it gave storage back.
  bool trim_tenant_files_locked();

  NodeId m_node;
  mutable std::shared_mutex m_mutex;
  std::unique_ptr<MetadataStore> m_meta;  // durable metadata; null without
  RecoveryReport m_recovery;  // what this start found (SpaceRecovery)
  std::unique_ptr<VersionSegments> m_versions;
  PageTable m_table;
  std::array<TierState, 4> m_tiers;
  DomainTable m_domains;  // the tenants' domains
  FrameLoans m_loans;  // frames lent and borrowed
  uint32_t m_next_generation = 1;
  std::map<uint64_t, Allocation> m_allocations;  // by start (start_of)
  std::unordered_map<std::string, uint64_t> m_names;  // -> start
  uint64_t m_sub_page_max = 0;
  SlabSet m_slabs;  // the pages sub-page allocations share
  LocalVersionWords m_local_words;
  std::array<std::optional<BackendFrameData>, 4> m_local_frames;
  std::mutex m_trims_mutex;
  std::vector<FileTrim> m_trims;  // cut, not reported yet
};

}  // namespace tiermem
