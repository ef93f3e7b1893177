#include "daemon/cluster_service.hpp"

#include <chrono>

#include <tiermem/status_macros.h>

#include "common/host_id.hpp"
#include "convert.hpp"
#include "daemon/data_plane.hpp"
#include "daemon/migrator.hpp"
#include "daemon/peer_manager.hpp"

namespace tiermem {
namespace {

bool is_domain_region(const proto::RegionKey& k, const std::string& tenant) { return k.tenant() == tenant; }

}  // namespace

ClusterService::ClusterService(AddressSpace& space, const DaemonConfig& config, const TenantMap& tenants,
                               const Authoriser& auth, CheckIns& check_ins, DataPlane* data_plane,
                               PeerManager* peers, ClusterSecret secret, uint64_t incarnation)
    : m_space(space),
      m_config(config),
      m_tenants(tenants),
      m_auth(auth),
      m_check_ins(check_ins),
      m_data_plane(data_plane),
      m_peers(peers),
      m_secret(std::move(secret)),
      m_incarnation(incarnation) {}

proto::NodeInfo ClusterService::self() const {
  if (m_data_plane != nullptr) return m_data_plane->self();
  proto::NodeInfo n;
  n.set_node_id(m_space.node());
  n.set_state(proto::NodeInfo::SELF);
  n.set_incarnation(m_incarnation);
  n.set_page_size(m_space.page_size());
  n.set_socket_path(m_config.socket_path);
  n.set_host_id(host_id());
  n.set_fabric(fabric_choice(m_config).name());
  return n;
}

void ClusterService::ping(proto::PingResponse* out) const {
  out->set_incarnation(m_incarnation);
  out->set_regions_version(self().regions_version());
}

Status ClusterService::peer_challenge(const proto::PeerChallengeRequest& r, SessionState& s,
                                      proto::PeerChallengeResponse* out) {
  if (!s.remote) return Status(ErrorCode::unexpected_message, "peers connect over TCP, not the Unix socket");
  if (r.protocol_version() != proto::PROTOCOL_VERSION_CURRENT) {
    return Status(ErrorCode::protocol_mismatch,
                  "peer node " + std::to_string(r.node_id()) + " speaks protocol " + std::to_string(r.protocol_version()));
  }
  if (m_peers == nullptr || m_secret.empty()) {
    return Status(ErrorCode::permission_denied, "this daemon runs alone and takes no peers");
  }
  if (r.node_id() == 0 || r.node_id() > 0xffff || r.node_id() == m_space.node() ||
      !m_peers->knows(static_cast<NodeId>(r.node_id()))) {
    return Status(ErrorCode::permission_denied,
                  "node " + std::to_string(r.node_id()) + " is not a peer in this daemon's cluster file");
  }
  if (r.nonce().size() != k_nonce_bytes) return Status(ErrorCode::malformed_frame, "a peer challenge needs a nonce");
  s.peer_node = static_cast<NodeId>(r.node_id());
  s.peer_nonce = r.nonce();
  s.challenge_nonce = make_nonce();
  out->set_node_id(m_space.node());
  out->set_nonce(s.challenge_nonce);
  out->set_proof(m_secret.proof("server", s.peer_node, m_space.node(), s.peer_nonce, s.challenge_nonce));
  return Status();
}

Status ClusterService::peer_hello(const proto::PeerHelloRequest& r, SessionState& s, proto::PeerHelloResponse* out) {
  if (s.challenge_nonce.empty() || r.self().node_id() != s.peer_node) {
    return Status(ErrorCode::permission_denied, "peer hello without a challenge for that node");
  }
  if (!m_secret.verify(r.proof(), "client", s.peer_node, m_space.node(), s.peer_nonce, s.challenge_nonce)) {
    return Status(ErrorCode::permission_denied, "node " + std::to_string(s.peer_node) +
                                                    " did not prove it knows the cluster secret (check "
                                                    "cluster.secret_file on both nodes)");
  }
  // Refused in the words of the asking node, which shows the answer as our
  // last error (and does not ask its peer why; see PeerManager::open_link).
  TIERMEM_RETURN_IF_ERROR(same_fabric(m_space.node(), self().fabric(), r.self().fabric()));
  s.greeted = true;
  s.peer = true;
  s.client_name = "node " + std::to_string(s.peer_node);
  m_peers->on_peer_hello(r.self());
  *out->mutable_self() = self();
  return Status();
}

Reply ClusterService::nodes(const proto::Request& request, const Identity& who) {
  Reply reply = ok_reply(request);
  if (request.nodes().refresh() && m_peers != nullptr && request.nodes().node() != m_space.node()) {
    // Asks the peer: off the control threads.
    reply.deferred = [this, request, who]() {
      (void)m_peers->refresh(static_cast<NodeId>(request.nodes().node()));
      Reply out = ok_reply(request);
      list_nodes(who, out.response.mutable_nodes());
      return out;
    };
    return reply;
  }
  list_nodes(who, reply.response.mutable_nodes());
  return reply;
}

void ClusterService::list_nodes(const Identity& who, proto::NodesResponse* out) {
  out->set_transport(fabric_name(m_data_plane));
  std::vector<proto::NodeInfo> all;
  if (m_peers == nullptr) {
    all.push_back(self());
    all.back().set_state(proto::NodeInfo::SELF);
  } else {
    all = m_peers->nodes();
  }
  for (proto::NodeInfo& n : all) {
    // Keys are capabilities: a client gets those of its tenant's domains,
    // in its tenant's own plane, and that plane's address only (see
    // DataPlane). A node without tenant planes offers clients none.
    if (!who.is_operator) {
      auto* regions = n.mutable_regions();
      for (int i = regions->size() - 1; i >= 0; --i) {
        if (!is_domain_region(regions->Get(i), who.tenant)) regions->DeleteSubrange(i, 1);
      }
      for (proto::RegionKey& k : *regions) k.set_packed_key(k.tenant_packed_key());
      std::string plane;
      for (const proto::TenantPlane& p : n.tenant_planes()) {
        if (p.tenant() == who.tenant) plane = p.transport_address();
      }
      n.set_transport_address(plane);
      n.clear_tenant_planes();
    }
    // A UCX worker address (a node whose UCX cannot listen: shared memory
    // only) is for its peers, never for a client, operators included: over
    // UCX 1.13's shared memory a client killed while it wires up can wedge
    // the node's receive FIFO, and its wire-up by worker address can abort
    // the node. Such a node's memory goes through the client's daemon.
    if (!is_listener_address(n.transport_address()) && !is_ofi_address(n.transport_address())) {
      n.clear_transport_address();
    }
    for (proto::RegionKey& k : *n.mutable_regions()) k.clear_tenant_packed_key();
    *out->add_nodes() = std::move(n);
  }
  for (proto::ClientEdge& c : m_check_ins.edges()) {
    // A client sees its own tenant's clients; an operator every one.
    if (who.is_operator || c.tenant() == who.tenant) *out->add_clients() = std::move(c);
  }
}

Status ClusterService::reserve_frames(const proto::Request& request, const SessionState& s,
                                      proto::ReserveFramesResponse* out) {
  const proto::ReserveFramesRequest& r = request.reserve_frames();
  const Tier tier = wire::from_proto(r.tier());
  if (tier == Tier::automatic || !proto::Tier_IsValid(r.tier())) {
    return Status(ErrorCode::invalid_argument, "reserve_frames needs a tier (vram, dram or pmem)");
  }
  const std::string& tenant = request.tenant();
  TIERMEM_ASSIGN_OR_RETURN(const uint32_t domain, ensure_domain(m_space, m_data_plane, tenant, m_tenants.limits(tenant)));
  TIERMEM_ASSIGN_OR_RETURN(auto frames,
                           m_space.reserve_frames(tier, r.pages(), tenant, m_tenants.limits(tenant), s.peer_node));
  for (const Extent& x : frames) wire::to_proto(x, out->add_extents());
  // Of the domain the frames are from (the tenant's): made anew, it takes
  // them with it, and the borrower must learn so.
  out->set_memory_generation(m_space.versions().memory_generation(domain));
  out->set_incarnation(m_incarnation);
  return Status();
}

Status ClusterService::release_frames(const proto::ReleaseFramesRequest& r, const SessionState& s) {
  std::vector<Extent> frames;
  for (const auto& x : r.extents()) {
    if (!proto::Tier_IsValid(x.tier())) return Status(ErrorCode::invalid_argument, "release_frames of no tier");
    frames.push_back(wire::from_proto(x));
  }
  return m_space.release_frames(frames, s.peer_node);
}

void ClusterService::break_locks(const proto::BreakLocksRequest& r, const Identity& who,
                                 proto::BreakLocksResponse* out) {
  uint32_t broken = 0;
  for (const proto::LockRecord& l : r.locks()) {
    broken += m_space.break_dead_lock(l.page(), l.locked(), who.tenant, who.is_operator) ? 1 : 0;
  }
  out->set_broken(broken);
}

Reply ClusterService::persist_frames(const proto::Request& request, const Identity& who) {
  Reply reply = ok_reply(request);
  // msync on a non-DAX file can take milliseconds: off the control threads.
  reply.deferred = [this, request, who]() {
    Status s = persist(request.persist_frames(), who);
    if (!s.ok()) return error_reply(request.id(), s, false);
    Reply out = ok_reply(request);
    out.response.mutable_persist_frames();
    return out;
  };
  return reply;
}

Status ClusterService::persist(const proto::PersistFramesRequest& r, const Identity& who) {
  const Tier tier = wire::from_proto(r.tier());
  TierBackend* b = tier == Tier::automatic ? nullptr : m_space.backend(tier);
  if (b == nullptr) return Status(ErrorCode::tier_unavailable, "no such tier on this node");
  if (!b->contains(r.frame_offset(), r.length())) {
    return Status(ErrorCode::out_of_range, "persist range lies outside the tier's frames");
  }
  if (!who.is_operator) {
    const auto domain = m_space.find_domain(who.tenant);
    if (!domain || b->domain_of(r.frame_offset()) != *domain) {
      return Status(ErrorCode::permission_denied, who.describe() + " may not persist frames of another tenant");
    }
  }
  return b->persist(r.frame_offset(), r.length());
}

Reply ClusterService::migrate(const proto::Request& request, const Identity& who) {
  auto info = m_auth.authorize(who, wire::from_proto(request.migrate().gva()), "migrate");
  if (!info.ok()) return error_reply(request.id(), info.status(), false);
  Reply reply;
  reply.deferred = [this, request, info]() {
    const proto::MigrateRequest& m = request.migrate();
    const Gva gva = Authoriser::checked(wire::from_proto(m.gva()), *info);
    Migrator migrator(m_space, m_peers, transport_of(m_data_plane),
                      std::chrono::milliseconds(m_config.transport_timeout_ms), m_tenants.limits(info->tenant));
    auto result = migrator.migrate(gva, wire::from_proto(m.tier()), static_cast<NodeId>(m.to_node()));
    if (!result.ok()) return error_reply(request.id(), result.status(), false);
    Reply out = ok_reply(request);
    wire::to_proto(result->allocation, out.response.mutable_migrate()->mutable_allocation());
    out.response.mutable_migrate()->set_pages_moved(result->pages_moved);
    return out;
  };
  return reply;
}

}  // namespace tiermem
