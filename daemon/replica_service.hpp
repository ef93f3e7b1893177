// The replica family of requests, and the replicated paths of the data
// family's (H2, daemon/replicator.hpp): allocating with copies, writes and
// atomics through the home, reads from a copy when the home cannot be
// reached, and what only a copy's home may ask of it. It owns the
// Replicator, which runs in a cluster only: a daemon alone has none and
// refuses allocations with replicas.
//
// Thread-safety: any method may be called from any control thread at once;
// the Reply::deferred work it hands back runs on the server's pool and uses
// the service, which must outlive it (as the handler that holds it does).
#pragma once

#include <memory>

#include <tiermem/gva.h>
#include <tiermem/status.h>
#include <tiermem/types.h>

#include "control.pb.h"
#include "daemon/config.hpp"
#include "daemon/copy_writer.hpp"
#include "daemon/replicator.hpp"
#include "daemon/reply.hpp"
#include "daemon/tenants.hpp"
#include "mapping/address_space.hpp"

namespace tiermem {

class DataPlane;
class PeerManager;

class ReplicaService {
 public:
  // `data_plane` and `peers` are null for a daemon that runs alone (and in
  // unit tests): then there is no Replicator. Every reference must outlive
  // the service. The Replicator's background work starts here.
  ReplicaService(AddressSpace& space, const DaemonConfig& config, DataPlane* data_plane, PeerManager* peers);
  // Stops the Replicator's background work.
  ~ReplicaService();
  ReplicaService(const ReplicaService&) = delete;
  ReplicaService& operator=(const ReplicaService&) = delete;

  // Whether copies are kept here (in a cluster: a Replicator runs).
  bool active() const { return m_replicator != nullptr; }
  // Writes into copies so far, by path (zero when not active()).
  Replicator::CopyWrites copy_writes() const {
    return m_replicator != nullptr ? m_replicator->copy_writes() : Replicator::CopyWrites{};
  }
  // A copy is written, freed and marked by its home only: permission_denied
  // (naming the home) when `who` is not acting for it.
  static Status guard_copy(const AllocationInfo& info, const Identity& who, const char* verb);
  // Whether what an allocation asks of copies may be made. Errors:
  // permission_denied (a copy asked by other than its home),
  // invalid_argument (too many, of a session or coherent allocation, copies
  // of a copy), unavailable (a daemon alone).
  Status check_replicas(const proto::AllocRequest& r, const Identity& who) const;

  // The replicated paths, each a Reply whose deferred work talks to the
  // copies' nodes. `info`, just allocated here, gets its copies (freed
  // again when they cannot be placed). Needs active().
  Reply alloc(const proto::Request& request, const Identity& who, const AllocationInfo& info);
  // A write (an atomic) of `gva`, checked for `who`: every copy, then here.
  // Needs active().
  Reply write(const proto::Request& request, const Identity& who, Gva gva);
  Reply atomic(const proto::Request& request, const Identity& who, Gva gva, WordOp op);
  // A read from a copy (the home cannot be reached): this node's copy, or
  // one of another node's (never the home's node) when this one has none.
  Reply read_copy(const proto::Request& request, const Identity& who);
  // The copy's home says the copy is filled and listed: it may serve reads.
  // Errors: invalid_argument (not a copy), those of guard_copy() and
  // AddressSpace::translate().
  Status replica_ready(const proto::ReplicaReadyRequest& r, const Identity& who);
  // `info` was freed here: its copies are freed. Needs active().
  void freed(const AllocationInfo& info, const Identity& who);

 private:
  AddressSpace& m_space;
  const DaemonConfig& m_config;
  DataPlane* m_data_plane;
  PeerManager* m_peers;
  std::unique_ptr<CopyWriter> m_copy_writer;  // in a cluster; used by the Replicator
  std::unique_ptr<Replicator> m_replicator;   // in a cluster
};

}  // namespace tiermem
