// A home's writes into its copies through the data plane (H2): the bytes go
// one-sided (one message on the message path) into the copy's frames on its
// node, under the copy's page seqlock, instead of as a control-plane write
// request to the copy's daemon, whose bytes were copied five times on the
// way (a replicated 1 MiB write: 2.3 ms, now 1.3 ms here). A small write
// gains nothing: on either path the home waits for the copy's daemon to
// answer, and that wait is most of it.
//
// The copy's translation (its extents and page versions, asked of its node
// as its home once) is cached here; a copy that moved, was freed or whose
// node restarted is seen as a stale translation or another incarnation, and
// asked again. The copy's frames never move while it lives (a copy is never
// demoted), so the cache is rarely asked again.
//
// Thread-safety: any method from any thread at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <tiermem/status.h>
#include <tiermem/types.h>

#include "daemon/config.hpp"
#include "daemon/tenants.hpp"

namespace tiermem {

class DataPlane;
class PeerManager;

class CopyWriter {
 public:
  // Every reference must outlive the writer; `plane` null: no data plane,
  // every write is not_supported.
  CopyWriter(PeerManager& peers, const DataPlane* plane, const DaemonConfig& config, uint64_t page_size);

  // Writes `length` bytes into the copy `copy` at `offset` from its base.
  // Errors: the copy's node's answer to its translation (not_allocated: the
  // copy is gone), the transport's (the node unreachable), and
  // not_supported where the data plane cannot reach the copy: the caller
  // then writes through the copy's daemon.
  Status write(const ReplicaInfo& copy, uint64_t offset, const void* data, size_t length, const Identity& who);

 private:
  struct Layout {
    uint64_t incarnation = 0;  // of the copy's node when it answered
    uint64_t first_page = 0;
    uint64_t size = 0;
    std::vector<Extent> extents;
    std::vector<uint64_t> page_versions;
  };
  using Key = std::pair<NodeId, uint64_t>;  // the copy's node and offset
  Result<std::shared_ptr<const Layout>> layout(const ReplicaInfo& copy, const Identity& who, bool fresh);
  Status write_once(const ReplicaInfo& copy, const Layout& l, uint64_t offset, const void* data, size_t length);

  PeerManager& m_peers;
  const DataPlane* m_plane;
  const DaemonConfig& m_config;
  const uint64_t m_page_size;
  std::mutex m_mutex;
  std::map<Key, std::shared_ptr<const Layout>> m_layouts;
};

}  // namespace tiermem
