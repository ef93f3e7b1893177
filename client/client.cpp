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
    auto r = next.control().map(e.allocation.gva);
    if (!r.ok()) {
      set.revoke(id, Status(r.status().code(), "the mapping was revoked: after its tiermemd restarted, " +
                                                         e.allocation.gva.to_string() +
                                                         " could not be pinned again: " + r.status().message()));
      continue;
    }
    const std::vector<Extent>& now = r->extents;
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
      (void)next.control().unmap(e.allocation.gva);
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
      m_earlier.plane_fallbacks += c.plane_fallbacks;
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

// `ask`'s answer, asked through `run` (Client::run: it connects again when
// the daemon went, and repeats what may be repeated).
template <class T, class Run, class Ask>
Result<T> answer(Run run, Ask ask) {
  T out;
  TIERMEM_RETURN_IF_ERROR(run([&](ClientCore& c) -> Status {
    TIERMEM_ASSIGN_OR_RETURN(out, ask(c.control()));
    return Status();
  }));
  return out;
}

}  // namespace

Result<AllocationInfo> Client::alloc(uint64_t size, const AllocOptions& options) {
  TIERMEM_RETURN_IF_ERROR(check_name(options.name));
  return answer<AllocationInfo>([&](auto op) { return run("alloc", false, op); },
                                [&](ControlStub& s) { return s.alloc(size, options); });
}

Status Client::free(Gva gva) {
  return run("free", false, [&](ClientCore& c) {
    Status s = c.control().free(gva);
    if (s.ok()) c.forget(gva);
    return s;
  });
}

Result<AllocationInfo> Client::lookup(std::string_view name, NodeId node) {
  TIERMEM_RETURN_IF_ERROR(check_name(name));
  return answer<AllocationInfo>([&](auto op) { return run("lookup", true, op); },
                                [&](ControlStub& s) { return s.lookup(name, node); });
}

Result<Translation> Client::translate(Gva gva) {
  return answer<Translation>([&](auto op) { return run("translate", true, op); },
                             [&](ControlStub& s) { return s.translate(gva); });
}

Result<AllocationInfo> Client::migrate(Gva gva, Tier tier, NodeId to_node) {
  AllocationInfo out;
  TIERMEM_RETURN_IF_ERROR(run("migrate", false, [&](ClientCore& c) {
    auto moved = c.control().migrate(gva, tier, to_node);
    c.forget(gva);
    TIERMEM_ASSIGN_OR_RETURN(out, std::move(moved));
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
  c.staged_device += m_earlier.staged_device;
  c.plane_fallbacks += m_earlier.plane_fallbacks;
  return c;
}

Result<std::vector<NodeInfo>> Client::nodes() {
  TIERMEM_ASSIGN_OR_RETURN(auto reply, answer<NodesReply>([&](auto op) { return run("nodes", true, op); },
                                                         [&](ControlStub& s) { return s.nodes(); }));
  return std::move(reply.nodes);
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
    NodesReply seen;
    Status s = run("health", true, [&](ClientCore& c) {
      TIERMEM_ASSIGN_OR_RETURN(seen, c.control().nodes(n.node == self ? 0 : n.node));
      return Status();
    });
    if (!s.ok()) {
      g.unasked.push_back("node " + std::to_string(n.node) + ": " + s.to_string());
      continue;
    }
    for (CheckInEdge& e : seen.clients) {
      e.node = n.node;
      g.check_ins.push_back(std::move(e));
    }
    for (NodeInfo& to : seen.nodes) {
      if (to.node != n.node) g.edges.push_back({n.node, std::move(to)});
    }
  }
  return g;
}

Result<Mapping> Client::map(Gva gva) {
  MapReply pinned;
  std::shared_ptr<ClientCore> pinned_by;  // the connection the pin was taken on
  TIERMEM_RETURN_IF_ERROR(run("map", true, [&](ClientCore& c) {
    pinned_by = core();
    TIERMEM_ASSIGN_OR_RETURN(pinned, c.control().map(gva));
    return Status();
  }));
  const AllocationInfo info = pinned.allocation;
  detail::MappedSet::Entry entry;
  entry.allocation = info;
  entry.extents = std::move(pinned.extents);
  // What was mapped so far goes, and the pin is given back.
  auto fail = [&](Status s) {
    if (entry.base != nullptr) ::munmap(entry.base, entry.length);
    (void)pinned_by->control().unmap(info.gva);
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
  return answer<NodeStat>([&](auto op) { return run("stat", true, op); },
                          [&](ControlStub& s) { return s.stat(node); });
}

Result<std::vector<AllocationInfo>> Client::list(NodeId node) {
  return answer<std::vector<AllocationInfo>>([&](auto op) { return run("list", true, op); },
                                             [&](ControlStub& s) { return s.list(node); });
}

Result<MappingDump> Client::dump(NodeId node) {
  return answer<MappingDump>([&](auto op) { return run("dump", true, op); },
                             [&](ControlStub& s) { return s.dump(node); });
}

Result<std::string> Client::metrics(NodeId node) {
  return answer<std::string>([&](auto op) { return run("metrics", true, op); },
                             [&](ControlStub& s) { return s.metrics(node); });
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
      // A failure means the connection is gone: the daemon's lease of this
      // client lets the pin go when it connects again without this mapping,
      // or when its process exits.
      (void)core->control().unmap(m_allocation.gva);
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
