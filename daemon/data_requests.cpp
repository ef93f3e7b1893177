// Requests about the data of allocations homed on this node: translate, read,
// write, atomics, free, and the zero-copy mapping for co-located clients.
#include <algorithm>

#include <tiermem/status_macros.h>

#include "convert.hpp"
#include "daemon/peer_access.hpp"
#include "daemon/request_handler.hpp"

namespace tiermem {

Status RequestHandler::translate(const proto::TranslateRequest& r, proto::TranslateResponse* out) {
  const Gva gva = wire::from_proto(r.gva());
  TIERMEM_ASSIGN_OR_RETURN(auto t, m_space.translate(gva));
  // The layout is read under one lock: extents and versions agree, which is
  // what a client's cache relies on.
  TIERMEM_ASSIGN_OR_RETURN(auto layout, m_space.layout(gva));
  wire::to_proto(layout.info, out->mutable_allocation());
  out->set_offset_in_allocation(gva.offset - layout.info.gva.offset);
  wire::to_proto(t.page, out->add_pages());
  for (const Extent& x : layout.extents) wire::to_proto(x, out->add_extents());
  out->set_first_page_index(layout.first_page);
  for (uint64_t v : layout.page_versions) out->add_page_versions(v);
  out->set_coherent(layout.coherent);
  return Status();
}

Reply RequestHandler::read(const proto::Request& request) {
  const proto::ReadRequest& r = request.read();
  if (r.length() > m_config.max_inline_bytes) {
    return error_reply(request.id(),
                       Status(ErrorCode::invalid_argument,
                              "inline read of " + std::to_string(r.length()) + " bytes exceeds max_inline_bytes (" +
                                  std::to_string(m_config.max_inline_bytes) + "); split it or map the allocation"),
                       false);
  }
  const Gva gva = wire::from_proto(r.gva());
  Reply reply = ok_reply(request);
  std::string* data = reply.response.mutable_read()->mutable_data();
  data->resize(r.length());
  Status s = m_space.read(gva, data->data(), data->size());
  if (s.code() == ErrorCode::not_supported && m_peers != nullptr) {
    // Some pages live on other nodes: copy one-sided, off the control threads.
    reply.deferred = [this, request, gva]() mutable {
      Reply out = ok_reply(request);
      std::string* d = out.response.mutable_read()->mutable_data();
      d->resize(request.read().length());
      PeerAccess access(m_peers, m_transport, transport_timeout());
      Status st = m_space.read(gva, d->data(), d->size(), &access);
      return st.ok() ? out : error_reply(request.id(), st, false);
    };
    return reply;
  }
  return s.ok() ? reply : error_reply(request.id(), s, false);
}

Reply RequestHandler::write(const proto::Request& request) {
  const Gva gva = wire::from_proto(request.write().gva());
  const std::string& data = request.write().data();
  Status s = m_space.write(gva, data.data(), data.size());
  if (s.code() == ErrorCode::not_supported && m_peers != nullptr) {
    Reply reply;
    reply.deferred = [this, request, gva]() {
      PeerAccess access(m_peers, m_transport, transport_timeout());
      const std::string& d = request.write().data();
      Status st = m_space.write(gva, d.data(), d.size(), &access);
      if (!st.ok()) return error_reply(request.id(), st, false);
      Reply out = ok_reply(request);
      out.response.mutable_write()->set_written(d.size());
      return out;
    };
    return reply;
  }
  if (!s.ok()) return error_reply(request.id(), s, false);
  Reply reply = ok_reply(request);
  reply.response.mutable_write()->set_written(data.size());
  return reply;
}

Reply RequestHandler::atomic(const proto::Request& request) {
  const proto::AtomicRequest& r = request.atomic();
  const Gva gva = wire::from_proto(r.gva());
  const WordOp op = r.op() == proto::ATOMIC_FETCH_ADD ? WordOp::fetch_add : WordOp::compare_swap;
  auto run = [this, request, gva, op](MemoryAccess* elsewhere) {
    auto old = m_space.atomic(gva, op, request.atomic().operand(), request.atomic().compare(), elsewhere);
    if (!old.ok()) return error_reply(request.id(), old.status(), false);
    Reply out = ok_reply(request);
    out.response.mutable_atomic()->set_old_value(*old);
    return out;
  };
  Reply reply = run(nullptr);
  if (reply.response.status().code() == static_cast<uint32_t>(ErrorCode::not_supported) && m_peers != nullptr) {
    reply = Reply();
    reply.deferred = [this, run]() {
      PeerAccess access(m_peers, m_transport, transport_timeout());
      return run(&access);
    };
  }
  return reply;
}

Reply RequestHandler::free(const proto::Request& request) {
  std::vector<Extent> remote_frames;
  Status s = m_space.free(wire::from_proto(request.free().gva()), &remote_frames);
  if (!s.ok()) return error_reply(request.id(), s, false);
  Reply reply = ok_reply(request);
  reply.response.mutable_free();
  if (!remote_frames.empty() && m_peers != nullptr) {
    // Give the frames lent by other nodes back before answering.
    reply.deferred = [this, request, remote_frames]() {
      for (const Extent& x : remote_frames) {
        proto::Request release;
        wire::to_proto(x, release.mutable_release_frames()->add_extents());
        (void)m_peers->call(x.node, release);
      }
      Reply out = ok_reply(request);
      out.response.mutable_free();
      return out;
    };
  }
  return reply;
}

Status RequestHandler::open_regions(const SessionState& s, proto::OpenRegionsResponse* out, std::vector<int>* fds) {
  if (s.remote) {
    return Status(ErrorCode::not_supported, "memory regions are shared only with clients on this node (Unix socket)");
  }
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
  if (s.remote) return Status(ErrorCode::not_supported, "only clients on this node can map memory");
  TIERMEM_ASSIGN_OR_RETURN(auto layout, m_space.pin(wire::from_proto(r.gva())));
  s.pins.push_back(layout.info.gva);
  wire::to_proto(layout.info, out->mutable_allocation());
  for (const Extent& x : layout.extents) wire::to_proto(x, out->add_extents());
  return Status();
}

Status RequestHandler::unmap(const proto::UnmapRequest& r, SessionState& s) {
  const Gva gva = wire::from_proto(r.gva());
  auto it = std::find_if(s.pins.begin(), s.pins.end(), [&](const Gva& g) {
    return g.node == gva.node && g.offset == gva.offset;
  });
  if (it == s.pins.end()) {
    return Status(ErrorCode::failed_precondition, gva.to_string() + " is not mapped by this client");
  }
  Status status = m_space.unpin(*it);
  s.pins.erase(it);
  return status;
}

}  // namespace tiermem
