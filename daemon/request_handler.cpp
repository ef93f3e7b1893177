#include "daemon/request_handler.hpp"

#include <spdlog/spdlog.h>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "convert.hpp"
#include "common/deadline.hpp"
#include "daemon/data_plane.hpp"
#include "daemon/peer_manager.hpp"
#include "daemon/request_checks.hpp"
#include "tiers/truncation_guard.hpp"
#include "tiermem_config.h"

namespace tiermem {
namespace {

// The GVA a request is about, if any.
const proto::Gva* gva_of(const proto::Request& r) {
  switch (r.body_case()) {
    case proto::Request::kFree: return &r.free().gva();
    case proto::Request::kTranslate: return &r.translate().gva();
    case proto::Request::kRead: return &r.read().gva();
    case proto::Request::kWrite: return &r.write().gva();
    case proto::Request::kMigrate: return &r.migrate().gva();
    case proto::Request::kAtomic: return &r.atomic().gva();
    default: return nullptr;
  }
}

// Requests about this daemon or this connection, never forwarded.
bool is_local_only(const proto::Request& r) {
  switch (r.body_case()) {
    case proto::Request::kHello:
    case proto::Request::kPeerChallenge:
    case proto::Request::kPeerHello:
    case proto::Request::kPing:
    case proto::Request::kNodeInfo:
    case proto::Request::kCheckIn:
    case proto::Request::kNodes:
    case proto::Request::kOpenRegions:
    case proto::Request::kDeviceChunks:
    case proto::Request::kMap:
    case proto::Request::kUnmap:
    case proto::Request::kReserveFrames:
    case proto::Request::kReleaseFrames:
      return true;
    default:
      return false;
  }
}

}  // namespace

RequestHandler::RequestHandler(AddressSpace& space, const DaemonConfig& config, const TenantMap& tenants,
                               DataPlane* data_plane, PeerManager* peers, ClusterSecret secret, uint64_t incarnation)
    : m_space(space),
      m_auth(space),
      m_config(config),
      m_tenants(tenants),
      m_data_plane(data_plane),
      m_peers(peers),
      m_started(std::chrono::steady_clock::now()),
      m_counting(config.metrics_enabled),
      m_sessions(space, config, tenants, m_auth, data_plane, peers, incarnation),
      m_replicas(space, config, data_plane, peers),
      m_data(space, config, m_auth, m_sessions, m_replicas, data_plane, peers, incarnation),
      m_cluster(space, config, tenants, m_auth, m_sessions.check_ins(), data_plane, peers, std::move(secret),
                incarnation),
      m_demoter(space, [&tenants](const std::string& tenant) { return tenants.limits(tenant); },
                DemotionOptions{.enabled = config.demotion_enabled,
                                .high_water_percent = config.demotion_high_water_percent,
                                .low_water_percent = config.demotion_low_water_percent,
                                .interval = std::chrono::milliseconds(config.demotion_interval_ms),
                                .lock_timeout = std::chrono::milliseconds(config.transport_timeout_ms)}) {
  m_demoter.start();
}

Reply RequestHandler::handle(const proto::Request& request, SessionState& session) {
  const auto started = std::chrono::steady_clock::now();
  m_sessions.seen(session);  // any request of a client is a check-in
  Reply reply = route(request, session);
  if (request.deadline_ms() > 0 && reply.deferred) {
    // The blocking part ends by the caller's deadline (its peer requests and
    // one-sided copies wait no longer).
    const auto at = std::chrono::steady_clock::now() + std::chrono::milliseconds(request.deadline_ms());
    reply.deferred = [work = std::move(reply.deferred), at]() {
      ScopedDeadline deadline(at);
      return work();
    };
  }
  if (!m_counting) return reply;  // metrics.enabled = false: nothing counts
  // The request's type names a descriptor's field: it outlives the request.
  const auto* field = proto::Request::GetDescriptor()->FindFieldByNumber(static_cast<int>(request.body_case()));
  Counted counted{field != nullptr ? std::string_view(field->name()) : std::string_view("none"),
                  session.peer ? Authoriser::requester(request, session).tenant : session.who.tenant,
                  request.has_write() ? request.write().data().size() : 0, started,
                  target_of(request) == m_space.node()};
  if (!reply.deferred) {
    count(counted, reply.response);
  } else {
    // Counted when the blocking part is done, with its time.
    reply.deferred = [this, work = std::move(reply.deferred), counted = std::move(counted)]() {
      Reply done = work();
      count(counted, done.response);
      return done;
    };
  }
  return reply;
}

void RequestHandler::count(const Counted& c, const proto::Response& response) {
  const auto result = static_cast<ErrorCode>(response.status().code());
  m_metrics.request(c.type, result, c.tenant, std::chrono::steady_clock::now() - c.started);
  if (result != ErrorCode::ok || !c.here) return;  // bytes of a relayed request count where they moved
  m_metrics.bytes("write", c.tenant, c.written);
  if (response.has_read()) m_metrics.bytes("read", c.tenant, response.read().data().size());
  if (response.has_migrate()) m_metrics.bytes("migrate", c.tenant, response.migrate().pages_moved() * m_space.page_size());
}

Reply RequestHandler::route(const proto::Request& request, SessionState& session) {
  const Route* kind = route_of(static_cast<int>(request.body_case()));
  if (Status s = Authoriser::admit(request, session, kind != nullptr ? kind->name : "this request",
                                   kind != nullptr && kind->peer_only);
      !s.ok()) {
    return error_reply(request.id(), s, !session.greeted);
  }
  if (Status s = check_request_fields(request); !s.ok()) return error_reply(request.id(), s, !session.greeted);
  const NodeId target = target_of(request);
  if (request.has_alloc() && request.alloc().session() && (target != m_space.node() || session.peer)) {
    // Its session is here; a peer's session never ends with the client's.
    return error_reply(request.id(),
                       Status(ErrorCode::not_supported, "session allocations live on the client's own node (" +
                                                            std::to_string(m_space.node()) + "); node " +
                                                            std::to_string(target) + " was asked"),
                       false);
  }
  if (target != m_space.node()) {
    if (request.forwarded()) {
      return error_reply(request.id(),
                         Status(ErrorCode::bad_gva, "request for node " + std::to_string(target) +
                                                        " reached node " + std::to_string(m_space.node()) +
                                                        " (misrouted)"),
                         false);
    }
    return forward(target, request, session);
  }
  return dispatch(kind, request, session);
}

// --- routing ------------------------------------------------------------------------
// Sending a request on to another node's daemon is the router's work, not the
// cluster family's: it is no request kind of its own, any family's request
// may take it (by Request.node or its GVA's home), and it is decided before
// a service is chosen. The ClusterService answers what peers ask of this node.

NodeId RequestHandler::target_of(const proto::Request& request) const {
  if (request.has_nodes() && request.nodes().from() != 0) return static_cast<NodeId>(request.nodes().from());
  if (is_local_only(request)) return m_space.node();
  // A read from a copy is served where it is asked, or where a daemon sends it.
  if (request.has_read() && request.read().from_replica()) {
    return request.node() != 0 ? static_cast<NodeId>(request.node()) : m_space.node();
  }
  if (request.node() != 0) return static_cast<NodeId>(request.node());
  if (const proto::Gva* g = gva_of(request)) return static_cast<NodeId>(g->node());
  return m_space.node();
}

Reply RequestHandler::forward(NodeId node, const proto::Request& request, const SessionState& session) {
  if (m_peers == nullptr || !m_peers->knows(node)) {
    return error_reply(request.id(),
                       Status(ErrorCode::bad_gva,
                              "node " + std::to_string(node) + " is not in the cluster" +
                                  (m_peers == nullptr ? " (this daemon runs alone: no cluster.file)" : "")),
                       false);
  }
  // The peer acts for our client.
  proto::Request relayed = Authoriser::relayed(request, Authoriser::requester(request, session));
  Reply reply;
  // A migration takes no slot: it is long, and clients ask few at once.
  if (request.body_case() != proto::Request::kMigrate) reply.peer = node;
  // Runs once: the request moves on to the call (a write's data is not
  // copied once more; the frame budget counts on it).
  reply.deferred = [this, node, relayed = std::move(relayed)]() mutable {
    // A migration moves page after page, each waiting out its writers.
    const auto timeout = relayed.body_case() == proto::Request::kMigrate ? std::chrono::milliseconds(3600 * 1000)
                                                                         : std::chrono::milliseconds(0);
    const uint64_t id = relayed.id();
    auto response = m_peers->call(node, std::move(relayed), timeout);
    if (!response.ok()) return error_reply(id, response.status(), false);
    Reply out;
    out.response = std::move(response).value();
    out.response.set_id(id);
    return out;
  };
  return reply;
}

Reply RequestHandler::alloc_anywhere(const proto::Request& request, const SessionState& session,
                                     const Status& local_error) {
  if (m_peers == nullptr || m_peers->connected().empty()) return error_reply(request.id(), local_error, false);
  const proto::Request relayed = Authoriser::relayed(request, Authoriser::requester(request, session));
  Reply reply;
  reply.deferred = [this, relayed, local_error]() {
    std::string tried;
    for (NodeId node : m_peers->connected()) {
      auto response = m_peers->call(node, relayed);
      if (response.ok()) {
        Reply out;
        out.response = std::move(response).value();
        out.response.set_id(relayed.id());
        return out;
      }
      tried += "; node " + std::to_string(node) + ": " + response.status().message();
    }
    return error_reply(relayed.id(), Status(local_error.code(), local_error.message() + tried), false);
  };
  return reply;
}

// --- the node's own requests ---------------------------------------------------------

Status RequestHandler::alloc(const proto::AllocRequest& r, const Identity& who, proto::AllocResponse* out) {
  AllocRequest req;
  req.size = r.size();
  req.tier = wire::from_proto(r.tier());
  req.strict = r.strict();
  req.name = r.name();
  req.owner_uid = who.uid;
  req.coherent = r.coherent();
  req.session = r.session();
  req.tenant = who.tenant;
  req.limits = m_tenants.limits(who.tenant);
  TIERMEM_RETURN_IF_ERROR(m_replicas.check_replicas(r, who));
  if (r.qos() > static_cast<uint32_t>(QosClass::graceful_degrade)) {
    return Status(ErrorCode::invalid_argument, "qos " + std::to_string(r.qos()) + " is no QoS class (0 to 3)");
  }
  req.policy.qos = static_cast<QosClass>(r.qos());
  if (r.demotable() && r.coherent()) {
    return Status(ErrorCode::invalid_argument,
                  "an allocation cannot be both coherent and demotable: coherent pages never move (their atomic "
                  "words stay where clients address them)");
  }
  req.policy.demotable = r.demotable();
  req.policy.replicas_wanted = r.replicas();
  if (r.has_replica_of()) {
    req.policy.replica_of = wire::from_proto(r.replica_of());
    req.policy.replica_ready = r.replica_ready();
  }
  TIERMEM_RETURN_IF_ERROR(ensure_domain(m_space, m_data_plane, who.tenant, m_tenants.limits(who.tenant)).status());
  TIERMEM_ASSIGN_OR_RETURN(auto info, m_space.allocate(req));
  wire::to_proto(info, out->mutable_allocation());
  return Status();
}

Status RequestHandler::lookup(const proto::LookupRequest& r, const Identity& who, proto::LookupResponse* out) {
  TIERMEM_ASSIGN_OR_RETURN(auto info, m_space.lookup(r.name()));
  if (!who.is_operator && info.tenant != who.tenant) {
    return Status(ErrorCode::permission_denied, who.describe() + " may not look up '" + r.name() +
                                                    "': it belongs to tenant '" + info.tenant + "'");
  }
  wire::to_proto(info, out->mutable_allocation());
  return Status();
}

void RequestHandler::list(const Identity& who, proto::ListResponse* out) {
  for (const AllocationInfo& a : m_space.list()) {
    if (who.is_operator || a.tenant == who.tenant) wire::to_proto(a, out->add_allocations());
  }
}

void RequestHandler::log_admissions() {
  if (m_data_plane != nullptr) m_data_plane->log_admissions();
}

void RequestHandler::trim_tenant_files() {
  const uint64_t unbacked = TruncationGuard::unbacked_pages();
  if (const uint64_t seen = m_unbacked_seen.exchange(unbacked); unbacked > seen) {
    spdlog::error("{} page(s) of tenants' memory files got no storage when this daemon touched them (holes their "
                  "tenant punched, on a full file system): the daemon sees zeros there, and those tenants' memory on "
                  "them is lost; free space on the tiers' file systems",
                  unbacked - seen);
  }
  for (const AddressSpace::FileTrim& t : m_space.trim_tenant_files()) {
    if (!t.error.ok()) {
      spdlog::error("tenant '{}' grew {} past its {} and it could not be cut back: {}", t.tenant, t.path,
                    format_size(t.size), t.error.message());
      continue;
    }
    m_files_trimmed.fetch_add(1);
    m_trimmed_bytes.fetch_add(t.storage_freed);
    spdlog::warn("tenant '{}' grew {} to {} ({} past the {} it was given); cut back, {} of storage given back",
                 t.tenant, t.path, format_size(t.found_bytes), format_size(t.found_bytes > t.size ? t.found_bytes - t.size : 0),
                 format_size(t.size), format_size(t.storage_freed));
  }
}

void RequestHandler::stat(const Identity& who, proto::StatResponse* out) {
  out->set_node_id(m_space.node());
  out->set_page_size(m_space.page_size());
  for (const TierStat& t : m_space.tier_stats()) wire::to_proto(t, out->add_tiers());
  out->set_allocations(m_space.allocation_count());
  out->set_sessions(m_sessions.open());
  out->set_uptime_ms(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                               std::chrono::steady_clock::now() - m_started)
                                               .count()));
  out->set_daemon_version(TIERMEM_VERSION);
  out->set_socket_path(m_config.socket_path);
  out->set_fabric(fabric_name(m_data_plane));
  out->set_locks_broken(m_sessions.locks_broken());
  out->set_truncations_repaired(TruncationGuard::repairs());
  out->set_files_trimmed(m_files_trimmed.load());
  out->set_trimmed_bytes(m_trimmed_bytes.load());
  const RecoveryReport& r = m_space.recovery();
  proto::RecoveryInfo* ri = out->mutable_recovery();
  ri->set_durable(m_space.durable());
  ri->set_memory_adopted(r.memory_adopted);
  ri->set_starts(r.starts);
  ri->set_allocations(r.allocations);
  ri->set_lost_allocations(r.lost_allocations);
  ri->set_lost_pages(r.lost_pages);
  ri->set_dropped(r.dropped);
  ri->set_lent_frames(r.lent_frames);
  ri->set_locks_broken(r.locks_broken);
  ri->set_elapsed_ms(r.elapsed_ms);
  // What was lost names allocations and tenants: a client sees its own.
  for (const TenantNote& l : r.lost) {
    if (who.is_operator || l.tenant == who.tenant) ri->add_lost(l.text);
  }
  for (const TenantNote& d : r.domains_made_anew) {
    if (who.is_operator || d.tenant == who.tenant) ri->add_domains_made_anew(d.text);
  }
  ri->set_pool(r.pool);
}

void RequestHandler::dump(const Identity& who, proto::DumpResponse* out) {
  const MappingDump d = m_space.dump();
  out->set_node_id(d.node);
  out->set_page_size(d.page_size);
  out->set_l2_pages(d.l2_pages);
  // The pages come allocation by allocation, in the order of the allocations.
  size_t page = 0;
  for (const AllocationInfo& a : d.allocations) {
    const bool shown = who.is_operator || a.tenant == who.tenant;
    if (shown) wire::to_proto(a, out->add_allocations());
    for (uint64_t i = 0; i < a.pages && page < d.pages.size(); ++i, ++page) {
      if (shown) wire::to_proto(d.pages[page], out->add_pages());
    }
  }
}

}  // namespace tiermem
