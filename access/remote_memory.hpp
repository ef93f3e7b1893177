// One-sided access to another node's version words and frames over a
// Transport: the remote side of pages/seqlock_copy.hpp. Used by clients
// (reading and writing memory on other nodes) and by daemons (migration).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/types.h>

#include "access/node_advert.hpp"
#include "pages/seqlock_copy.hpp"
#include "transport/transport.hpp"

namespace tiermem {

struct RemoteRegion {
  uint64_t first = 0;
  uint64_t base = 0;
  uint64_t length = 0;
  bool persistent = false;
  uint64_t memory_generation = 0;  // of its domain's memory
  std::shared_ptr<RemoteKey> key;  // null: not reachable one-sided (or not given to us)
};

// How a piece of another node's memory is reached with the keys held.
enum class Reach : uint8_t {
  one_sided,  // an RDMA key: the NIC checks and runs each operation
  message,    // the checked message path (TCP): the home's progress thread runs it
  stale,      // no key, but the node may have given this tenant one since (a newer domain)
  none,       // never reachable with a key: through the daemon (VRAM: its region is
              // registered for no tenant, so no client holds its key)
};


// Everything needed to reach one node: an endpoint and its unpacked keys.
// Bound to one incarnation of the node's daemon (the endpoint is).
struct RemoteNode {
  NodeId node = 0;
  uint64_t incarnation = 0;
  uint64_t pages_per_domain = 0;
  std::shared_ptr<Endpoint> endpoint;
  std::map<uint32_t, RemoteRegion> versions;            // by domain
  std::array<std::map<uint32_t, RemoteRegion>, 4> tiers;  // [tier][domain]
  std::array<uint64_t, 4> domain_span{};                // frame offsets per domain, by tier
  uint64_t regions_version = 0;  // of the description the keys came from

  // The region holding pages [page, page + count) or frames [offset,
  // offset + length), or nullptr.
  const RemoteRegion* version_region(uint64_t page, uint64_t count) const;
  const RemoteRegion* frame_region(Tier tier, uint64_t offset, uint64_t length) const;
  // How version words [page, +count) and frames [offset, +length) of `tier`
  // are reached through `transport` with the keys held (the route a client
  // decides once per translation).
  Reach reach_words(const Transport& transport, uint64_t page, uint64_t count) const;
  Reach reach_frames(const Transport& transport, Tier tier, uint64_t offset, uint64_t length) const;
};

// Connects to a node's transport address and unpacks its region keys.
// Errors: transport_error.
Result<std::shared_ptr<RemoteNode>> connect_remote_node(Transport& transport, const NodeAdvert& advert);
// A copy of `node`, on the same endpoint, with the keys of `regions` (a
// domain given to a tenant since) unpacked and added. The copy's
// regions_version is the caller's to set.
Result<std::shared_ptr<RemoteNode>> with_regions(Transport& transport, const RemoteNode& node,
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
  // One batch of CASes: one message, or one-sided operations in flight together.
  bool batches_locks() const override { return true; }
  Status compare_swap_all(uint64_t first, size_t count, const uint64_t* expected, uint64_t* old) override;
  // Words, data and words again in one batch, ordered by fences, when every
  // segment is on this same node: one round trip instead of three (on the
  // message path one message, which the home runs in that order).
  Status snapshot(uint64_t first, size_t count, std::span<const CopySegment> segments, uint64_t* before,
                  uint64_t* after) override;
  // On the message path, when every segment is on this same node and the
  // whole copy fits in one message: one message of conditional adds that lock
  // the pages (each only while unlocked, not wanted exclusively and of its
  // cached epoch: a failing one stops the message and releases those before
  // it), the puts or gets, a persist on a persistent tier, and the releases.
  // One round trip, whatever the number of pages. not_supported elsewhere
  // (one-sided keys, segments on other nodes).
  Status locked_copy(const PageRange& range, std::span<const CopySegment> segments, bool to_memory,
                     uint64_t* blocked, uint64_t* seen) override;
  // Likewise: take the page, the atomic (and its persist), the release, in
  // one message (coherent: the page's epoch checked, then the atomic).
  Status locked_atomic(uint64_t page, uint64_t cached, FrameData& data, uint64_t frame_offset, WordOp op,
                       uint64_t operand, uint64_t compare, uint64_t* old, uint64_t* seen, bool coherent) override;

  // The same three as one group each of `batch` (Transport::end_group),
  // issued and not waited for: many operations to this node share one
  // message (a client Batch's), and each judges its own outcome once the
  // batch completed. Each reserves room for the whole group in one message;
  // not_supported where the one-request forms above are (one-sided keys,
  // segments on other nodes, too large for a message). *stopped: 0 when
  // the group ran whole.
  // - snapshot: the words into before[0, count), the segments, the words
  //   into after[0, count) (a consistent read when they are equal, even and
  //   of the cached epochs).
  Status issue_snapshot(TransportBatch& batch, uint64_t first, size_t count, std::span<const CopySegment> segments,
                        uint64_t* before, uint64_t* after);
  // - locked copy: olds[i] and releases[i] (range.count words each) receive
  //   the page words seen; stopped: a page could not be taken (the one
  //   whose olds[i] does not match its cached epoch, or is locked), nothing
  //   was copied and nothing stays locked.
  Status issue_locked_copy(TransportBatch& batch, const PageRange& range, std::span<const CopySegment> segments,
                           bool to_memory, uint64_t* olds, uint64_t* releases, uint64_t* stopped);
  // - locked atomic: *taken the page word seen, *old the data word before
  //   (coherent: the page checked, not taken; *released untouched).
  Status issue_locked_atomic(TransportBatch& batch, uint64_t page, uint64_t cached, FrameData& data, uint64_t frame_offset,
                             WordOp op, uint64_t operand, uint64_t compare, uint64_t* taken, uint64_t* old,
                             uint64_t* released, uint64_t* stopped, bool coherent = false);
  const RemoteNode& node() const { return *m_node; }

 private:
  // The segments' frames when all are on this node's endpoint, else nullptr.
  bool same_node(std::span<const CopySegment> segments, std::vector<class RemoteFrameData*>* frames) const;
  Result<const RemoteRegion*> region(uint64_t first, size_t count) const;
  static uint64_t address(const RemoteRegion& r, uint64_t page);
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
  Status issue_read(TransportBatch& batch, uint64_t frame_offset, void* dst, size_t length);
  // Issues the puts of a write into `batch`, then, on the message path and a
  // persistent tier, a persist of them (wait() then returns once they are
  // durable). Elsewhere the caller flushes and persists after waiting.
  Status issue_write(TransportBatch& batch, uint64_t frame_offset, const void* src, size_t length);
  // Issues the atomic (and on the message path and a persistent tier, its
  // persist) into `batch`.
  Status issue_atomic(TransportBatch& batch, uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare,
                      uint64_t* old);
  // Whether [frame_offset, +length) travels as messages (not one-sided).
  bool messages(uint64_t frame_offset, size_t length) const;
  const RemoteNode& node() const { return *m_node; }

 private:
  Result<const RemoteRegion*> region(uint64_t frame_offset, size_t length) const;
  Transport& m_transport;
  std::shared_ptr<RemoteNode> m_node;
  Tier m_tier;
  std::chrono::milliseconds m_timeout;
  Persist m_persist;
};

// Pieces a large one-sided get or put is split into, so several are in
// flight. On the message path a whole message's worth goes as one.
inline constexpr size_t k_remote_chunk = 256 << 10;

}  // namespace tiermem
