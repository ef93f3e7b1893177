#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <condition_variable>
#include <map>
#include <new>
#include <thread>

#include <tiermem/client.h>
#include <tiermem/status_macros.h>

#include "client/client_core.hpp"
#include "client/device_buffers.hpp"
#include "client/mapped_set.hpp"
#include "common/random.hpp"
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

namespace {

// Pins the mappings of `mapped` (the live ones, in the order the hello of
// `next` listed them) on a new connection: those whose pin the daemon kept
// are as they were; the others are pinned again and checked against their
// frames, or revoked.
void repin(detail::MappedSet& set, ClientCore& next, const std::map<uint64_t, detail::MappedSet::Entry>& mapped) {
  size_t i = 0;
  for (const auto& [id, e] : mapped) {
    if (next.mapped_kept(i++)) continue;  // its pin was kept all along: the mapping is as it was
    // A daemon that knows nothing of it (it restarted): pinned again, and
    // valid only where its bytes still are.
    proto::Request pin;
    wire::to_proto(e.allocation.gva, pin.mutable_map()->mutable_gva());
    auto r = next.call(pin);
    if (!r.ok()) {
      set.revoke(id, Status(r.status().code(), "the mapping was revoked: after its tiermemd restarted, " +
                                                         e.allocation.gva.to_string() +
                                                         " could not be pinned again: " + r.status().message()));
      continue;
    }
    std::vector<Extent> now;
    for (const auto& x : r->map().extents()) now.push_back(wire::from_proto(x));
    const bool same = now.size() == e.extents.size() &&
                      std::equal(now.begin(), now.end(), e.extents.begin(), [](const Extent& a, const Extent& b) {
                        return a.tier == b.tier && a.node == b.node && a.frame_offset == b.frame_offset &&
                               a.gva_offset == b.gva_offset && a.length == b.length;
                      });
    if (!same) {
      set.revoke(id, Status(ErrorCode::failed_precondition,
                                  "the mapping was revoked: after its tiermemd restarted, " +
                                      e.allocation.gva.to_string() + " is no longer on the frames it mapped"));
    }
    if (!same || !set.contains(id)) {
      // Not the mapping's any more (or it was released meanwhile): the pin goes.
      proto::Request unpin;
      wire::to_proto(e.allocation.gva, unpin.mutable_unmap()->mutable_gva());
      (void)next.call(unpin);
    }
  }
}

}  // namespace

// The thread that connects again at once when the daemon went away while
// the client holds mappings (their pins must be taken again before anyone
// else can free or move what they map), instead of at the next call.
struct Client::Keeper {
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  const ClientCore* lost = nullptr;  // a connection whose daemon went away, to replace
  std::thread thread;
};

// What a connection's watcher reaches the Client through; cut when the
// Client goes (a Mapping may keep a connection, and its watcher, alive).
struct detail::ClientLink {
  std::mutex mutex;
  Client* client = nullptr;
};

Result<std::unique_ptr<Client>> Client::connect(const ClientOptions& options) {
  // Its daemon keeps its mappings' pins and session allocations by this
  // (with its pid) across its connections.
  const uint64_t id = random_nonzero();
  TIERMEM_ASSIGN_OR_RETURN(auto core, ClientCore::connect(options, id));
  return std::unique_ptr<Client>(new Client(std::move(core), options, id));
}

Client::Client(std::shared_ptr<ClientCore> core, const ClientOptions& options, uint64_t client_id)
    : m_options(options), m_client_id(client_id), m_core(std::move(core)),
      m_mapped(std::make_shared<detail::MappedSet>(options.on_mapping_revoked)),
      m_link(std::make_shared<detail::ClientLink>()) {
  m_link->client = this;
  m_current.store(m_core.get(), std::memory_order_release);
  m_mapped->set_core(m_core);
  if (m_options.reconnect_timeout.count() > 0) {
    m_keeper = std::make_unique<Keeper>();
    m_keeper->thread = std::thread([this] { keep(); });
  }
  watch(m_core);
}

Client::~Client() {
  {
    std::lock_guard lock(m_link->mutex);  // waits for a watcher inside daemon_lost
    m_link->client = nullptr;
  }
  if (m_keeper) {
    {
      std::lock_guard lock(m_keeper->mutex);
      m_keeper->stop = true;
    }
    m_keeper->wake.notify_all();
    m_keeper->thread.join();
  }
}

std::shared_ptr<ClientCore> Client::core() const {
  std::lock_guard lock(m_core_mutex);
  return m_core;
}

void Client::watch(const std::shared_ptr<ClientCore>& core) {
  core->on_lost([link = m_link](ClientCore* lost) {
    std::lock_guard lock(link->mutex);
    if (link->client != nullptr) link->client->daemon_lost(lost);
  });
}

void Client::daemon_lost(const ClientCore* lost) {
  // An older connection's? (Not through core(): this runs on a watcher,
  // maybe inside a reconnect that holds m_core_mutex.)
  if (m_current.load(std::memory_order_acquire) != lost) return;
  const bool died = lost->daemon_died();
  if (died) {
    // Session allocations end with their daemon: nothing of theirs comes back.
    m_mapped->revoke_if([](const detail::MappedSet::Entry& e) { return e.allocation.lifetime == Lifetime::session; },
                        Status(ErrorCode::not_allocated,
                               "the mapping was revoked: its allocation was of session lifetime, which ended when "
                               "its tiermemd died"));
  }
  if (!m_keeper) {
    if (died) {
      m_mapped->revoke_if([](const detail::MappedSet::Entry&) { return true; },
                          Status(ErrorCode::unavailable,
                                 "the mapping was revoked: its tiermemd died and this client does not connect again "
                                 "(reconnect_timeout 0), so nothing keeps its allocation where it was mapped"));
    }
  } else if (!m_mapped->live().empty()) {
    {
      std::lock_guard lock(m_keeper->mutex);
      m_keeper->lost = lost;
    }
    m_keeper->wake.notify_all();
  }
  m_mapped->deliver();
}

void Client::keep() {
  std::unique_lock lock(m_keeper->mutex);
  for (;;) {
    m_keeper->wake.wait(lock, [this] { return m_keeper->stop || m_keeper->lost != nullptr; });
    if (m_keeper->stop) return;
    const ClientCore* lost = std::exchange(m_keeper->lost, nullptr);
    lock.unlock();
    if (Status s = reconnect(lost); !s.ok()) {
      m_mapped->revoke_if([](const detail::MappedSet::Entry&) { return true; },
                          Status(ErrorCode::unavailable, "the mapping was revoked: its allocation could not be pinned "
                                                         "again: " + s.message()));
    }
    m_mapped->deliver();
    lock.lock();
  }
}

Status Client::reconnect(const ClientCore* lost) {
  std::lock_guard lock(m_core_mutex);
  if (m_core.get() != lost) return Status();  // another thread got there first
  const NodeId node = lost->node();
  const auto deadline = std::chrono::steady_clock::now() + m_options.reconnect_timeout;
  auto pause = std::chrono::milliseconds(10);
  Status last;
  do {
    // The mappings it holds now: the daemon keeps their pins for this
    // client while its process lives, a restarted one knows none of them.
    const auto mapped = m_mapped->live();
    std::vector<Gva> gvas;
    for (const auto& [id, e] : mapped) gvas.push_back(e.allocation.gva);
    auto fresh = ClientCore::connect(m_options, m_client_id, gvas);
    if (fresh.ok()) {
      const AccessCounters c = m_core->counters();
      m_earlier.direct_local += c.direct_local;
      m_earlier.direct_remote += c.direct_remote;
      m_earlier.message += c.message;
      m_earlier.through_daemon += c.through_daemon;
      std::shared_ptr<ClientCore> next = std::move(fresh).value();
      repin(*m_mapped, *next, mapped);
      m_mapped->set_core(next);
      m_core = std::move(next);
      m_current.store(m_core.get(), std::memory_order_release);
      watch(m_core);
      return Status();
    }
    last = fresh.status();
    if (last.code() != ErrorCode::connection_failed && last.code() != ErrorCode::connection_closed &&
        last.code() != ErrorCode::unavailable) {
      break;  // a daemon that answers and refuses: waiting does not help
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  } while (std::chrono::steady_clock::now() < deadline);
  return Status(ErrorCode::unavailable, "the tiermemd of node " + std::to_string(node) +
                                            " went away and no daemon took its place on the socket within " +
                                            std::to_string(m_options.reconnect_timeout.count()) +
                                            " ms (last: " + last.message() + ")");
}

Status Client::run(const char* what, bool repeatable, const std::function<Status(ClientCore&)>& op) {
  std::shared_ptr<ClientCore> c = core();
  if (c->lost() && m_options.reconnect_timeout.count() > 0) {
    TIERMEM_RETURN_IF_ERROR(reconnect(c.get()));
    c = core();
  }
  Status s = op(*c);
  if (s.ok() || m_options.reconnect_timeout.count() == 0) return s;
  if (s.code() == ErrorCode::unavailable) {
    // The watcher may not have seen the socket close yet (a broken
    // connection of a call marks the daemon lost at once; a connection_closed
    // about a peer is the daemon's answer, not a lost daemon).
    for (int i = 0; i < 20 && !c->lost(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!c->lost()) return s;
  // The daemon went away while `op` was under way.
  TIERMEM_RETURN_IF_ERROR(reconnect(c.get()));
  if (repeatable) return op(*core());
  return Status(ErrorCode::unavailable, "the tiermemd of node " + std::to_string(c->node()) + " restarted while " +
                                            what + " was in flight: it may or may not have taken effect (this "
                                            "client is connected again; look before repeating it)");
}

NodeId Client::node() const { return core()->node(); }
uint64_t Client::page_size() const { return core()->page_size(); }

namespace {

// A request whose response's body `get` turns into T.
template <class T, class Get>
Status call_into(ClientCore& c, proto::Request request, T* out, Get get) {
  TIERMEM_ASSIGN_OR_RETURN(auto response, c.call(request));
  *out = get(response);
  return Status();
}

NodeInfo node_info_of(const proto::NodeInfo& n) {
  NodeInfo info;
  info.node = static_cast<NodeId>(n.node_id());
  info.control_address = n.control_address();
  info.state = static_cast<NodeState>(n.state());
  info.incarnation = n.incarnation();
  info.transports = n.transports();
  info.last_error = n.last_error();
  info.state_since_ms = n.state_since_ms();
  info.health = static_cast<NodeHealth>(n.health());
  info.health_since_ms = n.health_since_ms();
  info.last_heartbeat_ms = n.last_heartbeat_ms();
  info.missed_heartbeats = n.missed_heartbeats();
  info.heartbeat_rtt_us = n.heartbeat_rtt_us();
  return info;
}

CheckInEdge check_in_of(NodeId node, const proto::ClientEdge& c) {
  CheckInEdge e;
  e.node = node;
  e.session = c.session();
  e.client_name = c.client_name();
  e.pid = c.pid();
  e.uid = c.uid();
  e.tenant = c.tenant();
  e.health = static_cast<NodeHealth>(c.health());
  e.health_since_ms = c.health_since_ms();
  e.last_checkin_ms = c.last_checkin_ms();
  e.missed = c.missed();
  e.interval_ms = c.interval_ms();
  return e;
}

}  // namespace

Result<AllocationInfo> Client::alloc(uint64_t size, const AllocOptions& options) {
  TIERMEM_RETURN_IF_ERROR(check_name(options.name));
  proto::Request request;
  proto::AllocRequest* a = request.mutable_alloc();
  a->set_size(size);
  a->set_tier(wire::to_proto(options.tier));
  a->set_strict(options.strict);
  a->set_name(options.name);
  a->set_coherent(options.coherent);
  a->set_session(options.lifetime == Lifetime::session);
  a->set_replicas(options.replicas);
  a->set_qos(static_cast<uint32_t>(options.qos));
  request.set_node(options.node);
  AllocationInfo out;
  TIERMEM_RETURN_IF_ERROR(run("alloc", false, [&](ClientCore& c) {
    return call_into(c, request, &out, [](const proto::Response& r) { return wire::from_proto(r.alloc().allocation()); });
  }));
  return out;
}

Status Client::free(Gva gva) {
  proto::Request request;
  wire::to_proto(gva, request.mutable_free()->mutable_gva());
  return run("free", false, [&](ClientCore& c) {
    auto response = c.call(request);
    if (response.ok()) c.forget(gva);
    return response.status();
  });
}

Result<AllocationInfo> Client::lookup(std::string_view name, NodeId node) {
  TIERMEM_RETURN_IF_ERROR(check_name(name));
  proto::Request request;
  request.set_node(node);
  request.mutable_lookup()->set_name(std::string(name));
  AllocationInfo out;
  TIERMEM_RETURN_IF_ERROR(run("lookup", true, [&](ClientCore& c) {
    return call_into(c, request, &out, [](const proto::Response& r) { return wire::from_proto(r.lookup().allocation()); });
  }));
  return out;
}

Result<Translation> Client::translate(Gva gva) {
  proto::Request request;
  wire::to_proto(gva, request.mutable_translate()->mutable_gva());
  Translation out;
  TIERMEM_RETURN_IF_ERROR(run("translate", true, [&](ClientCore& c) {
    return call_into(c, request, &out, [](const proto::Response& r) {
      const proto::TranslateResponse& t = r.translate();
      Translation x;
      x.allocation = wire::from_proto(t.allocation());
      x.offset_in_allocation = t.offset_in_allocation();
      if (t.pages_size() > 0) x.page = wire::from_proto(t.pages(0));
      for (const auto& e : t.extents()) x.extents.push_back(wire::from_proto(e));
      return x;
    });
  }));
  return out;
}

Result<AllocationInfo> Client::migrate(Gva gva, Tier tier, NodeId to_node) {
  proto::Request request;
  auto* m = request.mutable_migrate();
  wire::to_proto(gva, m->mutable_gva());
  m->set_tier(wire::to_proto(tier));
  m->set_to_node(to_node);
  AllocationInfo out;
  TIERMEM_RETURN_IF_ERROR(run("migrate", false, [&](ClientCore& c) {
    auto response = c.call(request);
    c.forget(gva);
    if (!response.ok()) return response.status();
    out = wire::from_proto(response->migrate().allocation());
    return Status();
  }));
  return out;
}

AccessCounters Client::access_counters() const {
  std::lock_guard lock(m_core_mutex);
  AccessCounters c = m_core->counters();
  c.direct_local += m_earlier.direct_local;
  c.direct_remote += m_earlier.direct_remote;
  c.message += m_earlier.message;
  c.through_daemon += m_earlier.through_daemon;
  return c;
}

Result<std::vector<NodeInfo>> Client::nodes() {
  proto::Request request;
  request.mutable_nodes();
  std::vector<NodeInfo> out;
  TIERMEM_RETURN_IF_ERROR(run("nodes", true, [&](ClientCore& c) {
    return call_into(c, request, &out, [](const proto::Response& r) {
      std::vector<NodeInfo> v;
      for (const proto::NodeInfo& n : r.nodes().nodes()) v.push_back(node_info_of(n));
      return v;
    });
  }));
  return out;
}

Result<HealthGraph> Client::health() {
  HealthGraph g;
  TIERMEM_ASSIGN_OR_RETURN(g.nodes, nodes());
  const NodeId self = g.nodes.empty() ? 0 : g.nodes[0].node;
  for (const NodeInfo& n : g.nodes) {
    if (n.node != self && n.state != NodeState::connected) {
      g.unasked.push_back("node " + std::to_string(n.node) + ": " + std::string(node_state_name(n.state)) +
                          (n.last_error.empty() ? "" : " (" + n.last_error + ")"));
      continue;
    }
    proto::Request request;
    request.mutable_nodes()->set_from(n.node == self ? 0 : n.node);
    std::vector<NodeInfo> seen;
    Status s = run("health", true, [&](ClientCore& c) {
      return call_into(c, request, &seen, [&](const proto::Response& r) {
        std::vector<NodeInfo> v;
        for (const proto::NodeInfo& x : r.nodes().nodes()) v.push_back(node_info_of(x));
        for (const proto::ClientEdge& x : r.nodes().clients()) g.check_ins.push_back(check_in_of(n.node, x));
        return v;
      });
    });
    if (!s.ok()) {
      g.unasked.push_back("node " + std::to_string(n.node) + ": " + s.to_string());
      continue;
    }
    for (NodeInfo& to : seen) {
      if (to.node != n.node) g.edges.push_back({n.node, std::move(to)});
    }
  }
  return g;
}

Result<Mapping> Client::map(Gva gva) {
  proto::Request request;
  wire::to_proto(gva, request.mutable_map()->mutable_gva());
  proto::Response response;
  std::shared_ptr<ClientCore> pinned_by;  // the connection the pin was taken on
  TIERMEM_RETURN_IF_ERROR(run("map", true, [&](ClientCore& c) {
    pinned_by = core();
    return call_into(c, request, &response, [](const proto::Response& r) { return r; });
  }));
  const AllocationInfo info = wire::from_proto(response.map().allocation());
  detail::MappedSet::Entry entry;
  entry.allocation = info;
  for (const auto& px : response.map().extents()) entry.extents.push_back(wire::from_proto(px));
  // What was mapped so far goes, and the pin is given back.
  auto fail = [&](Status s) {
    if (entry.base != nullptr) ::munmap(entry.base, entry.length);
    proto::Request unpin;
    wire::to_proto(info.gva, unpin.mutable_unmap()->mutable_gva());
    (void)pinned_by->call(unpin);
    return s.with_context("map " + info.gva.to_string());
  };

  Mapping m;
  m.m_allocation = info;
  if (info.tier == Tier::vram) {
    // Device memory: the frames as this process imported them (one device
    // range; nothing to munmap).
    auto at = pinned_by->device_address(entry.extents);
    if (!at.ok()) return fail(at.status());
    m.m_data = *at;
    m.m_size = info.size;
    m.m_device = pinned_by->device_ordinal();
  } else if (info.slot_bytes != 0) {
    // A sub-page allocation (one extent, its slot): the system pages around
    // it are mapped, and data() is its first byte.
    if (entry.extents.size() != 1) return fail(Status(ErrorCode::internal, "a sub-page allocation mapped as several extents"));
    const Extent& x = entry.extents[0];
    auto file = pinned_by->tier_file(x.tier, x.frame_offset, x.length);
    if (!file.ok()) return fail(file.status());
    const auto system_page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t lead = file->second % system_page;
    const uint64_t length = (lead + x.length + system_page - 1) / system_page * system_page;
    void* at = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, file->first,
                      static_cast<off_t>(file->second - lead));
    if (at == MAP_FAILED) return fail(Status(ErrorCode::io_error, std::strerror(errno)));
    entry.base = static_cast<std::byte*>(at);
    entry.length = length;
    m.m_data = entry.base + lead;
  } else {
    // Reserve one range for the whole allocation, then place each physically
    // contiguous extent into it, from the file of the tenant's domain that
    // holds it.
    const uint64_t length = info.pages * page_size();
    void* base = ::mmap(nullptr, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      return fail(Status(ErrorCode::io_error, std::string("reserving address space: ") + std::strerror(errno)));
    }
    entry.base = static_cast<std::byte*>(base);
    entry.length = length;
    for (const Extent& x : entry.extents) {
      auto file = pinned_by->tier_file(x.tier, x.frame_offset, x.length);
      if (!file.ok()) return fail(file.status());
      void* at = ::mmap(entry.base + x.gva_offset, x.length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                        file->first, static_cast<off_t>(file->second));
      if (at == MAP_FAILED) return fail(Status(ErrorCode::io_error, std::string("an extent: ") + std::strerror(errno)));
    }
    m.m_data = entry.base;
  }
  if (info.tier != Tier::vram) {
    m.m_size = info.size;
    m.m_persistent = pinned_by->region_persistent(info.tier);
  }
  // From here the set owns the range and the pin (release() gives both back).
  m.m_set = m_mapped;
  m.m_id = m_mapped->add(std::move(entry));
  return m;
}

Result<NodeStat> Client::stat(NodeId node) {
  proto::Request request;
  request.set_node(node);
  request.mutable_stat();
  proto::Response response;
  TIERMEM_RETURN_IF_ERROR(run("stat", true, [&](ClientCore& c) {
    return call_into(c, request, &response, [](const proto::Response& r) { return r; });
  }));
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
  const proto::RecoveryInfo& r = s.recovery();
  out.recovery.durable = r.durable();
  out.recovery.memory_adopted = r.memory_adopted();
  out.recovery.starts = r.starts();
  out.recovery.allocations = r.allocations();
  out.recovery.lost_allocations = r.lost_allocations();
  out.recovery.lost_pages = r.lost_pages();
  out.recovery.dropped = r.dropped();
  out.recovery.lent_frames = r.lent_frames();
  out.recovery.locks_broken = r.locks_broken();
  out.recovery.elapsed_ms = r.elapsed_ms();
  out.recovery.lost.assign(r.lost().begin(), r.lost().end());
  out.recovery.domains_made_anew.assign(r.domains_made_anew().begin(), r.domains_made_anew().end());
  out.recovery.pool = r.pool();
  return out;
}

Result<std::vector<AllocationInfo>> Client::list(NodeId node) {
  proto::Request request;
  request.set_node(node);
  request.mutable_list();
  proto::Response response;
  TIERMEM_RETURN_IF_ERROR(run("list", true, [&](ClientCore& c) {
    return call_into(c, request, &response, [](const proto::Response& r) { return r; });
  }));
  std::vector<AllocationInfo> out;
  for (const auto& a : response.list().allocations()) out.push_back(wire::from_proto(a));
  return out;
}

Result<MappingDump> Client::dump(NodeId node) {
  proto::Request request;
  request.set_node(node);
  request.mutable_dump();
  proto::Response response;
  TIERMEM_RETURN_IF_ERROR(run("dump", true, [&](ClientCore& c) {
    return call_into(c, request, &response, [](const proto::Response& r) { return r; });
  }));
  const proto::DumpResponse& d = response.dump();
  MappingDump out;
  out.node = static_cast<NodeId>(d.node_id());
  out.page_size = d.page_size();
  out.l2_pages = d.l2_pages();
  for (const auto& a : d.allocations()) out.allocations.push_back(wire::from_proto(a));
  for (const auto& p : d.pages()) out.pages.push_back(wire::from_proto(p));
  return out;
}

Result<std::string> Client::metrics(NodeId node) {
  proto::Request request;
  request.set_node(node);
  request.mutable_metrics();
  proto::Response response;
  TIERMEM_RETURN_IF_ERROR(run("metrics", true, [&](ClientCore& c) {
    return call_into(c, request, &response, [](const proto::Response& r) { return r; });
  }));
  return response.metrics().text();
}

// --- Mapping -------------------------------------------------------------------

Mapping::Mapping(Mapping&& other) noexcept { *this = std::move(other); }

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    release();
    m_set = std::move(other.m_set);
    m_id = std::exchange(other.m_id, 0);
    m_allocation = other.m_allocation;
    m_data = std::exchange(other.m_data, nullptr);
    m_size = std::exchange(other.m_size, 0);
    m_persistent = other.m_persistent;
    m_device = std::exchange(other.m_device, -1);
  }
  return *this;
}

Mapping::~Mapping() { release(); }

void Mapping::release() {
  m_data = nullptr;
  m_device = -1;
  m_size = 0;
  if (!m_set) return;
  // The range goes back first (under the set's lock, so a revocation never
  // maps over it), then the pin, through the connection that holds it now.
  if (m_set->remove(m_id)) {
    if (std::shared_ptr<detail::ClientCore> core = m_set->core()) {
      proto::Request request;
      wire::to_proto(m_allocation.gva, request.mutable_unmap()->mutable_gva());
      // A failure means the connection is gone: the daemon's lease of this
      // client lets the pin go when it connects again without this mapping,
      // or when its process exits.
      (void)core->call(request);
    }
  }
  m_set.reset();
  m_id = 0;
}

Status Mapping::status() const { return m_set ? m_set->status(m_id) : Status(); }

Status Mapping::persist(size_t offset, size_t length) const {
  TIERMEM_RETURN_IF_ERROR(status());
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
