// A daemon's data plane: its transports, the registration of its memory with
// them (the version words of every domain at start, the frames of a domain
// when a tenant is given it), and the description of this node that peers
// and clients reach it by (NodeInfo: incarnation, transport address, one key
// per registered region, each marked with its domain, tenant and the
// domain's memory generation).
//
// Two kinds of transport (isolation, issue 29):
//   - the node's own, which its peers (authenticated daemons) connect to: every
//     region is registered there;
//   - one per tenant with memory here (a "tenant plane"), made when a domain
//     is given to the tenant: its own UCX context or libfabric domain (on
//     RDMA its own protection domain, so the NIC refuses another tenant's
//     keys), its own admission token (and with UCX its own listener), and
//     only that tenant's regions (version words and frames of its domains).
//     A client gets its tenant's plane and keys only.
// The fabric is the configuration's ([transport] fabric and provider), the
// same for both kinds. Both listen (UcxOptions::listen_ip, the node's control
// IP) when the node is in a cluster; where UCX cannot listen (shared memory
// only) the node's own transport falls back to its worker address and there
// are no tenant planes: clients of other nodes then go through the daemon.
// (libfabric has no listener: its address carries a token on every provider.)
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <tiermem/status.h>

#include "control.pb.h"
#include "daemon/config.hpp"
#include "mapping/address_space.hpp"
#include "transport/transport.hpp"

namespace tiermem {

class DataPlane {
 public:
  // Errors: those of make_transport() (transport_error: the fabric could not
  // start; not_supported: a libfabric provider that cannot be used here).
  // `listen_ip`: where the transports listen (this node's control IP);
  // empty: nowhere (a daemon alone).
  static Result<std::unique_ptr<DataPlane>> start(const DaemonConfig& config, const std::string& listen_ip);
  ~DataPlane();

  Transport* transport() const { return m_transport.get(); }
  // The fabric of every transport of this plane.
  const FabricChoice& fabric() const { return m_fabric; }

  // Registers the version words of every domain and the frames of every
  // open one, and builds this node's description. Errors: transport_error.
  Status describe(const DaemonConfig& config, AddressSpace& space, const std::string& control,
                  uint64_t incarnation);
  // Registers the frames of `domain` (just given to a tenant) and adds their
  // keys to the description (regions_version goes up). Idempotent.
  Status register_domain(AddressSpace& space, uint32_t domain);

  // This node's description now (thread-safe copy).
  proto::NodeInfo self() const;
  // Whether tenants get planes of their own (the node's transport listens).
  bool tenant_planes() const { return m_planes_enabled; }
  // Logs the connections its transports turned away before they proved
  // anything (Transport::take_admission_report), per plane and source, at
  // most every 2 s (tiermemd's timer calls it often).
  void log_admissions();

 private:
  DataPlane() = default;
  // Registers a region with the node's transport (and its tenant's plane)
  // and returns its key. Caller holds m_register_mutex.
  Result<proto::RegionKey> add(const void* base, size_t length, MemoryKind kind, bool versions, Tier tier,
                               uint32_t domain, uint64_t first, bool persistent, const std::string& tenant,
                               uint64_t memory_generation);
  // Registers the region of `key` in `tenant`'s plane (made on first use)
  // and sets its tenant_packed_key. Caller holds m_register_mutex.
  Status add_to_plane(proto::RegionKey& key, const std::string& tenant);
  Result<Transport*> plane(const std::string& tenant);

  FabricChoice m_fabric;
  UcxOptions m_options;  // and the options every fabric shares (make_transport)
  bool m_planes_enabled = false;
  std::unique_ptr<Transport> m_transport;
  // Registrations and tenant planes, made one at a time under
  // m_register_mutex: they take long (a tenant plane over tcp;ofi_rxm
  // 60 ms, 230 ms with rxm's default receive pool), and m_mutex, which
  // every heartbeat answer takes to read the description (self()), is held
  // only to copy keys in and out.
  std::mutex m_register_mutex;
  std::map<std::string, std::unique_ptr<Transport>> m_planes;  // by tenant
  std::set<std::pair<int, uint32_t>> m_registered_domains;     // (tier, domain)
  std::set<uint32_t> m_complete_domains;  // register_domain ran to its end (written under both mutexes)
  // Registrations end before the transport.
  std::vector<std::unique_ptr<RegisteredRegion>> m_regions;
  mutable std::mutex m_mutex;
  proto::NodeInfo m_self;
  std::chrono::steady_clock::time_point m_admissions_logged;
};

// The fabric `config` chooses ([transport] fabric and provider).
FabricChoice fabric_choice(const DaemonConfig& config);

// The node's own transport; null for a daemon with no data plane (alone).
Transport* transport_of(const DataPlane* plane);
// What the node reports as its fabric (status, metrics, nodes): the plane's
// FabricChoice::name(), "none" without a plane.
std::string fabric_name(const DataPlane* plane);

// The domain of `tenant` on this node, given to it now (within `limits`) when
// it has none yet; a domain just given has its frames registered with
// `plane` (null: a daemon with no transport). The data, session and cluster
// requests that hand out a tenant's memory all go through it. Errors: those
// of AddressSpace::domain_for() and DataPlane::register_domain().
Result<uint32_t> ensure_domain(AddressSpace& space, DataPlane* plane, const std::string& tenant,
                               const TenantLimits& limits);

}  // namespace tiermem
