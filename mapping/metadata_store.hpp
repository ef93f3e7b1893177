// Durable mapping metadata (H5): what a restarted daemon needs to rebuild its
// address space, kept in a PMDK libpmemobj pool (mapping/pmem_metadata.cpp).
//
//   - the geometry it was made for (node, page size, domains, pages per
//     domain, frames per tier): a pool of another geometry is refused;
//   - the next generation to hand out, so that a GVA freed before a crash is
//     still stale after it, and per domain the memory generation of its
//     shared memory (kept while that memory is re-adopted; a domain made
//     anew gets a new one, in a table beside the domains);
//   - per domain, its tenant and its frame limits;
//   - per persistent allocation, everything AllocationInfo shows and its page
//     entries, as runs of consecutive frames;
//   - per local frame lent to another node's page, the borrower;
//   - per allocation, where its copies are (or what it is a copy of) and its
//     default QoS class, in a
//     table beside the slots (added after the first layout: a pool made
//     before gets it at its next open).
//
// Every change is one transaction: it is on the pool, or not at all, when the
// call returns; a process killed inside one leaves the state before it (the
// pool's undo log is rolled back at the next open). AddressSpace calls these
// under its exclusive lock, after it checked the change and before it makes
// it visible, so nothing is acknowledged that is not recorded.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>
#include <tiermem/types.h>

#include "mapping/allocation_policy.hpp"

namespace tiermem {

// Consecutive pages of an allocation on consecutive frames of one tier of one
// node, with the same page flags.
struct RunRecord {
  uint64_t frame_offset = 0;  // of the first page's frame
  uint64_t pages = 0;
  NodeId node = 0;
  Tier tier = Tier::automatic;
  uint8_t flags = 0;  // PageEntry::flags
  uint64_t memory_generation = 0;  // of the lender's domain that lent the frames (runs on other nodes)
};

// Sub-page allocations (M10): a page shared by small allocations is a slab,
// recorded with its page entry like a one-page allocation; each allocation in
// it is a record of its own with its offset in the page and no runs (it is
// where its slab is).
enum class RecordKind : uint8_t { whole = 0, slab = 1, sub = 2 };

struct AllocationRecord {
  RecordKind kind = RecordKind::whole;
  uint64_t page_offset = 0;  // sub: where it starts in its slab's page
  uint32_t slot_bytes = 0;   // slab, sub: the size class
  uint64_t first_page = 0;
  uint64_t pages = 0;
  uint64_t size = 0;
  uint32_t generation = 0;
  Tier tier = Tier::automatic;
  bool coherent = false;
  uint32_t owner_uid = 0;
  uint64_t created_unix_ms = 0;
  uint64_t lost_pages = 0;
  uint64_t torn_pages = 0;
  std::string tenant;  // at most 63 bytes
  std::string name;    // at most 255 bytes
  std::vector<RunRecord> runs;  // in page order, covering every page
  AllocationPolicy policy;  // its copies, or what this copy copies; its QoS class
};

struct DomainRecord {
  uint32_t domain = 0;
  std::string tenant;
  std::array<uint64_t, 4> limit_pages{};  // frames it may use per tier (Tier index)
};

// A local frame lent to a page of another node.
struct LentRecord {
  Tier tier = Tier::automatic;
  uint64_t frame = 0;  // frame number (offset / page size)
  NodeId borrower = 0;
  uint32_t domain = 0;  // whose quota it counts against
};

struct MetadataGeometry {
  NodeId node = 0;
  uint64_t page_size = 0;
  uint32_t domains = 0;
  uint64_t pages_per_domain = 0;
  std::array<uint64_t, 4> tier_frames{};  // frame numbers per tier, over all its domains (0: no such tier)
};

// What the pool held when it was opened.
struct MetadataImage {
  bool created = false;  // a new pool: nothing to recover
  uint32_t next_generation = 0;
  // Per domain (indexed by domain), the memory generation of its shared
  // memory as last recorded; 0: none.
  std::vector<uint64_t> memory_generations;
  uint64_t starts = 0;  // daemon starts on this pool, this one included
  std::vector<DomainRecord> domains;
  std::vector<AllocationRecord> allocations;
  std::vector<LentRecord> lent;
};

class MetadataStore {
 public:
  virtual ~MetadataStore() = default;

  // What was on the pool at open (the caller rebuilds from it once).
  virtual const MetadataImage& image() const = 0;
  // Where the records are, for logs and status.
  virtual std::string describe() const = 0;

  virtual Status put_domain(const DomainRecord& domain) = 0;
  // Records a new allocation, or replaces the record of the one at the same
  // place (first page, offset in it and kind: page entries changed by
  // migration, torn or lost pages), with the generation counter. Errors:
  // tier_exhausted (the pool's table is full), io_error.
  virtual Status put_allocation(const AllocationRecord& a, uint32_t next_generation) = 0;
  virtual Status erase_allocation(uint64_t first_page, uint64_t page_offset = 0,
                                  RecordKind kind = RecordKind::whole) = 0;
  // Records frames of `tier` as lent to `borrower` (0: given back).
  virtual Status set_lent(Tier tier, const std::vector<uint64_t>& frames, NodeId borrower, uint32_t domain) = 0;
  // Records the memory generation of every domain (indexed by domain).
  virtual Status set_memory_generations(const std::vector<uint64_t>& generations) = 0;
};

struct MetadataOptions {
  std::string path;               // the pool file
  uint64_t pool_bytes = 0;        // of a new pool; 0: enough for max_allocations
  uint64_t max_allocations = 65536;
};

// Opens the pool at options.path, or creates it when there is none.
// Errors: config_error (the pool was made for another geometry: says which
// field, and that moving the pool away loses its allocations), io_error
// (PMDK's message: not a pool, corrupt, no room).
Result<std::unique_ptr<MetadataStore>> open_pmem_metadata(const MetadataOptions& options,
                                                          const MetadataGeometry& geometry);

}  // namespace tiermem
