#include "daemon/data_plane.hpp"

#include <spdlog/spdlog.h>

#include <tiermem/status_macros.h>

#include "common/host_id.hpp"
#include "convert.hpp"

namespace tiermem {

FabricChoice fabric_choice(const DaemonConfig& config) {
  return {.fabric = config.transport_fabric, .provider = config.transport_provider};
}

Result<std::unique_ptr<DataPlane>> DataPlane::start(const DaemonConfig& config, const std::string& listen_ip) {
  auto dp = std::unique_ptr<DataPlane>(new DataPlane);
  dp->m_fabric = fabric_choice(config);
  dp->m_options = {.tls = config.transport_tls,
                   .devices = config.transport_devices,
                   .progress_thread = true,
                   .keepalive_interval_ms = static_cast<uint32_t>(config.transport_keepalive_interval_ms),
                   .listen_ip = listen_ip};
  auto transport = make_transport(dp->m_fabric, dp->m_options);
  if (!transport.ok() && !listen_ip.empty() && dp->m_fabric.fabric == "ucx") {
    // UCX cannot listen here: its connection manager needs a socket
    // transport (tcp, rdmacm), and shared memory alone has none. (libfabric
    // has no listener to fail: its address always carries a token.)
    spdlog::warn("data plane: no listener ({}); peers connect by this node's UCX worker address, and clients of "
                 "other nodes reach its memory through this daemon",
                 transport.status().message());
    dp->m_options.listen_ip.clear();
    transport = make_transport(dp->m_fabric, dp->m_options);
  } else {
    dp->m_planes_enabled = !listen_ip.empty();
  }
  if (!transport.ok()) return transport.status().with_context("starting the data plane (" + dp->m_fabric.name() + ")");
  dp->m_transport = std::move(transport).value();
  spdlog::info("data plane: {} at {}", dp->m_fabric.name(), listen_ip.empty() ? "this node only" : listen_ip);
  return dp;
}

Result<Transport*> DataPlane::plane(const std::string& tenant) {
  if (auto it = m_planes.find(tenant); it != m_planes.end()) return it->second.get();
  auto t = make_transport(m_fabric, m_options);
  if (!t.ok()) return t.status().with_context("starting tenant " + tenant + "'s data plane (" + m_fabric.name() + ")");
  {
    std::lock_guard lock(m_mutex);
    proto::TenantPlane* p = m_self.add_tenant_planes();
    p->set_tenant(tenant);
    p->set_transport_address((*t)->address());
  }
  spdlog::info("data plane of tenant {}: its own {} transport, with its own admission token", tenant, m_fabric.name());
  return (m_planes[tenant] = std::move(t).value()).get();
}

Status DataPlane::add_to_plane(proto::RegionKey& key, const std::string& tenant) {
  if (!m_planes_enabled || tenant.empty() || !key.tenant_packed_key().empty()) return Status();
  TIERMEM_ASSIGN_OR_RETURN(Transport * t, plane(tenant));
  TIERMEM_ASSIGN_OR_RETURN(auto region,
                           t->register_region(reinterpret_cast<void*>(key.base()), key.length(), MemoryKind::host));
  key.set_tenant_packed_key(region->packed_key());
  m_regions.push_back(std::move(region));
  return Status();
}

DataPlane::~DataPlane() {
  m_regions.clear();  // before the transport
}

Result<proto::RegionKey> DataPlane::add(const void* base, size_t length, MemoryKind kind, bool versions, Tier tier,
                                        uint32_t domain, uint64_t first, bool persistent, const std::string& tenant,
                                        uint64_t memory_generation) {
  TIERMEM_ASSIGN_OR_RETURN(auto region, m_transport->register_region(const_cast<void*>(base), length, kind));
  proto::RegionKey k;
  k.set_kind(versions ? proto::Region::VERSIONS : proto::Region::TIER);
  k.set_tier(wire::to_proto(tier));
  k.set_base(region->base());
  k.set_length(length);
  k.set_packed_key(region->packed_key());
  k.set_persistent(persistent);
  k.set_domain(domain);
  k.set_first(first);
  k.set_tenant(tenant);
  k.set_memory_generation(memory_generation);
  m_regions.push_back(std::move(region));
  if (kind == MemoryKind::host) TIERMEM_RETURN_IF_ERROR(add_to_plane(k, tenant));
  return k;
}

Status DataPlane::describe(const DaemonConfig& config, AddressSpace& space, const std::string& control,
                           uint64_t incarnation) {
  {
    std::lock_guard reg(m_register_mutex);
    {
      std::lock_guard lock(m_mutex);
      m_self.set_node_id(config.node_id);
      m_self.set_control_address(control);
      m_self.set_page_size(space.page_size());
      m_self.set_incarnation(incarnation);
      m_self.set_pages_per_domain(space.pages_per_domain());
      m_self.set_socket_path(config.socket_path);
      m_self.set_host_id(host_id());
      m_self.set_transport_address(m_transport->address());
      m_self.set_fabric(m_fabric.name());
    }
    VersionSegments& v = space.versions();
    for (uint32_t d = 0; d < v.domains(); ++d) {
      auto k = add(v.domain_words(d), v.domain_words_bytes(), MemoryKind::host, true, Tier::automatic, d,
                   uint64_t{d} * v.pages_per_domain(), false, space.tenant_of_domain(d), v.memory_generation(d));
      if (!k.ok()) return k.status().with_context("registering the version words");
      std::lock_guard lock(m_mutex);
      *m_self.add_regions() = std::move(k).value();
    }
    // VRAM (its chunks come and go with frames, so peers reach it through
    // the daemon unless the transport registers the whole device range).
    if (TierBackend* b = space.backend(Tier::vram)) {
      auto k = add(b->region_base(), b->domains() * b->domain_span(), MemoryKind::cuda, false, Tier::vram, 0, 0,
                   false, "", 0);
      if (!k.ok()) {
        spdlog::info("vram tier not reachable one-sided: {}", k.status().message());
      } else {
        std::lock_guard lock(m_mutex);
        *m_self.add_regions() = std::move(k).value();
      }
    }
  }
  for (uint32_t d = 0; d < space.domains(); ++d) {
    if (!space.tenant_of_domain(d).empty()) TIERMEM_RETURN_IF_ERROR(register_domain(space, d));
  }
  return Status();
}

Status DataPlane::register_domain(AddressSpace& space, uint32_t domain) {
  {
    // Registered already: no wait behind another domain's registration.
    std::lock_guard lock(m_mutex);
    if (m_complete_domains.count(domain) != 0) return Status();
  }
  std::lock_guard reg(m_register_mutex);
  if (m_complete_domains.count(domain) != 0) return Status();
  const std::string tenant = space.tenant_of_domain(domain);
  std::vector<proto::RegionKey> added;
  for (Tier t : {Tier::dram, Tier::pmem}) {
    TierBackend* b = space.backend(t);
    if (b == nullptr || b->domain_bytes(domain) == 0) continue;
    if (!m_registered_domains.insert({static_cast<int>(t), domain}).second) continue;
    const uint64_t first = uint64_t{domain} * b->domain_span();
    TIERMEM_ASSIGN_OR_RETURN(auto k, add(b->host_base() + first, b->domain_bytes(domain), MemoryKind::host, false, t,
                                         domain, first, b->persistent(), tenant,
                                         space.versions().memory_generation(domain)));
    added.push_back(std::move(k));
  }
  // The domain's version words: now its tenant's, and in its plane. (Only
  // this function and describe() change keys, under m_register_mutex.)
  std::vector<std::pair<int, proto::RegionKey>> versions;
  {
    std::lock_guard lock(m_mutex);
    for (int i = 0; i < m_self.regions_size(); ++i) {
      const proto::RegionKey& k = m_self.regions(i);
      if (k.kind() == proto::Region::VERSIONS && k.domain() == domain) versions.emplace_back(i, k);
    }
  }
  bool changed = !added.empty();
  for (auto& [i, k] : versions) {
    k.set_tenant(tenant);
    if (k.tenant_packed_key().empty() && m_planes_enabled) {
      TIERMEM_RETURN_IF_ERROR(add_to_plane(k, tenant));
      changed = true;
    }
  }
  std::lock_guard lock(m_mutex);
  for (auto& [i, k] : versions) *m_self.mutable_regions(i) = std::move(k);
  for (proto::RegionKey& k : added) *m_self.add_regions() = std::move(k);
  if (changed) m_self.set_regions_version(m_self.regions_version() + 1);
  m_complete_domains.insert(domain);  // under both mutexes
  return Status();
}

proto::NodeInfo DataPlane::self() const {
  std::lock_guard lock(m_mutex);
  return m_self;
}

Transport* transport_of(const DataPlane* plane) { return plane != nullptr ? plane->transport() : nullptr; }

std::string fabric_name(const DataPlane* plane) { return plane != nullptr ? plane->fabric().name() : "none"; }

Result<uint32_t> ensure_domain(AddressSpace& space, DataPlane* plane, const std::string& tenant,
                               const TenantLimits& limits) {
  TIERMEM_ASSIGN_OR_RETURN(const uint32_t domain, space.domain_for(tenant, limits, nullptr));
  // Every caller, not only the one that made the domain: a request that
  // finds it made waits (m_register_mutex) until its regions are in the
  // node's description, or a peer told of frames there (reserve_frames)
  // could ask for the keys before they exist (the CI's migration failure:
  // "node 3's pmem tier cannot be reached one-sided").
  if (plane != nullptr) TIERMEM_RETURN_IF_ERROR(plane->register_domain(space, domain));
  return domain;
}

}  // namespace tiermem

namespace tiermem {

void DataPlane::log_admissions() {
  const auto now = std::chrono::steady_clock::now();
  if (now - m_admissions_logged < std::chrono::seconds(2)) return;
  m_admissions_logged = now;
  const auto log = [](Transport& t, const std::string& whose) {
    const Transport::AdmissionReport r = t.take_admission_report();
    if (r.turned_away == 0) return;
    std::string from;
    for (const auto& [source, n] : r.sources) from += (from.empty() ? "" : ", ") + std::to_string(n) + " from " + source;
    spdlog::warn("{}: {} connection(s) turned away that had not said hello with the admission token (each source "
                 "has a budget of such connections; its oldest go first): {}",
                 whose, r.turned_away, from);
  };
  if (m_transport) log(*m_transport, "the node's data plane");
  // Never waits on a plane being made (that takes tens of ms): next time.
  std::unique_lock lock(m_register_mutex, std::try_to_lock);
  if (!lock) return;
  for (const auto& [tenant, plane] : m_planes) log(*plane, "tenant '" + tenant + "''s data plane");
}

}  // namespace tiermem
