// The control protocol as calls: one method per request, taking and returning
// the public types (include/tiermem/types.h) where the request has them, and
// the response's message where only tiermem's own code reads it (a hello's
// geometry, a node's adverts, the descriptors of regions). Every request a
// client makes of a daemon is built here and nowhere else; the conversions
// are proto/convert.cpp's.
//
// The stub does not own a connection: it is given the function that sends one
// request and waits for its response (RpcConnection::call, a client's
// ClientCore::call, which also notices a lost daemon). Deadlines: a request
// made under a ScopedDeadline carries what is left of it (deadline_ms), and
// the daemon's own waits end by then. Retries are the caller's, who knows
// whether a request may be repeated (Client::run connects again and repeats
// only what is repeatable); the stub sends each request once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>
#include <tiermem/types.h>

#include "common/unique_fd.hpp"
#include "control.pb.h"

namespace tiermem {

class RpcConnection;

// What a map request answers: the allocation and where its bytes are.
struct MapReply {
  AllocationInfo allocation;
  std::vector<Extent> extents;
};

// What a nodes request answers: the cluster as the asked daemon sees it, and
// the check-in edges of that daemon's clients.
struct NodesReply {
  std::vector<NodeInfo> nodes;
  std::vector<CheckInEdge> clients;  // their `node` is the daemon that answered
};

// Who a daemon asks for, in a request to a peer (believed from an
// authenticated peer only; a client's own requests carry nothing: its
// session says who it is).
struct OnBehalf {
  std::string tenant;
  bool is_operator = false;
  uint32_t uid = 0;
  bool by_home = false;  // as the home of the copy the request is about
};

// What a peer lent (reserve_frames).
struct LentFrames {
  std::vector<Extent> extents;
  uint64_t memory_generation = 0;  // of the lender's memory they are in
  uint64_t incarnation = 0;        // of the lender
};

// A hello's arguments.
struct HelloArgs {
  std::string client_name;
  uint32_t checkin_interval_ms = 0;
  uint64_t client_id = 0;
  std::vector<Gva> mapped;  // the allocations this process still maps
};

class ControlStub {
 public:
  // Sends `request` and returns its response (a non-OK status in it is the
  // error); descriptors sent with it go to *fds when given.
  using CallFn = std::function<Result<proto::Response>(proto::Request&, std::vector<UniqueFd>*)>;

  explicit ControlStub(CallFn call, OnBehalf on_behalf = {})
      : m_call(std::move(call)), m_on_behalf(std::move(on_behalf)) {}
  // Requests over `connection`, which must outlive the stub.
  static ControlStub over(RpcConnection& connection);

  // --- sessions ---
  Result<proto::HelloResponse> hello(const HelloArgs& args);
  Status check_in();
  // The descriptors of the node's regions (its tiers' files, version words,
  // the session's lock log), in the order the response lists them.
  Result<proto::OpenRegionsResponse> open_regions(std::vector<UniqueFd>* fds);
  // The VRAM chunks over [frame_offset, frame_offset + length) of `tier`, each
  // with its frame offset and a descriptor to import. Errors: malformed_frame
  // when offsets and descriptors do not pair up.
  Result<std::vector<std::pair<uint64_t, UniqueFd>>> device_chunks(Tier tier, uint64_t frame_offset, uint64_t length);
  Result<MapReply> map(Gva gva);
  Status unmap(Gva gva);

  // --- allocations ---
  Result<AllocationInfo> alloc(uint64_t size, const AllocOptions& options);
  Status free(Gva gva);
  Result<AllocationInfo> lookup(std::string_view name, NodeId node);
  Result<Translation> translate(Gva gva);
  // The translation with what a client caches of it (page versions, the
  // allocation's first page index, coherence).
  Result<proto::TranslateResponse> translate_for_cache(Gva gva);
  Result<AllocationInfo> migrate(Gva gva, Tier tier, NodeId to_node);

  // --- bytes and words through the daemon ---
  // Reads dst.size() bytes at `gva` (of the copy the daemon serves when
  // `from_replica`). Errors: internal on a short answer.
  Status read(Gva gva, std::span<std::byte> dst, bool from_replica);
  // Writes *data at `gva`; the string is handed back (its buffer is kept from
  // call to call by the caller).
  Status write(Gva gva, std::unique_ptr<std::string>& data);
  Result<uint64_t> fetch_add(Gva gva, uint64_t value);
  Result<uint64_t> compare_swap(Gva gva, uint64_t expected, uint64_t desired);
  // Makes [frame_offset, frame_offset + length) of `tier` on `node` durable.
  Status persist_frames(NodeId node, Tier tier, uint64_t frame_offset, uint64_t length);

  // --- the cluster ---
  // As the asked daemon sees it (`from`: the daemon to ask, 0: this one).
  Result<NodesReply> nodes(NodeId from = 0);
  // One node as the asked daemon describes it, with what only tiermem reads
  // (its adverts, host, socket); asked of the node itself when `ask_node`.
  // Errors: bad_gva when it is not in the cluster.
  Result<proto::NodeInfo> describe(NodeId node, bool ask_node = false);
  Result<NodeStat> stat(NodeId node);
  Result<std::vector<AllocationInfo>> list(NodeId node);
  Result<MappingDump> dump(NodeId node);
  Result<std::string> metrics(NodeId node);

  // --- daemon to daemon (peer-only requests; the stub's OnBehalf says for
  // whom) ---
  Result<proto::PeerChallengeResponse> peer_challenge(NodeId self, const std::string& nonce);
  // The peer's description, once it accepted `proof`.
  Result<proto::NodeInfo> peer_hello(const proto::NodeInfo& self, const std::string& proof);
  Result<proto::PingResponse> ping();
  Result<proto::NodeInfo> node_info();
  Result<LentFrames> reserve_frames(Tier tier, uint64_t pages);
  Status release_frames(std::span<const Extent> extents);
  // Breaks the page locks (page, locked word) a dead session held there;
  // returns how many were broken.
  Result<uint32_t> break_locks(std::span<const std::pair<uint64_t, uint64_t>> locks);
  // A copy of `of` (by its home), filled and ready when `ready`.
  Result<AllocationInfo> alloc_copy(const AllocationInfo& of, bool ready);
  Status replica_ready(Gva copy);
  Status write(Gva gva, std::span<const std::byte> data);

 private:
  // A request with the stub's OnBehalf on it.
  proto::Request start() const;
  Result<proto::Response> call(proto::Request& request, std::vector<UniqueFd>* fds = nullptr);
  Result<uint64_t> atomic(Gva gva, proto::AtomicOp op, uint64_t operand, uint64_t compare);

  CallFn m_call;
  OnBehalf m_on_behalf;
};

}  // namespace tiermem
