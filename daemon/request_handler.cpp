#include "daemon/request_handler.hpp"

#include <algorithm>

#include <tiermem/status_macros.h>

#include "convert.hpp"
#include "tiermem_config.h"

namespace tiermem {
namespace {

constexpr uint32_t k_protocol_version = proto::PROTOCOL_VERSION_CURRENT;

// The reply for a request whose handler filled `reply` and returned `status`.
Reply finish(Reply reply, const Status& status, uint64_t id) {
  if (!status.ok()) return RequestHandler::error_reply(id, status, reply.close_after);
  wire::to_proto(status, reply.response.mutable_status());
  reply.response.set_fd_count(static_cast<uint32_t>(reply.fds.size()));
  return reply;
}

}  // namespace

RequestHandler::RequestHandler(AddressSpace& space, const DaemonConfig& config, proto::NodeInfo self,
                               PeerManager* peers, Transport* transport)
    : m_space(space),
      m_config(config),
      m_self(std::move(self)),
      m_peers(peers),
      m_transport(transport),
      m_started(std::chrono::steady_clock::now()) {}

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

Reply RequestHandler::handle(const proto::Request& request, SessionState& session) {
  const auto body = request.body_case();
  if (!session.greeted && body != proto::Request::kHello && body != proto::Request::kPeerHello) {
    return error_reply(request.id(),
                       Status(ErrorCode::unexpected_message,
                              "the first request on a connection must be hello"),
                       true);
  }
  const NodeId target = target_of(request);
  if (target != m_space.node()) {
    if (request.forwarded()) {
      return error_reply(request.id(),
                         Status(ErrorCode::bad_gva, "request for node " + std::to_string(target) +
                                                        " reached node " + std::to_string(m_space.node()) +
                                                        " (misrouted)"),
                         false);
    }
    return forward(target, request);
  }
  return dispatch(request, session);
}

Reply RequestHandler::dispatch(const proto::Request& request, SessionState& session) {
  Reply reply = ok_reply(request);
  proto::Response& resp = reply.response;
  Status status;
  switch (request.body_case()) {
    case proto::Request::kHello:
      status = hello(request.hello(), session, resp.mutable_hello());
      reply.close_after = !status.ok();
      break;
    case proto::Request::kPeerHello:
      status = peer_hello(request.peer_hello(), session, resp.mutable_peer_hello());
      reply.close_after = !status.ok();
      break;
    case proto::Request::kAlloc:
      status = alloc(request.alloc(), session, resp.mutable_alloc());
      if ((status.code() == ErrorCode::tier_exhausted || status.code() == ErrorCode::tier_unavailable) &&
          request.node() == 0 && !request.forwarded()) {
        return alloc_anywhere(request, status);
      }
      break;
    case proto::Request::kFree: return free(request);
    case proto::Request::kTranslate:
      status = translate(request.translate(), resp.mutable_translate());
      break;
    case proto::Request::kRead: return read(request);
    case proto::Request::kWrite: return write(request);
    case proto::Request::kAtomic: return atomic(request);
    case proto::Request::kMap:
      status = map(request.map(), session, resp.mutable_map());
      break;
    case proto::Request::kUnmap:
      status = unmap(request.unmap(), session);
      resp.mutable_unmap();
      break;
    case proto::Request::kLookup: {
      auto info = m_space.lookup(request.lookup().name());
      if (info.ok()) wire::to_proto(*info, resp.mutable_lookup()->mutable_allocation());
      status = info.status();
      break;
    }
    case proto::Request::kStat: stat(resp.mutable_stat()); break;
    case proto::Request::kList:
      for (const AllocationInfo& a : m_space.list()) wire::to_proto(a, resp.mutable_list()->add_allocations());
      break;
    case proto::Request::kDump: dump(resp.mutable_dump()); break;
    case proto::Request::kOpenRegions:
      status = open_regions(session, resp.mutable_open_regions(), &reply.fds);
      break;
    case proto::Request::kNodes: nodes(resp.mutable_nodes()); break;
    case proto::Request::kPing: resp.mutable_ping()->set_incarnation(m_self.incarnation()); break;
    case proto::Request::kMigrate: return migrate(request);
    case proto::Request::kReserveFrames:
      status = reserve_frames(request.reserve_frames(), resp.mutable_reserve_frames());
      break;
    case proto::Request::kReleaseFrames:
      status = release_frames(request.release_frames());
      resp.mutable_release_frames();
      break;
    case proto::Request::kPersistFrames:
      // msync on a non-DAX file can take milliseconds: off the control threads.
      reply.deferred = [this, request]() {
        Status s = persist_frames(request.persist_frames());
        if (!s.ok()) return error_reply(request.id(), s, false);
        Reply out = ok_reply(request);
        out.response.mutable_persist_frames();
        return out;
      };
      return reply;
    case proto::Request::BODY_NOT_SET:
      status = Status(ErrorCode::malformed_frame, "request has no body (unknown request type?)");
      break;
  }
  return finish(std::move(reply), status, request.id());
}

Status RequestHandler::hello(const proto::HelloRequest& r, SessionState& s, proto::HelloResponse* out) {
  if (r.protocol_version() != k_protocol_version) {
    return Status(ErrorCode::protocol_mismatch,
                  "client speaks protocol " + std::to_string(r.protocol_version()) +
                      ", tiermemd " TIERMEM_VERSION " speaks " + std::to_string(k_protocol_version) +
                      "; use a libtiermem and tiermemctl of the same release");
  }
  s.greeted = true;
  s.client_name = r.client_name();
  out->set_protocol_version(k_protocol_version);
  out->set_node_id(m_space.node());
  out->set_page_size(m_space.page_size());
  out->set_daemon_version(TIERMEM_VERSION);
  out->set_version_words(m_space.virtual_pages());
  out->set_session_id(s.id);
  out->set_max_frame_bytes(m_config.max_frame_bytes);
  out->set_max_inline_bytes(m_config.max_inline_bytes);
  for (const TierStat& t : m_space.tier_stats()) wire::to_proto(t, out->add_tiers());
  return Status();
}

Status RequestHandler::alloc(const proto::AllocRequest& r, const SessionState& s, proto::AllocResponse* out) {
  AllocRequest req;
  req.size = r.size();
  req.tier = wire::from_proto(r.tier());
  req.strict = r.strict();
  req.name = r.name();
  req.owner_uid = s.uid;
  req.coherent = r.coherent();
  TIERMEM_ASSIGN_OR_RETURN(auto info, m_space.allocate(req));
  wire::to_proto(info, out->mutable_allocation());
  return Status();
}

void RequestHandler::end_session(SessionState& session) {
  // Errors are ignored on purpose: an allocation can only be unpinned, and it
  // cannot have been freed while pinned.
  for (const Gva& g : session.pins) (void)m_space.unpin(g);
  session.pins.clear();
}

void RequestHandler::stat(proto::StatResponse* out) {
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
}

void RequestHandler::dump(proto::DumpResponse* out) {
  const MappingDump d = m_space.dump();
  out->set_node_id(d.node);
  out->set_page_size(d.page_size);
  out->set_l2_pages(d.l2_pages);
  for (const AllocationInfo& a : d.allocations) wire::to_proto(a, out->add_allocations());
  for (const PageInfo& p : d.pages) wire::to_proto(p, out->add_pages());
}

}  // namespace tiermem
