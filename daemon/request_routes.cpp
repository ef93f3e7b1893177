// The table of requests: one row per request kind (the body's field number in
// proto/control.proto), saying who may ask it and which service serves it.
// RequestHandler::route() admits a request by its row (a peer-only request
// from a client is refused before any work) and dispatch() calls the row's
// function. A kind with no row is refused as malformed.
//
// The services, by family:
//   session  hello, open_regions, device_chunks, map, unmap, check_in
//            (SessionService)
//   cluster  peer_challenge, peer_hello, ping, node_info, nodes, reserve_frames,
//            release_frames, persist_frames, break_locks, migrate
//            (ClusterService)
//   data     translate, read, write, atomic, free (DataService)
//   replica  replica_ready (and the replicated paths of alloc, write, atomic,
//            free and read, which the data family hands it) (ReplicaService)
//   node     alloc, lookup, stat, list, dump, metrics: of the node as a whole,
//            the handler's own (an alloc that finds no room here is routed to
//            another node; metrics are the handler's counts)
#include <array>

#include "convert.hpp"
#include "daemon/request_handler.hpp"

namespace tiermem {

Reply RequestHandler::finish(Reply reply, const Status& status, uint64_t id) {
  if (!status.ok()) return error_reply(id, status, reply.close_after);
  wire::to_proto(status, reply.response.mutable_status());
  reply.response.set_fd_count(static_cast<uint32_t>(reply.fds.size()));
  return reply;
}

namespace {
using Body = proto::Request::BodyCase;
using R = const proto::Request&;
using S = SessionState&;
using H = RequestHandler&;
}  // namespace

void RequestHandler::add(RouteTable& t, int body, const char* name, bool peer_only, Serve serve) {
  t[static_cast<size_t>(body)] = Route{name, peer_only, serve};
}

// Each family's rows. Lambdas defined in a member function may reach the
// handler's private services; each row's `serve` is a plain function pointer.
void RequestHandler::session_routes(RouteTable& t) {
  add(t, Body::kHello, "hello", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status = h.m_sessions.hello(r.hello(), s, reply.response.mutable_hello());
    reply.close_after = !status.ok();
    if (status.ok() && !s.remote) h.m_sessions.take_lease(r.hello(), s, reply.response.mutable_hello());
    return finish(std::move(reply), status, r.id());
  });
  add(t, Body::kOpenRegions, "open_regions", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status = h.m_sessions.open_regions(s, reply.response.mutable_open_regions(), &reply.fds);
    return finish(std::move(reply), status, r.id());
  });
  add(t, Body::kDeviceChunks, "device_chunks", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status =
        h.m_sessions.device_chunks(r.device_chunks(), s, reply.response.mutable_device_chunks(), &reply.fds);
    return finish(std::move(reply), status, r.id());
  });
  add(t, Body::kMap, "map", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status = h.m_sessions.map(r.map(), s, reply.response.mutable_map());
    return finish(std::move(reply), status, r.id());
  });
  add(t, Body::kUnmap, "unmap", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status = h.m_sessions.unmap(r.unmap(), s);
    reply.response.mutable_unmap();
    return finish(std::move(reply), status, r.id());
  });
  add(t, Body::kCheckIn, "check_in", false, [](H, R r, S) {
    Reply reply = ok_reply(r);  // handle() took the check-in: any request is one
    reply.response.mutable_check_in();
    return finish(std::move(reply), Status(), r.id());
  });
}

void RequestHandler::cluster_routes(RouteTable& t) {
  add(t, Body::kPeerChallenge, "peer_challenge", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status = h.m_cluster.peer_challenge(r.peer_challenge(), s, reply.response.mutable_peer_challenge());
    reply.close_after = !status.ok();
    return finish(std::move(reply), status, r.id());
  });
  add(t, Body::kPeerHello, "peer_hello", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status = h.m_cluster.peer_hello(r.peer_hello(), s, reply.response.mutable_peer_hello());
    reply.close_after = !status.ok();
    return finish(std::move(reply), status, r.id());
  });
  add(t, Body::kPing, "ping", true, [](H h, R r, S) {
    Reply reply = ok_reply(r);
    h.m_cluster.ping(reply.response.mutable_ping());
    return finish(std::move(reply), Status(), r.id());
  });
  add(t, Body::kNodeInfo, "node_info", true, [](H h, R r, S) {
    Reply reply = ok_reply(r);
    *reply.response.mutable_node_info()->mutable_self() = h.m_cluster.self();
    return finish(std::move(reply), Status(), r.id());
  });
  add(t, Body::kNodes, "nodes", false,
      [](H h, R r, S s) { return h.m_cluster.nodes(r, Authoriser::requester(r, s)); });
  add(t, Body::kReserveFrames, "reserve_frames", true, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status = h.m_cluster.reserve_frames(r, s, reply.response.mutable_reserve_frames());
    return finish(std::move(reply), status, r.id());
  });
  add(t, Body::kReleaseFrames, "release_frames", true, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status = h.m_cluster.release_frames(r.release_frames(), s);
    reply.response.mutable_release_frames();
    return finish(std::move(reply), status, r.id());
  });
  add(t, Body::kPersistFrames, "persist_frames", false,
      [](H h, R r, S s) { return h.m_cluster.persist_frames(r, Authoriser::requester(r, s)); });
  add(t, Body::kBreakLocks, "break_locks", true, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    h.m_cluster.break_locks(r.break_locks(), Authoriser::requester(r, s), reply.response.mutable_break_locks());
    return finish(std::move(reply), Status(), r.id());
  });
  add(t, Body::kMigrate, "migrate", false,
      [](H h, R r, S s) { return h.m_cluster.migrate(r, Authoriser::requester(r, s)); });
}

void RequestHandler::data_routes(RouteTable& t) {
  add(t, Body::kFree, "free", false, [](H h, R r, S s) { return h.m_data.free(r, Authoriser::requester(r, s)); });
  add(t, Body::kTranslate, "translate", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status =
        h.m_data.translate(r.translate(), Authoriser::requester(r, s), reply.response.mutable_translate());
    return finish(std::move(reply), status, r.id());
  });
  add(t, Body::kRead, "read", false, [](H h, R r, S s) { return h.m_data.read(r, Authoriser::requester(r, s)); });
  add(t, Body::kWrite, "write", false,
      [](H h, R r, S s) { return h.m_data.write(r, Authoriser::requester(r, s)); });
  add(t, Body::kAtomic, "atomic", false,
      [](H h, R r, S s) { return h.m_data.atomic(r, Authoriser::requester(r, s)); });
}

void RequestHandler::node_routes(RouteTable& t) {
  add(t, Body::kAlloc, "alloc", false,
      [](H h, R r, S s) { return h.serve_alloc(r, s, Authoriser::requester(r, s)); });
  add(t, Body::kLookup, "lookup", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status = h.lookup(r.lookup(), Authoriser::requester(r, s), reply.response.mutable_lookup());
    return finish(std::move(reply), status, r.id());
  });
  add(t, Body::kStat, "stat", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    h.stat(Authoriser::requester(r, s), reply.response.mutable_stat());
    return finish(std::move(reply), Status(), r.id());
  });
  add(t, Body::kList, "list", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    h.list(Authoriser::requester(r, s), reply.response.mutable_list());
    return finish(std::move(reply), Status(), r.id());
  });
  add(t, Body::kDump, "dump", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    h.dump(Authoriser::requester(r, s), reply.response.mutable_dump());
    return finish(std::move(reply), Status(), r.id());
  });
  add(t, Body::kMetrics, "metrics", false, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status = h.serve_metrics(Authoriser::requester(r, s), reply.response.mutable_metrics());
    return finish(std::move(reply), status, r.id());
  });
}

void RequestHandler::replica_routes(RouteTable& t) {
  add(t, Body::kReplicaReady, "replica_ready", true, [](H h, R r, S s) {
    Reply reply = ok_reply(r);
    Status status = h.m_replicas.replica_ready(r.replica_ready(), Authoriser::requester(r, s));
    reply.response.mutable_replica_ready();
    return finish(std::move(reply), status, r.id());
  });
}

const RequestHandler::Route* RequestHandler::route_of(int body) {
  static const RouteTable table = [] {
    RouteTable t{};
    session_routes(t);
    cluster_routes(t);
    data_routes(t);
    replica_routes(t);
    node_routes(t);
    return t;
  }();
  if (body <= 0 || static_cast<size_t>(body) >= table.size() || table[static_cast<size_t>(body)].serve == nullptr) {
    return nullptr;
  }
  return &table[static_cast<size_t>(body)];
}

Reply RequestHandler::dispatch(const Route* route, const proto::Request& request, SessionState& session) {
  if (route == nullptr) {
    return error_reply(request.id(),
                       Status(ErrorCode::malformed_frame, "request has no body (unknown request type?)"), false);
  }
  return route->serve(*this, request, session);
}

// --- the services the table names that are more than one call -----------------------

Reply RequestHandler::serve_alloc(const proto::Request& request, SessionState& session, const Identity& who) {
  Reply reply = ok_reply(request);
  proto::Response& resp = reply.response;
  Status status = alloc(request.alloc(), who, resp.mutable_alloc());
  if (status.ok() && request.alloc().session()) {
    session.owned.push_back(wire::from_proto(resp.alloc().allocation().gva()));
  }
  if (status.ok() && request.alloc().replicas() > 0) {
    return m_replicas.alloc(request, who, wire::from_proto(resp.alloc().allocation()));
  }
  if ((status.code() == ErrorCode::tier_exhausted || status.code() == ErrorCode::tier_unavailable) &&
      request.node() == 0 && !request.forwarded() && !request.alloc().session()) {
    return alloc_anywhere(request, session, status);
  }
  return finish(std::move(reply), status, request.id());
}

Status RequestHandler::serve_metrics(const Identity& who, proto::MetricsResponse* out) {
  if (!who.is_operator) {
    return Status(ErrorCode::permission_denied, "the metrics name every tenant: operators only (root or "
                                                "tenants.admin_group), not " + who.describe());
  }
  if (!m_counting) {
    return Status(ErrorCode::failed_precondition,
                  "metrics.enabled is false on node " + std::to_string(m_space.node()) + ": nothing is counted");
  }
  out->set_text(metrics());
  return Status();
}

}  // namespace tiermem
