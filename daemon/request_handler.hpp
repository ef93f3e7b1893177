// Turns one control request into one response, against the node's
// AddressSpace and (in a cluster) its peers. Independent of the socket code,
// so it reads as the protocol.
//
// Routing: a request for another node (Request.node, or the home node of its
// GVA) is forwarded to that node's daemon, once; its answer is relayed.
// Work that blocks (forwarding, migration, one-sided copies to other nodes)
// comes back as Reply::deferred for the server to run off its control
// threads.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <tiermem/gva.h>

#include "control.pb.h"
#include "daemon/config.hpp"
#include "mapping/address_space.hpp"

namespace tiermem {

class PeerManager;
class Transport;

// What the daemon knows about one connection.
struct SessionState {
  uint64_t id = 0;
  uid_t uid = 0;
  pid_t pid = 0;
  std::string client_name;
  bool greeted = false;        // hello (or peer hello) exchanged
  bool peer = false;           // another daemon
  bool remote = false;         // over TCP: no descriptors, no mappings
  std::vector<Gva> pins;       // allocations this session has mapped
};

struct Reply {
  proto::Response response;
  std::vector<int> fds;           // sent with the response (SCM_RIGHTS); not owned
  bool close_after = false;       // protocol error: end the session after replying
  std::function<Reply()> deferred;  // when set: run it (it may block) and send its reply instead
};

class RequestHandler {
 public:
  // `self` describes this node (incarnation, transport address, region keys).
  // `peers` and `transport` are null for a daemon that runs alone.
  RequestHandler(AddressSpace& space, const DaemonConfig& config, proto::NodeInfo self,
                 PeerManager* peers, Transport* transport);

  // Handles a decoded request. Never throws; every failure becomes a status
  // in the response.
  Reply handle(const proto::Request& request, SessionState& session);
  // Releases what a closing session still held (its mappings).
  void end_session(SessionState& session);

  // A response carrying only an error, for frames that could not be decoded.
  static Reply error_reply(uint64_t id, const Status& status, bool close_after);

  void session_opened() { ++m_sessions; }
  void session_closed() { --m_sessions; }

 private:
  Reply dispatch(const proto::Request& request, SessionState& session);
  // --- routing and cluster (cluster_requests.cpp) ---
  NodeId target_of(const proto::Request& request) const;
  Reply forward(NodeId node, const proto::Request& request);
  Reply alloc_anywhere(const proto::Request& request, const Status& local_error);
  Status peer_hello(const proto::PeerHelloRequest& r, SessionState& s, proto::PeerHelloResponse* out);
  void nodes(proto::NodesResponse* out);
  Status reserve_frames(const proto::ReserveFramesRequest& r, proto::ReserveFramesResponse* out);
  Status release_frames(const proto::ReleaseFramesRequest& r);
  Status persist_frames(const proto::PersistFramesRequest& r);
  Reply migrate(const proto::Request& request);
  // --- data (data_requests.cpp) ---
  Status translate(const proto::TranslateRequest& r, proto::TranslateResponse* out);
  Reply read(const proto::Request& request);
  Reply write(const proto::Request& request);
  Reply atomic(const proto::Request& request);
  Reply free(const proto::Request& request);
  Status open_regions(const SessionState& s, proto::OpenRegionsResponse* out, std::vector<int>* fds);
  Status map(const proto::MapRequest& r, SessionState& s, proto::MapResponse* out);
  Status unmap(const proto::UnmapRequest& r, SessionState& s);
  // --- node (request_handler.cpp) ---
  Status hello(const proto::HelloRequest& r, SessionState& s, proto::HelloResponse* out);
  Status alloc(const proto::AllocRequest& r, const SessionState& s, proto::AllocResponse* out);
  void stat(proto::StatResponse* out);
  void dump(proto::DumpResponse* out);

  Reply ok_reply(const proto::Request& request);
  std::chrono::milliseconds transport_timeout() const {
    return std::chrono::milliseconds(m_config.transport_timeout_ms);
  }

  AddressSpace& m_space;
  const DaemonConfig& m_config;
  proto::NodeInfo m_self;
  PeerManager* m_peers;
  Transport* m_transport;
  std::chrono::steady_clock::time_point m_started;
  std::atomic<uint64_t> m_sessions{0};
};

}  // namespace tiermem
