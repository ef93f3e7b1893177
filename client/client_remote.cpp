// ClientCore's reach into other nodes (client_core.hpp): the data plane's
// endpoints and keys per node (RemoteNodes), and the daemons of this host
// whose memory is mapped instead.
#include <algorithm>
#include <chrono>
#include <utility>

#include <tiermem/status_macros.h>

#include "client/client_core.hpp"

namespace tiermem::detail {
// --- other nodes ---------------------------------------------------------------------

Result<std::shared_ptr<RemoteState>> ClientCore::remote(NodeId node, bool reconnect) {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  return m_nodes.get(node, reconnect);
}

void ClientCore::drop_remote(NodeId node) {
  {
    std::lock_guard lock(m_sibling_mutex);
    m_siblings.erase(node);
  }
  m_nodes.drop(node);
}

// --- daemons of this host ------------------------------------------------------------

Result<std::shared_ptr<SiblingNode>> ClientCore::sibling(NodeId node) {
  if (!m_direct || !m_map_same_host || m_hello.host_id().empty()) {
    return Status(ErrorCode::not_supported, "same-host mapping is off");
  }
  std::lock_guard lock(m_sibling_mutex);
  if (auto it = m_siblings.find(node); it != m_siblings.end()) {
    const std::shared_ptr<SiblingNode>& s = it->second;
    if (!s->on_host) return Status(ErrorCode::not_supported, "node " + std::to_string(node) + " is on another host");
    if (!s->lost.load(std::memory_order_acquire) && !s->regions->daemon_died()) return s;
    m_siblings.erase(it);  // its daemon went: ask again
  }
  auto described = m_stub.describe(node);
  if (!described.ok() && described.status().code() == ErrorCode::bad_gva) {
    return Status(ErrorCode::not_supported, "node " + std::to_string(node) + " is not in this daemon's cluster");
  }
  TIERMEM_RETURN_IF_ERROR(described.status());
  if (described->host_id() != m_hello.host_id() || described->socket_path().empty()) {
    auto elsewhere = std::make_shared<SiblingNode>();
    elsewhere->node = node;
    m_siblings[node] = elsewhere;
    return Status(ErrorCode::not_supported, "node " + std::to_string(node) + " is on another host");
  }
  auto s = open_sibling(*described);
  // Not cached when it fails (a daemon restarting, a socket this user may
  // not open): the data plane serves meanwhile, and the next translation
  // tries again.
  if (s.ok()) m_siblings[node] = *s;
  return s;
}

Result<std::shared_ptr<SiblingNode>> ClientCore::open_sibling(const proto::NodeInfo& info) {
  auto s = std::make_shared<SiblingNode>();
  s->node = static_cast<NodeId>(info.node_id());
  s->on_host = true;
  TIERMEM_ASSIGN_OR_RETURN(s->connection, RpcConnection::connect_unix(info.socket_path()));
  s->connection->set_timeout(m_nodes.timeout());
  ControlStub sibling = ControlStub::over(*s->connection);
  const HelloArgs hello{m_client_name + " (maps node " + std::to_string(info.node_id()) + ")", 0, m_client_id, {}};
  TIERMEM_ASSIGN_OR_RETURN(s->hello, sibling.hello(hello));
  // The socket must be that node's, serving the incarnation its peers know.
  if (s->hello.node_id() != info.node_id() || s->hello.incarnation() != info.incarnation() ||
      s->hello.host_id() != m_hello.host_id()) {
    return Status(ErrorCode::not_supported, "the daemon at " + info.socket_path() + " is not node " +
                                                std::to_string(info.node_id()) + " as its peers know it");
  }
  std::vector<UniqueFd> fds;
  TIERMEM_ASSIGN_OR_RETURN(auto regions, sibling.open_regions(&fds));
  s->regions = std::make_unique<NodeRegions>(s->hello, info.socket_path(), &s->lost, /*sibling=*/true);
  TIERMEM_RETURN_IF_ERROR(s->regions->map(regions, fds));
  return s;
}

}  // namespace tiermem::detail
