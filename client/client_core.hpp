// The state behind a Client (internal): the control connection, the tier
// regions and version array mapped into this process, and the cache of
// allocation layouts that lets reads and writes go straight to memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include <tiermem/client.h>

#include "client/connection.hpp"
#include "common/shared_memory.hpp"
#include "common/unique_fd.hpp"

namespace tiermem::detail {

// A translation cached by the client: valid while every page's epoch in the
// version array still equals the one recorded here.
struct CachedAllocation {
  Gva base;  // carries the generation
  uint64_t size = 0;
  Tier tier = Tier::automatic;
  uint64_t first_page = 0;
  std::vector<Extent> extents;
  std::vector<uint64_t> page_versions;
};

struct LocalRegion {
  UniqueFd fd;
  MappedRegion map;
  bool persistent = false;
};

class ClientCore {
 public:
  static Result<std::shared_ptr<ClientCore>> connect(const ClientOptions& options);

  Connection& connection() { return *m_connection; }
  NodeId node() const { return static_cast<NodeId>(m_connection->hello().node_id()); }
  uint64_t page_size() const { return m_connection->hello().page_size(); }

  Status write(Gva gva, const void* src, size_t length);
  Status read(Gva gva, void* dst, size_t length);
  // Drops a cached translation (after free).
  void forget(Gva gva);

  // The descriptor of a local tier region, or -1 (maps it on first use).
  Result<int> region_fd(Tier tier);
  bool region_persistent(Tier tier) const;

 private:
  explicit ClientCore(std::unique_ptr<Connection> connection, bool direct)
      : m_connection(std::move(connection)), m_direct(direct) {}

  Status open_regions();
  Result<std::shared_ptr<const CachedAllocation>> cached(Gva gva, bool refresh);
  // Copies one stretch through the mapped tier; not_found means "the cached
  // translation went stale: refresh and retry".
  Status copy_direct(const CachedAllocation& a, uint64_t offset, std::byte* buf, size_t length,
                     bool to_memory);
  // One physically contiguous stretch of a copy (see copy_direct).
  struct Run {
    const CachedAllocation& alloc;
    uint64_t offset;   // from the allocation's base
    size_t length;
    std::byte* memory; // in the mapped tier region
    std::byte* buffer; // the caller's
  };
  Status write_run(const Run& run, bool persistent);
  Status read_run(const Run& run);
  Status copy_rpc(Gva gva, std::byte* buf, size_t length, bool to_memory);
  Status copy(Gva gva, std::byte* buf, size_t length, bool to_memory);
  bool can_copy_direct(const CachedAllocation& a) const;
  void mark_written(uint64_t page, uint64_t offset, uint64_t length, bool dirty);

  std::unique_ptr<Connection> m_connection;
  bool m_direct;

  std::once_flag m_regions_once;
  Status m_regions_status;
  MappedRegion m_versions;
  MappedRegion m_sub_blocks;  // L3 bits, set on direct writes
  LocalRegion m_regions[4];  // by Tier

  std::shared_mutex m_cache_mutex;
  std::map<uint64_t, std::shared_ptr<const CachedAllocation>> m_cache;  // by base offset
};

}  // namespace tiermem::detail
