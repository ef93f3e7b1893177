// ClientCore's reach into other nodes (client_core.hpp): the data plane's
// endpoints and keys per node (connected on first use, keys refreshed on the
// same endpoint when the node's regions grew), the daemons of this host whose
// memory is mapped instead, and whether a node is still reachable while a
// wait is on it.
#include <algorithm>
#include <chrono>
#include <utility>

#include <tiermem/status_macros.h>

#include "client/client_core.hpp"
#include "convert.hpp"

namespace tiermem::detail {
namespace {

// How often a wait on another node asks the daemon whether that node is
// UNREACHABLE.
constexpr auto k_reachability_check = std::chrono::milliseconds(100);

}  // namespace

// --- other nodes ---------------------------------------------------------------------

Result<std::shared_ptr<RemoteState>> ClientCore::remote(NodeId node, bool reconnect) {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  std::lock_guard lock(m_remote_mutex);
  if (auto it = m_remote.find(node); it != m_remote.end() && !reconnect) return it->second;
  if (!m_transport && m_transport_status.ok()) {
    auto t = make_ucx_transport({});
    if (t.ok()) {
      m_transport = std::move(t).value();
      // A peer this client waits on that its daemon already knows is
      // UNREACHABLE (a partition) fails the wait now, not at the timeout.
      m_transport->check_while_waiting([this](const Endpoint& ep) { return still_reachable(ep); },
                                       k_reachability_check);
    } else {
      m_transport_status = t.status();
    }
  }
  if (!m_transport) {
    return Status(ErrorCode::not_supported, "no data plane here: " + m_transport_status.message());
  }
  const auto no_plane = [&] {
    // Up, but no data plane for this tenant there: not a failure, a route.
    return Status(ErrorCode::not_supported, "node " + std::to_string(node) +
                                                " offers this client's tenant no data plane (its daemon gave no "
                                                "transport address): its memory goes through the daemon");
  };
  const auto now = std::chrono::steady_clock::now();
  if (auto it = m_no_plane.find(node); it != m_no_plane.end() && !reconnect) {
    if (now - it->second < k_forced_refresh) return no_plane();  // asked a moment ago
    m_no_plane.erase(it);
  }
  TIERMEM_ASSIGN_OR_RETURN(proto::NodeInfo n, node_info(node, reconnect));
  if (n.state() == proto::NodeInfo::CONNECTED && n.transport_address().empty() && !reconnect && may_ask(node)) {
    // The daemon's description may lag the node's (a data plane made for
    // this tenant when it got a domain there): ask the node.
    TIERMEM_ASSIGN_OR_RETURN(n, node_info(node, true));
  }
  if (n.state() != proto::NodeInfo::CONNECTED) {
    return Status(ErrorCode::transport_error, "node " + std::to_string(node) + " is " +
                                                  std::string(node_state_name(static_cast<NodeState>(n.state()))) +
                                                  (n.last_error().empty() ? "" : ": " + n.last_error()));
  }
  if (n.transport_address().empty()) {
    m_no_plane[node] = now;  // not asked again for a while: its memory goes through the daemon
    return no_plane();
  }
  if (static_cast<NodeHealth>(n.health()) == NodeHealth::unreachable) {
    // Connected as far as TCP knows, but not answering (a partition).
    return Status(ErrorCode::transport_error, "node " + std::to_string(node) + " is UNREACHABLE (as node " +
                                                  std::to_string(this->node()) + " sees it)");
  }
  TIERMEM_ASSIGN_OR_RETURN(auto rn, connect_remote_node(*m_transport, wire::advert_of(n)));
  {
    std::lock_guard endpoints(m_endpoint_mutex);
    m_endpoint_nodes[rn->endpoint.get()] = node;
  }
  // Translations from before a restart of the node are void (those of the
  // incarnation it still runs stay: the first connection drops nothing).
  auto [known, first] = m_incarnations.try_emplace(node, n.incarnation());
  if (reconnect || (!first && known->second != n.incarnation())) forget_node(node);
  known->second = n.incarnation();
  auto state = remote_state(node, std::move(rn));
  m_remote[node] = state;
  return state;
}

std::shared_ptr<RemoteState> ClientCore::remote_state(NodeId node, std::shared_ptr<RemoteNode> rn) {
  auto state = std::make_shared<RemoteState>();
  state->node = std::move(rn);
  state->words = std::make_unique<RemoteVersionWords>(*m_transport, state->node, m_remote_timeout);
  for (Tier t : k_tiers_fastest_first) {
    if (state->node->tiers[static_cast<size_t>(t)].empty()) continue;
    state->frames[static_cast<size_t>(t)] = std::make_unique<RemoteFrameData>(
        *m_transport, state->node, t, m_remote_timeout,
        [this, node](Tier tier, uint64_t off, uint64_t len) { return persist_remote(node, tier, off, len); });
  }
  return state;
}

Result<proto::NodeInfo> ClientCore::node_info(NodeId node, bool ask_node) { return m_stub.describe(node, ask_node); }

bool ClientCore::may_ask(NodeId node) {
  auto& last = m_forced_refresh[node];
  const auto now = std::chrono::steady_clock::now();
  if (last != std::chrono::steady_clock::time_point{} && now - last < k_forced_refresh) return false;
  last = now;
  return true;
}

Status ClientCore::refresh_keys(NodeId node) {
  std::lock_guard lock(m_remote_mutex);
  auto it = m_remote.find(node);
  if (it == m_remote.end() || !m_transport) return Status(ErrorCode::not_supported, "not connected");
  const std::shared_ptr<RemoteNode> held = it->second->node;
  const auto newer = [&](const proto::NodeInfo& n) {
    return n.incarnation() == held->incarnation && n.regions_version() > held->regions_version;
  };
  // The local daemon's description first (a request it answers itself);
  // the node itself only when that is no newer, and not too often.
  TIERMEM_ASSIGN_OR_RETURN(proto::NodeInfo n, node_info(node, false));
  if (!newer(n)) {
    if (!may_ask(node)) return Status(ErrorCode::not_supported, "node " + std::to_string(node) + " gave no newer keys");
    TIERMEM_ASSIGN_OR_RETURN(n, node_info(node, true));
    if (!newer(n)) return Status(ErrorCode::not_supported, "node " + std::to_string(node) + " has no newer keys");
  }
  TIERMEM_ASSIGN_OR_RETURN(auto fresh, with_regions(*m_transport, *held, wire::advert_of(n).regions));
  fresh->regions_version = n.regions_version();
  it->second = remote_state(node, std::move(fresh));
  m_routes_epoch.fetch_add(1, std::memory_order_acq_rel);
  return Status();
}

Status ClientCore::still_reachable(const Endpoint& ep) {
  NodeId node = 0;
  {
    std::lock_guard lock(m_endpoint_mutex);
    auto it = m_endpoint_nodes.find(&ep);
    if (it == m_endpoint_nodes.end()) return Status();
    node = it->second;
  }
  auto n = m_stub.describe(node);
  if (!n.ok()) return Status();  // the daemon cannot say: the fabric decides
  if (static_cast<NodeHealth>(n->health()) == NodeHealth::unreachable) {
    return Status(ErrorCode::transport_error,
                  "node " + std::to_string(node) + " is UNREACHABLE (as node " + std::to_string(this->node()) +
                      " sees it" + (n->last_error().empty() ? std::string() : ": " + n->last_error()) +
                      "); its operations were given up");
  }
  return Status();
}

void ClientCore::drop_remote(NodeId node) {
  {
    std::lock_guard lock(m_sibling_mutex);
    m_siblings.erase(node);
  }
  std::lock_guard lock(m_remote_mutex);
  m_remote.erase(node);
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
  s->connection->set_timeout(m_remote_timeout);
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

Status ClientCore::persist_remote(NodeId node, Tier tier, uint64_t frame_offset, uint64_t length) {
  return m_stub.persist_frames(node, tier, frame_offset, length);
}

}  // namespace tiermem::detail
