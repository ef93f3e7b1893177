#include "proto/control_stub.hpp"

#include <cstring>

#include <tiermem/status_macros.h>

#include "common/deadline.hpp"
#include "convert.hpp"
#include "rpc_connection.hpp"

namespace tiermem {

proto::Request ControlStub::start() const {
  proto::Request request;
  request.set_tenant(m_on_behalf.tenant);
  request.set_is_operator(m_on_behalf.is_operator);
  request.set_uid(m_on_behalf.uid);
  request.set_by_home(m_on_behalf.by_home);
  return request;
}

Result<proto::Response> ControlStub::call(proto::Request& request, std::vector<UniqueFd>* fds) {
  if (ScopedDeadline::active()) request.set_deadline_ms(static_cast<uint32_t>(ScopedDeadline::remaining_ms()));
  return m_call(request, fds);
}

ControlStub ControlStub::over(RpcConnection& connection) {
  return ControlStub([&connection](proto::Request& request, std::vector<UniqueFd>* fds) {
    return connection.call(request, fds);
  });
}

// --- sessions ----------------------------------------------------------------------

Result<proto::HelloResponse> ControlStub::hello(const HelloArgs& args) {
  proto::Request request = start();
  proto::HelloRequest* h = request.mutable_hello();
  h->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  h->set_client_name(args.client_name);
  h->set_checkin_interval_ms(args.checkin_interval_ms);
  h->set_client_id(args.client_id);
  for (const Gva& g : args.mapped) wire::to_proto(g, h->add_mapped());
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return std::move(*response.mutable_hello());
}

Status ControlStub::check_in() {
  proto::Request request = start();
  request.mutable_check_in();
  return call(request).status();
}

Result<proto::OpenRegionsResponse> ControlStub::open_regions(std::vector<UniqueFd>* fds) {
  proto::Request request = start();
  request.mutable_open_regions();
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request, fds));
  return std::move(*response.mutable_open_regions());
}

Result<std::vector<std::pair<uint64_t, UniqueFd>>> ControlStub::device_chunks(Tier tier, uint64_t frame_offset,
                                                                             uint64_t length) {
  proto::Request request = start();
  proto::DeviceChunksRequest* r = request.mutable_device_chunks();
  r->set_tier(wire::to_proto(tier));
  r->set_frame_offset(frame_offset);
  r->set_length(length);
  std::vector<UniqueFd> fds;
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request, &fds));
  const auto& offsets = response.device_chunks().frame_offsets();
  if (static_cast<size_t>(offsets.size()) != fds.size()) {
    return Status(ErrorCode::malformed_frame, "tiermemd sent VRAM chunks and descriptors that do not pair up");
  }
  std::vector<std::pair<uint64_t, UniqueFd>> out;
  for (int i = 0; i < offsets.size(); ++i) out.emplace_back(offsets[i], std::move(fds[static_cast<size_t>(i)]));
  return out;
}

Result<MapReply> ControlStub::map(Gva gva) {
  proto::Request request = start();
  wire::to_proto(gva, request.mutable_map()->mutable_gva());
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  MapReply out;
  out.allocation = wire::from_proto(response.map().allocation());
  for (const auto& x : response.map().extents()) out.extents.push_back(wire::from_proto(x));
  return out;
}

Status ControlStub::unmap(Gva gva) {
  proto::Request request = start();
  wire::to_proto(gva, request.mutable_unmap()->mutable_gva());
  return call(request).status();
}

// --- allocations -------------------------------------------------------------------

Result<AllocationInfo> ControlStub::alloc(uint64_t size, const AllocOptions& options) {
  proto::Request request = start();
  proto::AllocRequest* a = request.mutable_alloc();
  a->set_size(size);
  a->set_tier(wire::to_proto(options.tier));
  a->set_strict(options.strict);
  a->set_name(options.name);
  a->set_coherent(options.coherent);
  a->set_session(options.lifetime == Lifetime::session);
  a->set_replicas(options.replicas);
  a->set_qos(static_cast<uint32_t>(options.qos));
  a->set_demotable(options.demotable);
  request.set_node(options.node);
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return wire::from_proto(response.alloc().allocation());
}

Status ControlStub::free(Gva gva) {
  proto::Request request = start();
  wire::to_proto(gva, request.mutable_free()->mutable_gva());
  return call(request).status();
}

Result<AllocationInfo> ControlStub::lookup(std::string_view name, NodeId node) {
  proto::Request request = start();
  request.set_node(node);
  request.mutable_lookup()->set_name(std::string(name));
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return wire::from_proto(response.lookup().allocation());
}

Result<Translation> ControlStub::translate(Gva gva) {
  TIERMEM_ASSIGN_OR_RETURN(auto t, translate_for_cache(gva));
  return wire::from_proto(t);
}

Result<proto::TranslateResponse> ControlStub::translate_for_cache(Gva gva) {
  proto::Request request = start();
  wire::to_proto(gva, request.mutable_translate()->mutable_gva());
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return std::move(*response.mutable_translate());
}

Result<AllocationInfo> ControlStub::migrate(Gva gva, Tier tier, NodeId to_node) {
  proto::Request request = start();
  proto::MigrateRequest* m = request.mutable_migrate();
  wire::to_proto(gva, m->mutable_gva());
  m->set_tier(wire::to_proto(tier));
  m->set_to_node(to_node);
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return wire::from_proto(response.migrate().allocation());
}

// --- bytes and words ---------------------------------------------------------------

Status ControlStub::read(Gva gva, std::span<std::byte> dst, bool from_replica) {
  proto::Request request = start();
  proto::ReadRequest* r = request.mutable_read();
  wire::to_proto(gva, r->mutable_gva());
  r->set_length(dst.size());
  r->set_from_replica(from_replica);
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  const std::string& data = response.read().data();
  if (data.size() != dst.size()) return Status(ErrorCode::internal, "tiermemd returned a short read");
  std::memcpy(dst.data(), data.data(), dst.size());
  return Status();
}

Status ControlStub::write(Gva gva, std::unique_ptr<std::string>& data) {
  proto::Request request = start();
  wire::to_proto(gva, request.mutable_write()->mutable_gva());
  request.mutable_write()->set_allocated_data(data.release());
  auto response = call(request);
  data.reset(request.mutable_write()->release_data());
  return response.status();
}

Result<uint64_t> ControlStub::atomic(Gva gva, proto::AtomicOp op, uint64_t operand, uint64_t compare) {
  proto::Request request = start();
  proto::AtomicRequest* a = request.mutable_atomic();
  wire::to_proto(gva, a->mutable_gva());
  a->set_op(op);
  a->set_operand(operand);
  a->set_compare(compare);
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return response.atomic().old_value();
}

Result<uint64_t> ControlStub::fetch_add(Gva gva, uint64_t value) {
  return atomic(gva, proto::ATOMIC_FETCH_ADD, value, 0);
}

Result<uint64_t> ControlStub::compare_swap(Gva gva, uint64_t expected, uint64_t desired) {
  return atomic(gva, proto::ATOMIC_COMPARE_SWAP, desired, expected);
}

Status ControlStub::persist_frames(NodeId node, Tier tier, uint64_t frame_offset, uint64_t length) {
  proto::Request request = start();
  request.set_node(node);
  proto::PersistFramesRequest* p = request.mutable_persist_frames();
  p->set_tier(wire::to_proto(tier));
  p->set_frame_offset(frame_offset);
  p->set_length(length);
  return call(request).status();
}

// --- the cluster -------------------------------------------------------------------

Result<NodesReply> ControlStub::nodes(NodeId from) {
  proto::Request request = start();
  request.mutable_nodes()->set_from(from);
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  NodesReply out;
  for (const proto::NodeInfo& n : response.nodes().nodes()) out.nodes.push_back(wire::from_proto(n));
  const NodeId answered = from != 0 ? from : (out.nodes.empty() ? 0 : out.nodes.front().node);
  for (const proto::ClientEdge& c : response.nodes().clients()) out.clients.push_back(wire::from_proto(answered, c));
  return out;
}

Result<proto::NodeInfo> ControlStub::describe(NodeId node, bool ask_node) {
  proto::Request request = start();
  request.mutable_nodes()->set_refresh(ask_node);
  request.mutable_nodes()->set_node(node);
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  for (proto::NodeInfo& n : *response.mutable_nodes()->mutable_nodes()) {
    if (n.node_id() == node) return std::move(n);
  }
  return Status(ErrorCode::bad_gva, "node " + std::to_string(node) + " is not in the cluster");
}

Result<NodeStat> ControlStub::stat(NodeId node) {
  proto::Request request = start();
  request.set_node(node);
  request.mutable_stat();
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return wire::from_proto(response.stat());
}

Result<std::vector<AllocationInfo>> ControlStub::list(NodeId node) {
  proto::Request request = start();
  request.set_node(node);
  request.mutable_list();
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  std::vector<AllocationInfo> out;
  for (const auto& a : response.list().allocations()) out.push_back(wire::from_proto(a));
  return out;
}

Result<MappingDump> ControlStub::dump(NodeId node) {
  proto::Request request = start();
  request.set_node(node);
  request.mutable_dump();
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return wire::from_proto(response.dump());
}

Result<std::string> ControlStub::metrics(NodeId node) {
  proto::Request request = start();
  request.set_node(node);
  request.mutable_metrics();
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return std::move(*response.mutable_metrics()->mutable_text());
}

// --- daemon to daemon -----------------------------------------------------------------

Result<proto::PeerChallengeResponse> ControlStub::peer_challenge(NodeId self, const std::string& nonce) {
  proto::Request request = start();
  proto::PeerChallengeRequest* c = request.mutable_peer_challenge();
  c->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  c->set_node_id(self);
  c->set_nonce(nonce);
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return std::move(*response.mutable_peer_challenge());
}

Result<proto::NodeInfo> ControlStub::peer_hello(const proto::NodeInfo& self, const std::string& proof) {
  proto::Request request = start();
  proto::PeerHelloRequest* h = request.mutable_peer_hello();
  h->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  *h->mutable_self() = self;
  h->set_proof(proof);
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return std::move(*response.mutable_peer_hello()->mutable_self());
}

Result<proto::PingResponse> ControlStub::ping() {
  proto::Request request = start();
  request.mutable_ping();
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return std::move(*response.mutable_ping());
}

Result<proto::NodeInfo> ControlStub::node_info() {
  proto::Request request = start();
  request.mutable_node_info();
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return std::move(*response.mutable_node_info()->mutable_self());
}

Result<LentFrames> ControlStub::reserve_frames(Tier tier, uint64_t pages) {
  proto::Request request = start();
  request.mutable_reserve_frames()->set_tier(wire::to_proto(tier));
  request.mutable_reserve_frames()->set_pages(pages);
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  LentFrames out;
  for (const auto& x : response.reserve_frames().extents()) out.extents.push_back(wire::from_proto(x));
  out.memory_generation = response.reserve_frames().memory_generation();
  out.incarnation = response.reserve_frames().incarnation();
  return out;
}

Status ControlStub::release_frames(std::span<const Extent> extents) {
  proto::Request request = start();
  for (const Extent& x : extents) wire::to_proto(x, request.mutable_release_frames()->add_extents());
  return call(request).status();
}

Result<uint32_t> ControlStub::break_locks(std::span<const std::pair<uint64_t, uint64_t>> locks) {
  proto::Request request = start();
  for (const auto& [page, locked] : locks) {
    proto::LockRecord* r = request.mutable_break_locks()->add_locks();
    r->set_page(page);
    r->set_locked(locked);
  }
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return response.break_locks().broken();
}

Result<AllocationInfo> ControlStub::alloc_copy(const AllocationInfo& of, bool ready) {
  proto::Request request = start();
  proto::AllocRequest* a = request.mutable_alloc();
  a->set_size(of.size);
  a->set_tier(wire::to_proto(of.tier));
  a->set_name(of.name);  // findable while the home is away (Client::list)
  wire::to_proto(of.gva, a->mutable_replica_of());
  a->set_replica_ready(ready);
  TIERMEM_ASSIGN_OR_RETURN(auto response, call(request));
  return wire::from_proto(response.alloc().allocation());
}

Status ControlStub::replica_ready(Gva copy) {
  proto::Request request = start();
  wire::to_proto(copy, request.mutable_replica_ready()->mutable_gva());
  return call(request).status();
}

Status ControlStub::write(Gva gva, std::span<const std::byte> data) {
  proto::Request request = start();
  wire::to_proto(gva, request.mutable_write()->mutable_gva());
  request.mutable_write()->set_data(data.data(), data.size());
  return call(request).status();
}

}  // namespace tiermem
