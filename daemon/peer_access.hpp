// The daemon's way to other nodes' memory for one operation (a copy, an
// atomic, a page migration): one-sided through the transport, with
// persistence of remote PMEM writes asked of the owning daemon.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "daemon/peer_manager.hpp"
#include "mapping/seqlock_copy.hpp"

namespace tiermem {

// Keeps what it hands out alive until it is destroyed; use one per operation.
class PeerAccess final : public MemoryAccess {
 public:
  PeerAccess(PeerManager* peers, Transport* transport, std::chrono::milliseconds timeout)
      : m_peers(peers), m_transport(transport), m_timeout(timeout) {}

  Result<VersionWords*> versions(NodeId home) override;
  Result<FrameData*> frames(NodeId node, Tier tier) override;

 private:
  Result<std::shared_ptr<RemoteNode>> node(NodeId id);

  PeerManager* m_peers;
  Transport* m_transport;
  std::chrono::milliseconds m_timeout;
  std::vector<std::unique_ptr<VersionWords>> m_words;
  std::vector<std::unique_ptr<FrameData>> m_frames;
};

}  // namespace tiermem
