#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <tiermem/client.h>
#include <tiermem/status_macros.h>

#include "client/client_core.hpp"
#include "convert.hpp"

namespace tiermem {

using detail::ClientCore;

namespace {

constexpr size_t k_max_name_bytes = 255;

// Names travel as protobuf strings, which must be UTF-8 (protobuf refuses to
// decode others, which would end the session): refused here, with a reason.
Status check_name(std::string_view name) {
  const auto bad = [&](const char* why) {
    return Status(ErrorCode::invalid_argument, std::string("allocation name ") + why);
  };
  if (name.size() > k_max_name_bytes) return bad("is longer than 255 bytes");
  for (size_t i = 0; i < name.size();) {
    const auto c = static_cast<unsigned char>(name[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > name.size()) return bad("is not UTF-8 text");
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(name[i + k]) >> 6) != 0x2) return bad("is not UTF-8 text");
    }
    if (c < 0x20 || c == 0x7f) return bad("holds a control character");
    i += n;
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<Client>> Client::connect(const ClientOptions& options) {
  TIERMEM_ASSIGN_OR_RETURN(auto core, ClientCore::connect(options));
  return std::unique_ptr<Client>(new Client(std::move(core)));
}

Client::Client(std::shared_ptr<ClientCore> core) : m_core(std::move(core)) {}
Client::~Client() = default;

NodeId Client::node() const { return m_core->node(); }
uint64_t Client::page_size() const { return m_core->page_size(); }

Result<AllocationInfo> Client::alloc(uint64_t size, const AllocOptions& options) {
  TIERMEM_RETURN_IF_ERROR(check_name(options.name));
  proto::Request request;
  proto::AllocRequest* a = request.mutable_alloc();
  a->set_size(size);
  a->set_tier(wire::to_proto(options.tier));
  a->set_strict(options.strict);
  a->set_name(options.name);
  a->set_coherent(options.coherent);
  request.set_node(options.node);
  TIERMEM_ASSIGN_OR_RETURN(auto response, m_core->call(request));
  return wire::from_proto(response.alloc().allocation());
}

Status Client::free(Gva gva) {
  proto::Request request;
  wire::to_proto(gva, request.mutable_free()->mutable_gva());
  auto response = m_core->call(request);
  if (response.ok()) m_core->forget(gva);
  return response.status();
}

Result<AllocationInfo> Client::lookup(std::string_view name, NodeId node) {
  TIERMEM_RETURN_IF_ERROR(check_name(name));
  proto::Request request;
  request.set_node(node);
  request.mutable_lookup()->set_name(std::string(name));
  TIERMEM_ASSIGN_OR_RETURN(auto response, m_core->call(request));
  return wire::from_proto(response.lookup().allocation());
}

Result<Translation> Client::translate(Gva gva) {
  proto::Request request;
  wire::to_proto(gva, request.mutable_translate()->mutable_gva());
  TIERMEM_ASSIGN_OR_RETURN(auto response, m_core->call(request));
  const proto::TranslateResponse& t = response.translate();
  Translation out;
  out.allocation = wire::from_proto(t.allocation());
  out.offset_in_allocation = t.offset_in_allocation();
  if (t.pages_size() > 0) out.page = wire::from_proto(t.pages(0));
  for (const auto& x : t.extents()) out.extents.push_back(wire::from_proto(x));
  return out;
}

Status Client::write(Gva gva, const void* data, size_t length) {
  return m_core->write(gva, data, length);
}

Status Client::read(Gva gva, void* data, size_t length) { return m_core->read(gva, data, length); }

Result<uint64_t> Client::fetch_add(Gva gva, uint64_t value) {
  return m_core->atomic(gva, WordOp::fetch_add, value, 0);
}

Result<uint64_t> Client::compare_swap(Gva gva, uint64_t expected, uint64_t desired) {
  return m_core->atomic(gva, WordOp::compare_swap, desired, expected);
}

Result<AllocationInfo> Client::migrate(Gva gva, Tier tier, NodeId to_node) {
  proto::Request request;
  auto* m = request.mutable_migrate();
  wire::to_proto(gva, m->mutable_gva());
  m->set_tier(wire::to_proto(tier));
  m->set_to_node(to_node);
  auto response = m_core->call(request);
  m_core->forget(gva);
  if (!response.ok()) return response.status();
  return wire::from_proto(response->migrate().allocation());
}

AccessCounters Client::access_counters() const { return m_core->counters(); }

Result<std::vector<NodeInfo>> Client::nodes() {
  proto::Request request;
  request.mutable_nodes();
  TIERMEM_ASSIGN_OR_RETURN(auto response, m_core->call(request));
  std::vector<NodeInfo> out;
  for (const proto::NodeInfo& n : response.nodes().nodes()) {
    NodeInfo info;
    info.node = static_cast<NodeId>(n.node_id());
    info.control_address = n.control_address();
    info.state = static_cast<NodeState>(n.state());
    info.incarnation = n.incarnation();
    info.transports = n.transports();
    info.last_error = n.last_error();
    info.state_since_ms = n.state_since_ms();
    out.push_back(std::move(info));
  }
  return out;
}

Result<Mapping> Client::map(Gva gva) {
  proto::Request request;
  wire::to_proto(gva, request.mutable_map()->mutable_gva());
  TIERMEM_ASSIGN_OR_RETURN(auto response, m_core->call(request));
  const AllocationInfo info = wire::from_proto(response.map().allocation());

  Mapping m;
  m.m_core = m_core;
  m.m_allocation = info;
  auto unpin_on_error = [&](Status s) {
    m.release();
    return s;
  };
  // Reserve one range for the whole allocation, then place each physically
  // contiguous extent into it, from the file of the tenant's domain that
  // holds it.
  m.m_reserved = info.pages * page_size();
  void* base = ::mmap(nullptr, m.m_reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    m.m_reserved = 0;
    return unpin_on_error(Status(ErrorCode::io_error, std::string("reserving address space: ") + std::strerror(errno)));
  }
  m.m_data = static_cast<std::byte*>(base);
  m.m_size = info.size;
  m.m_persistent = m_core->region_persistent(info.tier);
  for (const auto& px : response.map().extents()) {
    const Extent x = wire::from_proto(px);
    auto file = m_core->tier_file(x.tier, x.frame_offset, x.length);
    if (!file.ok()) return unpin_on_error(file.status().with_context("map " + info.gva.to_string()));
    void* at = ::mmap(m.m_data + x.gva_offset, x.length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                      file->first, static_cast<off_t>(file->second));
    if (at == MAP_FAILED) {
      return unpin_on_error(Status(ErrorCode::io_error, "mapping an extent of " + info.gva.to_string() +
                                                            ": " + std::strerror(errno)));
    }
  }
  return m;
}

Result<NodeStat> Client::stat(NodeId node) {
  proto::Request request;
  request.set_node(node);
  request.mutable_stat();
  TIERMEM_ASSIGN_OR_RETURN(auto response, m_core->call(request));
  const proto::StatResponse& s = response.stat();
  NodeStat out;
  out.node = static_cast<NodeId>(s.node_id());
  out.page_size = s.page_size();
  for (const auto& t : s.tiers()) out.tiers.push_back(wire::from_proto(t));
  out.allocations = s.allocations();
  out.sessions = s.sessions();
  out.uptime_ms = s.uptime_ms();
  out.daemon_version = s.daemon_version();
  out.socket_path = s.socket_path();
  out.locks_broken = s.locks_broken();
  out.truncations_repaired = s.truncations_repaired();
  return out;
}

Result<std::vector<AllocationInfo>> Client::list(NodeId node) {
  proto::Request request;
  request.set_node(node);
  request.mutable_list();
  TIERMEM_ASSIGN_OR_RETURN(auto response, m_core->call(request));
  std::vector<AllocationInfo> out;
  for (const auto& a : response.list().allocations()) out.push_back(wire::from_proto(a));
  return out;
}

Result<MappingDump> Client::dump(NodeId node) {
  proto::Request request;
  request.set_node(node);
  request.mutable_dump();
  TIERMEM_ASSIGN_OR_RETURN(auto response, m_core->call(request));
  const proto::DumpResponse& d = response.dump();
  MappingDump out;
  out.node = static_cast<NodeId>(d.node_id());
  out.page_size = d.page_size();
  out.l2_pages = d.l2_pages();
  for (const auto& a : d.allocations()) out.allocations.push_back(wire::from_proto(a));
  for (const auto& p : d.pages()) out.pages.push_back(wire::from_proto(p));
  return out;
}

// --- Mapping -------------------------------------------------------------------

Mapping::Mapping(Mapping&& other) noexcept { *this = std::move(other); }

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    release();
    m_core = std::move(other.m_core);
    m_allocation = other.m_allocation;
    m_data = std::exchange(other.m_data, nullptr);
    m_size = std::exchange(other.m_size, 0);
    m_reserved = std::exchange(other.m_reserved, 0);
    m_persistent = other.m_persistent;
  }
  return *this;
}

Mapping::~Mapping() { release(); }

void Mapping::release() {
  if (m_data != nullptr) ::munmap(m_data, m_reserved);
  m_data = nullptr;
  m_size = m_reserved = 0;
  if (m_core) {
    proto::Request request;
    wire::to_proto(m_allocation.gva, request.mutable_unmap()->mutable_gva());
    // A failure means the connection is gone, and the daemon then unpins the
    // session's mappings itself.
    (void)m_core->call(request);
    m_core.reset();
  }
}

Status Mapping::persist(size_t offset, size_t length) const {
  if (offset > m_size || length > m_size - offset) {
    return Status(ErrorCode::out_of_range, "persist range runs past the end of the mapping");
  }
  if (!m_persistent || length == 0) return Status();
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(m_data + offset) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(m_data + offset + length);
  if (::msync(reinterpret_cast<void*>(start), end - start, MS_SYNC) != 0) {
    return Status(ErrorCode::io_error, std::string("msync: ") + std::strerror(errno));
  }
  return Status();
}

}  // namespace tiermem
