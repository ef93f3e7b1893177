#include "daemon/session_service.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include <tiermem/status_macros.h>

#include "common/frame.hpp"
#include "common/host_id.hpp"
#include "convert.hpp"
#include "daemon/data_plane.hpp"
#include "daemon/peer_manager.hpp"
#include "daemon/replicator.hpp"
#include "daemon/session_locks.hpp"
#include "pages/lock_intents.hpp"
#include "pages/segment_layout.hpp"
#include "tiermem_config.h"

namespace tiermem {
namespace {

constexpr uint32_t k_protocol_version = proto::PROTOCOL_VERSION_CURRENT;

}  // namespace

SessionService::SessionService(AddressSpace& space, const DaemonConfig& config, const TenantMap& tenants,
                               const Authoriser& auth, DataPlane* data_plane, PeerManager* peers,
                               uint64_t incarnation)
    : m_space(space),
      m_config(config),
      m_tenants(tenants),
      m_auth(auth),
      m_data_plane(data_plane),
      m_peers(peers),
      m_incarnation(incarnation),
      m_locks(std::make_unique<SessionLocks>(space, peers, std::chrono::milliseconds(config.stale_writer_grace_ms))),
      m_check_ins(config.health_degraded_after_missed, std::chrono::milliseconds(config.health_unreachable_after_ms)),
      m_leases(std::chrono::milliseconds(config.lease_grace_ms)) {}

SessionService::~SessionService() = default;

uint64_t SessionService::locks_broken() const { return m_locks->broken(); }

void SessionService::seen(const SessionState& s) {
  if (s.greeted && !s.peer) m_check_ins.seen(s.id);
}

Status SessionService::hello(const proto::HelloRequest& r, SessionState& s, proto::HelloResponse* out) {
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

void SessionService::take_lease(const proto::HelloRequest& r, SessionState& session, proto::HelloResponse* out) {
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

void SessionService::end(SessionState& session) {
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

ClientKey SessionService::client_key(const SessionState& s) { return {s.pid, s.uid, s.client_id}; }

void SessionService::sweep_leases() { let_go(m_leases.expired(), "an ended lease"); }

void SessionService::let_go(const Leases::Held& held, const std::string& whose) {
  // Errors are ignored on purpose: an allocation can only be unpinned, and it
  // cannot have been freed while pinned. Unpinned first: a pinned session
  // allocation cannot be freed.
  for (const Gva& g : held.pins) (void)m_space.unpin(g);
  if (!held.owned.empty()) free_session_allocations(held.owned, whose);
}

void SessionService::free_session_allocations(const std::vector<Gva>& owned, const std::string& whose) {
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

Status SessionService::open_regions(const SessionState& s, proto::OpenRegionsResponse* out, std::vector<int>* fds) {
  if (s.remote) {
    return Status(ErrorCode::not_supported, "memory regions are shared only with clients on this node (Unix socket)");
  }
  // The session's own tenant's domain, given to it now if it has none yet;
  // an operator's also every other tenant's, as far as one reply carries
  // their descriptors (the rest it reaches through the daemon).
  TIERMEM_ASSIGN_OR_RETURN(const uint32_t own,
                           ensure_domain(m_space, m_data_plane, s.who.tenant, m_tenants.limits(s.who.tenant)));
  const auto fds_of = [&](uint32_t d) { return 2 + m_space.domain_files(d).tiers.size(); };
  std::vector<uint32_t> domains = {own};
  size_t budget = wire::k_max_fds_per_frame - 1 - fds_of(own);  // 1: the lock log
  if (s.who.is_operator) {
    for (uint32_t d = 0; d < m_space.domains(); ++d) {
      if (d == own || m_space.tenant_of_domain(d).empty() || fds_of(d) > budget) continue;
      budget -= fds_of(d);
      domains.push_back(d);
    }
  }
  for (uint32_t d : domains) {
    const DomainFiles files = m_space.domain_files(d);
    // The header first (read-only: nothing a client writes is what the
    // daemon trusts at its next start), then the words it guards.
    proto::Region* h = out->add_regions();
    h->set_kind(proto::Region::HEADER);
    h->set_domain(d);
    h->set_length(k_segment_header_bytes);
    h->set_has_fd(true);
    fds->push_back(files.header_fd);
    proto::Region* v = out->add_regions();
    v->set_kind(proto::Region::VERSIONS);
    v->set_domain(d);
    v->set_first(files.first_page);
    v->set_length(files.versions_bytes);
    v->set_has_fd(true);
    fds->push_back(files.versions_fd);
    if (const TierBackend* b = m_space.backend(Tier::vram); b != nullptr && b->domain_bytes(d) > 0) {
      // Device memory: no file, chunks imported one by one (device_chunks).
      proto::Region* r = out->add_regions();
      r->set_kind(proto::Region::TIER);
      r->set_tier(wire::to_proto(Tier::vram));
      r->set_domain(d);
      r->set_first(uint64_t{d} * b->domain_span());
      r->set_length(b->domain_bytes(d));
      r->set_device_uuid(b->device_uuid());
      r->set_chunk_bytes(b->chunk_bytes());
    }
    for (const DomainFiles::TierFile& t : files.tiers) {
      proto::Region* r = out->add_regions();
      r->set_kind(proto::Region::TIER);
      r->set_tier(wire::to_proto(t.tier));
      r->set_domain(d);
      r->set_first(t.frame_offset);
      r->set_length(t.bytes);
      r->set_persistent(t.persistent);
      r->set_has_fd(true);
      fds->push_back(t.fd);
    }
  }
  // The session's lock log: what it locks, so a death does not leave pages
  // locked (SessionLocks).
  TIERMEM_ASSIGN_OR_RETURN(const int log_fd, m_locks->open(s.id, s.pid, s.who));
  proto::Region* log = out->add_regions();
  log->set_kind(proto::Region::INTENTS);
  log->set_length(k_intent_log_bytes);
  log->set_has_fd(true);
  fds->push_back(log_fd);
  return Status();
}

Status SessionService::device_chunks(const proto::DeviceChunksRequest& r, const SessionState& s,
                                     proto::DeviceChunksResponse* out, std::vector<int>* fds) {
  constexpr size_t k_most = wire::k_max_fds_per_frame;
  if (s.remote) {
    return Status(ErrorCode::not_supported, "device memory is shared only with clients on this node (Unix socket)");
  }
  const Tier tier = wire::from_proto(r.tier());
  const TierBackend* b = tier == Tier::automatic ? nullptr : m_space.backend(tier);
  if (b == nullptr || b->chunk_bytes() == 0) {
    return Status(ErrorCode::not_supported, "node " + std::to_string(m_space.node()) + " has no " +
                                                std::string(tier_name(tier)) + " tier of device memory");
  }
  // Only chunks of a domain the session may map: its tenant's (an operator's:
  // any tenant's, as with the host tiers' files).
  const uint32_t d = b->domain_of(r.frame_offset());
  const std::string tenant = d < m_space.domains() ? m_space.tenant_of_domain(d) : std::string();
  const uint64_t first = uint64_t{d} * b->domain_span();
  if (tenant.empty() || (tenant != s.who.tenant && !s.who.is_operator) || r.length() == 0 ||
      r.length() > b->domain_bytes(d) || r.frame_offset() - first > b->domain_bytes(d) - r.length()) {
    return Status(ErrorCode::permission_denied,
                  s.who.describe() + " may not open " + std::string(tier_name(tier)) + " frames [" +
                      std::to_string(r.frame_offset()) + ", +" + std::to_string(r.length()) +
                      "): they are not all of its tenant's domain");
  }
  out->set_chunk_bytes(b->chunk_bytes());
  for (const TierBackend::DeviceChunk& c : b->device_chunks(r.frame_offset(), r.length(), k_most)) {
    out->add_frame_offsets(c.frame_offset);
    fds->push_back(c.fd);
  }
  return Status();
}

Status SessionService::map(const proto::MapRequest& r, SessionState& s, proto::MapResponse* out) {
  if (s.remote) return Status(ErrorCode::not_supported, "only clients on this node can map memory");
  TIERMEM_ASSIGN_OR_RETURN(auto info, m_auth.authorize(s.who, wire::from_proto(r.gva()), "map"));
  if (info.tenant != s.who.tenant) {
    // An operator reads and writes other tenants' memory through the daemon;
    // a mapping would need that tenant's files.
    return Status(ErrorCode::permission_denied, s.who.describe() + " may not map " + info.gva.to_string() +
                                                    " of tenant '" + info.tenant + "' (read or write it instead)");
  }
  if (replicated(info) || info.replica_of.node != 0) {
    return Status(ErrorCode::failed_precondition,
                  info.gva.to_string() + (replicated(info) ? " is replicated: its writes go through its home daemon to "
                                                             "every copy, which stores through a mapping would bypass"
                                                           : " is a copy of " + info.replica_of.to_string() +
                                                                 ", written by its home only") +
                      "; read and write it instead");
  }
  TIERMEM_ASSIGN_OR_RETURN(auto layout, m_space.pin(Authoriser::checked(wire::from_proto(r.gva()), info)));
  // The pin is the client's while its process lives (its mapping is in the
  // process's address space, whatever becomes of this connection).
  m_leases.pin(client_key(s), layout.info.gva);
  wire::to_proto(layout.info, out->mutable_allocation());
  for (const Extent& x : layout.extents) wire::to_proto(x, out->add_extents());
  return Status();
}

Status SessionService::unmap(const proto::UnmapRequest& r, SessionState& s) {
  const Gva gva = wire::from_proto(r.gva());
  const std::optional<Gva> pinned = s.remote ? std::nullopt : m_leases.unpin(client_key(s), gva);
  if (!pinned) return Status(ErrorCode::failed_precondition, gva.to_string() + " is not mapped by this client");
  return m_space.unpin(*pinned);
}

}  // namespace tiermem
