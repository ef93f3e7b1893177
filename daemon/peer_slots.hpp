// How many requests a daemon has outstanding to each peer (C4, S3): at most
// `per_peer`, so that a stopped peer holds at most that many of the pool's
// threads. A request over the limit waits for a slot, first come first
// served, until its caller's deadline; a peer that goes down fails its
// waiters at once.
//
// Two kinds of waiters share a peer's line. The control server's sessions
// wait without a thread (wait(): a callback wakes the coroutine), take the
// slot before their work goes to the pool, and that work's calls use it
// (Use). Other callers (migration, replication, one-sided access, allocs
// elsewhere) are on a pool thread already and block (acquire()); at most
// `blocked_per_peer` of them wait on one peer, so that waiting never takes
// the whole pool: more are refused at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <tiermem/gva.h>
#include <tiermem/status.h>

namespace tiermem {

class PeerSlots {
 public:
  using Clock = std::chrono::steady_clock;

  PeerSlots(size_t per_peer, size_t blocked_per_peer);
  ~PeerSlots();
  PeerSlots(const PeerSlots&) = delete;
  PeerSlots& operator=(const PeerSlots&) = delete;

  // One outstanding request to a peer, until `until`; given back (to the
  // first waiter) when destroyed.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept;
    Slot& operator=(Slot&& other) noexcept;
    ~Slot();
    explicit operator bool() const { return m_owner != nullptr; }
    NodeId node() const { return m_node; }
    // The caller's deadline: a call made with the slot ends by then.
    Clock::time_point until() const { return m_until; }

   private:
    friend class PeerSlots;
    Slot(PeerSlots* owner, NodeId node, Clock::time_point until) : m_owner(owner), m_node(node), m_until(until) {}
    PeerSlots* m_owner = nullptr;
    NodeId m_node = 0;
    Clock::time_point m_until{};
  };

  // Why a wait ends: the caller's deadline, and what it is (for the error).
  struct Deadline {
    Clock::time_point until;
    std::string what;  // "the request's deadline of 50 ms", "cluster.peer_timeout_ms, 5000 ms"
  };

  struct Waiter;
  // A place in a peer's line for a caller that must not block (a session's
  // coroutine). Leaving it (destroyed) gives back a slot handed over but
  // not taken.
  class Wait {
   public:
    Wait() = default;
    Wait(Wait&&) noexcept = default;
    Wait& operator=(Wait&&) noexcept = default;
    ~Wait();
    // A slot was handed over, or the wait failed (the peer is down).
    bool ready() const;
    // The slot; else the failure; else (still waiting: the deadline passed)
    // it leaves the line and says so. Errors: connection_failed (down),
    // unavailable (deadline).
    Result<Slot> take();

   private:
    friend class PeerSlots;
    PeerSlots* m_owner = nullptr;
    std::shared_ptr<Waiter> m_waiter;
  };

  // Joins `node`'s line; `wake` runs once (any thread, no lock held) when
  // the wait is ready. A free slot with nobody in line is handed over at once.
  Wait wait(NodeId node, Deadline deadline, std::function<void()> wake);
  // Blocks until a slot is handed over, the deadline passes or the peer
  // goes down. Errors: connection_failed (down), unavailable (deadline, or
  // too many threads wait on the peer already).
  Result<Slot> acquire(NodeId node, const Deadline& deadline);

  // The peer is down: its waiters fail with `why` now, and so does every
  // later wait until set_up().
  void set_down(NodeId node, const Status& why);
  void set_up(NodeId node);

  size_t outstanding(NodeId node) const;
  size_t waiting(NodeId node) const;

  // While alive, calls from this thread to one node are made with a slot
  // a session took before its work went to the pool, or fail as that
  // session's wait for one did (so that the failure takes the work's own
  // path: its reply, its metrics).
  class Use {
   public:
    explicit Use(const Slot& slot);
    Use(NodeId node, Status refused);
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    // What this thread holds for `node`, or null.
    static const Use* of(NodeId node);
    const Slot* slot() const { return m_slot; }
    const Status& refused() const { return m_refused; }

   private:
    NodeId m_node;
    const Slot* m_slot = nullptr;
    Status m_refused;
    const Use* m_previous;
  };

 private:
  struct Peer {
    size_t outstanding = 0;
    size_t blocked = 0;  // waiters holding a thread
    std::deque<std::shared_ptr<Waiter>> line;
    Status down;  // not OK while the peer is down
  };
  void give_back(NodeId node);
  // Hands a free slot of `peer` to its first waiter, if any; returns the
  // callback to run unlocked.
  std::function<void()> hand_over_locked(NodeId node, Peer& peer);
  Status expired_locked(const Waiter& w, const Peer& peer) const;
  void leave(const std::shared_ptr<Waiter>& w);

  const size_t m_per_peer;
  const size_t m_blocked_per_peer;
  mutable std::mutex m_mutex;
  std::condition_variable m_changed;  // for blocked waiters
  std::map<NodeId, Peer> m_peers;
};

}  // namespace tiermem
