// Turns one control request into one response, against the node's
// AddressSpace and (in a cluster) its peers. Independent of the socket code,
// so it reads as the protocol.
//
// The handler routes; what owns state of its own is a service it holds, and
// the table of requests (request_routes.cpp) says which one serves each
// request kind:
//   - Authoriser (authoriser.hpp): who may ask what, checked before any work;
//   - SessionService (session_service.hpp), the session family: hello,
//     check-ins, the leases of client processes, the lock logs of sessions,
//     and the regions, device chunks and mappings of co-located clients;
//   - ReplicaService (replica_service.hpp), the replica family and the
//     replicated paths of alloc, write, atomic, free and read: it owns the
//     Replicator (in a cluster);
//   - DataService (data_service.hpp), the data family: translate, read,
//     write, atomic and free of plain allocations, handing replicated ones
//     to the ReplicaService;
//   - ClusterService (cluster_service.hpp), the cluster family: peer
//     authentication (it owns the cluster secret), what peers ask of this
//     node, nodes, persist_frames and migrate;
//   - Demoter (demoter.hpp): background rounds that move cold pages of
//     demotable allocations down the tiers under capacity pressure;
//   - the node's own requests (alloc, lookup, list, stat, dump, metrics) are
//     the handler's: they ask the whole node, and its counts are the
//     handler's.
//
// Routing: a request for another node (Request.node, or the home node of its
// GVA) is forwarded to that node's daemon, once, with the client's identity;
// its answer is relayed. Work that blocks (forwarding, migration, one-sided
// copies to other nodes) comes back as Reply::deferred for the server to run
// off its control threads.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tiermem/gva.h>

#include "control.pb.h"
#include "daemon/authoriser.hpp"
#include "daemon/cluster_service.hpp"
#include "daemon/config.hpp"
#include "daemon/data_service.hpp"
#include "daemon/demoter.hpp"
#include "daemon/metrics.hpp"
#include "daemon/peer_auth.hpp"
#include "daemon/replica_service.hpp"
#include "daemon/reply.hpp"
#include "daemon/session_service.hpp"
#include "daemon/session_state.hpp"
#include "daemon/tenants.hpp"
#include "mapping/address_space.hpp"

namespace tiermem {

class DataPlane;
class PeerManager;

class RequestHandler {
 public:
  // `data_plane` and `peers` are null for a daemon that runs alone (and in
  // unit tests); `secret` is empty then.
  RequestHandler(AddressSpace& space, const DaemonConfig& config, const TenantMap& tenants, DataPlane* data_plane,
                 PeerManager* peers, ClusterSecret secret, uint64_t incarnation);

  // Handles a decoded request. Never throws; every failure becomes a status
  // in the response.
  Reply handle(const proto::Request& request, SessionState& session);
  // What the control server and tiermemd ask of the sessions (SessionService).
  // Releases what a closing session still held (its mappings) and, once its
  // process is gone, the page locks its lock log shows (SessionLocks).
  void end_session(SessionState& session) { m_sessions.end(session); }

  void session_opened() { m_sessions.opened(); }
  void session_closed() { m_sessions.closed(); }
  // The check-in edges of this daemon's clients (swept by tiermemd's timer).
  CheckIns& check_ins() { return m_sessions.check_ins(); }
  // Frees the session allocations whose lease ended (tiermemd's timer).
  void sweep_leases() { m_sessions.sweep_leases(); }
  // Cuts tenants' files grown past their sizes back (AddressSpace::
  // trim_tenant_files) and logs each, naming the tenant (tiermemd's timer,
  // and once at start).
  void trim_tenant_files();
  // Logs the connections the data plane's listeners turned away (tiermemd's timer).
  void log_admissions();
  // The Prometheus text exposition of this daemon now: its counters, and
  // gauges of tiers, tenants, peers, clients and recovery (metrics.cpp,
  // handler_metrics.cpp).
  std::string metrics();

 private:
  // handle() but for the caller's deadline.
  Reply route(const proto::Request& request, SessionState& session);
  // Calls the service of the request's row of the table (request_routes.cpp;
  // `route` null: a kind with no row, refused as malformed).
  struct Route;
  Reply dispatch(const Route* route, const proto::Request& request, SessionState& session);

  // One row of the table of requests, per request kind.
  using Serve = Reply (*)(RequestHandler&, const proto::Request&, SessionState&);
  struct Route {
    const char* name = nullptr;  // the body's field name
    bool peer_only = false;      // daemons ask it of each other, never clients
    Serve serve = nullptr;
  };
  // The row of body field number `body`; null for a kind that has none.
  static const Route* route_of(int body);
  using RouteTable = std::array<Route, 64>;  // by body field number
  static void add(RouteTable& t, int body, const char* name, bool peer_only, Serve serve);
  static void session_routes(RouteTable& t);
  static void cluster_routes(RouteTable& t);
  static void data_routes(RouteTable& t);
  static void replica_routes(RouteTable& t);
  static void node_routes(RouteTable& t);
  // The reply for a request whose service filled `reply` and returned `status`.
  static Reply finish(Reply reply, const Status& status, uint64_t id);
  Reply serve_alloc(const proto::Request& request, SessionState& session, const Identity& who);
  Status serve_metrics(const Identity& who, proto::MetricsResponse* out);
  // What m_metrics counts of a request, taken before it is answered.
  struct Counted {
    std::string_view type;  // the body's field name
    std::string tenant;     // who asked
    uint64_t written = 0;   // bytes a write carried
    std::chrono::steady_clock::time_point started;
    bool here = true;       // served by this node (not relayed to another)
  };
  // Counts an answered request (and the bytes it carried) into m_metrics.
  void count(const Counted& counted, const proto::Response& response);

  // --- routing to other nodes ---
  // The node that serves a request: Request.node, or the home of its GVA;
  // this one for requests about this daemon or connection.
  NodeId target_of(const proto::Request& request) const;
  // Relays the request to `node`'s daemon, acting for its client.
  Reply forward(NodeId node, const proto::Request& request, const SessionState& session);
  // An alloc that found no room here, asked of every connected node in turn.
  Reply alloc_anywhere(const proto::Request& request, const SessionState& session, const Status& local_error);
  // --- the node's own requests ---
  Status alloc(const proto::AllocRequest& r, const Identity& who, proto::AllocResponse* out);
  Status lookup(const proto::LookupRequest& r, const Identity& who, proto::LookupResponse* out);
  void list(const Identity& who, proto::ListResponse* out);
  void stat(const Identity& who, proto::StatResponse* out);
  void dump(const Identity& who, proto::DumpResponse* out);

  AddressSpace& m_space;
  Authoriser m_auth;  // who may ask what
  const DaemonConfig& m_config;
  const TenantMap& m_tenants;
  DataPlane* m_data_plane;
  PeerManager* m_peers;
  std::chrono::steady_clock::time_point m_started;
  // Tenants' files found grown and cut back, and the storage that gave back.
  std::atomic<uint64_t> m_files_trimmed{0}, m_trimmed_bytes{0};
  std::atomic<uint64_t> m_unbacked_seen{0};  // TruncationGuard::unbacked_pages() logged so far
  Metrics m_metrics;
  bool m_counting = false;  // metrics.enabled
  SessionService m_sessions;  // the session family's state and services
  // Its Replicator's background work stops before the sessions and what is
  // above go.
  ReplicaService m_replicas;
  // The services that use those above (destroyed before them).
  DataService m_data;
  ClusterService m_cluster;
  // Moves cold pages down under capacity pressure (M7); its rounds stop
  // first.
  Demoter m_demoter;
};

}  // namespace tiermem
