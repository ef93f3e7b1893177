#include "daemon/peer_manager.hpp"

#include <chrono>

#include <spdlog/spdlog.h>

#include <tiermem/status_macros.h>

#include "convert.hpp"

namespace tiermem {
namespace {

uint64_t now_unix_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

std::vector<RegionAdvert> adverts(const proto::NodeInfo& info) {
  std::vector<RegionAdvert> out;
  for (const proto::RegionKey& k : info.regions()) {
    out.push_back({k.kind() == proto::Region::VERSIONS, wire::from_proto(k.tier()), k.base(), k.length(),
                   k.packed_key(), k.persistent()});
  }
  return out;
}

}  // namespace

PeerManager::PeerManager(PeerOptions options, proto::NodeInfo self, Transport* transport)
    : m_options(std::move(options)), m_self(std::move(self)), m_transport(transport) {
  m_self.set_state(proto::NodeInfo::SELF);
  m_self.set_state_since_ms(now_unix_ms());
  for (const ClusterMember& m : m_options.members) {
    if (m.id == m_options.self) continue;
    Peer p;
    p.member = m;
    p.info.set_node_id(m.id);
    p.info.set_control_address(m.control);
    p.since_ms = now_unix_ms();
    m_peers.emplace(m.id, std::move(p));
  }
}

PeerManager::~PeerManager() { stop(); }

void PeerManager::start() {
  m_thread = std::thread([this] { run(); });
}

void PeerManager::stop() {
  {
    std::lock_guard lock(m_mutex);
    m_stop = true;
  }
  m_wake.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

PeerManager::Peer* PeerManager::find(NodeId node) {
  auto it = m_peers.find(node);
  return it == m_peers.end() ? nullptr : &it->second;
}

const PeerManager::Peer* PeerManager::find(NodeId node) const {
  auto it = m_peers.find(node);
  return it == m_peers.end() ? nullptr : &it->second;
}

bool PeerManager::knows(NodeId node) const {
  std::lock_guard lock(m_mutex);
  return node == m_options.self || find(node) != nullptr;
}

void PeerManager::mark(Peer& peer, NodeState state, const std::string& error) {
  if (peer.state != state) {
    if (state == NodeState::connected) {
      spdlog::info("peer node {} at {} connected (incarnation {:x}, data plane: {})", peer.member.id,
                   peer.member.control, peer.info.incarnation(), peer.info.transports());
    } else if (peer.state == NodeState::connected) {
      spdlog::warn("peer node {} at {} is down: {}", peer.member.id, peer.member.control, error);
    }
    peer.since_ms = now_unix_ms();
  }
  peer.state = state;
  peer.last_error = error;
  if (state != NodeState::connected) {
    peer.connection.reset();
    peer.remote.reset();
    peer.idle.clear();
  }
}

// Connects, says hello and sets up the data plane to one peer. Called by the
// background thread without the lock held during I/O.
Result<std::unique_ptr<RpcConnection>> PeerManager::open_link(const std::string& address, proto::NodeInfo* info) {
  TIERMEM_ASSIGN_OR_RETURN(auto conn, RpcConnection::connect_tcp(address, m_options.timeout));
  proto::Request hello;
  hello.mutable_peer_hello()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  *hello.mutable_peer_hello()->mutable_self() = m_self;
  TIERMEM_ASSIGN_OR_RETURN(auto response, conn->call(hello));
  *info = response.peer_hello().self();
  return conn;
}

Status PeerManager::handshake(NodeId node) {
  std::string address;
  {
    std::lock_guard lock(m_mutex);
    address = find(node)->member.control;
  }
  proto::NodeInfo info;
  TIERMEM_ASSIGN_OR_RETURN(auto conn, open_link(address, &info));
  if (info.node_id() != node) {
    return Status(ErrorCode::config_error, "the daemon at " + address + " is node " +
                                               std::to_string(info.node_id()) + ", not node " +
                                               std::to_string(node) + " (check the cluster file)");
  }
  std::shared_ptr<RemoteNode> remote;
  if (m_transport != nullptr && !info.transport_address().empty()) {
    TIERMEM_ASSIGN_OR_RETURN(auto r,
                             connect_remote_node(*m_transport, node, info.incarnation(), info.transport_address(), adverts(info)));
    remote = r;
    info.set_transports(remote->endpoint->transports());
  }
  std::lock_guard lock(m_mutex);
  Peer& p = *find(node);
  const bool restarted = p.info.incarnation() != 0 && p.info.incarnation() != info.incarnation();
  if (restarted) spdlog::info("peer node {} restarted (incarnation {:x})", node, info.incarnation());
  info.set_state(proto::NodeInfo::CONNECTED);
  p.info = std::move(info);
  p.connection = std::shared_ptr<RpcConnection>(std::move(conn));
  p.remote = std::move(remote);
  mark(p, NodeState::connected, "");
  return Status();
}

void PeerManager::check(NodeId node) {
  std::shared_ptr<RpcConnection> conn;
  uint64_t incarnation = 0;
  {
    std::lock_guard lock(m_mutex);
    Peer& p = *find(node);
    conn = p.state == NodeState::connected ? p.connection : nullptr;
    incarnation = p.info.incarnation();
  }
  if (conn) {
    proto::Request ping;
    ping.mutable_ping();
    auto response = conn->call(ping);
    if (response.ok() && response->ping().incarnation() == incarnation) return;
    std::lock_guard lock(m_mutex);
    mark(*find(node), NodeState::down,
         response.ok() ? "restarted (new incarnation)" : response.status().message());
  }
  Status s = handshake(node);
  if (!s.ok()) {
    std::lock_guard lock(m_mutex);
    Peer& p = *find(node);
    mark(p, p.state == NodeState::connecting ? NodeState::connecting : NodeState::down, s.message());
  }
}

void PeerManager::run() {
  std::unique_lock lock(m_mutex);
  while (!m_stop) {
    const auto now = std::chrono::steady_clock::now();
    auto next = now + m_options.heartbeat_interval;
    for (auto& [id, peer] : m_peers) {
      if (peer.next_check <= now) {
        const NodeId node = id;
        lock.unlock();
        check(node);
        lock.lock();
        if (m_stop) return;
        Peer& p = *find(node);
        p.next_check = std::chrono::steady_clock::now() +
                       (p.state == NodeState::connected ? m_options.heartbeat_interval
                                                        : m_options.reconnect_interval);
      }
      next = std::min(next, find(id)->next_check);
    }
    m_wake.wait_until(lock, next);
  }
}

void PeerManager::on_peer_hello(const proto::NodeInfo& info) {
  {
    std::lock_guard lock(m_mutex);
    Peer* p = find(static_cast<NodeId>(info.node_id()));
    if (p == nullptr) return;
    if (p->state == NodeState::connected && p->info.incarnation() == info.incarnation()) return;
    p->next_check = {};  // redo our link now
  }
  m_wake.notify_all();
}

Result<proto::Response> PeerManager::call(NodeId node, proto::Request request,
                                          std::chrono::milliseconds timeout) {
  std::shared_ptr<RpcConnection> conn;
  std::string address;
  uint64_t incarnation = 0;
  {
    std::lock_guard lock(m_mutex);
    Peer* p = find(node);
    if (p == nullptr) {
      return Status(ErrorCode::bad_gva, "node " + std::to_string(node) + " is not in the cluster file");
    }
    if (p->state != NodeState::connected) {
      return Status(ErrorCode::connection_failed,
                    "node " + std::to_string(node) + " (" + p->member.control + ") is " +
                        std::string(node_state_name(p->state)) +
                        (p->last_error.empty() ? "" : ": " + p->last_error));
    }
    address = p->member.control;
    incarnation = p->info.incarnation();
    if (!p->idle.empty()) {
      conn = std::move(p->idle.back());
      p->idle.pop_back();
    }
  }
  if (!conn) {
    proto::NodeInfo info;
    auto opened = open_link(address, &info);
    if (!opened.ok()) return opened.status().with_context("node " + std::to_string(node));
    if (info.incarnation() != incarnation) {
      // It restarted since the heartbeat saw it: let the heartbeat redo the
      // link (and the data plane) first.
      {
        std::lock_guard lock(m_mutex);
        find(node)->next_check = {};
      }
      m_wake.notify_all();
      return Status(ErrorCode::connection_failed, "node " + std::to_string(node) + " restarted; reconnecting");
    }
    conn = std::shared_ptr<RpcConnection>(std::move(opened).value());
  }
  conn->set_timeout(timeout.count() > 0 ? timeout : m_options.timeout);
  request.set_node(node);
  request.set_forwarded(true);
  auto response = conn->call(request);
  if (conn->broken()) {
    // A timeout or a dead connection: this link is done. Whether the peer is
    // down is for the heartbeat to find out, now.
    {
      std::lock_guard lock(m_mutex);
      find(node)->next_check = {};
    }
    m_wake.notify_all();
    return response.ok() ? response : Result<proto::Response>(response.status().with_context("node " + std::to_string(node)));
  }
  {
    std::lock_guard lock(m_mutex);
    Peer& p = *find(node);
    constexpr size_t k_max_idle = 8;
    if (p.state == NodeState::connected && p.info.incarnation() == incarnation && p.idle.size() < k_max_idle) {
      p.idle.push_back(std::move(conn));
    }
  }
  return response;
}

std::vector<proto::NodeInfo> PeerManager::nodes() const {
  std::lock_guard lock(m_mutex);
  std::vector<proto::NodeInfo> out{m_self};
  for (const ClusterMember& m : m_options.members) {
    const Peer* p = find(m.id);
    if (p == nullptr) continue;
    proto::NodeInfo info = p->info;
    info.set_state(static_cast<proto::NodeInfo::State>(p->state));
    info.set_last_error(p->last_error);
    info.set_state_since_ms(p->since_ms);
    if (p->state != NodeState::connected) {
      info.clear_regions();
      info.clear_transport_address();
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<NodeId> PeerManager::connected() const {
  std::lock_guard lock(m_mutex);
  std::vector<NodeId> out;
  for (const auto& [id, p] : m_peers) {
    if (p.state == NodeState::connected) out.push_back(id);
  }
  return out;
}

Result<std::shared_ptr<RemoteNode>> PeerManager::remote(NodeId node) {
  std::lock_guard lock(m_mutex);
  Peer* p = find(node);
  if (p == nullptr) return Status(ErrorCode::bad_gva, "node " + std::to_string(node) + " is not in the cluster file");
  if (p->state != NodeState::connected || !p->remote) {
    return Status(ErrorCode::transport_error, "node " + std::to_string(node) + " is " +
                                                  std::string(node_state_name(p->state)));
  }
  return p->remote;
}

}  // namespace tiermem
