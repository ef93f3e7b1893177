// RemoteNodes: endpoints and keys of other nodes (see remote_nodes.hpp).
#include "client/remote_nodes.hpp"

#include <cstdio>
#include <utility>

#include <tiermem/status_macros.h>

#include "convert.hpp"

namespace tiermem::detail {
namespace {

// How often a wait on another node asks the daemon whether that node is
// UNREACHABLE.
constexpr auto k_reachability_check = std::chrono::milliseconds(100);

// The fabric a transport address is of, as FabricChoice::name() says it.
std::string fabric_of(std::string_view address) {
  return is_ofi_address(address) ? "libfabric/" + ofi_provider_of(address) : "ucx";
}

Status unreachable(NodeId node, NodeId self, const std::string& detail) {
  return Status(ErrorCode::transport_error, "node " + std::to_string(node) + " is UNREACHABLE (as node " +
                                                std::to_string(self) + " sees it" +
                                                (detail.empty() ? std::string() : ": " + detail) + ")");
}

}  // namespace

RemoteNodes::RemoteNodes(ControlStub& daemon, NodeId self, std::function<void(NodeId)> restarted)
    : m_daemon(daemon), m_self(self), m_restarted(std::move(restarted)) {}

Status RemoteNodes::start_transport(NodeId node, std::string_view address) {
  const std::string fabric = fabric_of(address);
  if (m_transport) {
    if (fabric == m_fabric) return Status();
    return Status(ErrorCode::not_supported,
                  "node " + std::to_string(node) + "'s data plane runs over " + fabric + " and this client's over " +
                      m_fabric + " (the fabric of the first node it reached): a client has one transport, so this "
                      "node's memory goes through the daemon; a cluster uses one fabric on every node");
  }
  if (m_transport_status.ok()) {
    auto t = make_transport_for(address, {});
    if (t.ok()) {
      m_transport = std::move(t).value();
      m_fabric = fabric;
      // A peer this client waits on that its daemon already knows is
      // UNREACHABLE (a partition) fails the wait now, not at the timeout.
      m_transport->check_while_waiting([this](const Endpoint& ep) { return still_reachable(ep); },
                                       k_reachability_check);
      m_transport_ptr.store(m_transport.get(), std::memory_order_release);
      return Status();
    }
    m_transport_status = t.status();
  }
  return Status(ErrorCode::not_supported, "no data plane here: " + m_transport_status.message());
}

void RemoteNodes::on_fallback(std::function<void(NodeId, const Status&)> told) { m_on_fallback = std::move(told); }

Result<std::shared_ptr<RemoteState>> RemoteNodes::get(NodeId node, bool reconnect) {
  Status fell_back;
  Result<std::shared_ptr<RemoteState>> got = Status(ErrorCode::internal, "not reached");
  {
    std::lock_guard lock(m_mutex);
    got = get_locked(node, reconnect, &fell_back);
  }
  if (!fell_back.ok()) {
    m_fallbacks.fetch_add(1, std::memory_order_relaxed);
    if (m_on_fallback) {
      m_on_fallback(node, fell_back);
    } else {
      std::lock_guard told(m_told_mutex);
      if (!m_told[node]) {
        m_told[node] = true;
        std::fprintf(stderr, "libtiermem: warning: %s\n", fell_back.message().c_str());
      }
    }
  }
  return got;
}

Result<std::shared_ptr<RemoteState>> RemoteNodes::get_locked(NodeId node, bool reconnect, Status* fell_back) {
  if (auto it = m_nodes.find(node); it != m_nodes.end() && !reconnect) return it->second;
  // A transport that could not be made is not tried again (nor the daemon
  // asked about the node for it).
  if (!m_transport_status.ok()) {
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
  TIERMEM_ASSIGN_OR_RETURN(proto::NodeInfo n, m_daemon.describe(node, reconnect));
  if (n.state() == proto::NodeInfo::CONNECTED && n.transport_address().empty() && !reconnect && may_ask(node)) {
    // The daemon's description may lag the node's (a data plane made for
    // this tenant when it got a domain there): ask the node.
    TIERMEM_ASSIGN_OR_RETURN(n, m_daemon.describe(node, true));
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
    return unreachable(node, m_self, "");
  }
  // Made for the first node reached, on its fabric (all nodes share one).
  TIERMEM_RETURN_IF_ERROR(start_transport(node, n.transport_address()));
  auto connected = connect_remote_node(*m_transport, wire::advert_of(n));
  if (!connected.ok() && connected.status().code() != ErrorCode::not_supported) {
    // Not answering: the node may be down (the daemon's view lags a kill),
    // and then the caller turns to its copies. Only a node whose daemon
    // answers now has a plane that fails while it is up.
    auto fresh = m_daemon.describe(node, true);
    if (!fresh.ok() || fresh->state() != proto::NodeInfo::CONNECTED ||
        static_cast<NodeHealth>(fresh->health()) == NodeHealth::unreachable) {
      return connected.status().with_context("node " + std::to_string(node));
    }
  }
  if (!connected.ok()) {
    // A plane this client cannot use (libfabric shm and a daemon of another
    // user, a queue that fails its checks), or one that does not answer
    // while its node's daemon does (a flood at its listener): its memory
    // goes through the daemon, which is told, and the plane is tried again
    // after a while.
    m_no_plane[node] = now;
    *fell_back = Status(ErrorCode::not_supported,
                        "node " + std::to_string(node) + "'s data plane cannot be used (" +
                            connected.status().message() + "): its memory goes through the daemon");
    return *fell_back;
  }
  TIERMEM_ASSIGN_OR_RETURN(auto rn, std::move(connected));
  {
    std::lock_guard endpoints(m_endpoint_mutex);
    m_endpoint_nodes[rn->endpoint.get()] = node;
  }
  // Translations from before a restart of the node are void (those of the
  // incarnation it still runs stay: the first connection drops nothing).
  auto [known, first] = m_incarnations.try_emplace(node, n.incarnation());
  if (reconnect || (!first && known->second != n.incarnation())) m_restarted(node);
  known->second = n.incarnation();
  auto state = state_of(node, std::move(rn));
  m_nodes[node] = state;
  return state;
}

std::shared_ptr<RemoteState> RemoteNodes::state_of(NodeId node, std::shared_ptr<RemoteNode> rn) {
  auto state = std::make_shared<RemoteState>();
  state->node = std::move(rn);
  state->words = std::make_unique<RemoteVersionWords>(*m_transport, state->node, m_timeout);
  for (Tier t : k_tiers_fastest_first) {
    if (state->node->tiers[static_cast<size_t>(t)].empty()) continue;
    // Stores to another node's PMEM are made durable by its daemon.
    state->frames[static_cast<size_t>(t)] = std::make_unique<RemoteFrameData>(
        *m_transport, state->node, t, m_timeout, [this, node](Tier tier, uint64_t off, uint64_t len) {
          return m_daemon.persist_frames(node, tier, off, len);
        });
  }
  return state;
}

bool RemoteNodes::may_ask(NodeId node) {
  auto& last = m_asked[node];
  const auto now = std::chrono::steady_clock::now();
  if (last != std::chrono::steady_clock::time_point{} && now - last < k_forced_refresh) return false;
  last = now;
  return true;
}

Status RemoteNodes::refresh_keys(NodeId node) {
  std::lock_guard lock(m_mutex);
  auto it = m_nodes.find(node);
  if (it == m_nodes.end() || !m_transport) return Status(ErrorCode::not_supported, "not connected");
  const std::shared_ptr<RemoteNode> held = it->second->node;
  const auto newer = [&](const proto::NodeInfo& n) {
    return n.incarnation() == held->incarnation && n.regions_version() > held->regions_version;
  };
  // The local daemon's description first (a request it answers itself);
  // the node itself only when that is no newer, and not too often.
  TIERMEM_ASSIGN_OR_RETURN(proto::NodeInfo n, m_daemon.describe(node, false));
  if (!newer(n)) {
    if (!may_ask(node)) return Status(ErrorCode::not_supported, "node " + std::to_string(node) + " gave no newer keys");
    TIERMEM_ASSIGN_OR_RETURN(n, m_daemon.describe(node, true));
    if (!newer(n)) return Status(ErrorCode::not_supported, "node " + std::to_string(node) + " has no newer keys");
  }
  TIERMEM_ASSIGN_OR_RETURN(auto fresh, with_regions(*m_transport, *held, wire::advert_of(n).regions));
  fresh->regions_version = n.regions_version();
  it->second = state_of(node, std::move(fresh));
  m_epoch.fetch_add(1, std::memory_order_acq_rel);
  return Status();
}

Status RemoteNodes::still_reachable(const Endpoint& ep) {
  NodeId node = 0;
  {
    std::lock_guard lock(m_endpoint_mutex);
    auto it = m_endpoint_nodes.find(&ep);
    if (it == m_endpoint_nodes.end()) return Status();
    node = it->second;
  }
  auto n = m_daemon.describe(node);
  if (!n.ok()) return Status();  // the daemon cannot say: the fabric decides
  if (static_cast<NodeHealth>(n->health()) == NodeHealth::unreachable) {
    const Status s = unreachable(node, m_self, n->last_error());
    return Status(s.code(), s.message() + "; its operations were given up");
  }
  return Status();
}

void RemoteNodes::drop(NodeId node) {
  std::lock_guard lock(m_mutex);
  m_nodes.erase(node);
}

bool RemoteNodes::may_have_plane() const {
  std::lock_guard lock(m_mutex);
  return m_transport_status.ok();
}

uint64_t RemoteNodes::requests_sent() const {
  const Transport* t = transport();
  return t != nullptr ? t->requests_sent() : 0;
}

}  // namespace tiermem::detail
