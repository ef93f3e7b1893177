// Routing to other nodes and the requests daemons make of each other.
#include <tiermem/status_macros.h>

#include "convert.hpp"
#include "daemon/migrator.hpp"
#include "daemon/peer_manager.hpp"
#include "daemon/request_handler.hpp"

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
    case proto::Request::kPeerHello:
    case proto::Request::kPing:
    case proto::Request::kNodes:
    case proto::Request::kOpenRegions:
    case proto::Request::kMap:
    case proto::Request::kUnmap:
      return true;
    default:
      return false;
  }
}

}  // namespace

NodeId RequestHandler::target_of(const proto::Request& request) const {
  if (is_local_only(request)) return m_space.node();
  if (request.node() != 0) return static_cast<NodeId>(request.node());
  if (const proto::Gva* g = gva_of(request)) return static_cast<NodeId>(g->node());
  return m_space.node();
}

Reply RequestHandler::forward(NodeId node, const proto::Request& request) {
  if (m_peers == nullptr || !m_peers->knows(node)) {
    return error_reply(request.id(),
                       Status(ErrorCode::bad_gva,
                              "node " + std::to_string(node) + " is not in the cluster" +
                                  (m_peers == nullptr ? " (this daemon runs alone: no cluster.file)" : "")),
                       false);
  }
  Reply reply;
  reply.deferred = [this, node, request]() {
    // A migration moves page after page, each waiting out its writers.
    const auto timeout = request.body_case() == proto::Request::kMigrate ? std::chrono::milliseconds(3600 * 1000)
                                                                         : std::chrono::milliseconds(0);
    auto response = m_peers->call(node, request, timeout);
    if (!response.ok()) return error_reply(request.id(), response.status(), false);
    Reply out;
    out.response = std::move(response).value();
    out.response.set_id(request.id());
    return out;
  };
  return reply;
}

Reply RequestHandler::alloc_anywhere(const proto::Request& request, const Status& local_error) {
  if (m_peers == nullptr || m_peers->connected().empty()) return error_reply(request.id(), local_error, false);
  Reply reply;
  reply.deferred = [this, request, local_error]() {
    std::string tried;
    for (NodeId node : m_peers->connected()) {
      auto response = m_peers->call(node, request);
      if (response.ok()) {
        Reply out;
        out.response = std::move(response).value();
        out.response.set_id(request.id());
        return out;
      }
      tried += "; node " + std::to_string(node) + ": " + response.status().message();
    }
    return error_reply(request.id(), Status(local_error.code(), local_error.message() + tried), false);
  };
  return reply;
}

Status RequestHandler::peer_hello(const proto::PeerHelloRequest& r, SessionState& s, proto::PeerHelloResponse* out) {
  if (r.protocol_version() != proto::PROTOCOL_VERSION_CURRENT) {
    return Status(ErrorCode::protocol_mismatch, "peer node " + std::to_string(r.self().node_id()) +
                                                    " speaks protocol " + std::to_string(r.protocol_version()));
  }
  if (m_peers == nullptr || !m_peers->knows(static_cast<NodeId>(r.self().node_id()))) {
    return Status(ErrorCode::permission_denied,
                  "node " + std::to_string(r.self().node_id()) + " is not in this daemon's cluster file");
  }
  s.greeted = true;
  s.peer = true;
  s.client_name = "node " + std::to_string(r.self().node_id());
  m_peers->on_peer_hello(r.self());
  *out->mutable_self() = m_self;
  return Status();
}

void RequestHandler::nodes(proto::NodesResponse* out) {
  out->set_transport(m_transport != nullptr ? "ucx" : "none");
  if (m_peers == nullptr) {
    *out->add_nodes() = m_self;
    return;
  }
  for (proto::NodeInfo& n : m_peers->nodes()) *out->add_nodes() = std::move(n);
}

Status RequestHandler::reserve_frames(const proto::ReserveFramesRequest& r, proto::ReserveFramesResponse* out) {
  TIERMEM_ASSIGN_OR_RETURN(auto frames, m_space.reserve_frames(wire::from_proto(r.tier()), r.pages()));
  for (const Extent& x : frames) wire::to_proto(x, out->add_extents());
  return Status();
}

Status RequestHandler::release_frames(const proto::ReleaseFramesRequest& r) {
  std::vector<Extent> frames;
  for (const auto& x : r.extents()) frames.push_back(wire::from_proto(x));
  return m_space.release_frames(frames);
}

Status RequestHandler::persist_frames(const proto::PersistFramesRequest& r) {
  TierBackend* b = m_space.backend(wire::from_proto(r.tier()));
  if (b == nullptr) return Status(ErrorCode::tier_unavailable, "no such tier on this node");
  if (r.frame_offset() > b->capacity() || r.length() > b->capacity() - r.frame_offset()) {
    return Status(ErrorCode::out_of_range, "persist range lies outside the tier");
  }
  return b->persist(r.frame_offset(), r.length());
}

Reply RequestHandler::migrate(const proto::Request& request) {
  Reply reply;
  reply.deferred = [this, request]() {
    const proto::MigrateRequest& m = request.migrate();
    Migrator migrator(m_space, m_peers, m_transport, transport_timeout());
    auto result = migrator.migrate(wire::from_proto(m.gva()), wire::from_proto(m.tier()),
                                   static_cast<NodeId>(m.to_node()));
    if (!result.ok()) return error_reply(request.id(), result.status(), false);
    Reply out = ok_reply(request);
    wire::to_proto(result->allocation, out.response.mutable_migrate()->mutable_allocation());
    out.response.mutable_migrate()->set_pages_moved(result->pages_moved);
    return out;
  };
  return reply;
}

}  // namespace tiermem
