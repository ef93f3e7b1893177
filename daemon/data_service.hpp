// The data family of requests (request_routes.cpp): translate, read, write,
// atomic and free of allocations homed on this node (the zero-copy mapping
// for co-located clients is the SessionService's). Each is checked against
// the requester's tenant first (Authoriser); the GVA a request goes on with
// carries the generation of the allocation that was checked
// (Authoriser::checked), so an allocation freed and made anew in between is
// stale, never someone else's.
//
// It serves plain allocations. A replicated one (and a read from a copy) it
// hands, checked, to the ReplicaService, which wraps the same operation with
// the copies: the data paths here know nothing of copies. Where some pages
// live on other nodes, the copy or atomic runs one-sided (PeerAccess) as
// Reply::deferred work.
//
// Thread-safety: any method may be called from any control thread at once;
// the Reply::deferred work it hands back runs on the server's pool and uses
// the service, which must outlive it (as the handler that holds it does).
#pragma once

#include <cstdint>

#include <tiermem/status.h>
#include <tiermem/types.h>

#include "control.pb.h"
#include "daemon/authoriser.hpp"
#include "daemon/config.hpp"
#include "daemon/replica_service.hpp"
#include "daemon/reply.hpp"
#include "mapping/address_space.hpp"

namespace tiermem {

class DataPlane;
class PeerManager;
class SessionService;

class DataService {
 public:
  // `data_plane` and `peers` are null for a daemon that runs alone (and in
  // unit tests). Every reference must outlive the service; `incarnation` is
  // this daemon's, said in every translation.
  DataService(AddressSpace& space, const DaemonConfig& config, const Authoriser& auth, SessionService& sessions,
              ReplicaService& replicas, DataPlane* data_plane, PeerManager* peers, uint64_t incarnation);
  DataService(const DataService&) = delete;
  DataService& operator=(const DataService&) = delete;

  // The allocation holding a GVA, its layout (extents and page versions,
  // read under one lock) and this daemon's incarnation: what a client
  // caches. Errors: those of Authoriser::authorize() and
  // AddressSpace::layout().
  Status translate(const proto::TranslateRequest& r, const Identity& who, proto::TranslateResponse* out);
  // The inline requests, each answered (or deferred) as a Reply. Errors in
  // the reply: invalid_argument (a read above max_inline_bytes, an atomic
  // that is no operation), those of Authoriser::authorize(),
  // ReplicaService::guard_copy() and the AddressSpace's read, write, atomic
  // and free.
  Reply read(const proto::Request& request, const Identity& who);
  Reply write(const proto::Request& request, const Identity& who);
  Reply atomic(const proto::Request& request, const Identity& who);
  // Frees the allocation; a free refused for a pin sweeps the ended leases
  // (SessionService) and tries once more. Frames lent by other nodes are
  // given back, and the copies freed, before the answer.
  Reply free(const proto::Request& request, const Identity& who);

 private:
  AddressSpace& m_space;
  const DaemonConfig& m_config;
  const Authoriser& m_auth;
  SessionService& m_sessions;
  ReplicaService& m_replicas;  // the replicated paths
  DataPlane* m_data_plane;
  PeerManager* m_peers;
  uint64_t m_incarnation;
};

}  // namespace tiermem
