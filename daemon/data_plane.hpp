// A daemon's data plane: its transport, the registration of its memory with
// it (the version words of every domain at start, the frames of a domain
// when a tenant is given it), and the description of this node that peers
// and clients reach it by (NodeInfo: incarnation, transport address, one key
// per registered region, each marked with its domain, tenant and the
// domain's memory generation).
#pragma once

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
  // Errors: transport_error (UCX could not start).
  static Result<std::unique_ptr<DataPlane>> start(const DaemonConfig& config);
  ~DataPlane();

  Transport* transport() const { return m_transport.get(); }

  // Registers the version words of every domain and the frames of every
  // open one, and builds this node's description. Errors: transport_error.
  Status describe(const DaemonConfig& config, AddressSpace& space, const std::string& control,
                  uint64_t incarnation);
  // Registers the frames of `domain` (just given to a tenant) and adds their
  // keys to the description (regions_version goes up). Idempotent.
  Status register_domain(AddressSpace& space, uint32_t domain);

  // This node's description now (thread-safe copy).
  proto::NodeInfo self() const;

 private:
  DataPlane() = default;
  Status add(const void* base, size_t length, MemoryKind kind, bool versions, Tier tier, uint32_t domain,
             uint64_t first, bool persistent, const std::string& tenant, uint64_t memory_generation);

  std::unique_ptr<Transport> m_transport;
  mutable std::mutex m_mutex;
  proto::NodeInfo m_self;
  std::set<std::pair<int, uint32_t>> m_registered_domains;  // (tier, domain)
  // Registrations end before the transport.
  std::vector<std::unique_ptr<RegisteredRegion>> m_regions;
};

}  // namespace tiermem
