#include "daemon/peer_manager.hpp"

#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

#include "common/deadline.hpp"

#include <tiermem/status_macros.h>

#include "convert.hpp"

namespace tiermem {
namespace {

uint64_t now_unix_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

PeerManager::PeerManager(PeerOptions options, std::function<proto::NodeInfo()> self, Transport* transport,
                         ClusterSecret secret, std::function<void(NodeId, const MemoryGenerations&)> on_memory)
    : m_options(std::move(options)),
      m_self(std::move(self)),
      m_transport(transport),
      m_secret(std::move(secret)),
      m_on_memory(std::move(on_memory)),
      m_slots(m_options.max_in_flight, m_options.max_blocked_waiters),
      m_self_since_ms(now_unix_ms()) {
  for (const ClusterMember& m : m_options.members) {
    if (m.id == m_options.self) continue;
    Peer p;
    p.member = m;
    p.info.set_node_id(m.id);
    p.info.set_control_address(m.control);
    p.since_ms = now_unix_ms();
    m_slots.set_down(m.id, not_connected(p));
    m_peers.emplace(m.id, std::move(p));
  }
  if (m_transport != nullptr) {
    m_transport->on_failure([this](const Endpoint& ep, const std::string& why) { fabric_failed(ep, why); });
  }
}

PeerManager::~PeerManager() {
  if (m_transport != nullptr) m_transport->on_failure({});
  stop();
}

void PeerManager::fabric_failed(const Endpoint& ep, const std::string& why) {
  {
    std::lock_guard lock(m_mutex);
    for (auto& [id, p] : m_peers) {
      if (!p.remote || p.remote->endpoint.get() != &ep || p.state != NodeState::connected) continue;
      p.fabric_failure = why;
      p.next_check = std::chrono::steady_clock::now();
    }
  }
  m_wake.notify_all();
}

void PeerManager::start() {
  m_reaper = std::thread([this] { reap(); });
  // One heartbeat thread per peer: a ping that waits on one peer (cut off,
  // stopped) holds up no other peer's.
  for (const auto& [id, peer] : m_peers) {
    const NodeId node = id;
    m_threads.emplace_back([this, node] { run(node); });
  }
  if (!m_peers.empty()) m_threads.emplace_back([this] { sweep(); });
}

void PeerManager::stop() {
  {
    std::lock_guard lock(m_mutex);
    m_stop = true;
  }
  m_wake.notify_all();
  m_sweep_wake.notify_all();
  for (std::thread& t : m_threads) {
    if (t.joinable()) t.join();
  }
  m_threads.clear();
  {
    std::lock_guard lock(m_reaper_mutex);
    m_reaper_stop = true;
  }
  m_reaper_wake.notify_all();
  if (m_reaper.joinable()) m_reaper.join();
}

void PeerManager::bury(std::vector<std::shared_ptr<void>> dead) {
  {
    std::lock_guard lock(m_reaper_mutex);
    if (m_reaper.joinable() && !m_reaper_stop) {
      for (auto& d : dead) m_to_reap.push_back(std::move(d));
      dead.clear();
    }
  }
  m_reaper_wake.notify_one();
  // Not started or stopping: `dead` goes here.
}

void PeerManager::reap() {
  std::unique_lock lock(m_reaper_mutex);
  for (;;) {
    m_reaper_wake.wait(lock, [this] { return m_reaper_stop || !m_to_reap.empty(); });
    std::vector<std::shared_ptr<void>> batch;
    batch.swap(m_to_reap);
    lock.unlock();
    batch.clear();  // closes endpoints and connections, however long that takes
    lock.lock();
    if (m_reaper_stop && m_to_reap.empty()) return;
  }
}

Status PeerManager::not_connected(const Peer& p) {
  return Status(ErrorCode::connection_failed, "node " + std::to_string(p.member.id) + " (" + p.member.control +
                                                  ") is " + std::string(node_state_name(p.state)) +
                                                  (p.last_error.empty() ? "" : ": " + p.last_error));
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

void PeerManager::mark(Peer& peer, NodeState state, const std::string& error, Graveyard* graveyard) {
  if (peer.state != state) {
    if (state == NodeState::connected) {
      spdlog::info("peer node {} at {} connected (incarnation {:x}, data plane: {})", peer.member.id,
                   peer.member.control, peer.info.incarnation(), peer.info.transports());
    } else if (peer.state == NodeState::connected || state == NodeState::down) {
      spdlog::warn("peer node {} at {} is down: {}", peer.member.id, peer.member.control, error);
    }
    peer.since_ms = now_unix_ms();
  }
  peer.state = state;
  peer.last_error = error;
  // Requests waiting for the peer go on waiting while it is connected, and
  // fail now when it is not.
  if (state == NodeState::connected) {
    m_slots.set_up(peer.member.id);
  } else {
    m_slots.set_down(peer.member.id, not_connected(peer));
  }
  if (state != NodeState::connected) {
    graveyard->dead.push_back(std::move(peer.connection));
    graveyard->dead.push_back(std::move(peer.remote));
    for (auto& c : peer.idle) graveyard->dead.push_back(std::move(c));
    peer.connection.reset();
    peer.remote.reset();
    peer.idle.clear();
  }
}

void PeerManager::beat(NodeId node, bool answered, std::chrono::microseconds rtt, bool refused,
                       const std::string& error) {
  std::lock_guard lock(m_mutex);
  Peer& p = *find(node);
  const auto now = std::chrono::steady_clock::now();
  NodeHealth next = p.health;
  p.gone = !answered && refused;
  if (answered) {
    p.missed = 0;
    p.last_heartbeat_ms = now_unix_ms();
    p.last_answer = now;
    p.rtt_us = static_cast<uint64_t>(rtt.count());
    next = NodeHealth::healthy;
  } else {
    ++p.missed;
    const auto silent = now - (p.last_heartbeat_ms != 0 ? p.last_answer : m_started);
    if (refused || silent >= m_options.unreachable_after) {
      next = NodeHealth::unreachable;
    } else if (p.missed >= m_options.degraded_after_missed) {
      next = NodeHealth::degraded;
    }
  }
  if (next == p.health) return;
  // Back from UNREACHABLE on the link it had (sweep() set its slots down).
  if (p.health == NodeHealth::unreachable && next != NodeHealth::unreachable && p.state == NodeState::connected) {
    m_slots.set_up(node);
  }
  const auto name = [](NodeHealth h) { return std::string(node_health_name(h)); };
  if (next == NodeHealth::healthy) {
    spdlog::info("node {} health: {} -> healthy (heartbeat answered in {} us)", node, name(p.health), p.rtt_us);
  } else {
    spdlog::warn("node {} health: {} -> {} ({} heartbeat(s) unanswered{}: {})", node, name(p.health), name(next),
                 p.missed, p.last_heartbeat_ms == 0 ? ", never answered" : "", error);
  }
  p.health = next;
  p.health_since_ms = now_unix_ms();
}

Result<std::unique_ptr<RpcConnection>> PeerManager::open_link(const std::string& address, NodeId node,
                                                              proto::NodeInfo* info) {
  // A caller's deadline bounds a link made for its request (heartbeats have none).
  TIERMEM_ASSIGN_OR_RETURN(auto conn, RpcConnection::connect_tcp(address, ScopedDeadline::bound(m_options.timeout)));
  const std::string nonce = make_nonce();
  ControlStub link = ControlStub::over(*conn);
  TIERMEM_ASSIGN_OR_RETURN(const proto::PeerChallengeResponse c, link.peer_challenge(m_options.self, nonce));
  if (c.node_id() != node) {
    return Status(ErrorCode::config_error, "the daemon at " + address + " is node " + std::to_string(c.node_id()) +
                                               ", not node " + std::to_string(node) + " (check the cluster file)");
  }
  if (!m_secret.verify(c.proof(), "server", m_options.self, node, nonce, c.nonce())) {
    return Status(ErrorCode::permission_denied, "the daemon at " + address + " (node " + std::to_string(node) +
                                                    ") did not prove it knows the cluster secret");
  }
  const proto::NodeInfo self = m_self();
  TIERMEM_ASSIGN_OR_RETURN(proto::NodeInfo answer,
                           link.peer_hello(self, m_secret.proof("client", m_options.self, node, nonce, c.nonce())));
  // A peer from before libfabric says nothing of fabrics: we refuse it here.
  TIERMEM_RETURN_IF_ERROR(same_fabric(node, answer.fabric(), self.fabric()));
  *info = std::move(answer);
  return conn;
}

Status PeerManager::handshake(NodeId node) {
  std::string address;
  {
    std::lock_guard lock(m_mutex);
    address = find(node)->member.control;
  }
  proto::NodeInfo info;
  TIERMEM_ASSIGN_OR_RETURN(auto conn, open_link(address, node, &info));
  std::shared_ptr<RemoteNode> remote;
  if (m_transport != nullptr && !info.transport_address().empty()) {
    TIERMEM_ASSIGN_OR_RETURN(remote, connect_remote_node(*m_transport, wire::advert_of(info)));
    info.set_transports(remote->endpoint->transports());
  }
  if (m_on_memory) {
    MemoryGenerations generations;
    for (const proto::RegionKey& k : info.regions()) {
      if (k.kind() == proto::Region::VERSIONS && !k.tenant().empty()) generations[k.tenant()] = k.memory_generation();
    }
    m_on_memory(node, generations);
  }
  Graveyard graveyard{this};
  std::lock_guard lock(m_mutex);
  Peer& p = *find(node);
  const bool restarted = p.info.incarnation() != 0 && p.info.incarnation() != info.incarnation();
  if (restarted) spdlog::info("peer node {} restarted (incarnation {:x})", node, info.incarnation());
  info.set_state(proto::NodeInfo::CONNECTED);
  graveyard.dead.push_back(std::move(p.connection));
  graveyard.dead.push_back(std::move(p.remote));
  p.info = std::move(info);
  p.connection = std::shared_ptr<RpcConnection>(std::move(conn));
  p.remote = std::move(remote);
  mark(p, NodeState::connected, "", &graveyard);
  return Status();
}

Status PeerManager::refresh_regions(NodeId node, const std::shared_ptr<RpcConnection>& conn) {
  TIERMEM_ASSIGN_OR_RETURN(auto info, ControlStub::over(*conn).node_info());
  return apply_node_info(node, info);
}

Status PeerManager::refresh(NodeId node) {
  TIERMEM_ASSIGN_OR_RETURN(auto info, stub(node, Identity{}).node_info());
  return apply_node_info(node, info);
}

Status PeerManager::apply_node_info(NodeId node, const proto::NodeInfo& info) {
  std::shared_ptr<RemoteNode> old;
  uint64_t incarnation = 0;
  {
    std::lock_guard lock(m_mutex);
    old = find(node)->remote;
    incarnation = find(node)->info.incarnation();
  }
  if (info.incarnation() != incarnation) return Status(ErrorCode::unavailable, "node " + std::to_string(node) + " restarted");
  std::shared_ptr<RemoteNode> fresh;
  if (old && m_transport != nullptr) {
    TIERMEM_ASSIGN_OR_RETURN(fresh, with_regions(*m_transport, *old, wire::advert_of(info).regions));
  }
  Graveyard graveyard{this};
  std::lock_guard lock(m_mutex);
  Peer& p = *find(node);
  if (p.info.incarnation() != incarnation || p.state != NodeState::connected) return Status();
  const std::string transports = p.info.transports();
  p.info = info;
  p.info.set_transports(transports);
  p.info.set_state(proto::NodeInfo::CONNECTED);
  if (fresh) {
    graveyard.dead.push_back(std::move(p.remote));
    p.remote = std::move(fresh);
  }
  return Status();
}

void PeerManager::check(NodeId node) {
  std::shared_ptr<RpcConnection> conn;
  uint64_t incarnation = 0, regions_version = 0;
  std::string fabric_failure;
  {
    std::lock_guard lock(m_mutex);
    Peer& p = *find(node);
    conn = p.state == NodeState::connected ? p.connection : nullptr;
    incarnation = p.info.incarnation();
    regions_version = p.info.regions_version();
    fabric_failure.swap(p.fabric_failure);
  }
  const auto elapsed = [start = std::chrono::steady_clock::now()] {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
  };
  if (conn && !fabric_failure.empty()) {
    // The fabric says so (H2): the link and the failed endpoint go now, and
    // the handshake below (instead of the next heartbeat) finds out at once
    // whether the peer is gone (refused: unreachable) or was only cut off
    // at the fabric's level (a new link and endpoint, still healthy).
    spdlog::warn("the data plane reports node {} failed ({}); checking it now", node, fabric_failure);
    Graveyard graveyard{this};
    std::lock_guard lock(m_mutex);
    mark(*find(node), NodeState::down, fabric_failure, &graveyard);
    conn.reset();
  }
  if (conn) {
    auto response = ControlStub::over(*conn).ping();
    if (response.ok() && response->incarnation() == incarnation) {
      beat(node, true, elapsed(), false, "");
      if (response->regions_version() != regions_version) (void)refresh_regions(node, conn);
      return;
    }
    const std::string why = response.ok() ? "restarted (new incarnation)" : response.status().message();
    if (!response.ok()) beat(node, false, elapsed(), false, why);
    Graveyard graveyard{this};
    std::lock_guard lock(m_mutex);
    mark(*find(node), NodeState::down, why, &graveyard);
  }
  Status s = handshake(node);
  // Where the kernel says nothing listens, the process is gone: no need to
  // wait out the timeout to call it unreachable.
  beat(node, s.ok(), elapsed(), s.message().find("Connection refused") != std::string::npos,
       fabric_failure.empty() ? s.message() : "the data plane: " + fabric_failure + "; " + s.message());
  if (!s.ok()) {
    Graveyard graveyard{this};
    std::lock_guard lock(m_mutex);
    Peer& p = *find(node);
    // Refused for its configuration (or ours: another fabric, another node
    // at its address): down, not on its way, until an operator changes one.
    const bool refused_config = s.code() == ErrorCode::config_error;
    mark(p, p.state == NodeState::connecting && !refused_config ? NodeState::connecting : NodeState::down,
         s.message(), &graveyard);
  }
}

NodeHealth PeerManager::health_now(const Peer& p, uint64_t* since_ms) const {
  *since_ms = p.health_since_ms;
  if (p.last_heartbeat_ms == 0 || p.health == NodeHealth::unreachable) return p.health;
  const auto silent = std::chrono::steady_clock::now() - p.last_answer;
  if (silent < m_options.unreachable_after) return p.health;
  // Past its deadline, whether or not the sweeper has run yet: decisions
  // that rest on it (a copy serving, a home dropping one) go by the clock.
  const auto late = std::chrono::duration_cast<std::chrono::milliseconds>(silent - m_options.unreachable_after);
  *since_ms = now_unix_ms() - static_cast<uint64_t>(late.count());
  return NodeHealth::unreachable;
}

void PeerManager::sweep() {
  std::unique_lock lock(m_mutex);
  while (!m_stop) {
    // A peer that answered before and has been silent for unreachable_after
    // is UNREACHABLE now, whether or not a ping to it is still waiting (it
    // waits up to the peer timeout; its link goes when it times out).
    const auto now = std::chrono::steady_clock::now();
    auto next = now + m_options.heartbeat_interval;
    for (auto& [id, p] : m_peers) {
      if (p.last_heartbeat_ms == 0 || p.health == NodeHealth::unreachable) continue;
      const auto deadline = p.last_answer + m_options.unreachable_after;
      if (deadline > now) {
        next = std::min(next, deadline);
        continue;
      }
      const uint64_t silent_ms = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(now - p.last_answer).count());
      spdlog::warn("node {} health: {} -> unreachable (no heartbeat answered for {} ms; {} unanswered)", id,
                   node_health_name(p.health), silent_ms, p.missed);
      p.health = NodeHealth::unreachable;
      // Requests that would wait for it fail now (those under way end by
      // their own deadline); its link stays until its ping times out, and an
      // answer brings it back.
      m_slots.set_down(id, Status(ErrorCode::connection_failed,
                                  "node " + std::to_string(id) + " (" + p.member.control +
                                      ") is unreachable: no heartbeat answered for " + std::to_string(silent_ms) +
                                      " ms"));
      // Since its deadline, not since this look.
      p.health_since_ms = now_unix_ms() - (silent_ms - static_cast<uint64_t>(m_options.unreachable_after.count()));
    }
    m_sweep_wake.wait_until(lock, next);
  }
}

void PeerManager::run(NodeId node) {
  std::unique_lock lock(m_mutex);
  while (!m_stop) {
    if (find(node)->next_check <= std::chrono::steady_clock::now()) {
      lock.unlock();
      check(node);
      lock.lock();
      if (m_stop) return;
      Peer& p = *find(node);
      p.next_check = std::chrono::steady_clock::now() +
                     (p.state == NodeState::connected ? m_options.heartbeat_interval : m_options.reconnect_interval);
    }
    // Woken early when the peer is to be checked now (fabric_failed,
    // on_peer_hello, take_connection) or the manager stops.
    m_wake.wait_until(lock, find(node)->next_check);
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

Result<std::shared_ptr<RpcConnection>> PeerManager::take_connection(NodeId node, uint64_t incarnation,
                                                                    const std::string& address) {
  {
    std::lock_guard lock(m_mutex);
    Peer& p = *find(node);
    if (!p.idle.empty()) {
      auto conn = std::move(p.idle.back());
      p.idle.pop_back();
      return conn;
    }
  }
  proto::NodeInfo info;
  auto opened = open_link(address, node, &info);
  if (!opened.ok()) return opened.status().with_context("node " + std::to_string(node));
  if (info.incarnation() != incarnation) {
    // It restarted since the heartbeat saw it: let the heartbeat redo the
    // link (and the data plane) first.
    {
      std::lock_guard lock(m_mutex);
      find(node)->next_check = {};
    }
    m_wake.notify_all();
    return Status(ErrorCode::unavailable, "node " + std::to_string(node) + " restarted; reconnecting");
  }
  return std::shared_ptr<RpcConnection>(std::move(opened).value());
}

void PeerManager::put_back(NodeId node, uint64_t incarnation, std::shared_ptr<RpcConnection> conn) {
  std::shared_ptr<RpcConnection> dropped;
  std::lock_guard lock(m_mutex);
  Peer& p = *find(node);
  constexpr size_t k_max_idle = 8;
  if (conn && !conn->broken() && p.state == NodeState::connected && p.info.incarnation() == incarnation &&
      p.idle.size() < k_max_idle) {
    p.idle.push_back(std::move(conn));
  } else {
    dropped = std::move(conn);
  }
}

PeerSlots::Deadline PeerManager::slot_deadline(std::chrono::milliseconds timeout) const {
  const auto now = std::chrono::steady_clock::now();
  if (ScopedDeadline::active() && ScopedDeadline::at() < now + timeout) {
    return {ScopedDeadline::at(), "the caller's deadline of " +
                                      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                         ScopedDeadline::at() - now)
                                                         .count()) +
                                      " ms"};
  }
  return {now + timeout, "the call's timeout of " + std::to_string(timeout.count()) + " ms" +
                             (timeout == m_options.timeout ? " (cluster.peer_timeout_ms)" : "")};
}

ControlStub PeerManager::stub(NodeId node, const Identity& who, bool by_home, std::chrono::milliseconds timeout) {
  return ControlStub([this, node, timeout](proto::Request& request,
                                           std::vector<UniqueFd>*) { return call(node, request, timeout); },
                     OnBehalf{who.tenant, who.is_operator, who.uid, by_home});
}

Result<proto::Response> PeerManager::call(NodeId node, proto::Request request, std::chrono::milliseconds timeout) {
  const PeerSlots::Use* use = PeerSlots::Use::of(node);
  if (use != nullptr && !use->refused().ok()) return use->refused();
  std::string address;
  uint64_t incarnation = 0;
  {
    std::lock_guard lock(m_mutex);
    Peer* p = find(node);
    if (p == nullptr) {
      return Status(ErrorCode::bad_gva, "node " + std::to_string(node) + " is not in the cluster file");
    }
    if (p->state != NodeState::connected) return not_connected(*p);
    address = p->member.control;
    incarnation = p->info.incarnation();
  }
  timeout = timeout.count() > 0 ? timeout : m_options.timeout;
  // One slot per outstanding request: the session's, taken before this
  // work reached the pool, or one taken here (waiting on this thread).
  PeerSlots::Slot own;
  const PeerSlots::Slot* slot = use != nullptr ? use->slot() : nullptr;
  if (slot == nullptr && request.body_case() != proto::Request::kMigrate) {
    TIERMEM_ASSIGN_OR_RETURN(own, m_slots.acquire(node, slot_deadline(timeout)));
    slot = &own;
  }
  if (slot != nullptr) {
    // What waiting for the slot left of the caller's deadline.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(slot->until() -
                                                                            std::chrono::steady_clock::now());
    timeout = std::min(timeout, std::max(left, std::chrono::milliseconds(1)));
  }
  auto conn = take_connection(node, incarnation, address);
  if (!conn.ok()) return conn.status();
  timeout = ScopedDeadline::bound(timeout);
  (*conn)->set_timeout(timeout);
  request.set_node(node);
  request.set_forwarded(true);
  if (ScopedDeadline::active()) request.set_deadline_ms(static_cast<uint32_t>(ScopedDeadline::remaining_ms()));
  auto response = (*conn)->call(request);
  if ((*conn)->broken()) {
    // A timeout or a dead connection: this link is done. Whether the peer is
    // down is for the heartbeat to find out, now.
    {
      std::lock_guard lock(m_mutex);
      find(node)->next_check = {};
    }
    m_wake.notify_all();
    if (!response.ok() && response.status().code() == ErrorCode::timeout) {
      response = Status(ErrorCode::timeout, "node " + std::to_string(node) + " did not answer within " +
                                                std::to_string(timeout.count()) +
                                                " ms (it may be stopped or partitioned away)");
    } else if (!response.ok()) {
      response = response.status().with_context("node " + std::to_string(node));
    }
  }
  put_back(node, incarnation, std::move(conn).value());
  return response;
}

std::vector<proto::NodeInfo> PeerManager::nodes() const {
  proto::NodeInfo self = m_self();
  self.set_state(proto::NodeInfo::SELF);
  self.set_state_since_ms(m_self_since_ms);
  self.set_health(proto::NodeInfo::HEALTHY);
  self.set_health_since_ms(m_self_since_ms);
  std::lock_guard lock(m_mutex);
  std::vector<proto::NodeInfo> out{std::move(self)};
  for (const ClusterMember& m : m_options.members) {
    const Peer* p = find(m.id);
    if (p == nullptr) continue;
    proto::NodeInfo info = p->info;
    info.set_state(static_cast<proto::NodeInfo::State>(p->state));
    info.set_last_error(p->last_error);
    info.set_state_since_ms(p->since_ms);
    uint64_t since_ms = 0;
    info.set_health(static_cast<proto::NodeInfo::Health>(health_now(*p, &since_ms)));
    info.set_health_since_ms(since_ms);
    info.set_last_heartbeat_ms(p->last_heartbeat_ms);
    info.set_missed_heartbeats(p->missed);
    info.set_heartbeat_rtt_us(p->rtt_us);
    if (p->state != NodeState::connected) {
      info.clear_regions();
      info.clear_transport_address();
      info.clear_tenant_planes();
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<PeerHealth> PeerManager::health() const {
  std::lock_guard lock(m_mutex);
  std::vector<PeerHealth> out;
  for (const ClusterMember& m : m_options.members) {
    const Peer* p = find(m.id);
    if (p == nullptr) continue;
    uint64_t since_ms = 0;
    const NodeHealth h = health_now(*p, &since_ms);
    const auto silent = std::chrono::steady_clock::now() - (p->last_heartbeat_ms != 0 ? p->last_answer : m_started);
    const uint64_t silent_ms =
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(silent).count());
    out.push_back({m.id, h, since_ms, p->gone, silent_ms});
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
