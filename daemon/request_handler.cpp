#include "daemon/request_handler.hpp"

#include <algorithm>

#include "convert.hpp"
#include "tiermem_config.h"

namespace tiermem {
namespace {

constexpr uint32_t k_protocol_version = proto::PROTOCOL_VERSION_CURRENT;

}  // namespace

RequestHandler::RequestHandler(AddressSpace& space, const DaemonConfig& config)
    : m_space(space), m_config(config), m_started(std::chrono::steady_clock::now()) {}

Reply RequestHandler::error_reply(uint64_t id, const Status& status, bool close_after) {
  Reply reply;
  reply.response.set_id(id);
  wire::to_proto(status, reply.response.mutable_status());
  reply.close_after = close_after;
  return reply;
}

Reply RequestHandler::handle(const proto::Request& request, SessionState& session) {
  Reply reply;
  proto::Response& resp = reply.response;
  resp.set_id(request.id());
  if (!session.greeted && request.body_case() != proto::Request::kHello) {
    return error_reply(request.id(),
                       Status(ErrorCode::unexpected_message,
                              "the first request on a connection must be hello"),
                       true);
  }
  Status status;
  switch (request.body_case()) {
    case proto::Request::kHello:
      status = hello(request.hello(), session, resp.mutable_hello());
      reply.close_after = !status.ok();
      break;
    case proto::Request::kAlloc:
      status = alloc(request.alloc(), session, resp.mutable_alloc());
      break;
    case proto::Request::kFree:
      status = m_space.free(wire::from_proto(request.free().gva()));
      resp.mutable_free();
      break;
    case proto::Request::kTranslate:
      status = translate(request.translate(), resp.mutable_translate());
      break;
    case proto::Request::kRead:
      status = read(request.read(), resp.mutable_read());
      break;
    case proto::Request::kWrite:
      status = write(request.write(), resp.mutable_write());
      break;
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
    case proto::Request::kStat:
      stat(resp.mutable_stat());
      break;
    case proto::Request::kList:
      for (const AllocationInfo& a : m_space.list()) {
        wire::to_proto(a, resp.mutable_list()->add_allocations());
      }
      break;
    case proto::Request::kDump:
      dump(resp.mutable_dump());
      break;
    case proto::Request::kOpenRegions:
      status = open_regions(resp.mutable_open_regions(), &reply.fds);
      break;
    case proto::Request::BODY_NOT_SET:
      status = Status(ErrorCode::malformed_frame, "request has no body (unknown request type?)");
      break;
  }
  if (!status.ok()) {
    // Keep the id and the status; drop a half-filled body.
    const bool close = reply.close_after;
    reply = error_reply(request.id(), status, close);
  } else {
    wire::to_proto(status, resp.mutable_status());
    resp.set_fd_count(static_cast<uint32_t>(reply.fds.size()));
  }
  return reply;
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
  auto info = m_space.allocate(req);
  if (!info.ok()) return info.status();
  wire::to_proto(*info, out->mutable_allocation());
  return Status();
}

Status RequestHandler::translate(const proto::TranslateRequest& r, proto::TranslateResponse* out) {
  const Gva gva = wire::from_proto(r.gva());
  auto t = m_space.translate(gva);
  if (!t.ok()) return t.status();
  // The layout is read under one lock: extents and versions agree, which is
  // what a client's cache relies on.
  auto layout = m_space.layout(gva);
  if (!layout.ok()) return layout.status();
  wire::to_proto(layout->info, out->mutable_allocation());
  out->set_offset_in_allocation(gva.offset - layout->info.gva.offset);
  wire::to_proto(t->page, out->add_pages());
  for (const Extent& x : layout->extents) wire::to_proto(x, out->add_extents());
  out->set_first_page_index(layout->first_page);
  for (uint64_t v : layout->page_versions) out->add_page_versions(v);
  return Status();
}

Status RequestHandler::read(const proto::ReadRequest& r, proto::ReadResponse* out) {
  if (r.length() > m_config.max_inline_bytes) {
    return Status(ErrorCode::invalid_argument,
                  "inline read of " + std::to_string(r.length()) + " bytes exceeds max_inline_bytes (" +
                      std::to_string(m_config.max_inline_bytes) + "); split it or map the allocation");
  }
  std::string* data = out->mutable_data();
  data->resize(r.length());
  return m_space.read(wire::from_proto(r.gva()), data->data(), data->size());
}

Status RequestHandler::write(const proto::WriteRequest& r, proto::WriteResponse* out) {
  Status s = m_space.write(wire::from_proto(r.gva()), r.data().data(), r.data().size());
  if (s.ok()) out->set_written(r.data().size());
  return s;
}

Status RequestHandler::open_regions(proto::OpenRegionsResponse* out, std::vector<int>* fds) {
  proto::Region* v = out->add_regions();
  v->set_kind(proto::Region::VERSIONS);
  v->set_length(m_space.versions().bytes());
  v->set_has_fd(true);
  fds->push_back(m_space.versions().fd());
  proto::Region* l3 = out->add_regions();
  l3->set_kind(proto::Region::SUB_BLOCKS);
  l3->set_length(m_space.sub_block_words().bytes());
  l3->set_has_fd(true);
  fds->push_back(m_space.sub_block_words().fd());
  for (Tier t : k_tiers_fastest_first) {
    TierBackend* b = m_space.backend(t);
    if (b == nullptr) continue;
    proto::Region* r = out->add_regions();
    r->set_kind(proto::Region::TIER);
    r->set_tier(wire::to_proto(t));
    r->set_length(b->capacity());
    r->set_persistent(b->persistent());
    r->set_ipc_handle(b->ipc_handle());
    if (b->share_fd() >= 0) {
      r->set_has_fd(true);
      fds->push_back(b->share_fd());
    }
  }
  return Status();
}

Status RequestHandler::map(const proto::MapRequest& r, SessionState& s, proto::MapResponse* out) {
  auto layout = m_space.pin(wire::from_proto(r.gva()));
  if (!layout.ok()) return layout.status();
  s.pins.push_back(layout->info.gva);
  wire::to_proto(layout->info, out->mutable_allocation());
  for (const Extent& x : layout->extents) wire::to_proto(x, out->add_extents());
  return Status();
}

Status RequestHandler::unmap(const proto::UnmapRequest& r, SessionState& s) {
  const Gva gva = wire::from_proto(r.gva());
  auto it = std::find_if(s.pins.begin(), s.pins.end(), [&](const Gva& g) {
    return g.node == gva.node && g.offset == gva.offset;
  });
  if (it == s.pins.end()) {
    return Status(ErrorCode::failed_precondition,
                  gva.to_string() + " is not mapped by this client");
  }
  Status status = m_space.unpin(*it);
  s.pins.erase(it);
  return status;
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
