#include "daemon/data_service.hpp"

#include <algorithm>

#include <tiermem/status_macros.h>

#include "convert.hpp"
#include "daemon/data_plane.hpp"
#include "daemon/peer_access.hpp"
#include "daemon/replicator.hpp"
#include "daemon/session_service.hpp"
#include "pages/seqlock_copy.hpp"

namespace tiermem {

DataService::DataService(AddressSpace& space, const DaemonConfig& config, const Authoriser& auth,
                         SessionService& sessions, ReplicaService& replicas, DataPlane* data_plane,
                         PeerManager* peers, uint64_t incarnation)
    : m_space(space),
      m_config(config),
      m_auth(auth),
      m_sessions(sessions),
      m_replicas(replicas),
      m_data_plane(data_plane),
      m_peers(peers),
      m_incarnation(incarnation) {}

Status DataService::translate(const proto::TranslateRequest& r, const Identity& who, proto::TranslateResponse* out) {
  const Gva asked = wire::from_proto(r.gva());
  TIERMEM_ASSIGN_OR_RETURN(auto t, m_space.translate(asked));
  TIERMEM_RETURN_IF_ERROR(Authoriser::permit(who, asked, t.allocation, "translate"));
  const Gva gva = Authoriser::checked(asked, t.allocation);
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
  out->set_home_incarnation(m_incarnation);
  return Status();
}

Reply DataService::read(const proto::Request& request, const Identity& who) {
  const proto::ReadRequest& r = request.read();
  if (r.length() > m_config.max_inline_bytes) {
    return error_reply(request.id(),
                       Status(ErrorCode::invalid_argument,
                              "inline read of " + std::to_string(r.length()) + " bytes exceeds max_inline_bytes (" +
                                  std::to_string(m_config.max_inline_bytes) + "); split it or map the allocation"),
                       false);
  }
  // The home could not be reached: a copy serves it (the ReplicaService).
  if (r.from_replica()) return m_replicas.read_copy(request, who);
  auto info = m_auth.authorize(who, wire::from_proto(r.gva()), "read");
  if (!info.ok()) return error_reply(request.id(), info.status(), false);
  const Gva gva = Authoriser::checked(wire::from_proto(r.gva()), *info);
  const uint64_t offset = gva.offset - info->gva.offset;
  if (offset > info->size || r.length() > info->size - offset) {
    // Refused before a byte of memory is committed to the answer.
    return error_reply(request.id(), past_the_end(false, r.length(), gva, offset, info->gva, info->size), false);
  }
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
      PeerAccess access(m_peers, m_data_plane, m_config);
      Status st = m_space.read(gva, d->data(), d->size(), &access);
      return st.ok() ? out : error_reply(request.id(), st, false);
    };
    return reply;
  }
  return s.ok() ? reply : error_reply(request.id(), s, false);
}

Reply DataService::write(const proto::Request& request, const Identity& who) {
  auto info = m_auth.authorize(who, wire::from_proto(request.write().gva()), "write");
  if (!info.ok()) return error_reply(request.id(), info.status(), false);
  if (Status s = ReplicaService::guard_copy(*info, who, "write"); !s.ok()) return error_reply(request.id(), s, false);
  const Gva gva = Authoriser::checked(wire::from_proto(request.write().gva()), *info);
  // Replicated: the ReplicaService writes every copy and then this one.
  if (replicated(*info) && m_replicas.active()) return m_replicas.write(request, who, gva);
  const std::string& data = request.write().data();
  Status s = m_space.write(gva, data.data(), data.size());
  if (s.code() == ErrorCode::not_supported && m_peers != nullptr) {
    Reply reply;
    reply.deferred = [this, request, gva]() {
      PeerAccess access(m_peers, m_data_plane, m_config);
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

Reply DataService::atomic(const proto::Request& request, const Identity& who) {
  const proto::AtomicRequest& r = request.atomic();
  if (r.op() != proto::ATOMIC_FETCH_ADD && r.op() != proto::ATOMIC_COMPARE_SWAP) {
    return error_reply(request.id(),
                       Status(ErrorCode::invalid_argument,
                              "atomic operation " + std::to_string(r.op()) + " is not fetch_add (0) or compare_swap (1)"),
                       false);
  }
  auto info = m_auth.authorize(who, wire::from_proto(r.gva()), "run an atomic on");
  if (!info.ok()) return error_reply(request.id(), info.status(), false);
  if (info->replica_of.node != 0) {
    return error_reply(request.id(), ReplicaService::guard_copy(*info, Identity{}, "run an atomic on"), false);
  }
  const Gva gva = Authoriser::checked(wire::from_proto(r.gva()), *info);
  const WordOp op = r.op() == proto::ATOMIC_FETCH_ADD ? WordOp::fetch_add : WordOp::compare_swap;
  if (replicated(*info) && m_replicas.active()) return m_replicas.atomic(request, who, gva, op);
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
      PeerAccess access(m_peers, m_data_plane, m_config);
      return run(&access);
    };
  }
  return reply;
}

Reply DataService::free(const proto::Request& request, const Identity& who) {
  auto info = m_auth.authorize(who, wire::from_proto(request.free().gva()), "free");
  if (!info.ok()) return error_reply(request.id(), info.status(), false);
  if (Status s = ReplicaService::guard_copy(*info, who, "free"); !s.ok()) return error_reply(request.id(), s, false);
  std::vector<Extent> remote_frames;
  const Gva gva = Authoriser::checked(wire::from_proto(request.free().gva()), *info);
  Status s = m_space.free(gva, &remote_frames);
  if (s.code() == ErrorCode::failed_precondition) {
    // Pinned: perhaps only by a process that exited since the last sweep
    // (its pidfd turns readable after its connection closed); let those go
    // and ask once more.
    m_sessions.sweep_leases();
    s = m_space.free(gva, &remote_frames);
  }
  if (!s.ok()) return error_reply(request.id(), s, false);
  Reply reply = ok_reply(request);
  reply.response.mutable_free();
  const bool copies = !info->replicas.empty() && m_replicas.active();
  if ((!remote_frames.empty() || copies) && m_peers != nullptr) {
    // Give the frames lent by other nodes back, and free the copies, before
    // answering.
    reply.deferred = [this, request, remote_frames, who, freed = *info, copies]() {
      for (const Extent& x : remote_frames) {
        (void)m_peers->own_stub(x.node).release_frames({&x, 1});
      }
      if (copies) m_replicas.freed(freed, who);
      Reply out = ok_reply(request);
      out.response.mutable_free();
      return out;
    };
  }
  return reply;
}

}  // namespace tiermem
