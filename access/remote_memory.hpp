// One-sided access to another node's version words and frames over a
// Transport: the remote side of mapping/seqlock_copy.hpp. Used by clients
// (reading and writing memory on other nodes) and by daemons (migration).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/types.h>

#include "mapping/seqlock_copy.hpp"
#include "transport/transport.hpp"

namespace tiermem {

// A region as a node advertises it (NodeInfo.regions on the wire).
struct RegionAdvert {
  bool versions = false;  // the version-word array; else a tier region
  Tier tier = Tier::automatic;
  uint64_t base = 0;
  uint64_t length = 0;
  std::string packed_key;
  bool persistent = false;
};

struct RemoteRegion {
  uint64_t base = 0;
  uint64_t length = 0;
  bool persistent = false;
  std::shared_ptr<RemoteKey> key;  // null: not reachable one-sided
};

// Everything needed to reach one node: an endpoint and its unpacked keys.
struct RemoteNode {
  NodeId node = 0;
  uint64_t incarnation = 0;
  std::shared_ptr<Endpoint> endpoint;
  RemoteRegion versions;
  std::array<RemoteRegion, 4> tiers;  // by Tier
};

// Connects to a node's transport address and unpacks its region keys.
// Errors: transport_error.
Result<std::shared_ptr<RemoteNode>> connect_remote_node(Transport& transport, NodeId node,
                                                        uint64_t incarnation,
                                                        const std::string& address,
                                                        const std::vector<RegionAdvert>& regions);

// The version words of a remote home node.
class RemoteVersionWords final : public VersionWords {
 public:
  RemoteVersionWords(Transport& transport, std::shared_ptr<RemoteNode> node,
                     std::chrono::milliseconds timeout)
      : m_transport(transport), m_node(std::move(node)), m_timeout(timeout) {}
  Status load(uint64_t first, size_t count, uint64_t* out) override;
  Status compare_swap(uint64_t page, uint64_t expected, uint64_t desired, uint64_t* old) override;
  Status release(std::span<const uint64_t> pages) override;
  // Words, data and words again in one batch, ordered by fences, when every
  // segment is on this same node: one round trip instead of three.
  Status snapshot(uint64_t first, size_t count, std::span<const CopySegment> segments, uint64_t* before,
                  uint64_t* after) override;

 private:
  Status check(uint64_t first, size_t count) const;
  Transport& m_transport;
  std::shared_ptr<RemoteNode> m_node;
  std::chrono::milliseconds m_timeout;
};

// The frames of one tier of a remote node. Writes are flushed to remote
// completion; on a persistent tier `persist` is then asked to make them
// durable (one-sided writes alone do not reach persistence on every fabric).
class RemoteFrameData final : public FrameData {
 public:
  using Persist = std::function<Status(Tier tier, uint64_t frame_offset, uint64_t length)>;
  RemoteFrameData(Transport& transport, std::shared_ptr<RemoteNode> node, Tier tier,
                  std::chrono::milliseconds timeout, Persist persist)
      : m_transport(transport), m_node(std::move(node)), m_tier(tier), m_timeout(timeout),
        m_persist(std::move(persist)) {}
  Status read(uint64_t frame_offset, void* dst, size_t length) override;
  Status write(uint64_t frame_offset, const void* src, size_t length) override;
  Status atomic(uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare,
                uint64_t* old) override;
  bool persistent() const override;
  // Issues the gets of a read into `batch` without waiting.
  Status issue_read(Batch& batch, uint64_t frame_offset, void* dst, size_t length);
  const RemoteNode& node() const { return *m_node; }

 private:
  Status check(uint64_t frame_offset, size_t length) const;
  Transport& m_transport;
  std::shared_ptr<RemoteNode> m_node;
  Tier m_tier;
  std::chrono::milliseconds m_timeout;
  Persist m_persist;
};

// Pieces a large get or put is split into, so several are in flight (over TCP
// UCX emulates gets with messages; one large one would be one long round trip).
inline constexpr size_t k_remote_chunk = 256 << 10;

}  // namespace tiermem
