#include "daemon/replica_service.hpp"

#include <tiermem/status_macros.h>

#include "convert.hpp"
#include "daemon/authoriser.hpp"
#include "daemon/data_plane.hpp"
#include "daemon/peer_access.hpp"
#include "daemon/peer_manager.hpp"

namespace tiermem {

ReplicaService::ReplicaService(AddressSpace& space, const DaemonConfig& config, DataPlane* data_plane,
                               PeerManager* peers)
    : m_space(space), m_config(config), m_data_plane(data_plane), m_peers(peers) {
  if (peers == nullptr) return;
  m_copy_writer = std::make_unique<CopyWriter>(*peers, data_plane, config, space.page_size());
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
      PeerAccess access(m_peers, m_data_plane, m_config);
      s = m_space.read(gva, dst, n, &access);
    }
    return s;
  }, [this](const ReplicaInfo& copy, uint64_t offset, const void* data, size_t length, const Identity& who) {
    return m_copy_writer->write(copy, offset, data, length, who);
  });
}

ReplicaService::~ReplicaService() {
  if (m_replicator) m_replicator->stop();
}

void ReplicaService::freed(const AllocationInfo& info, const Identity& who) { m_replicator->freed(info, who); }

Status ReplicaService::guard_copy(const AllocationInfo& info, const Identity& who, const char* verb) {
  if (info.replica_of.node == 0 || who.acting_home == info.replica_of.node) return Status();
  return Status(ErrorCode::permission_denied,
                info.gva.to_string() + " is the copy of " + info.replica_of.to_string() + " on node " +
                    std::to_string(info.gva.node) + ": only its home, node " + std::to_string(info.replica_of.node) +
                    ", may " + verb + " it (write the allocation itself)");
}

Status ReplicaService::check_replicas(const proto::AllocRequest& r, const Identity& who) const {
  if (r.has_replica_of()) {
    const Gva of = wire::from_proto(r.replica_of());
    if (who.acting_home == 0 || who.acting_home != of.node) {
      return Status(ErrorCode::permission_denied, "only the home of " + of.to_string() + " makes copies of it");
    }
    if (r.replicas() > 0) return Status(ErrorCode::invalid_argument, "a copy has no copies of its own");
  }
  if (r.replicas() == 0) return Status();
  if (r.replicas() > k_max_replicas) {
    return Status(ErrorCode::invalid_argument, std::to_string(r.replicas()) + " replicas asked; at most " +
                                                   std::to_string(k_max_replicas));
  }
  if (r.session()) {
    return Status(ErrorCode::invalid_argument,
                  "session allocations are scratch memory and are not replicated; ask for a persistent one");
  }
  if (r.coherent()) {
    return Status(ErrorCode::invalid_argument,
                  "a coherent allocation takes one-sided atomics from every client, which its copies would not "
                  "see; ask for replicas or coherent, not both");
  }
  if (m_replicator == nullptr) {
    return Status(ErrorCode::unavailable, "node " + std::to_string(m_space.node()) +
                                              " runs alone (no cluster.file): there is no other node to copy to");
  }
  return Status();
}

Reply ReplicaService::alloc(const proto::Request& request, const Identity& who, const AllocationInfo& info) {
  Reply reply;
  reply.deferred = [this, request, who, info]() {
    Status s = m_replicator->place(info, request.alloc().replicas(), who);
    if (!s.ok()) {
      (void)m_space.free(info.gva);
      return error_reply(request.id(), s.with_context("allocation with replicas"), false);
    }
    Reply out = ok_reply(request);
    auto t = m_space.translate(info.gva);
    wire::to_proto(t.ok() ? t->allocation : info, out.response.mutable_alloc()->mutable_allocation());
    return out;
  };
  return reply;
}

Reply ReplicaService::write(const proto::Request& request, const Identity& who, Gva gva) {
  Reply reply;
  reply.deferred = [this, request, who, gva]() {
    const std::string& d = request.write().data();
    Status s = m_replicator->write(gva, d.data(), d.size(), who, [&]() {
      Status local = m_space.write(gva, d.data(), d.size());
      if (local.code() == ErrorCode::not_supported && m_peers != nullptr) {
        PeerAccess access(m_peers, m_data_plane, m_config);
        local = m_space.write(gva, d.data(), d.size(), &access);
      }
      return local;
    });
    if (!s.ok()) return error_reply(request.id(), s, false);
    Reply out = ok_reply(request);
    out.response.mutable_write()->set_written(d.size());
    return out;
  };
  return reply;
}

Reply ReplicaService::atomic(const proto::Request& request, const Identity& who, Gva gva, WordOp op) {
  Reply reply;
  reply.deferred = [this, request, who, gva, op]() {
    const proto::AtomicRequest& r = request.atomic();
    auto old = m_replicator->atomic(gva, op, r.operand(), r.compare(), who, [&]() {
      auto local = m_space.atomic(gva, op, r.operand(), r.compare());
      if (!local.ok() && local.status().code() == ErrorCode::not_supported && m_peers != nullptr) {
        PeerAccess access(m_peers, m_data_plane, m_config);
        local = m_space.atomic(gva, op, r.operand(), r.compare(), &access);
      }
      return local;
    });
    if (!old.ok()) return error_reply(request.id(), old.status(), false);
    Reply out = ok_reply(request);
    out.response.mutable_atomic()->set_old_value(*old);
    return out;
  };
  return reply;
}

Reply ReplicaService::read_copy(const proto::Request& request, const Identity& who) {
  const proto::ReadRequest& r = request.read();
  const Gva home = wire::from_proto(r.gva());
  auto copy = m_space.find_replica(home);
  if (copy.ok()) {
    Status s = Authoriser::permit(who, home, *copy, "read");
    if (s.ok() && m_replicator != nullptr) s = m_replicator->may_serve(*copy);
    const uint64_t offset = home.offset - copy->replica_of.offset;
    if (s.ok() && r.length() > copy->size - offset) {
      s = Status(ErrorCode::out_of_range, "read of " + std::to_string(r.length()) + " bytes at " + home.to_string() +
                                              " runs past the end of the allocation (" +
                                              std::to_string(copy->size) + " bytes)");
    }
    if (!s.ok()) return error_reply(request.id(), s, false);
    Reply reply;
    reply.deferred = [this, request, at = copy->gva.plus(offset)]() {
      Reply out = ok_reply(request);
      std::string* d = out.response.mutable_read()->mutable_data();
      d->resize(request.read().length());
      Status st = m_space.read(at, d->data(), d->size());
      if (st.code() == ErrorCode::not_supported && m_peers != nullptr) {
        PeerAccess access(m_peers, m_data_plane, m_config);
        st = m_space.read(at, d->data(), d->size(), &access);
      }
      return st.ok() ? out : error_reply(request.id(), st, false);
    };
    return reply;
  }
  if (request.forwarded() || m_peers == nullptr) return error_reply(request.id(), copy.status(), false);
  // Not here: ask every other node but the home, which could not be reached.
  Reply reply;
  reply.deferred = [this, request, who, home]() {
    const proto::Request relayed = Authoriser::relayed(request, who);
    std::string tried;
    for (NodeId node : m_peers->connected()) {
      if (node == home.node) continue;
      auto response = m_peers->call(node, relayed);
      if (response.ok()) {
        Reply out;
        out.response = std::move(response).value();
        out.response.set_id(request.id());
        return out;
      }
      if (response.status().code() == ErrorCode::not_found) continue;
      tried += "; node " + std::to_string(node) + ": " + response.status().message();
    }
    return error_reply(request.id(),
                       Status(ErrorCode::unavailable, "no copy of " + home.to_string() + " could serve the read" +
                                                          (tried.empty() ? std::string(" (none was found)") : tried)),
                       false);
  };
  return reply;
}

Status ReplicaService::replica_ready(const proto::ReplicaReadyRequest& r, const Identity& who) {
  const Gva gva = wire::from_proto(r.gva());
  TIERMEM_ASSIGN_OR_RETURN(auto t, m_space.translate(gva));
  if (t.allocation.replica_of.node == 0) {
    return Status(ErrorCode::invalid_argument, gva.to_string() + " is not a copy of another allocation");
  }
  TIERMEM_RETURN_IF_ERROR(guard_copy(t.allocation, who, "mark ready"));
  return m_space.change_policy(t.allocation.gva, [](AllocationPolicy& p) { p.replica_ready = true; });
}

}  // namespace tiermem
