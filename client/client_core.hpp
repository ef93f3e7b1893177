// The state behind a Client (internal): the control connection, this node's
// tier regions and version array mapped into this process, the data plane to
// other nodes, and the cache of allocation layouts that lets reads, writes and
// atomics go straight to memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <vector>

#include <tiermem/client.h>

#include "common/shared_memory.hpp"
#include "common/unique_fd.hpp"
#include "mapping/seqlock_copy.hpp"
#include "rpc_connection.hpp"
#include "access/remote_memory.hpp"

namespace tiermem::detail {

// A translation cached by the client: valid while every page's epoch in the
// home node's version array still equals the one recorded here.
struct CachedAllocation {
  Gva base;  // carries the generation
  uint64_t size = 0;
  uint64_t first_page = 0;
  bool coherent = false;
  std::vector<Extent> extents;
  std::vector<uint64_t> page_versions;
};

struct LocalRegion {
  UniqueFd fd;
  MappedRegion map;
  bool persistent = false;
};

// What reaches one other node one-sided; replaced when the node restarts.
struct RemoteState {
  std::shared_ptr<RemoteNode> node;
  std::unique_ptr<RemoteVersionWords> words;
  std::array<std::unique_ptr<RemoteFrameData>, 4> frames;
};

class ClientCore {
 public:
  static Result<std::shared_ptr<ClientCore>> connect(const ClientOptions& options);

  // A request to the local daemon (which forwards what is for other nodes).
  Result<proto::Response> call(proto::Request& request, std::vector<UniqueFd>* fds = nullptr) {
    return m_connection->call(request, fds);
  }
  NodeId node() const { return static_cast<NodeId>(m_hello.node_id()); }
  uint64_t page_size() const { return m_hello.page_size(); }

  Status write(Gva gva, const void* src, size_t length);
  Status read(Gva gva, void* dst, size_t length);
  Result<uint64_t> atomic(Gva gva, WordOp op, uint64_t operand, uint64_t compare);
  AccessCounters counters() const;
  // Drops a cached translation (after free or migration).
  void forget(Gva gva);

  // The descriptor of a local tier region, or -1 (maps it on first use).
  Result<int> region_fd(Tier tier);
  bool region_persistent(Tier tier) const;

  // Accessors for copy_through_layout (see ClientAccess in the .cpp).
  Result<VersionWords*> local_versions();
  Result<FrameData*> local_frames(Tier tier);
  Result<std::shared_ptr<RemoteState>> remote(NodeId node);
  // Forgets how to reach `node` (after a transport failure); the next access
  // asks the daemon again.
  void drop_remote(NodeId node);

 private:
  ClientCore(std::unique_ptr<RpcConnection> connection, proto::HelloResponse hello, bool direct)
      : m_connection(std::move(connection)), m_hello(std::move(hello)), m_direct(direct) {}

  Status open_regions();
  Result<std::shared_ptr<const CachedAllocation>> cached(Gva gva, bool refresh);
  void forget_node(NodeId node);
  Status copy(Gva gva, std::byte* buf, size_t length, bool to_memory);
  Status copy_rpc(Gva gva, std::byte* buf, size_t length, bool to_memory);
  Result<uint64_t> atomic_rpc(Gva gva, WordOp op, uint64_t operand, uint64_t compare);
  Status persist_remote(NodeId node, Tier tier, uint64_t frame_offset, uint64_t length);

  std::unique_ptr<RpcConnection> m_connection;
  proto::HelloResponse m_hello;
  bool m_direct;

  std::once_flag m_regions_once;
  Status m_regions_status;
  MappedRegion m_versions;
  MappedRegion m_sub_blocks;  // L3 bits, set on direct writes
  LocalRegion m_regions[4];   // by Tier
  std::optional<LocalVersionWords> m_local_words;
  std::optional<MappedFrameData> m_local_frames[4];

  std::mutex m_remote_mutex;
  std::unique_ptr<Transport> m_transport;
  Status m_transport_status;
  std::map<NodeId, std::shared_ptr<RemoteState>> m_remote;

  // Successful operations by path (access_counters()).
  std::atomic<uint64_t> m_direct_local{0}, m_direct_remote{0}, m_through_daemon{0};

  std::shared_mutex m_cache_mutex;
  std::map<std::pair<NodeId, uint64_t>, std::shared_ptr<const CachedAllocation>> m_cache;
};

}  // namespace tiermem::detail
