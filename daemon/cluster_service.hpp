// The cluster family of requests (request_routes.cpp): what daemons ask of
// each other and what clients ask about the cluster.
//   - peer authentication: peer_challenge, then peer_hello, each proving
//     knowledge of the cluster secret (S2), which the service owns;
//   - what a peer asks of this node: ping, node_info, reserve_frames and
//     release_frames (frames lent to its pages), break_locks (of a dead
//     client of it);
//   - nodes (the cluster as this daemon sees it, with the keys and plane a
//     client's tenant may use), persist_frames and migrate.
// Forwarding a request to another node's daemon is not here: that is
// routing, the RequestHandler's.
//
// Thread-safety: any method may be called from any control thread at once;
// a SessionState is only its connection's. The Reply::deferred work it hands
// back runs on the server's pool and uses the service, which must outlive it
// (as the handler that holds it does).
#pragma once

#include <cstdint>

#include <tiermem/status.h>
#include <tiermem/types.h>

#include "control.pb.h"
#include "daemon/authoriser.hpp"
#include "daemon/check_ins.hpp"
#include "daemon/config.hpp"
#include "daemon/peer_auth.hpp"
#include "daemon/reply.hpp"
#include "daemon/session_state.hpp"
#include "daemon/tenants.hpp"
#include "mapping/address_space.hpp"

namespace tiermem {

class DataPlane;
class PeerManager;

class ClusterService {
 public:
  // `data_plane` and `peers` are null, and `secret` empty, for a daemon that
  // runs alone (and in unit tests): it takes no peers. Every reference must
  // outlive the service; `incarnation` is this daemon's.
  ClusterService(AddressSpace& space, const DaemonConfig& config, const TenantMap& tenants, const Authoriser& auth,
                 CheckIns& check_ins, DataPlane* data_plane, PeerManager* peers, ClusterSecret secret,
                 uint64_t incarnation);
  ClusterService(const ClusterService&) = delete;
  ClusterService& operator=(const ClusterService&) = delete;

  // This node as peers and clients see it (the data plane's description, or
  // the little a daemon alone has).
  proto::NodeInfo self() const;
  // This daemon's incarnation and the version of its regions' keys.
  void ping(proto::PingResponse* out) const;

  // A peer's first request on its TCP connection: checks who it says it is
  // and answers with this node's proof and a nonce. Errors:
  // unexpected_message (on the Unix socket), protocol_mismatch,
  // permission_denied (alone, not in the cluster file), malformed_frame.
  Status peer_challenge(const proto::PeerChallengeRequest& r, SessionState& s, proto::PeerChallengeResponse* out);
  // The peer's proof: the session becomes that peer's (s.peer, s.greeted).
  // Errors: permission_denied (no challenge, a wrong proof).
  Status peer_hello(const proto::PeerHelloRequest& r, SessionState& s, proto::PeerHelloResponse* out);

  // The nodes and the clients `who` may see (refreshing one node's
  // description first, off the control threads, when asked to).
  Reply nodes(const proto::Request& request, const Identity& who);
  // Frames of the requester's tenant's domain here, lent to the asking
  // peer's pages. Errors: invalid_argument (no tier), those of
  // ensure_domain() and AddressSpace::reserve_frames().
  Status reserve_frames(const proto::Request& request, const SessionState& s, proto::ReserveFramesResponse* out);
  // The peer gives frames back. Errors: invalid_argument, those of
  // AddressSpace::release_frames().
  Status release_frames(const proto::ReleaseFramesRequest& r, const SessionState& s);
  // Makes frames durable (off the control threads). Errors in the reply:
  // tier_unavailable, out_of_range, permission_denied (another tenant's).
  Reply persist_frames(const proto::Request& request, const Identity& who);
  // Breaks the page locks a peer's dead client held, as far as `who` may.
  void break_locks(const proto::BreakLocksRequest& r, const Identity& who, proto::BreakLocksResponse* out);
  // Moves an allocation homed here to a tier and node (off the control
  // threads; Migrator). Errors in the reply: those of
  // Authoriser::authorize() and Migrator::migrate().
  Reply migrate(const proto::Request& request, const Identity& who);

 private:
  void list_nodes(const Identity& who, proto::NodesResponse* out);
  Status persist(const proto::PersistFramesRequest& r, const Identity& who);

  AddressSpace& m_space;
  const DaemonConfig& m_config;
  const TenantMap& m_tenants;
  const Authoriser& m_auth;
  CheckIns& m_check_ins;  // the clients' edges (nodes)
  DataPlane* m_data_plane;
  PeerManager* m_peers;
  ClusterSecret m_secret;
  uint64_t m_incarnation;
};

}  // namespace tiermem
