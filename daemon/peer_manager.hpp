// Membership (C4): the links from this daemon to every other node of the
// cluster file. A background thread connects to each peer's control listener,
// authenticates (daemon/peer_auth.hpp), exchanges PeerHello (node info:
// incarnation, memory generation, transport address, region keys), then pings
// it; a peer that stops answering is marked down and retried until it answers
// again, as a new incarnation if it restarted. A peer's regions grow as its
// tenants get domains: a ping says when, and the keys are fetched.
//
// A slow or stopped peer costs only the requests that go to it: each peer
// has a bounded number of requests in flight (more wait for one of them,
// within their caller's deadline: daemon/peer_slots.hpp), and nothing slow
// (closing endpoints, connecting) is done while the manager's lock is held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <tiermem/status.h>

#include "access/remote_memory.hpp"
#include "control.pb.h"
#include "daemon/cluster_file.hpp"
#include "daemon/peer_auth.hpp"
#include "daemon/peer_slots.hpp"
#include "daemon/tenants.hpp"
#include "proto/control_stub.hpp"
#include "rpc_connection.hpp"

namespace tiermem {

struct PeerOptions {
  NodeId self = 0;
  std::vector<ClusterMember> members;  // the whole cluster, self included
  std::chrono::milliseconds reconnect_interval{500};
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds timeout{5000};
  size_t max_in_flight = 2;  // requests to one peer at once (the control threads are few)
  // Callers blocking a thread while they wait for one of those (the others
  // wait without one: PeerSlots); more are refused at once.
  size_t max_blocked_waiters = 1;
  // Health (H1): heartbeats unanswered in a row that make a peer DEGRADED,
  // and the time without an answer that makes it UNREACHABLE.
  uint64_t degraded_after_missed = 2;
  std::chrono::milliseconds unreachable_after{30000};
};

// The health of the edge from this daemon to one peer, for decisions
// (replication's quorum).
struct PeerHealth {
  NodeId node = 0;
  NodeHealth health = NodeHealth::unknown;
  uint64_t since_ms = 0;  // unix ms of the last change (0: never changed)
  // The last check was refused by the kernel: nothing listens at the
  // peer's address, its daemon is gone (not merely cut off or slow).
  bool gone = false;
  // How long it has been silent: since its last answered heartbeat (or
  // since this daemon started, when it never answered).
  uint64_t silent_ms = 0;
};

class PeerManager {
 public:
  // `self` describes this daemon now (its regions grow); `transport` reaches
  // peers one-sided (may be null: then only the control plane works).
  // `on_memory` is told each peer's memory generations (of its tenants'
  // domains, by tenant) at every connect.
  using MemoryGenerations = std::map<std::string, uint64_t>;
  PeerManager(PeerOptions options, std::function<proto::NodeInfo()> self, Transport* transport, ClusterSecret secret,
              std::function<void(NodeId, const MemoryGenerations&)> on_memory = {});
  ~PeerManager();

  void start();
  void stop();

  // A blocking request to `node`, which executes it, on a connection of its
  // own (so a long request, a migration say, never holds up short ones).
  // `timeout` 0: the configured peer timeout. It takes one of the peer's
  // slots (waiting for one until the caller's deadline: the thread's
  // ScopedDeadline, else `timeout`), unless the thread holds one for `node`
  // already (PeerSlots::Use; the call then ends by that slot's deadline);
  // migrations take none (they are long, and few). Errors: bad_gva (not in
  // the cluster), connection_failed (down, also while waiting), unavailable
  // (too many requests to it outstanding until the deadline: it may be
  // stopped), timeout, or the peer's answer.
  Result<proto::Response> call(NodeId node, proto::Request request,
                               std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // Requests to `node` through call(), for `who` (as the home of a copy
  // when `by_home`). The stub must not outlive this manager.
  ControlStub stub(NodeId node, const Identity& who, bool by_home = false,
                   std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // ... for this daemon itself (an operator: its own page locks, lent frames).
  ControlStub own_stub(NodeId node) { return stub(node, Identity{"", true, 0, 0}); }
  // The peers' slots, for callers that wait for one without a thread.
  PeerSlots& slots() { return m_slots; }

  // This node first, then every peer in cluster-file order.
  std::vector<proto::NodeInfo> nodes() const;
  std::vector<NodeId> connected() const;
  // Every peer's health, in cluster-file order.
  std::vector<PeerHealth> health() const;
  bool knows(NodeId node) const;

  // How to reach `node` one-sided. Errors: transport_error (down or no
  // transport).
  Result<std::shared_ptr<RemoteNode>> remote(NodeId node);
  // Fetches `node`'s description now (a tenant got a domain there since the
  // last heartbeat said so), so remote() has the keys of its new regions.
  Status refresh(NodeId node);

  // A peer said hello on its own connection to us: if it is a new
  // incarnation, our link to it is redone at once.
  void on_peer_hello(const proto::NodeInfo& info);

 private:
  struct Peer {
    ClusterMember member;
    proto::NodeInfo info;
    NodeState state = NodeState::connecting;
    std::shared_ptr<RpcConnection> connection;  // heartbeats
    std::vector<std::shared_ptr<RpcConnection>> idle;  // for requests, reused
    std::shared_ptr<RemoteNode> remote;
    std::string last_error;
    uint64_t since_ms = 0;
    std::chrono::steady_clock::time_point next_check{};
    // Health (H1): the edge from this daemon to the peer.
    NodeHealth health = NodeHealth::unknown;
    uint64_t health_since_ms = 0;
    uint64_t last_heartbeat_ms = 0;  // unix ms of the last answered one
    std::chrono::steady_clock::time_point last_answer{};  // steady: for the timeout
    uint32_t missed = 0;
    bool gone = false;  // PeerHealth::gone
    uint64_t rtt_us = 0;
    std::string fabric_failure;  // the data plane reported the peer failed (handled by the next check)
  };
  // What a state change takes away: handed to the reaper thread when the
  // graveyard goes (after the lock is let go), since closing a UCX endpoint
  // to a stopped peer waits for it (seconds), and heartbeats of the others
  // must go on meanwhile.
  struct Graveyard {
    PeerManager* owner;
    std::vector<std::shared_ptr<void>> dead;
    ~Graveyard() {
      if (!dead.empty()) owner->bury(std::move(dead));
    }
  };
  void bury(std::vector<std::shared_ptr<void>> dead);
  // The transport reports that `ep`'s peer failed: that peer is checked at
  // once (see check()).
  void fabric_failed(const Endpoint& ep, const std::string& why);
  void reap();

  // The heartbeat of one peer (a thread each).
  void run(NodeId node);
  void check(NodeId node);
  // Health by the clock (a thread): a peer silent for unreachable_after is
  // UNREACHABLE then, while its ping may wait on (up to the peer timeout).
  void sweep();
  // A peer's health now (caller holds m_mutex): UNREACHABLE once silent for
  // unreachable_after even before the sweeper marks it; *since_ms when it
  // became what it is.
  NodeHealth health_now(const Peer& p, uint64_t* since_ms) const;
  Status handshake(NodeId node);
  Status refresh_regions(NodeId node, const std::shared_ptr<RpcConnection>& conn);
  Status apply_node_info(NodeId node, const proto::NodeInfo& info);
  // Connects to a peer, authenticates both ways and says hello; the reply
  // describes it.
  Result<std::unique_ptr<RpcConnection>> open_link(const std::string& address, NodeId node, proto::NodeInfo* info);
  void mark(Peer& peer, NodeState state, const std::string& error, Graveyard* graveyard);
  // A heartbeat (a ping, or a new link's handshake) was answered after
  // `rtt`, or not (`refused`: nothing listens on the peer's address, the
  // process is gone): updates the peer's health, logging each change once.
  void beat(NodeId node, bool answered, std::chrono::microseconds rtt, bool refused, const std::string& error);
  // Why a request to a peer that is not connected fails.
  static Status not_connected(const Peer& peer);
  Peer* find(NodeId node);
  const Peer* find(NodeId node) const;
  Result<std::shared_ptr<RpcConnection>> take_connection(NodeId node, uint64_t incarnation, const std::string& address);
  void put_back(NodeId node, uint64_t incarnation, std::shared_ptr<RpcConnection> conn);
  // The deadline of a call that takes a slot itself.
  PeerSlots::Deadline slot_deadline(std::chrono::milliseconds timeout) const;

  PeerOptions m_options;
  std::function<proto::NodeInfo()> m_self;
  Transport* m_transport;
  ClusterSecret m_secret;
  std::function<void(NodeId, const MemoryGenerations&)> m_on_memory;
  mutable std::mutex m_mutex;
  std::condition_variable m_wake;        // heartbeat threads: check a peer now, or stop
  std::condition_variable m_sweep_wake;  // sweep(): stop
  std::map<NodeId, Peer> m_peers;
  PeerSlots m_slots;
  bool m_stop = false;
  std::vector<std::thread> m_threads;  // one heartbeat per peer
  uint64_t m_self_since_ms = 0;
  std::chrono::steady_clock::time_point m_started = std::chrono::steady_clock::now();
  std::mutex m_reaper_mutex;
  std::condition_variable m_reaper_wake;
  std::vector<std::shared_ptr<void>> m_to_reap;
  bool m_reaper_stop = false;
  std::thread m_reaper;
};

}  // namespace tiermem
