#include "daemon/peer_access.hpp"

#include <tiermem/status_macros.h>

#include "convert.hpp"

namespace tiermem {

Result<std::shared_ptr<RemoteNode>> PeerAccess::node(NodeId id) {
  if (m_peers == nullptr || m_transport == nullptr) {
    return Status(ErrorCode::not_supported, "node " + std::to_string(id) + " is unknown: this daemon runs alone");
  }
  return m_peers->remote(id);
}

Result<VersionWords*> PeerAccess::versions(NodeId home) {
  TIERMEM_ASSIGN_OR_RETURN(auto n, node(home));
  m_words.push_back(std::make_unique<RemoteVersionWords>(*m_transport, n, m_timeout));
  return m_words.back().get();
}

Result<FrameData*> PeerAccess::frames(NodeId id, Tier tier) {
  TIERMEM_ASSIGN_OR_RETURN(auto n, node(id));
  PeerManager* peers = m_peers;
  m_frames.push_back(std::make_unique<RemoteFrameData>(
      *m_transport, n, tier, m_timeout, [peers, id](Tier t, uint64_t offset, uint64_t length) {
        proto::Request request;
        auto* p = request.mutable_persist_frames();
        p->set_tier(wire::to_proto(t));
        p->set_frame_offset(offset);
        p->set_length(length);
        return peers->call(id, request).status();
      }));
  return m_frames.back().get();
}

}  // namespace tiermem
