#include "daemon/peer_access.hpp"

#include <tiermem/status_macros.h>

#include "convert.hpp"
#include "daemon/data_plane.hpp"

namespace tiermem {

PeerAccess::PeerAccess(PeerManager* peers, const DataPlane* plane, const DaemonConfig& config)
    : PeerAccess(peers, transport_of(plane), std::chrono::milliseconds(config.transport_timeout_ms)) {}

Result<std::shared_ptr<RemoteNode>> PeerAccess::node(NodeId id) {
  if (m_peers == nullptr || m_transport == nullptr) {
    return Status(ErrorCode::not_supported, "node " + std::to_string(id) + " is unknown: this daemon runs alone");
  }
  if (auto it = m_nodes.find(id); it != m_nodes.end()) return it->second;
  TIERMEM_ASSIGN_OR_RETURN(auto remote, m_peers->remote(id));
  m_nodes.emplace(id, remote);
  return remote;
}

Status PeerAccess::ensure_frames(NodeId id, Tier tier, uint64_t offset, uint64_t length) {
  TIERMEM_ASSIGN_OR_RETURN(auto remote, node(id));
  const RemoteRegion* r = remote->frame_region(tier, offset, length);
  if (r != nullptr && r->key) return Status();
  TIERMEM_RETURN_IF_ERROR(m_peers->refresh(id));
  TIERMEM_ASSIGN_OR_RETURN(auto fresh, m_peers->remote(id));
  if (fresh->incarnation != remote->incarnation) {
    return Status(ErrorCode::unavailable, "node " + std::to_string(id) + " restarted");
  }
  m_nodes[id] = fresh;
  return Status();
}

Status PeerAccess::expect_incarnation(NodeId id, uint64_t incarnation) {
  TIERMEM_ASSIGN_OR_RETURN(auto remote, node(id));
  if (remote->incarnation == incarnation) return Status();
  return Status(ErrorCode::unavailable, "node " + std::to_string(id) + " restarted since it lent the frame");
}

Result<VersionWords*> PeerAccess::versions(NodeId home, uint64_t) {
  TIERMEM_ASSIGN_OR_RETURN(auto n, node(home));
  m_words.push_back(std::make_unique<RemoteVersionWords>(*m_transport, n, m_timeout));
  return m_words.back().get();
}

Result<FrameData*> PeerAccess::frames(NodeId id, Tier tier) {
  TIERMEM_ASSIGN_OR_RETURN(auto n, node(id));
  PeerManager* peers = m_peers;
  m_frames.push_back(std::make_unique<RemoteFrameData>(
      *m_transport, n, tier, m_timeout, [peers, id](Tier t, uint64_t offset, uint64_t length) {
        // The daemon's own, for a page it holds the lock of.
        return peers->own_stub(id).persist_frames(0, t, offset, length);
      }));
  return m_frames.back().get();
}

}  // namespace tiermem
