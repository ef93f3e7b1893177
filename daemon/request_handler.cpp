#include "daemon/request_handler.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include <tiermem/status_macros.h>

#include "convert.hpp"
#include "common/deadline.hpp"
#include "common/host_id.hpp"
#include "daemon/data_plane.hpp"
#include "daemon/peer_access.hpp"
#include "daemon/peer_manager.hpp"
#include "daemon/replicator.hpp"
#include "daemon/request_checks.hpp"
#include "daemon/session_locks.hpp"
#include "tiers/truncation_guard.hpp"
#include "tiermem_config.h"

namespace tiermem {
namespace {

constexpr uint32_t k_protocol_version = proto::PROTOCOL_VERSION_CURRENT;

}  // namespace

RequestHandler::RequestHandler(AddressSpace& space, const DaemonConfig& config, const TenantMap& tenants,
                               DataPlane* data_plane, PeerManager* peers, ClusterSecret secret, uint64_t incarnation)
    : m_space(space),
      m_auth(space),
      m_config(config),
      m_tenants(tenants),
      m_data_plane(data_plane),
      m_peers(peers),
      m_secret(std::move(secret)),
      m_incarnation(incarnation),
      m_started(std::chrono::steady_clock::now()),
      m_locks(std::make_unique<SessionLocks>(space, peers, std::chrono::milliseconds(config.stale_writer_grace_ms))),
      m_check_ins(config.health_degraded_after_missed, std::chrono::milliseconds(config.health_unreachable_after_ms)),
      m_counting(config.metrics_enabled),
      m_leases(std::chrono::milliseconds(config.lease_grace_ms)) {
  if (peers != nullptr) {
    ReplicationOptions o;
    o.drop_after = std::chrono::milliseconds(config.replication_drop_after_ms > 0
                                                 ? config.replication_drop_after_ms
                                                 : 2 * config.health_unreachable_after_ms);
    o.repair_interval = std::chrono::milliseconds(config.replication_repair_interval_ms);
    o.orphan_min_age = std::chrono::milliseconds(config.replication_orphan_min_age_ms);
    o.peer_timeout = std::chrono::milliseconds(config.peer_timeout_ms);
    m_replicator = std::make_unique<Replicator>(space, *peers, o, [this](Gva gva, void* dst, size_t n) {
      Status s = m_space.read(gva, dst, n);
      if (s.code() == ErrorCode::not_supported) {
        PeerAccess access(m_peers, transport(), transport_timeout());
        s = m_space.read(gva, dst, n, &access);
      }
      return s;
    });
  }
}

RequestHandler::~RequestHandler() {
  if (m_replicator) m_replicator->stop();
}

Transport* RequestHandler::transport() const { return m_data_plane != nullptr ? m_data_plane->transport() : nullptr; }

proto::NodeInfo RequestHandler::self() const {
  if (m_data_plane != nullptr) return m_data_plane->self();
  proto::NodeInfo n;
  n.set_node_id(m_space.node());
  n.set_state(proto::NodeInfo::SELF);
  n.set_incarnation(m_incarnation);
  n.set_page_size(m_space.page_size());
  n.set_socket_path(m_config.socket_path);
  n.set_host_id(host_id());
  return n;
}

Reply RequestHandler::error_reply(uint64_t id, const Status& status, bool close_after) {
  Reply reply;
  reply.response.set_id(id);
  wire::to_proto(status, reply.response.mutable_status());
  reply.close_after = close_after;
  return reply;
}

Reply RequestHandler::ok_reply(const proto::Request& request) {
  Reply reply;
  reply.response.set_id(request.id());
  wire::to_proto(Status(), reply.response.mutable_status());
  return reply;
}

Result<uint32_t> RequestHandler::ensure_domain(const std::string& tenant) {
  bool fresh = false;
  TIERMEM_ASSIGN_OR_RETURN(const uint32_t domain, m_space.domain_for(tenant, m_tenants.limits(tenant), &fresh));
  if (fresh && m_data_plane != nullptr) {
    TIERMEM_RETURN_IF_ERROR(m_data_plane->register_domain(m_space, domain));
  }
  return domain;
}

Reply RequestHandler::handle(const proto::Request& request, SessionState& session) {
  const auto started = std::chrono::steady_clock::now();
  if (session.greeted && !session.peer) m_check_ins.seen(session.id);  // any request is a check-in
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

Status RequestHandler::hello(const proto::HelloRequest& r, SessionState& s, proto::HelloResponse* out) {
  if (r.protocol_version() != k_protocol_version) {
    return Status(ErrorCode::protocol_mismatch,
                  "client speaks protocol " + std::to_string(r.protocol_version()) +
                      ", tiermemd " TIERMEM_VERSION " speaks " + std::to_string(k_protocol_version) +
                      "; use a libtiermem and tiermemctl of the same release");
  }
  TIERMEM_ASSIGN_OR_RETURN(s.who, m_tenants.identify(s.uid, s.gid, s.groups));
  s.greeted = true;
  s.client_name = r.client_name().substr(0, 256);
  s.client_id = r.client_id();
  m_check_ins.opened(s.id, s.client_name, s.pid, s.uid, s.who.tenant, r.checkin_interval_ms());
  out->set_protocol_version(k_protocol_version);
  out->set_node_id(m_space.node());
  out->set_page_size(m_space.page_size());
  out->set_daemon_version(TIERMEM_VERSION);
  out->set_version_words(m_space.virtual_pages());
  out->set_session_id(s.id);
  out->set_max_frame_bytes(m_config.max_frame_bytes);
  out->set_max_inline_bytes(m_config.max_inline_bytes);
  out->set_incarnation(m_incarnation);
  out->set_pages_per_domain(m_space.pages_per_domain());
  out->set_host_id(host_id());
  out->set_tenant(s.who.tenant);
  out->set_is_operator(s.who.is_operator);
  for (const TierStat& t : m_space.tier_stats()) wire::to_proto(t, out->add_tiers());
  return Status();
}

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
  TIERMEM_RETURN_IF_ERROR(check_replicas(r, who));
  if (r.qos() > static_cast<uint32_t>(QosClass::graceful_degrade)) {
    return Status(ErrorCode::invalid_argument, "qos " + std::to_string(r.qos()) + " is no QoS class (0 to 3)");
  }
  req.qos = static_cast<QosClass>(r.qos());
  req.replicas_wanted = r.replicas();
  if (r.has_replica_of()) {
    req.replica_of = wire::from_proto(r.replica_of());
    req.replica_ready = r.replica_ready();
  }
  TIERMEM_RETURN_IF_ERROR(ensure_domain(who.tenant).status());
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

void RequestHandler::end_session(SessionState& session) {
  m_check_ins.closed(session.id);
  // Session allocations go with their session, mappings with their process
  // (a peer's session has neither): at once when the process is gone; while
  // it lives on (it may connect again) its mappings stay pinned and its
  // session allocations wait for the lease's grace.
  if (!session.remote) {
    let_go(m_leases.end_session(client_key(session), session.id, std::move(session.owned)),
           "session " + std::to_string(session.id));
  }
  session.owned.clear();
  m_locks->end(session.id);
}

void RequestHandler::take_lease(const proto::HelloRequest& r, SessionState& session, proto::HelloResponse* out) {
  std::vector<Gva> mapped;
  for (const proto::Gva& g : r.mapped()) mapped.push_back(wire::from_proto(g));
  std::vector<Gva> owned;
  std::vector<bool> kept;
  let_go(m_leases.begin_session(client_key(session), mapped, &owned, &kept), "session " + std::to_string(session.id));
  for (bool k : kept) out->add_mapped_kept(k);
  const auto mappings = static_cast<size_t>(std::count(kept.begin(), kept.end(), true));
  if (owned.empty() && mappings == 0) return;
  spdlog::info("session {} (pid {}) took back {} session allocation(s) and {} mapping(s) of its earlier connection",
               session.id, session.pid, owned.size(), mappings);
  session.owned.insert(session.owned.end(), owned.begin(), owned.end());
}

ClientKey RequestHandler::client_key(const SessionState& s) { return {s.pid, s.uid, s.client_id}; }

void RequestHandler::sweep_leases() { let_go(m_leases.expired(), "an ended lease"); }

void RequestHandler::let_go(const Leases::Held& held, const std::string& whose) {
  // Errors are ignored on purpose: an allocation can only be unpinned, and it
  // cannot have been freed while pinned. Unpinned first: a pinned session
  // allocation cannot be freed.
  for (const Gva& g : held.pins) (void)m_space.unpin(g);
  if (!held.owned.empty()) free_session_allocations(held.owned, whose);
}

void RequestHandler::free_session_allocations(const std::vector<Gva>& owned, const std::string& whose) {
  // One still mapped by another session stays until that one unmaps it and
  // is never recovered.
  std::vector<Extent> remote_frames;
  for (const Gva& g : owned) {
    Status s = m_space.free(g, &remote_frames);
    if (!s.ok() && s.code() != ErrorCode::not_allocated && s.code() != ErrorCode::stale_generation) {
      spdlog::warn("{} ended: its session allocation {} stays: {}", whose, g.to_string(), s.to_string());
    }
  }
  // Pages migrated to other nodes: their frames go back to their lenders
  // (rare; this waits for the peers).
  for (const Extent& x : remote_frames) {
    if (m_peers == nullptr) break;
    (void)m_peers->own_stub(x.node).release_frames({&x, 1});
  }
}

void RequestHandler::stat(const Identity& who, proto::StatResponse* out) {
  out->set_node_id(m_space.node());
  out->set_page_size(m_space.page_size());
  for (const TierStat& t : m_space.tier_stats()) wire::to_proto(t, out->add_tiers());
  out->set_allocations(m_space.allocation_count());
  out->set_sessions(m_sessions.load());
  out->set_uptime_ms(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                               std::chrono::steady_clock::now() - m_started)
                                               .count()));
  out->set_daemon_version(TIERMEM_VERSION);
  out->set_socket_path(m_config.socket_path);
  out->set_locks_broken(m_locks->broken());
  out->set_truncations_repaired(TruncationGuard::repairs());
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
