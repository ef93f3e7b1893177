#include "daemon/peer_slots.hpp"

#include <algorithm>
#include <utility>
#include <vector>

namespace tiermem {
namespace {

thread_local const PeerSlots::Use* t_use = nullptr;

uint64_t ms_between(PeerSlots::Clock::time_point from, PeerSlots::Clock::time_point to) {
  return static_cast<uint64_t>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count()));
}

}  // namespace

// A caller in a peer's line. Every field is guarded by the owner's mutex.
struct PeerSlots::Waiter {
  NodeId node = 0;
  Deadline deadline;
  Clock::time_point since;
  bool handed = false;  // a slot is this waiter's (counted as outstanding)
  bool taken = false;   // ... and became a Slot
  Status failed;        // the peer went down meanwhile
  std::function<void()> wake;  // empty for a blocked waiter
};

PeerSlots::PeerSlots(size_t per_peer, size_t blocked_per_peer)
    : m_per_peer(std::max<size_t>(1, per_peer)), m_blocked_per_peer(blocked_per_peer) {}

PeerSlots::~PeerSlots() = default;

PeerSlots::Slot::Slot(Slot&& other) noexcept
    : m_owner(std::exchange(other.m_owner, nullptr)), m_node(other.m_node), m_until(other.m_until) {}

PeerSlots::Slot& PeerSlots::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    if (m_owner != nullptr) m_owner->give_back(m_node);
    m_owner = std::exchange(other.m_owner, nullptr);
    m_node = other.m_node;
    m_until = other.m_until;
  }
  return *this;
}

PeerSlots::Slot::~Slot() {
  if (m_owner != nullptr) m_owner->give_back(m_node);
}

Status PeerSlots::expired_locked(const Waiter& w, const Peer& peer) const {
  const auto now = Clock::now();
  return Status(ErrorCode::unavailable,
                "node " + std::to_string(w.node) + " has " + std::to_string(peer.outstanding) +
                    " requests outstanding that it has not answered; waited " + std::to_string(ms_between(w.since, now)) +
                    " ms for one of them to finish, until " + w.deadline.what +
                    " (it may be stopped or overloaded); try again");
}

std::function<void()> PeerSlots::hand_over_locked(NodeId, Peer& peer) {
  std::vector<std::function<void()>> woken;
  bool blocked = false;
  while (peer.outstanding < m_per_peer && !peer.line.empty()) {
    std::shared_ptr<Waiter> w = std::move(peer.line.front());
    peer.line.pop_front();
    w->handed = true;
    ++peer.outstanding;
    if (w->wake) {
      woken.push_back(std::move(w->wake));
    } else {
      blocked = true;
    }
  }
  if (blocked) m_changed.notify_all();
  if (woken.empty()) return {};
  return [woken = std::move(woken)] {
    for (const auto& w : woken) w();
  };
}

void PeerSlots::give_back(NodeId node) {
  std::function<void()> wake;
  {
    std::lock_guard lock(m_mutex);
    Peer& peer = m_peers[node];
    if (peer.outstanding > 0) --peer.outstanding;
    wake = hand_over_locked(node, peer);
  }
  if (wake) wake();
}

PeerSlots::Wait PeerSlots::wait(NodeId node, Deadline deadline, std::function<void()> wake) {
  Wait out;
  out.m_owner = this;
  out.m_waiter = std::make_shared<Waiter>();
  Waiter& w = *out.m_waiter;
  w.node = node;
  w.deadline = std::move(deadline);
  w.since = Clock::now();
  std::lock_guard lock(m_mutex);
  Peer& peer = m_peers[node];
  if (!peer.down.ok()) {
    w.failed = peer.down;
  } else if (peer.line.empty() && peer.outstanding < m_per_peer) {
    w.handed = true;
    ++peer.outstanding;
  } else {
    w.wake = std::move(wake);
    peer.line.push_back(out.m_waiter);
  }
  return out;
}

Result<PeerSlots::Slot> PeerSlots::acquire(NodeId node, const Deadline& deadline) {
  std::unique_lock lock(m_mutex);
  Peer& peer = m_peers[node];
  if (!peer.down.ok()) return peer.down;
  if (peer.line.empty() && peer.outstanding < m_per_peer) {
    ++peer.outstanding;
    return Slot(this, node, deadline.until);
  }
  if (peer.blocked >= m_blocked_per_peer) {
    return Status(ErrorCode::unavailable,
                  "node " + std::to_string(node) + " has " + std::to_string(peer.outstanding) +
                      " requests outstanding that it has not answered and " + std::to_string(peer.line.size()) +
                      " more waiting for them, " + std::to_string(peer.blocked) +
                      " of them on the daemon's threads, its most (it may be stopped or overloaded); try again");
  }
  auto w = std::make_shared<Waiter>();
  w->node = node;
  w->deadline = deadline;
  w->since = Clock::now();
  peer.line.push_back(w);
  ++peer.blocked;
  m_changed.wait_until(lock, deadline.until, [&] { return w->handed || !w->failed.ok(); });
  --peer.blocked;  // `peer` stays valid: map nodes are never erased
  if (w->handed) {
    w->taken = true;
    return Slot(this, node, deadline.until);
  }
  if (!w->failed.ok()) return w->failed;
  peer.line.erase(std::find(peer.line.begin(), peer.line.end(), w));
  return expired_locked(*w, peer);
}

void PeerSlots::leave(const std::shared_ptr<Waiter>& w) {
  std::function<void()> wake;
  {
    std::lock_guard lock(m_mutex);
    Peer& peer = m_peers[w->node];
    if (w->handed && !w->taken) {
      // Handed over while its caller was going: the next in line gets it.
      if (peer.outstanding > 0) --peer.outstanding;
      w->taken = true;
      wake = hand_over_locked(w->node, peer);
    } else if (!w->handed) {
      auto at = std::find(peer.line.begin(), peer.line.end(), w);
      if (at != peer.line.end()) peer.line.erase(at);
    }
  }
  if (wake) wake();
}

PeerSlots::Wait::~Wait() {
  if (m_owner != nullptr && m_waiter) m_owner->leave(m_waiter);
}

bool PeerSlots::Wait::ready() const {
  std::lock_guard lock(m_owner->m_mutex);
  return m_waiter->handed || !m_waiter->failed.ok();
}

Result<PeerSlots::Slot> PeerSlots::Wait::take() {
  std::lock_guard lock(m_owner->m_mutex);
  Waiter& w = *m_waiter;
  if (w.handed && !w.taken) {
    w.taken = true;
    return Slot(m_owner, w.node, w.deadline.until);
  }
  if (!w.failed.ok()) return w.failed;
  Peer& peer = m_owner->m_peers[w.node];
  auto at = std::find(peer.line.begin(), peer.line.end(), m_waiter);
  if (at != peer.line.end()) peer.line.erase(at);
  return m_owner->expired_locked(w, peer);
}

void PeerSlots::set_down(NodeId node, const Status& why) {
  std::vector<std::function<void()>> woken;
  {
    std::lock_guard lock(m_mutex);
    Peer& peer = m_peers[node];
    peer.down = why;
    for (auto& w : peer.line) {
      w->failed = why;
      if (w->wake) woken.push_back(std::move(w->wake));
    }
    peer.line.clear();
    m_changed.notify_all();
  }
  for (const auto& w : woken) w();
}

void PeerSlots::set_up(NodeId node) {
  std::lock_guard lock(m_mutex);
  m_peers[node].down = Status();
}

size_t PeerSlots::outstanding(NodeId node) const {
  std::lock_guard lock(m_mutex);
  auto it = m_peers.find(node);
  return it == m_peers.end() ? 0 : it->second.outstanding;
}

size_t PeerSlots::waiting(NodeId node) const {
  std::lock_guard lock(m_mutex);
  auto it = m_peers.find(node);
  return it == m_peers.end() ? 0 : it->second.line.size();
}

PeerSlots::Use::Use(const Slot& slot) : m_node(slot.node()), m_slot(&slot), m_previous(t_use) { t_use = this; }

PeerSlots::Use::Use(NodeId node, Status refused)
    : m_node(node), m_refused(std::move(refused)), m_previous(t_use) {
  t_use = this;
}

PeerSlots::Use::~Use() { t_use = m_previous; }

const PeerSlots::Use* PeerSlots::Use::of(NodeId node) {
  for (const Use* u = t_use; u != nullptr; u = u->m_previous) {
    if (u->m_node == node) return u;
  }
  return nullptr;
}

}  // namespace tiermem
