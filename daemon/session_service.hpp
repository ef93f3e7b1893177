// The session family of requests (request_routes.cpp): a client's control
// session from its hello to its end, and what the daemon keeps for the
// client's process beyond one connection. It owns
//   - the check-in edges of the sessions (CheckIns, H1);
//   - the leases of client processes (Leases, O6: their mappings' pins, and
//     their session allocations for the grace after a connection ends);
//   - the lock logs of sessions (SessionLocks, S3: a dead client's page locks
//     are broken);
//   - the count of open sessions (clients and peers);
// and serves hello (taking back the lease an earlier connection left), the
// memory regions and device chunks a co-located client maps, map and unmap.
//
// Thread-safety: any method may be called from any control thread at once
// (what it owns locks itself); a SessionState is only its connection's.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>

#include "control.pb.h"
#include "daemon/authoriser.hpp"
#include "daemon/check_ins.hpp"
#include "daemon/config.hpp"
#include "daemon/leases.hpp"
#include "daemon/session_state.hpp"
#include "daemon/tenants.hpp"
#include "mapping/address_space.hpp"

namespace tiermem {

class DataPlane;
class PeerManager;
class SessionLocks;

class SessionService {
 public:
  // `data_plane` and `peers` are null for a daemon that runs alone (and in
  // unit tests). Every reference must outlive the service; `incarnation` is
  // this daemon's, said in every hello.
  SessionService(AddressSpace& space, const DaemonConfig& config, const TenantMap& tenants, const Authoriser& auth,
                 DataPlane* data_plane, PeerManager* peers, uint64_t incarnation);
  ~SessionService();
  SessionService(const SessionService&) = delete;
  SessionService& operator=(const SessionService&) = delete;

  // A connection opened or closed (the control server's count).
  void opened() { ++m_open; }
  void closed() { --m_open; }
  uint64_t open() const { return m_open.load(); }

  // A client's greeting: who it is (its tenant, from its peer credentials)
  // and what this daemon is. Errors: protocol_mismatch (another release),
  // those of TenantMap::identify(). Sets s.who and s.greeted on success.
  Status hello(const proto::HelloRequest& r, SessionState& s, proto::HelloResponse* out);
  // After a hello on the Unix socket: the new session takes back what its
  // process's earlier session left in its lease (session allocations, the
  // pins of the mappings it still has), and says which mappings it kept.
  void take_lease(const proto::HelloRequest& r, SessionState& s, proto::HelloResponse* out);
  // A request arrived on `s`: for a greeted client, any request is a check-in.
  void seen(const SessionState& s);
  // Releases what a closing session still held (its mappings) and, once its
  // process is gone, the page locks its lock log shows (SessionLocks).
  void end(SessionState& s);
  // Frees the session allocations whose lease ended (tiermemd's timer; a
  // free refused for a pin sweeps too).
  void sweep_leases();

  // The descriptors a co-located client maps: its tenant's domain (given to
  // it now if it has none yet; an operator's also every other tenant's, as
  // far as one frame carries them) and its lock log. Errors: not_supported
  // over TCP; those of ensure_domain() and SessionLocks::open().
  Status open_regions(const SessionState& s, proto::OpenRegionsResponse* out, std::vector<int>* fds);
  // Descriptors of device-memory chunks of the session's tenant's domain.
  // Errors: not_supported (over TCP, no such tier), permission_denied.
  Status device_chunks(const proto::DeviceChunksRequest& r, const SessionState& s, proto::DeviceChunksResponse* out,
                       std::vector<int>* fds);
  // Pins an allocation of the session's own tenant for its process to map;
  // the pin is the process's lease's. Errors: not_supported over TCP,
  // permission_denied, failed_precondition (replicated or a copy), those of
  // AddressSpace::pin().
  Status map(const proto::MapRequest& r, SessionState& s, proto::MapResponse* out);
  // Lets one of the process's pins of the allocation go. Errors:
  // failed_precondition when the client has no such mapping.
  Status unmap(const proto::UnmapRequest& r, SessionState& s);

  // The check-in edges of this daemon's clients (nodes, metrics, and
  // tiermemd's sweep timer).
  CheckIns& check_ins() { return m_check_ins; }
  // Page locks of dead clients broken since the start (stat, metrics).
  uint64_t locks_broken() const;

 private:
  static ClientKey client_key(const SessionState& s);
  // Unpins and frees what a session or lease let go of (of `whose`: for the log).
  void let_go(const Leases::Held& held, const std::string& whose);
  // Frees session allocations (of `whose`: for the log), giving frames lent
  // by peers back.
  void free_session_allocations(const std::vector<Gva>& owned, const std::string& whose);

  AddressSpace& m_space;
  const DaemonConfig& m_config;
  const TenantMap& m_tenants;
  const Authoriser& m_auth;
  DataPlane* m_data_plane;
  PeerManager* m_peers;
  uint64_t m_incarnation;
  std::atomic<uint64_t> m_open{0};
  std::unique_ptr<SessionLocks> m_locks;
  CheckIns m_check_ins;
  Leases m_leases;
};

}  // namespace tiermem
