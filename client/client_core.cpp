#include "client/client_core.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <tiermem/status_macros.h>

#include "convert.hpp"

namespace tiermem::detail {
namespace {

constexpr auto k_timeout = std::chrono::milliseconds(10000);
// A range whose translation keeps changing (pages migrating one after the
// other) is retried this long before the caller hears busy.
constexpr auto k_retry_time = std::chrono::milliseconds(10000);
constexpr const char* k_default_socket = "/run/tiermem/tiermemd.sock";

// Hands copy_through_layout the accessors of this client: its mappings of
// local memory, and the data plane for other nodes. Keeps the remote states it
// handed out alive until the copy is done.
class ClientAccess final : public MemoryAccess {
 public:
  explicit ClientAccess(ClientCore& core) : m_core(core) {}
  // Whether the operation reached another node's memory.
  bool went_remote() const { return !m_held.empty(); }
  Result<VersionWords*> versions(NodeId home) override {
    if (home == m_core.node()) return m_core.local_versions();
    TIERMEM_ASSIGN_OR_RETURN(auto r, remote(home));
    return static_cast<VersionWords*>(r->words.get());
  }
  Result<FrameData*> frames(NodeId node, Tier tier) override {
    if (node == m_core.node()) return m_core.local_frames(tier);
    TIERMEM_ASSIGN_OR_RETURN(auto r, remote(node));
    RemoteFrameData* f = r->frames[static_cast<size_t>(tier)].get();
    if (f == nullptr) {
      return Status(ErrorCode::not_supported, "node " + std::to_string(node) + "'s " +
                                                  std::string(tier_name(tier)) + " tier is not reachable one-sided");
    }
    return static_cast<FrameData*>(f);
  }

 private:
  Result<std::shared_ptr<RemoteState>> remote(NodeId node) {
    auto r = m_core.remote(node);
    if (r.ok()) m_held.push_back(*r);
    return r;
  }
  ClientCore& m_core;
  std::vector<std::shared_ptr<RemoteState>> m_held;
};

bool is_transport_failure(const Status& s) {
  return s.code() == ErrorCode::transport_error || s.code() == ErrorCode::timeout;
}

// The extent holding byte `offset` of the allocation.
const Extent* extent_at(const CachedAllocation& a, uint64_t offset) {
  auto it = std::upper_bound(a.extents.begin(), a.extents.end(), offset,
                             [](uint64_t o, const Extent& x) { return o < x.gva_offset; });
  if (it == a.extents.begin()) return nullptr;
  --it;
  return offset < it->gva_offset + it->length ? &*it : nullptr;
}

}  // namespace

Result<std::shared_ptr<ClientCore>> ClientCore::connect(const ClientOptions& options) {
  std::string path = options.socket_path;
  if (path.empty()) {
    const char* env = std::getenv("TIERMEM_SOCKET");
    path = env != nullptr && *env != '\0' ? env : k_default_socket;
  }
  TIERMEM_ASSIGN_OR_RETURN(auto connection, RpcConnection::connect_unix(path));
  proto::Request request;
  request.mutable_hello()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  request.mutable_hello()->set_client_name(options.client_name);
  TIERMEM_ASSIGN_OR_RETURN(auto response, connection->call(request));
  if (response.hello().max_frame_bytes() > 0) {
    connection->set_max_frame(static_cast<uint32_t>(response.hello().max_frame_bytes()));
  }
  return std::shared_ptr<ClientCore>(
      new ClientCore(std::move(connection), response.hello(), options.direct_access));
}

// --- local memory --------------------------------------------------------------------

Status ClientCore::open_regions() {
  std::call_once(m_regions_once, [this] {
    proto::Request request;
    request.mutable_open_regions();
    std::vector<UniqueFd> fds;
    auto response = call(request, &fds);
    if (!response.ok()) {
      m_regions_status = response.status();
      return;
    }
    size_t next_fd = 0;
    for (const proto::Region& r : response->open_regions().regions()) {
      if (!r.has_fd()) continue;
      if (next_fd >= fds.size()) {
        m_regions_status = Status(ErrorCode::internal, "tiermemd sent fewer descriptors than regions");
        return;
      }
      UniqueFd fd = std::move(fds[next_fd++]);
      auto map = MappedRegion::map(fd.get(), r.length());
      if (!map.ok()) {
        m_regions_status = map.status().with_context("mapping a tier region");
        return;
      }
      if (r.kind() == proto::Region::VERSIONS) {
        m_versions = std::move(map).value();
      } else if (r.kind() == proto::Region::SUB_BLOCKS) {
        m_sub_blocks = std::move(map).value();
      } else {
        const auto tier = static_cast<size_t>(wire::from_proto(r.tier()));
        LocalRegion& region = m_regions[tier];
        region.fd = std::move(fd);
        region.map = std::move(map).value();
        region.persistent = r.persistent();
        m_local_frames[tier].emplace(region.map.data(), region.map.size(), region.persistent);
      }
    }
    m_local_words.emplace(reinterpret_cast<uint64_t*>(m_versions.data()), m_versions.size() / sizeof(uint64_t),
                          reinterpret_cast<uint64_t*>(m_sub_blocks.data()), page_size());
  });
  return m_regions_status;
}

Result<VersionWords*> ClientCore::local_versions() {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  TIERMEM_RETURN_IF_ERROR(open_regions());
  return static_cast<VersionWords*>(&*m_local_words);
}

Result<FrameData*> ClientCore::local_frames(Tier tier) {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  TIERMEM_RETURN_IF_ERROR(open_regions());
  auto& f = m_local_frames[static_cast<size_t>(tier)];
  if (!f) {
    return Status(ErrorCode::not_supported,
                  "the " + std::string(tier_name(tier)) + " tier cannot be mapped into a client");
  }
  return static_cast<FrameData*>(&*f);
}

Result<int> ClientCore::region_fd(Tier tier) {
  TIERMEM_RETURN_IF_ERROR(open_regions());
  const LocalRegion& r = m_regions[static_cast<size_t>(tier)];
  if (!r.fd.valid()) {
    return Status(ErrorCode::not_supported,
                  "the " + std::string(tier_name(tier)) + " tier cannot be mapped into a client process");
  }
  return r.fd.get();
}

bool ClientCore::region_persistent(Tier tier) const {
  return m_regions[static_cast<size_t>(tier)].persistent;
}

// --- other nodes ---------------------------------------------------------------------

Result<std::shared_ptr<RemoteState>> ClientCore::remote(NodeId node) {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  std::lock_guard lock(m_remote_mutex);
  if (auto it = m_remote.find(node); it != m_remote.end()) return it->second;
  if (!m_transport && m_transport_status.ok()) {
    auto t = make_ucx_transport({});
    if (t.ok()) {
      m_transport = std::move(t).value();
    } else {
      m_transport_status = t.status();
    }
  }
  if (!m_transport) {
    return Status(ErrorCode::not_supported, "no data plane here: " + m_transport_status.message());
  }
  proto::Request request;
  request.mutable_nodes();
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  for (const proto::NodeInfo& n : response.nodes().nodes()) {
    if (n.node_id() != node) continue;
    if (n.state() != proto::NodeInfo::CONNECTED || n.transport_address().empty()) {
      return Status(ErrorCode::transport_error, "node " + std::to_string(node) + " is " +
                                                    std::string(node_state_name(static_cast<NodeState>(n.state()))) +
                                                    (n.last_error().empty() ? "" : ": " + n.last_error()));
    }
    std::vector<RegionAdvert> regions;
    for (const proto::RegionKey& k : n.regions()) {
      regions.push_back({k.kind() == proto::Region::VERSIONS, wire::from_proto(k.tier()), k.base(), k.length(),
                         k.packed_key(), k.persistent()});
    }
    TIERMEM_ASSIGN_OR_RETURN(auto rn,
                             connect_remote_node(*m_transport, node, n.incarnation(), n.transport_address(), regions));
    forget_node(node);  // translations from before a restart of the node are void
    auto state = std::make_shared<RemoteState>();
    state->node = rn;
    state->words = std::make_unique<RemoteVersionWords>(*m_transport, state->node, k_timeout);
    for (Tier t : k_tiers_fastest_first) {
      if (!state->node->tiers[static_cast<size_t>(t)].key) continue;
      state->frames[static_cast<size_t>(t)] = std::make_unique<RemoteFrameData>(
          *m_transport, state->node, t, k_timeout,
          [this, node](Tier tier, uint64_t off, uint64_t len) { return persist_remote(node, tier, off, len); });
    }
    m_remote[node] = state;
    return state;
  }
  return Status(ErrorCode::bad_gva, "node " + std::to_string(node) + " is not in the cluster");
}

void ClientCore::drop_remote(NodeId node) {
  std::lock_guard lock(m_remote_mutex);
  m_remote.erase(node);
}

Status ClientCore::persist_remote(NodeId node, Tier tier, uint64_t frame_offset, uint64_t length) {
  proto::Request request;
  request.set_node(node);
  auto* p = request.mutable_persist_frames();
  p->set_tier(wire::to_proto(tier));
  p->set_frame_offset(frame_offset);
  p->set_length(length);
  return call(request).status();
}

// --- translations --------------------------------------------------------------------

Result<std::shared_ptr<const CachedAllocation>> ClientCore::cached(Gva gva, bool refresh) {
  if (!refresh) {
    std::shared_lock lock(m_cache_mutex);
    auto it = m_cache.upper_bound({gva.node, gva.offset});
    if (it != m_cache.begin()) {
      const auto& a = std::prev(it)->second;
      const bool inside = a->base.node == gva.node &&
                          gva.offset < a->base.offset + a->page_versions.size() * page_size();
      if (inside && (gva.generation == 0 || gva.generation == a->base.generation)) return a;
    }
  }
  proto::Request request;
  wire::to_proto(gva, request.mutable_translate()->mutable_gva());
  auto response = call(request);
  if (!response.ok()) {
    if (response.status().code() == ErrorCode::not_allocated) forget(gva);
    return response.status();
  }
  const proto::TranslateResponse& t = response->translate();
  auto a = std::make_shared<CachedAllocation>();
  const AllocationInfo info = wire::from_proto(t.allocation());
  a->base = info.gva;
  a->size = info.size;
  a->first_page = t.first_page_index();
  a->coherent = t.coherent();
  for (const auto& x : t.extents()) a->extents.push_back(wire::from_proto(x));
  a->page_versions.assign(t.page_versions().begin(), t.page_versions().end());
  std::unique_lock lock(m_cache_mutex);
  m_cache[{a->base.node, a->base.offset}] = a;
  return std::shared_ptr<const CachedAllocation>(a);
}

void ClientCore::forget(Gva gva) {
  std::unique_lock lock(m_cache_mutex);
  auto it = m_cache.upper_bound({gva.node, gva.offset});
  if (it != m_cache.begin() && std::prev(it)->first.first == gva.node) m_cache.erase(std::prev(it));
}

void ClientCore::forget_node(NodeId node) {
  std::unique_lock lock(m_cache_mutex);
  for (auto it = m_cache.begin(); it != m_cache.end();) {
    it = it->first.first == node ? m_cache.erase(it) : std::next(it);
  }
}

// --- data ----------------------------------------------------------------------------

AccessCounters ClientCore::counters() const {
  AccessCounters c;
  c.direct_local = m_direct_local.load(std::memory_order_relaxed);
  c.direct_remote = m_direct_remote.load(std::memory_order_relaxed);
  c.through_daemon = m_through_daemon.load(std::memory_order_relaxed);
  return c;
}

Status ClientCore::copy_rpc(Gva gva, std::byte* buf, size_t length, bool to_memory) {
  const uint64_t chunk = std::max<uint64_t>(4096, m_hello.max_inline_bytes());
  while (length > 0) {
    const size_t n = std::min<uint64_t>(length, chunk);
    proto::Request request;
    if (to_memory) {
      wire::to_proto(gva, request.mutable_write()->mutable_gva());
      request.mutable_write()->set_data(buf, n);
    } else {
      wire::to_proto(gva, request.mutable_read()->mutable_gva());
      request.mutable_read()->set_length(n);
    }
    TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
    if (!to_memory) {
      const std::string& data = response.read().data();
      if (data.size() != n) return Status(ErrorCode::internal, "tiermemd returned a short read");
      std::memcpy(buf, data.data(), n);
    }
    buf += n;
    gva.offset += n;
    length -= n;
  }
  m_through_daemon.fetch_add(1, std::memory_order_relaxed);
  return Status();
}

Status ClientCore::copy(Gva gva, std::byte* buf, size_t length, bool to_memory) {
  if (length == 0) return Status();
  if (!m_direct) return copy_rpc(gva, buf, length, to_memory);
  bool refresh = false;
  bool retried_transport = false;
  const auto give_up = std::chrono::steady_clock::now() + k_retry_time;
  while (std::chrono::steady_clock::now() < give_up) {
    TIERMEM_ASSIGN_OR_RETURN(auto a, cached(gva, refresh));
    const CachedAllocation& alloc = *a;
    const uint64_t offset = gva.offset - alloc.base.offset;
    if (offset > alloc.size || length > alloc.size - offset) {
      return Status(ErrorCode::out_of_range,
                    std::string(to_memory ? "write" : "read") + " of " + std::to_string(length) +
                        " bytes at " + gva.to_string() + " (offset " + std::to_string(offset) +
                        ") runs past the end of allocation " + alloc.base.to_string() + " of " +
                        std::to_string(alloc.size) + " bytes");
    }
    ClientAccess access(*this);
    const LayoutView view{alloc.base.node, alloc.first_page, page_size(), alloc.size, alloc.extents,
                          alloc.page_versions};
    Status s = copy_through_layout(view, access, offset, buf, length, to_memory, k_timeout);
    if (s.ok()) {
      (access.went_remote() ? m_direct_remote : m_direct_local).fetch_add(1, std::memory_order_relaxed);
      return s;
    }
    if (is_stale(s)) {
      refresh = true;  // migrated, freed or replaced: translate again. Bytes
      continue;        // copied before are copied again, which is harmless.
    }
    if (s.code() == ErrorCode::not_supported) return copy_rpc(gva, buf, length, to_memory);
    if (is_transport_failure(s) && !retried_transport) {
      // The node may have restarted: reconnect once with fresh addresses.
      retried_transport = true;
      for (const Extent& x : alloc.extents) drop_remote(x.node);
      drop_remote(alloc.base.node);
      refresh = true;
      continue;
    }
    return s;
  }
  return Status(ErrorCode::busy, "translation of " + gva.to_string() +
                                     " kept changing; the allocation is being migrated or freed");
}

Status ClientCore::write(Gva gva, const void* src, size_t length) {
  return copy(gva, static_cast<std::byte*>(const_cast<void*>(src)), length, true);
}

Status ClientCore::read(Gva gva, void* dst, size_t length) {
  return copy(gva, static_cast<std::byte*>(dst), length, false);
}

Result<uint64_t> ClientCore::atomic_rpc(Gva gva, WordOp op, uint64_t operand, uint64_t compare) {
  proto::Request request;
  auto* a = request.mutable_atomic();
  wire::to_proto(gva, a->mutable_gva());
  a->set_op(op == WordOp::fetch_add ? proto::ATOMIC_FETCH_ADD : proto::ATOMIC_COMPARE_SWAP);
  a->set_operand(operand);
  a->set_compare(compare);
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  m_through_daemon.fetch_add(1, std::memory_order_relaxed);
  return response.atomic().old_value();
}

Result<uint64_t> ClientCore::atomic(Gva gva, WordOp op, uint64_t operand, uint64_t compare) {
  if (gva.offset % 8 != 0) {
    return Status(ErrorCode::invalid_argument, "atomics need an 8-byte aligned word; " + gva.to_string() + " is not");
  }
  if (!m_direct) return atomic_rpc(gva, op, operand, compare);
  bool refresh = false;
  const auto give_up = std::chrono::steady_clock::now() + k_retry_time;
  while (std::chrono::steady_clock::now() < give_up) {
    TIERMEM_ASSIGN_OR_RETURN(auto a, cached(gva, refresh));
    const CachedAllocation& alloc = *a;
    const uint64_t offset = gva.offset - alloc.base.offset;
    if (offset + 8 > alloc.size) {
      return Status(ErrorCode::out_of_range, "word at " + gva.to_string() + " lies past the end of allocation " +
                                                 alloc.base.to_string() + " of " + std::to_string(alloc.size) + " bytes");
    }
    const Extent* x = extent_at(alloc, offset);
    if (x == nullptr) {
      refresh = true;
      continue;
    }
    ClientAccess access(*this);
    auto words = access.versions(alloc.base.node);
    auto frames = words.ok() ? access.frames(x->node, x->tier) : Result<FrameData*>(words.status());
    Status s = frames.status();
    uint64_t old = 0;
    if (s.ok()) {
      const uint64_t index = offset / page_size();
      s = seqlocked_atomic(**words, **frames, alloc.first_page + index, alloc.page_versions[index],
                           alloc.coherent, x->frame_offset + (offset - x->gva_offset), op, operand,
                           compare, &old, k_timeout);
    }
    if (s.ok()) {
      (access.went_remote() ? m_direct_remote : m_direct_local).fetch_add(1, std::memory_order_relaxed);
      return old;
    }
    if (is_stale(s)) {
      refresh = true;
      continue;
    }
    if (s.code() == ErrorCode::not_supported) return atomic_rpc(gva, op, operand, compare);
    if (is_transport_failure(s)) {
      // Not retried: the operation may have been applied before the failure,
      // and an atomic must not be applied twice.
      drop_remote(x->node);
      drop_remote(alloc.base.node);
      return s.with_context("atomic on " + gva.to_string() + " (its outcome is unknown)");
    }
    return s;
  }
  return Status(ErrorCode::busy, "translation of " + gva.to_string() + " kept changing");
}

}  // namespace tiermem::detail
