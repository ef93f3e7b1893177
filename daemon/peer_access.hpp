// The daemon's way to other nodes' memory for one operation (a copy, an
// atomic, a page migration): one-sided through the transport, with
// persistence of remote PMEM writes asked of the owning daemon.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "daemon/config.hpp"
#include "daemon/peer_manager.hpp"
#include "pages/seqlock_copy.hpp"

namespace tiermem {

class DataPlane;

// Keeps what it hands out alive until it is destroyed; use one per operation.
class PeerAccess final : public MemoryAccess {
 public:
  PeerAccess(PeerManager* peers, Transport* transport, std::chrono::milliseconds timeout)
      : m_peers(peers), m_transport(transport), m_timeout(timeout) {}
  // A daemon's: through its data plane's transport (`plane` null: a daemon
  // alone, which reaches no other node), each wait at most
  // transport.timeout_ms of `config`.
  PeerAccess(PeerManager* peers, const DataPlane* plane, const DaemonConfig& config);

  Result<VersionWords*> versions(NodeId home, uint64_t first_page) override;
  Result<FrameData*> frames(NodeId node, Tier tier) override;
  // Errors: unavailable when what was handed out for `node` (or would be
  // now) is not of daemon incarnation `incarnation` (it restarted).
  Status expect_incarnation(NodeId node, uint64_t incarnation);
  // Makes sure the keys of `node`'s frames [offset, offset+length) of
  // `tier` are known (fetching the node's regions when a tenant's domain is
  // newer than what we knew). Call before frames().
  Status ensure_frames(NodeId node, Tier tier, uint64_t offset, uint64_t length);

 private:
  Result<std::shared_ptr<RemoteNode>> node(NodeId id);

  PeerManager* m_peers;
  Transport* m_transport;
  std::chrono::milliseconds m_timeout;
  std::vector<std::unique_ptr<VersionWords>> m_words;
  std::vector<std::unique_ptr<FrameData>> m_frames;
  std::map<NodeId, std::shared_ptr<RemoteNode>> m_nodes;  // one incarnation per node for the whole operation
};

}  // namespace tiermem
