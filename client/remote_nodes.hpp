// How a client reaches other nodes' memory through the data plane (internal):
// the transport (started on first use, on the fabric of the first node's
// transport address: a client follows its cluster's fabric), and per node an endpoint with the
// keys of this tenant's regions there (RemoteState), connected on first use,
// replaced when the node restarts, its keys refreshed on the same endpoint
// when the node's regions grew.
//
// What a node is (its state, health, transport address, keys) comes from this
// client's daemon, which asks the node itself when told to; a node is asked
// that way at most once per k_forced_refresh. While operations wait on a node,
// the daemon is asked every 100 ms whether it sees the node UNREACHABLE (a
// partition fails the wait then, not at the fabric's timeout).
//
// Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <tiermem/client.h>

#include "access/remote_memory.hpp"
#include "proto/control_stub.hpp"

namespace tiermem::detail {

// A node whose keys lack a piece of this tenant's memory while the local
// daemon's description of it is no newer than the keys is asked through the
// daemon at most this often, and a provisional route decided again after it
// (the daemon's description lags the node's by up to a heartbeat, 1 s by
// default: asking more often finds nothing newer, and each ask is a round
// trip between daemons).
inline constexpr auto k_forced_refresh = std::chrono::milliseconds(1000);

// What reaches one other node one-sided; replaced when the node restarts.
struct RemoteState {
  std::shared_ptr<RemoteNode> node;
  std::unique_ptr<RemoteVersionWords> words;
  std::array<std::unique_ptr<RemoteFrameData>, 4> frames;
};

class RemoteNodes {
 public:
  // `daemon`: this client's daemon (outlives this); `self`: its node.
  // `restarted(node)` is called (under this object's lock) when a node is
  // found to run another incarnation than the one last connected to, or is
  // reconnected: translations of it are void.
  RemoteNodes(ControlStub& daemon, NodeId self, std::function<void(NodeId)> restarted);

  // How long one operation on another node may take.
  void set_timeout(std::chrono::milliseconds timeout) { m_timeout = timeout; }
  std::chrono::milliseconds timeout() const { return m_timeout; }

  // How this client reaches `node`. `reconnect`: the node restarted (or its
  // memory was made anew): ask it for its description, connect a new
  // endpoint and drop the node's translations. Errors: not_supported when
  // there is no route but the daemon (no data plane here, the node offers
  // this client's tenant none, or its fabric is not that of this client's
  // transport), transport_error when the node is down or UNREACHABLE.
  Result<std::shared_ptr<RemoteState>> get(NodeId node, bool reconnect = false);
  // Keys of `node` newer than those held (a domain this tenant got there
  // since), added on the same endpoint; translations are kept. ok: keys
  // were added (epoch() goes up); not_supported: the node has none newer.
  Status refresh_keys(NodeId node);
  // Forgets how to reach `node` (after a transport failure).
  void drop(NodeId node);
  // Who is told when a node's plane cannot be used and its memory goes
  // through the daemon (ClientOptions::on_data_plane_fallback; empty: one
  // line on stderr the first time per node); how often that happened.
  void on_fallback(std::function<void(NodeId, const Status&)> told);
  uint64_t fallbacks() const { return m_fallbacks.load(std::memory_order_relaxed); }

  // Goes up whenever keys are added to a node held: routes decided before
  // are decided again.
  uint64_t epoch() const { return m_epoch.load(std::memory_order_acquire); }
  // False once the data plane could not be started here (never again asked).
  bool may_have_plane() const;
  // The transport; null until get() first started it (never replaced).
  Transport* transport() const { return m_transport_ptr.load(std::memory_order_acquire); }
  // Requests sent to peers as messages.
  uint64_t requests_sent() const;

 private:
  // get() under m_mutex; a plane given up for the daemon's path goes to
  // *fell_back, to be told once the lock is let go.
  Result<std::shared_ptr<RemoteState>> get_locked(NodeId node, bool reconnect, Status* fell_back);
  // Starts the transport for reaching `node` at `address`, on that
  // address's fabric, unless started (caller holds m_mutex). Errors:
  // not_supported (the transport could not be made, a failure kept for
  // good; or it was made for another fabric than `address`'s), why.
  Status start_transport(NodeId node, std::string_view address);
  // The state that reaches `node` through `rn` (its words and each tier's frames).
  std::shared_ptr<RemoteState> state_of(NodeId node, std::shared_ptr<RemoteNode> rn);
  // Whether `node` may be asked for its description through the daemon now
  // (at most once per k_forced_refresh); true notes that it is.
  bool may_ask(NodeId node);
  // The transport's wait check: transport_error when the daemon sees the
  // node of `ep` UNREACHABLE.
  Status still_reachable(const Endpoint& ep);

  ControlStub& m_daemon;
  const NodeId m_self;
  const std::function<void(NodeId)> m_restarted;
  std::chrono::milliseconds m_timeout{10000};

  mutable std::mutex m_mutex;
  std::unique_ptr<Transport> m_transport;
  std::atomic<Transport*> m_transport_ptr{nullptr};
  std::string m_fabric;  // of m_transport (FabricChoice::name())
  Status m_transport_status;
  std::map<NodeId, std::shared_ptr<RemoteState>> m_nodes;
  // The incarnation of each node this client last connected to.
  std::map<NodeId, uint64_t> m_incarnations;
  // When a node was last asked for its description through the daemon, by node.
  std::map<NodeId, std::chrono::steady_clock::time_point> m_asked;
  // Nodes found to offer this tenant no data plane, and when.
  std::map<NodeId, std::chrono::steady_clock::time_point> m_no_plane;
  std::atomic<uint64_t> m_epoch{0};
  // Which node each endpoint reaches (for still_reachable, which runs
  // inside waits that may hold m_mutex).
  std::mutex m_endpoint_mutex;
  std::map<const Endpoint*, NodeId> m_endpoint_nodes;
  std::function<void(NodeId, const Status&)> m_on_fallback;  // set before any get()
  std::atomic<uint64_t> m_fallbacks{0};
  std::mutex m_told_mutex;
  std::map<NodeId, bool> m_told;  // nodes whose fallback went to stderr
};

}  // namespace tiermem::detail
