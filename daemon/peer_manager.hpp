// Membership (C4): the links from this daemon to every other node of the
// cluster file. A background thread connects to each peer's control listener,
// exchanges PeerHello (node info: incarnation, transport address, region
// keys), then pings it; a peer that stops answering is marked down and
// retried until it answers again, as a new incarnation if it restarted.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <tiermem/status.h>

#include "control.pb.h"
#include "daemon/cluster_file.hpp"
#include "rpc_connection.hpp"
#include "access/remote_memory.hpp"

namespace tiermem {

struct PeerOptions {
  NodeId self = 0;
  std::vector<ClusterMember> members;  // the whole cluster, self included
  std::chrono::milliseconds reconnect_interval{500};
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds timeout{5000};
};

class PeerManager {
 public:
  // `self` describes this daemon (state SELF); `transport` is used to reach
  // peers one-sided (may be null: then only the control plane works).
  PeerManager(PeerOptions options, proto::NodeInfo self, Transport* transport);
  ~PeerManager();

  void start();
  void stop();

  // A blocking request to `node`, which executes it, on a connection of its
  // own (so a long request, a migration say, never holds up short ones).
  // `timeout` 0: the configured peer timeout. Errors: bad_gva (not in the
  // cluster), connection_failed (down), timeout, or the peer's answer.
  Result<proto::Response> call(NodeId node, proto::Request request,
                               std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  // This node first, then every peer in cluster-file order.
  std::vector<proto::NodeInfo> nodes() const;
  std::vector<NodeId> connected() const;
  bool knows(NodeId node) const;
  const proto::NodeInfo& self() const { return m_self; }

  // How to reach `node` one-sided. Errors: transport_error (down or no
  // transport).
  Result<std::shared_ptr<RemoteNode>> remote(NodeId node);

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
  };

  void run();
  void check(NodeId node);
  Status handshake(NodeId node);
  // Connects to a peer and says hello; the reply describes it.
  Result<std::unique_ptr<RpcConnection>> open_link(const std::string& address, proto::NodeInfo* info);
  void mark(Peer& peer, NodeState state, const std::string& error);
  Peer* find(NodeId node);
  const Peer* find(NodeId node) const;

  PeerOptions m_options;
  proto::NodeInfo m_self;
  Transport* m_transport;
  mutable std::mutex m_mutex;
  std::condition_variable m_wake;
  std::map<NodeId, Peer> m_peers;
  bool m_stop = false;
  std::thread m_thread;
};

}  // namespace tiermem
