#include "client/client_core.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <list>
#include <optional>
#include <utility>

#include <tiermem/status_macros.h>

#include "common/deadline.hpp"
#include "convert.hpp"
#include "pages/sub_blocks.hpp"
#include "pages/segment_layout.hpp"
#include "pages/version.hpp"

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
  // `device_only`: the buffer is CUDA device memory, which only the copy
  // engines may touch: any frames but this node's VRAM are not_supported.
  explicit ClientAccess(ClientCore& core, bool device_only = false) : m_core(core), m_device_only(device_only) {}
  // Every lock taken through these words is recorded in a session's lock log
  // first, so a daemon can break it if this process dies holding it: the
  // session of the words' own daemon where this client maps them, else this
  // client's daemon's (which has the home break it).
  Result<VersionWords*> versions(NodeId home, uint64_t first_page) override {
    VersionWords* inner = nullptr;
    std::optional<IntentLog> log;
    if (home == m_core.node()) {
      TIERMEM_ASSIGN_OR_RETURN(inner, m_core.local_versions(first_page));
    } else if (auto s = sibling(home)) {
      TIERMEM_ASSIGN_OR_RETURN(inner, s->regions->versions(first_page));
      TIERMEM_ASSIGN_OR_RETURN(log, s->regions->intents());
    } else {
      TIERMEM_ASSIGN_OR_RETURN(auto r, remote(home));
      inner = r->words.get();
    }
    if (!log) {
      TIERMEM_ASSIGN_OR_RETURN(log, m_core.intents());
    }
    return record(*inner, *log, home);
  }
  Result<FrameData*> frames(NodeId node, Tier tier) override {
    if (m_device_only && tier != Tier::vram) {
      return Status(ErrorCode::not_supported, "a device buffer goes straight only to VRAM");
    }
    if (node == m_core.node()) return m_core.local_frames(tier);
    if (auto s = sibling(node)) {
      // A daemon of this host: its files, or its VRAM imported as this
      // node's is (another GPU: copies GPU to GPU).
      if (tier == Tier::vram) return ClientCore::sibling_vram(*s);
      return s->regions->frames(tier);
    }
    if (m_device_only) {
      return Status(ErrorCode::not_supported, "a device buffer goes straight only to the VRAM of this host's nodes");
    }
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
  // The node's mapped memory, when its daemon runs on this host (kept alive
  // until the copy is done).
  SiblingNode* sibling(NodeId node) {
    auto s = m_core.sibling(node);
    if (!s.ok()) return nullptr;
    m_siblings.push_back(*s);
    return s->get();
  }
  ClientCore& m_core;
  bool m_device_only;
  std::vector<std::shared_ptr<RemoteState>> m_held;
  std::vector<std::shared_ptr<SiblingNode>> m_siblings;
  // The words handed out (a copy asks once or twice: no allocation then).
  VersionWords* record(VersionWords& inner, IntentLog log, NodeId home) {
    for (auto& slot : m_recorded) {
      if (!slot) return &slot.emplace(inner, log, home);
    }
    return &m_more.emplace_back(inner, log, home);
  }
  std::optional<RecordedVersionWords> m_recorded[2];
  std::list<RecordedVersionWords> m_more;
};

// Translations that keep changing are tried again this long, or until the
// call's deadline.
std::chrono::steady_clock::time_point retry_until() {
  const auto until = std::chrono::steady_clock::now() + k_retry_time;
  return ScopedDeadline::active() ? std::min(until, ScopedDeadline::at()) : until;
}

bool is_transport_failure(const Status& s) {
  return s.code() == ErrorCode::transport_error || s.code() == ErrorCode::timeout;
}

}  // namespace

const Extent* extent_at(const CachedAllocation& a, uint64_t offset) {
  auto it = std::upper_bound(a.extents.begin(), a.extents.end(), offset,
                             [](uint64_t o, const Extent& x) { return o < x.gva_offset; });
  if (it == a.extents.begin()) return nullptr;
  --it;
  return offset < it->gva_offset + it->length ? &*it : nullptr;
}

namespace {

std::chrono::milliseconds checkin_interval_of(const ClientOptions& options) {
  if (options.checkin_interval.count() >= 0) return options.checkin_interval;
  if (const char* env = std::getenv("TIERMEM_CHECKIN_INTERVAL_MS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (end != env && *end == '\0' && v >= 0 && v <= 3600 * 1000) return std::chrono::milliseconds(v);
  }
  return std::chrono::milliseconds(30000);
}

}  // namespace

Result<std::shared_ptr<ClientCore>> ClientCore::connect(const ClientOptions& options, uint64_t client_id,
                                                       const std::vector<Gva>& mapped) {
  std::string path = options.socket_path;
  if (path.empty()) {
    const char* env = std::getenv("TIERMEM_SOCKET");
    path = env != nullptr && *env != '\0' ? env : k_default_socket;
  }
  TIERMEM_ASSIGN_OR_RETURN(auto connection, RpcConnection::connect_unix(path));
  if (options.timeout.count() > 0) connection->set_timeout(options.timeout);
  const std::chrono::milliseconds checkin = checkin_interval_of(options);
  HelloArgs hello{options.client_name, static_cast<uint32_t>(checkin.count()), client_id, mapped};
  TIERMEM_ASSIGN_OR_RETURN(proto::HelloResponse said, ControlStub::over(*connection).hello(hello));
  if (said.max_frame_bytes() > 0) connection->set_max_frame(static_cast<uint32_t>(said.max_frame_bytes()));
  auto core = std::shared_ptr<ClientCore>(
      new ClientCore(std::move(connection), std::move(said), options.direct_access, path, checkin));
  if (options.lock_timeout.count() > 0) core->m_lock_timeout = options.lock_timeout;
  core->m_map_same_host = options.map_same_host;
  if (const char* env = std::getenv("TIERMEM_MAP_SAME_HOST"); env != nullptr && std::string_view(env) == "0") {
    core->m_map_same_host = false;
  }
  core->m_client_id = client_id;
  core->m_client_name = options.client_name;
  core->m_qos.set_options(options.qos);
  if (options.timeout.count() > 0) core->m_nodes.set_timeout(std::min(options.timeout, k_timeout));
  core->m_nodes.on_fallback(options.on_data_plane_fallback);
  return core;
}

ClientCore::ClientCore(std::unique_ptr<RpcConnection> connection, proto::HelloResponse hello, bool direct,
                       std::string socket, std::chrono::milliseconds checkin_interval)
    : m_connection(std::move(connection)), m_hello(std::move(hello)), m_direct(direct), m_socket(std::move(socket)),
      m_checkin_interval(checkin_interval) {
  m_watch_stop.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  m_watcher = std::thread([this] { watch_daemon(); });
}

ClientCore::~ClientCore() {
  const uint64_t one = 1;
  if (m_watch_stop.valid()) (void)::write(m_watch_stop.get(), &one, sizeof one);
  if (m_watcher.joinable()) m_watcher.join();
}

// Waits for the daemon's end of the control socket to close (the daemon
// died, or dropped us): from then on no direct access is made. Checks in
// every m_checkin_interval meanwhile (the call waits while another is in
// flight, which the daemon counts as a check-in itself).
void ClientCore::watch_daemon() {
  // A descriptor of our own: the connection may close its one on an error.
  UniqueFd socket(m_connection->duplicate_fd());
  pollfd fds[2] = {{socket.get(), POLLRDHUP, 0}, {m_watch_stop.get(), POLLIN, 0}};
  const int wait_ms = m_checkin_interval.count() > 0 ? static_cast<int>(m_checkin_interval.count()) : -1;
  for (;;) {
    const int n = ::poll(fds, 2, wait_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      (void)ControlStub::over(*m_connection).check_in();  // a failure shows on the socket, or in the next call
      continue;
    }
    if (n < 0 || (fds[1].revents & POLLIN) != 0) return;
    if ((fds[0].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) {
      m_daemon_lost.store(true, std::memory_order_seq_cst);
      tell_lost();
      return;
    }
  }
}

void ClientCore::on_lost(std::function<void(ClientCore*)> hook) {
  {
    std::lock_guard lock(m_lost_mutex);
    m_on_lost = std::move(hook);
    if (!m_lost_told) return;
    m_lost_told = false;  // it closed before the hook was there: tell it now
  }
  tell_lost();
}

void ClientCore::tell_lost() {
  std::function<void(ClientCore*)> hook;
  {
    std::lock_guard lock(m_lost_mutex);
    if (m_lost_told) return;
    m_lost_told = true;
    hook = m_on_lost;
  }
  if (hook) hook(this);
}

bool ClientCore::daemon_died() const { return m_local.daemon_died(); }

Status ClientCore::daemon_gone() const {
  return Status(ErrorCode::unavailable, "tiermemd at " + m_socket +
                                            " is gone (its connection closed): nothing is written through its "
                                            "memory any more; connect again once it is back");
}

Result<proto::Response> ClientCore::call(proto::Request& request, std::vector<UniqueFd>* fds) {
  auto response = m_connection->call(request, fds);
  // Only this connection breaking means the daemon is lost: connection_closed
  // may also be the daemon's answer about a peer ("node 1: ... peer closed
  // the connection"), which must not make the client drop a healthy daemon.
  // (A timeout breaks the connection too, but is reported as what it is; the
  // next call finds the connection closed.)
  if (!response.ok() && response.status().code() == ErrorCode::connection_closed && m_connection->broken()) {
    m_daemon_lost.store(true, std::memory_order_seq_cst);
  }
  return response;
}

// --- translations --------------------------------------------------------------------

Result<std::shared_ptr<const CachedAllocation>> ClientCore::cached(Gva gva, bool refresh) {
  if (!refresh) {
    if (auto a = m_cache.find(gva)) return a;
  }
  auto response = m_stub.translate_for_cache(gva);
  if (!response.ok()) {
    if (response.status().code() == ErrorCode::not_allocated) forget(gva);
    return response.status();
  }
  const proto::TranslateResponse& t = *response;
  auto a = std::make_shared<CachedAllocation>();
  const AllocationInfo info = wire::from_proto(t.allocation());
  a->base = info.gva;
  a->size = info.size;
  a->slot_bytes = info.slot_bytes;
  a->first_page = t.first_page_index();
  a->coherent = t.coherent();
  a->readable_copies = info.replicas_wanted > 0 || !info.replicas.empty();
  a->changes_through_home = a->readable_copies || info.replica_of.node != 0;
  a->qos = info.qos;
  a->home_incarnation = t.home_incarnation();
  for (const auto& x : t.extents()) a->extents.push_back(wire::from_proto(x));
  a->page_versions.assign(t.page_versions().begin(), t.page_versions().end());
  m_cache.put(a);
  return std::shared_ptr<const CachedAllocation>(a);
}

void ClientCore::forget(Gva gva) {
  m_coherent.forget_all();
  m_cache.forget(gva);
}

void ClientCore::forget_node(NodeId node) {
  m_coherent.forget_all();
  m_cache.forget_node(node);
}

// --- data ----------------------------------------------------------------------------

AccessCounters ClientCore::counters() const {
  AccessCounters c;
  c.direct_local = m_direct_local.load(std::memory_order_relaxed);
  c.direct_remote = m_direct_remote.load(std::memory_order_relaxed);
  c.message = m_message.load(std::memory_order_relaxed);
  c.through_daemon = m_through_daemon.load(std::memory_order_relaxed);
  c.requests_sent = m_nodes.requests_sent();
  c.staged_device = m_staged_device.load(std::memory_order_relaxed);
  c.plane_fallbacks = m_nodes.fallbacks();
  return c;
}

Status ClientCore::copy_rpc(Gva gva, std::byte* buf, size_t length, bool to_memory, bool from_replica) {
  const uint64_t chunk = std::max<uint64_t>(4096, m_hello.max_inline_bytes());
  // The bytes of a write go into a string of this thread's kept from call
  // to call (fresh memory would take a page fault per page).
  thread_local std::unique_ptr<std::string> t_data;
  while (length > 0) {
    const size_t n = std::min<uint64_t>(length, chunk);
    if (to_memory) {
      if (!t_data) t_data = std::make_unique<std::string>();
      t_data->assign(reinterpret_cast<const char*>(buf), n);
      TIERMEM_RETURN_IF_ERROR(m_stub.write(gva, t_data));
    } else {
      TIERMEM_RETURN_IF_ERROR(m_stub.read(gva, {buf, n}, from_replica));
    }
    buf += n;
    gva.offset += n;
    length -= n;
  }
  m_through_daemon.fetch_add(1, std::memory_order_relaxed);
  return Status();
}

bool home_unreachable(const Status& s) {
  switch (s.code()) {
    case ErrorCode::transport_error:
    case ErrorCode::timeout:
    case ErrorCode::unavailable:
    case ErrorCode::connection_failed:
    case ErrorCode::connection_closed:
    case ErrorCode::io_error:  // the link to the home broke (EPIPE, ECONNRESET)
    case ErrorCode::data_lost:
      return true;
    default:
      return false;
  }
}

Status ClientCore::read_copy(Gva gva, std::byte* buf, size_t length, const Status& failed) {
  if (!home_unreachable(failed) || gva.node == node() || lost()) return failed;
  Status s = copy_rpc(gva, buf, length, false, true);
  if (s.ok()) return s;
  return Status(failed.code(), failed.message() + "; and from a copy: " + s.message());
}

Status ClientCore::check_remote_extents(const CachedAllocation& a) {
  if (a.base.node != node()) {
    if (auto s = sibling(a.base.node); s.ok()) {
      // Mapped from its daemon on this host: the translation must be of the
      // daemon that handed the memory over (its headers say when it goes).
      if ((*s)->hello.incarnation() != a.home_incarnation) return stale_translation();
      return check_lent_extents(a);
    }
    auto home = remote(a.base.node);
    if (home.ok() && (*home)->node->incarnation != a.home_incarnation) {
      // What we know of the home may be the older one (it restarted since):
      // ask once; a translation of another incarnation than the home's is
      // stale.
      home = remote(a.base.node, true);
      if (home.ok() && (*home)->node->incarnation != a.home_incarnation) return stale_translation();
    }
  }
  return check_lent_extents(a);
}

Status ClientCore::check_lent_extents(const CachedAllocation& a) {
  // Frames lent by a node whose domain holding them is not what it was when
  // it lent them (it came back with that domain's memory made anew) are
  // never touched: the home will say they are lost.
  const auto changed = [&](const RemoteNode& lender, const Extent& x) {
    const RemoteRegion* r = lender.frame_region(x.tier, x.frame_offset, x.length);
    return r != nullptr && r->memory_generation != x.memory_generation;
  };
  for (const Extent& x : a.extents) {
    if (x.node == a.base.node || x.node == node()) continue;
    if (auto s = sibling(x.node); s.ok()) {
      const uint64_t now = (*s)->regions->memory_generation(x.tier, x.frame_offset);
      if (now != 0 && now != x.memory_generation) return stale_translation();
      continue;
    }
    auto lender = remote(x.node);
    if (lender.ok() && changed(*(*lender)->node, x)) {
      lender = remote(x.node, true);  // unless what we know of it is old
      if (lender.ok() && changed(*(*lender)->node, x)) return stale_translation();
    }
  }
  return Status();
}

Result<Path> ClientCore::path_to(NodeId node, std::optional<Tier> tier, uint64_t first, uint64_t length,
                                 std::vector<NodeId>* stale) {
  if (node == this->node()) return Path::local;
  if (auto s = sibling(node); s.ok()) {
    // Another node's VRAM on this host: imported (another GPU), else
    // through its daemon.
    if (tier == Tier::vram) return sibling_vram(**s).ok() ? Path::mapped : Path::daemon;
    return Path::mapped;
  }
  auto r = remote(node);
  if (!r.ok()) {
    if (r.status().code() != ErrorCode::not_supported) return r.status();
    // A node that offers this tenant no data plane may offer one later (the
    // route is decided again then); a client with none of its own never.
    if (m_nodes.may_have_plane() && std::find(stale->begin(), stale->end(), node) == stale->end()) {
      stale->push_back(node);
    }
    return Path::daemon;
  }
  const RemoteNode& n = *(*r)->node;
  Transport& fabric = *m_nodes.transport();  // started: `node` was reached through it
  switch (tier ? n.reach_frames(fabric, *tier, first, length) : n.reach_words(fabric, first, length)) {
    case Reach::one_sided: return Path::one_sided;
    case Reach::message: return Path::message;
    case Reach::none: return Path::daemon;
    case Reach::stale: break;
  }
  if (std::find(stale->begin(), stale->end(), node) == stale->end()) stale->push_back(node);
  return Path::daemon;
}

std::shared_ptr<const CachedAllocation> ClientCore::routed(std::shared_ptr<const CachedAllocation> a, bool again) {
  uint64_t epoch = m_nodes.epoch();
  if (!again && a->routes && a->routes->epoch == epoch &&
      (!a->routes->provisional || std::chrono::steady_clock::now() - a->routes->decided < k_forced_refresh)) {
    return a;
  }
  auto routes = std::make_shared<Routes>();
  for (bool refreshed = false;; refreshed = true) {
    // Read before deciding: keys added meanwhile make the next call decide again.
    epoch = m_nodes.epoch();
    std::vector<NodeId> stale;
    routes->epoch = epoch;
    routes->failure = Status();
    // A node that cannot be reached fails the operations that touch it
    // only (they find out again after dropping it: see copy()).
    const auto or_failed = [&](Result<Path> p) {
      if (p.ok()) return *p;
      if (routes->failure.ok()) routes->failure = p.status();
      return Path::failed;
    };
    routes->words = or_failed(path_to(a->base.node, std::nullopt, a->first_page, a->page_versions.size(), &stale));
    routes->extents.clear();
    for (const Extent& x : a->extents) {
      routes->extents.push_back(or_failed(path_to(x.node, x.tier, x.frame_offset, x.length, &stale)));
    }
    routes->provisional = !stale.empty() || !routes->failure.ok();
    routes->decided = std::chrono::steady_clock::now();
    if (stale.empty() || refreshed) break;
    // No key for a piece: a domain of this tenant newer than the keys held,
    // or none at all. Keys are asked for once; without newer ones the piece
    // goes through the daemon (for this translation).
    bool added = false;
    for (NodeId n : stale) added = m_nodes.refresh_keys(n).ok() || added;
    if (!added) break;
  }
  auto with = std::make_shared<CachedAllocation>(*a);
  with->routes = std::move(routes);
  std::shared_ptr<const CachedAllocation> out = std::move(with);
  m_cache.replace(a, out);
  return out;
}

Path path_of(const CachedAllocation& a, uint64_t offset, uint64_t length) {
  Path path = a.routes->words;
  auto it = std::upper_bound(a.extents.begin(), a.extents.end(), offset,
                             [](uint64_t o, const Extent& x) { return o < x.gva_offset; });
  if (it != a.extents.begin()) --it;
  for (; it != a.extents.end() && it->gva_offset < offset + length; ++it) {
    if (offset < it->gva_offset + it->length) path = std::max(path, a.routes->extents[it - a.extents.begin()]);
  }
  return path;
}


void ClientCore::count(Path path) {
  switch (path) {
    case Path::local: m_direct_local.fetch_add(1, std::memory_order_relaxed); break;
    case Path::mapped:
    case Path::one_sided: m_direct_remote.fetch_add(1, std::memory_order_relaxed); break;
    case Path::message: m_message.fetch_add(1, std::memory_order_relaxed); break;
    case Path::daemon: m_through_daemon.fetch_add(1, std::memory_order_relaxed); break;
    case Path::failed: break;  // never counted: such an operation does not succeed
  }
}

Status ClientCore::copy(Gva gva, std::byte* buf, size_t length, bool to_memory, bool fallback) {
  if (length == 0) return Status();
  // A read the home could not serve goes to a copy (when asked to).
  const auto or_copy = [&](const Status& failed) {
    return fallback && !to_memory ? read_copy(gva, buf, length, failed) : failed;
  };
  if (!m_direct) {
    Status s = copy_rpc(gva, buf, length, to_memory);
    return s.ok() ? s : or_copy(s);
  }
  if (m_daemon_lost.load(std::memory_order_relaxed)) return daemon_gone();
  bool refresh = false;
  bool retried_transport = false;
  bool route_again = false;  // decide the routes anew (a copy was refused on them)
  bool rerouted = false;
  Status last;  // why the last attempt did not go through, for the final error
  bool plain = false;  // the allocation has no copies to read from
  const auto give_up = retry_until();
  while (std::chrono::steady_clock::now() < give_up) {
    auto a = cached(gva, refresh);
    if (!a.ok()) {
      // The home could not say what the allocation is: a copy may, unless
      // an earlier answer said it has none.
      return plain ? a.status() : or_copy(a.status());
    }
    const CachedAllocation& alloc = **a;
    plain = !alloc.readable_copies;
    const uint64_t offset = gva.offset - alloc.base.offset;
    if (alloc.changes_through_home && to_memory) return copy_rpc(gva, buf, length, true);
    if (offset > alloc.size || length > alloc.size - offset) {
      return past_the_end(to_memory, length, gva, offset, alloc.base, alloc.size);
    }
    Status s = check_remote_extents(alloc);
    // The route, decided once per translation: the daemon at once where
    // nothing else reaches a piece of the range.
    Path path = Path::local;
    if (s.ok()) {
      auto r = routed(*a, std::exchange(route_again, false));
      path = path_of(*r, offset, length);
      if (path == Path::failed) s = r->routes->failure;
    }
    if (s.ok() && path == Path::daemon) return copy_rpc(gva, buf, length, to_memory);
    ClientAccess access(*this);
    if (s.ok()) {
      s = copy_through_layout(layout_of(alloc), access, offset, buf, length, to_memory,
                              ScopedDeadline::bound(m_lock_timeout));
    }
    if (s.ok()) {
      count(path);
      return s;
    }
    if (is_stale(s)) {
      refresh = true;  // migrated, freed or replaced: translate again. Bytes
      last = s;        // copied before are copied again, which is harmless.
      continue;
    }
    if (s.code() == ErrorCode::not_supported && path != Path::local && !rerouted) {
      // Refused on the route decided (what reaches the node changed since):
      // decide it once more, then the daemon.
      rerouted = route_again = true;
      continue;
    }
    if (s.code() == ErrorCode::not_supported) return copy_rpc(gva, buf, length, to_memory);
    if (is_transport_failure(s) && !retried_transport) {
      // The node may have restarted: reconnect once with fresh addresses.
      retried_transport = true;
      for (const Extent& x : alloc.extents) drop_remote(x.node);
      drop_remote(alloc.base.node);
      refresh = true;
      last = s;
      continue;
    }
    return alloc.readable_copies ? or_copy(s) : s;
  }
  if (!last.ok() && !is_stale(last)) return plain ? last : or_copy(last);
  return Status(ErrorCode::busy, "translation of " + gva.to_string() +
                                     " kept changing for " + std::to_string(k_retry_time.count()) +
                                     " ms; the allocation is being migrated or freed");
}

LayoutView ClientCore::layout_of(const CachedAllocation& a) const {
  return {a.base.node, a.first_page, page_size(), a.size, a.extents, a.page_versions, a.base.offset % page_size()};
}

Result<FrameData*> ClientCore::sibling_vram(SiblingNode& s) {
  std::call_once(s.device_once, [&s] {
    if (s.regions->device_windows().empty()) {
      s.device_status = Status(ErrorCode::not_supported, "node " + std::to_string(s.node) + " shares no VRAM");
      return;
    }
    // A chunk its daemon does not hand over is not_supported: the copy then
    // goes through that daemon, as before this path existed.
    auto fetch = [&s](uint64_t offset, uint64_t length) -> Result<std::vector<std::pair<uint64_t, UniqueFd>>> {
      std::lock_guard lock(s.device_mutex);
      auto got = ControlStub::over(*s.connection).device_chunks(Tier::vram, offset, length);
      if (got.ok()) return got;
      return Status(ErrorCode::not_supported, "node " + std::to_string(s.node) + "'s VRAM chunks: " +
                                                  got.status().message());
    };
    auto f = DeviceFrameData::open(s.regions->device_uuid(), s.regions->device_chunk(), s.regions->device_windows(),
                                   std::move(fetch));
    if (f.ok()) {
      s.device = std::move(f).value();
    } else {
      s.device_status = f.status();
    }
  });
  if (!s.device) return s.device_status;
  return static_cast<FrameData*>(s.device.get());
}

Status ClientCore::copy_device(Gva gva, std::byte* buf, size_t length, bool to_memory) {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  if (m_daemon_lost.load(std::memory_order_relaxed)) return daemon_gone();
  bool refresh = false;
  const auto give_up = retry_until();
  while (std::chrono::steady_clock::now() < give_up) {
    TIERMEM_ASSIGN_OR_RETURN(auto a, cached(gva, refresh));
    const CachedAllocation& alloc = *a;
    // Replicated memory is written through its home daemon, to every copy.
    if (alloc.changes_through_home) return Status(ErrorCode::not_supported, "replicated");
    const uint64_t offset = gva.offset - alloc.base.offset;
    ClientAccess access(*this, true);
    Status s = copy_through_layout(layout_of(alloc), access, offset, buf, length, to_memory,
                                   ScopedDeadline::bound(m_lock_timeout));
    if (s.ok()) m_direct_local.fetch_add(1, std::memory_order_relaxed);
    if (!is_stale(s)) return s;
    refresh = true;  // migrated or freed: translate again
  }
  return Status(ErrorCode::not_supported, "translation kept changing");  // the staged path says what is wrong
}

Status ClientCore::write(Gva gva, const void* src, size_t length, std::optional<QosClass> qos) {
  auto* buf = static_cast<std::byte*>(const_cast<void*>(src));
  const QosClass c = class_of(gva, qos);
  if (c == QosClass::standard) return copy(gva, buf, length, true);
  return m_qos.copy(c, /*write=*/true, gva, [&] { return copy(gva, buf, length, true, false); }, nullptr);
}

Status ClientCore::read(Gva gva, void* dst, size_t length, std::optional<QosClass> qos) {
  auto* buf = static_cast<std::byte*>(dst);
  const QosClass c = class_of(gva, qos);
  if (c == QosClass::standard) return copy(gva, buf, length, false);
  return m_qos.copy(
      c, /*write=*/false, gva, [&] { return copy(gva, buf, length, false, false); },
      [&] { return copy_rpc(gva, buf, length, false, /*from_replica=*/true); });
}

std::shared_ptr<const CachedAllocation> ClientCore::peek(Gva gva) { return m_cache.find(gva); }

QosClass ClientCore::class_of(Gva gva, std::optional<QosClass> asked) {
  if (asked) return *asked;
  if (auto a = peek(gva)) return a->qos;
  // Not translated yet: ask, within the longest deadline a class has (a
  // home that does not answer is then a standard call's business).
  ScopedDeadline bounded(std::chrono::steady_clock::now() + m_qos.longest());
  auto a = cached(gva, false);
  return a.ok() ? (*a)->qos : QosClass::standard;
}

Result<uint64_t> ClientCore::atomic(Gva gva, WordOp op, uint64_t operand, uint64_t compare,
                                    std::optional<QosClass> asked) {
  const QosClass qos = class_of(gva, asked);
  if (qos == QosClass::standard) return atomic_once(gva, op, operand, compare);
  return m_qos.atomic(qos, gva, [&] { return atomic_once(gva, op, operand, compare); });
}

Result<uint64_t> ClientCore::atomic_rpc(Gva gva, WordOp op, uint64_t operand, uint64_t compare) {
  TIERMEM_ASSIGN_OR_RETURN(const uint64_t old, op == WordOp::fetch_add ? m_stub.fetch_add(gva, operand)
                                                                       : m_stub.compare_swap(gva, compare, operand));
  m_through_daemon.fetch_add(1, std::memory_order_relaxed);
  return old;
}

Result<uint64_t> ClientCore::atomic_once(Gva gva, WordOp op, uint64_t operand, uint64_t compare) {
  if (gva.offset % 8 != 0) {
    return Status(ErrorCode::invalid_argument, "atomics need an 8-byte aligned word; " + gva.to_string() + " is not");
  }
  if (!m_direct) return atomic_rpc(gva, op, operand, compare);
  if (m_daemon_lost.load(std::memory_order_relaxed)) return daemon_gone();
  bool refresh = false;
  const auto give_up = retry_until();
  while (std::chrono::steady_clock::now() < give_up) {
    TIERMEM_ASSIGN_OR_RETURN(auto a, cached(gva, refresh));
    const CachedAllocation& alloc = *a;
    if (alloc.changes_through_home) return atomic_rpc(gva, op, operand, compare);
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
    Status s = check_remote_extents(alloc);
    Path path = Path::local;
    if (s.ok()) {
      auto r = routed(a, false);
      path = std::max(r->routes->words, r->routes->extents[static_cast<size_t>(x - alloc.extents.data())]);
      if (path == Path::failed) s = r->routes->failure;
    }
    if (s.ok() && path == Path::daemon) return atomic_rpc(gva, op, operand, compare);
    ClientAccess access(*this);
    auto words = s.ok() ? access.versions(alloc.base.node, alloc.first_page) : Result<VersionWords*>(s);
    auto frames = words.ok() ? access.frames(x->node, x->tier) : Result<FrameData*>(words.status());
    s = frames.status();
    uint64_t old = 0;
    const uint64_t index = offset / page_size();
    if (s.ok() && alloc.coherent && (path == Path::local || path == Path::mapped)) {
      // A coherent word takes no lock: that the translation still holds is
      // the page's epoch (a free gives it a new one before its frames go
      // back). Mapped words here; on the message path the home checks it in
      // the atomic's own request (seqlocked_atomic); one-sided, the page is
      // locked instead (below).
      uint64_t now = 0;
      s = (*words)->load(alloc.first_page + index, 1, &now);
      if (s.ok() && version::epoch_of(now) != version::epoch_of(alloc.page_versions[index])) s = stale_translation();
    }
    if (s.ok()) {
      // One-sided, a coherent word's page is locked around the atomic like
      // any other's: the lock's compare-swap fails once a free moved the
      // page's epoch on, and a free waits for the lock. A check of the epoch
      // one round trip before the atomic would leave that round trip for a
      // free and a new allocation to take the frames.
      const bool straight = alloc.coherent && path != Path::one_sided;
      s = seqlocked_atomic(**words, **frames, alloc.first_page + index, alloc.page_versions[index], straight,
                           x->frame_offset + (offset - x->gva_offset), op, operand, compare, &old,
                           ScopedDeadline::bound(m_lock_timeout));
    }
    if (s.ok()) {
      count(path);
      if (alloc.coherent) learn_coherent(gva, a, *x, path);
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

bool ClientCore::short_atomic(Gva gva, WordOp op, uint64_t operand, uint64_t compare, uint64_t* old) {
  if (!m_direct || gva.offset % 8 != 0 || m_daemon_lost.load(std::memory_order_relaxed)) return false;
  uint8_t path = 0;
  if (!m_coherent.run(gva, page_size(), op, operand, compare, old, &path)) return false;
  count(static_cast<Path>(path));
  return true;
}

void ClientCore::learn_coherent(Gva gva, const std::shared_ptr<const CachedAllocation>& a, const Extent& x, Path path) {
  if (a->qos != QosClass::standard || x.tier == Tier::vram || (path != Path::local && path != Path::mapped)) return;
  CoherentWords::Route r;
  if (a->base.node == node()) {
    auto w = local_versions(a->first_page);
    if (!w.ok()) return;
    r.words = *w;
  } else {
    auto s = sibling(a->base.node);
    if (!s.ok()) return;
    auto w = (*s)->regions->versions(a->first_page);
    if (!w.ok()) return;
    r.words = *w;
    r.keep[0] = *s;
  }
  if (x.node == node()) {
    auto f = local_frames(x.tier);
    if (!f.ok()) return;
    r.frames = *f;
  } else {
    auto s = sibling(x.node);
    if (!s.ok()) return;
    auto f = (*s)->regions->frames(x.tier);
    if (!f.ok()) return;
    r.frames = *f;
    r.keep[1] = *s;
  }
  r.base = a->base;
  r.first = a->base.offset + x.gva_offset;
  r.end = r.first + x.length;
  r.frame_first = x.frame_offset;
  r.first_page = a->first_page;
  r.page_size = page_size();
  r.alloc = a;
  r.path = static_cast<uint8_t>(path);
  m_coherent.learn(gva, std::move(r));
}

}  // namespace tiermem::detail
