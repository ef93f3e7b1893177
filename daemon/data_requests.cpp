// Requests about the data of allocations homed on this node: translate, read,
// write, atomics, free, and the zero-copy mapping for co-located clients.
// Each is checked against the requester's tenant first; the GVA a request
// goes on with carries the generation of the allocation that was checked, so
// an allocation freed and made anew in between is stale, never someone else's.
#include <algorithm>

#include <tiermem/status_macros.h>

#include "common/frame.hpp"
#include "convert.hpp"
#include "daemon/data_plane.hpp"
#include "daemon/peer_access.hpp"
#include "daemon/replicator.hpp"
#include "daemon/request_handler.hpp"
#include "daemon/session_locks.hpp"
#include "pages/lock_intents.hpp"

namespace tiermem {
namespace {

// `gva`, pinned to the generation of the allocation it was authorized for.
Gva checked(Gva gva, const AllocationInfo& info) {
  gva.generation = info.gva.generation;
  return gva;
}

}  // namespace

Status RequestHandler::translate(const proto::TranslateRequest& r, const Identity& who, proto::TranslateResponse* out) {
  const Gva asked = wire::from_proto(r.gva());
  TIERMEM_ASSIGN_OR_RETURN(auto t, m_space.translate(asked));
  TIERMEM_RETURN_IF_ERROR(Authoriser::permit(who, asked, t.allocation, "translate"));
  const Gva gva = checked(asked, t.allocation);
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

Reply RequestHandler::read(const proto::Request& request, const Identity& who) {
  const proto::ReadRequest& r = request.read();
  if (r.length() > m_config.max_inline_bytes) {
    return error_reply(request.id(),
                       Status(ErrorCode::invalid_argument,
                              "inline read of " + std::to_string(r.length()) + " bytes exceeds max_inline_bytes (" +
                                  std::to_string(m_config.max_inline_bytes) + "); split it or map the allocation"),
                       false);
  }
  if (r.from_replica()) return read_copy(request, who);
  auto info = m_auth.authorize(who, wire::from_proto(r.gva()), "read");
  if (!info.ok()) return error_reply(request.id(), info.status(), false);
  const Gva gva = checked(wire::from_proto(r.gva()), *info);
  const uint64_t offset = gva.offset - info->gva.offset;
  if (offset > info->size || r.length() > info->size - offset) {
    // Refused before a byte of memory is committed to the answer.
    return error_reply(request.id(), m_space.read(gva, nullptr, r.length()), false);
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
      PeerAccess access(m_peers, transport(), transport_timeout());
      Status st = m_space.read(gva, d->data(), d->size(), &access);
      return st.ok() ? out : error_reply(request.id(), st, false);
    };
    return reply;
  }
  return s.ok() ? reply : error_reply(request.id(), s, false);
}

Reply RequestHandler::write(const proto::Request& request, const Identity& who) {
  auto info = m_auth.authorize(who, wire::from_proto(request.write().gva()), "write");
  if (!info.ok()) return error_reply(request.id(), info.status(), false);
  if (Status s = guard_copy(*info, who, "write"); !s.ok()) return error_reply(request.id(), s, false);
  const Gva gva = checked(wire::from_proto(request.write().gva()), *info);
  if (replicated(*info) && m_replicator != nullptr) return write_replicated(request, who, gva);
  const std::string& data = request.write().data();
  Status s = m_space.write(gva, data.data(), data.size());
  if (s.code() == ErrorCode::not_supported && m_peers != nullptr) {
    Reply reply;
    reply.deferred = [this, request, gva]() {
      PeerAccess access(m_peers, transport(), transport_timeout());
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

Reply RequestHandler::atomic(const proto::Request& request, const Identity& who) {
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
    return error_reply(request.id(), guard_copy(*info, Identity{}, "run an atomic on"), false);
  }
  const Gva gva = checked(wire::from_proto(r.gva()), *info);
  const WordOp op = r.op() == proto::ATOMIC_FETCH_ADD ? WordOp::fetch_add : WordOp::compare_swap;
  if (replicated(*info) && m_replicator != nullptr) return atomic_replicated(request, who, gva, op);
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
      PeerAccess access(m_peers, transport(), transport_timeout());
      return run(&access);
    };
  }
  return reply;
}

Reply RequestHandler::free(const proto::Request& request, const Identity& who) {
  auto info = m_auth.authorize(who, wire::from_proto(request.free().gva()), "free");
  if (!info.ok()) return error_reply(request.id(), info.status(), false);
  if (Status s = guard_copy(*info, who, "free"); !s.ok()) return error_reply(request.id(), s, false);
  std::vector<Extent> remote_frames;
  const Gva gva = checked(wire::from_proto(request.free().gva()), *info);
  Status s = m_space.free(gva, &remote_frames);
  if (s.code() == ErrorCode::failed_precondition) {
    // Pinned: perhaps only by a process that exited since the last sweep
    // (its pidfd turns readable after its connection closed); let those go
    // and ask once more.
    sweep_leases();
    s = m_space.free(gva, &remote_frames);
  }
  if (!s.ok()) return error_reply(request.id(), s, false);
  Reply reply = ok_reply(request);
  reply.response.mutable_free();
  const bool copies = !info->replicas.empty() && m_replicator != nullptr;
  if ((!remote_frames.empty() || copies) && m_peers != nullptr) {
    // Give the frames lent by other nodes back, and free the copies, before
    // answering.
    reply.deferred = [this, request, remote_frames, who, freed = *info, copies]() {
      for (const Extent& x : remote_frames) {
        (void)m_peers->own_stub(x.node).release_frames({&x, 1});
      }
      if (copies) m_replicator->freed(freed, who);
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
  // The session's own tenant's domain, given to it now if it has none yet;
  // an operator's also every other tenant's, as far as one reply carries
  // their descriptors (the rest it reaches through the daemon).
  TIERMEM_ASSIGN_OR_RETURN(const uint32_t own, ensure_domain(s.who.tenant));
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

Status RequestHandler::device_chunks(const proto::DeviceChunksRequest& r, const SessionState& s,
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

Status RequestHandler::map(const proto::MapRequest& r, SessionState& s, proto::MapResponse* out) {
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
  TIERMEM_ASSIGN_OR_RETURN(auto layout, m_space.pin(checked(wire::from_proto(r.gva()), info)));
  // The pin is the client's while its process lives (its mapping is in the
  // process's address space, whatever becomes of this connection).
  m_leases.pin(client_key(s), layout.info.gva);
  wire::to_proto(layout.info, out->mutable_allocation());
  for (const Extent& x : layout.extents) wire::to_proto(x, out->add_extents());
  return Status();
}

Status RequestHandler::unmap(const proto::UnmapRequest& r, SessionState& s) {
  const Gva gva = wire::from_proto(r.gva());
  const std::optional<Gva> pinned = s.remote ? std::nullopt : m_leases.unpin(client_key(s), gva);
  if (!pinned) return Status(ErrorCode::failed_precondition, gva.to_string() + " is not mapped by this client");
  return m_space.unpin(*pinned);
}

}  // namespace tiermem
