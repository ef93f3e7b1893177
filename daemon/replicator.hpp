// Replicated memory (H2): copies of an allocation on other nodes, kept by
// its home daemon.
//
// An allocation asked with `replicas: N` gets N copies, each an allocation
// of the same size and tenant on another reachable node (healthy ones
// first), made by the home and
// recorded in its durable metadata (the copies record what they copy). The
// home is the only writer:
//   - a write or atomic of a replicated allocation goes through the home
//     daemon, which serializes them per allocation, writes every copy
//     first (one-sided through the data plane, CopyWriter; else a peer
//     request each), then its own pages (the seqlock as
//     always); it is acknowledged once all of them hold it;
//   - a copy that does not take a write fails the write (unavailable, not
//     acknowledged: it may be on some copies), unless the copy's node is
//     UNREACHABLE and silent for `drop_after` (or its daemon is gone: its
//     connection refused) and this node sees a majority of the cluster:
//     then the copy is dropped and the write goes on without it;
//   - in the background, a dropped copy is replaced on another healthy node
//     (filled under the allocation's write lock, listed, then marked ready:
//     a ready copy is always one its home lists), and a
//     copy whose home no longer lists it is freed by its own node.
// A read goes to the home; when the home cannot be reached a client asks
// for a copy (ReadRequest.from_replica). A copy serves only when it is
// ready and its node sees at least half the cluster: a home that dropped
// it saw a majority without it, which then cannot be this side (on a
// partition the minority side serves nothing that could be stale).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <tiermem/status.h>
#include <tiermem/types.h>

#include "daemon/tenants.hpp"
#include "mapping/address_space.hpp"
#include "pages/seqlock_copy.hpp"
#include "proto/control_stub.hpp"

namespace tiermem {

class PeerManager;

struct ReplicationOptions {
  // A copy's node silent this long (no heartbeat answered; and this node
  // seeing a majority) before the home writes on without it; a node whose
  // daemon is gone (refused) at once.
  std::chrono::milliseconds drop_after{60000};
  // How often the home looks for copies to replace, and a copy's node for
  // copies nobody lists any more.
  std::chrono::milliseconds repair_interval{1000};
  // A copy younger than this is never taken for an orphan (its home may be
  // recording it still).
  std::chrono::milliseconds orphan_min_age{10000};
  std::chrono::milliseconds peer_timeout{5000};  // of one request to a copy's node
};

// Whether writes of `info` must reach copies: it was asked with replicas, or
// still has a copy that was not dropped.
bool replicated(const AllocationInfo& info);

class Replicator {
 public:
  // `read_home` reads bytes of an allocation homed here (pages on other
  // nodes included), to fill a new copy.
  // `write_direct` writes bytes into a copy through the data plane
  // (CopyWriter::write); where it fails, other than by a timeout, the write
  // goes to the copy's daemon as a request. Null: always as a request.
  using WriteCopy = std::function<Status(const ReplicaInfo&, uint64_t, const void*, size_t, const Identity&)>;
  Replicator(AddressSpace& space, PeerManager& peers, ReplicationOptions options,
             std::function<Status(Gva, void*, size_t)> read_home, WriteCopy write_direct = nullptr);
  ~Replicator();
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // Makes the `count` copies of `info`, just allocated here for `who`, on
  // other reachable nodes, and records them. Errors: unavailable (not enough
  // reachable nodes: says which are not), or the copies' nodes' errors; no
  // copy is left behind on error (the caller frees `info`). Copies the
  // background loop made first (it may see `info` before this runs) count.
  Status place(const AllocationInfo& info, uint32_t count, const Identity& who);

  // A write of `length` bytes at `gva` of a replicated allocation homed
  // here: to every copy, then here through `local`.
  Status write(Gva gva, const void* data, size_t length, const Identity& who,
               const std::function<Status()>& local);
  // An atomic: here through `local` (which returns the old value), then the
  // new word to every copy.
  Result<uint64_t> atomic(Gva gva, WordOp op, uint64_t operand, uint64_t compare, const Identity& who,
                          const std::function<Result<uint64_t>()>& local);
  // The allocation `info` was freed here: its copies are freed (now, or by
  // their nodes once they see it gone).
  void freed(const AllocationInfo& info, const Identity& who);

  // Whether this node may serve a read from its copy `copy`: it is ready,
  // its home has listed it since this daemon started, and this node sees at
  // least half of the cluster. Errors: unavailable, saying which.
  Status may_serve(const AllocationInfo& copy) const;

  // Stops the background work (also done by the destructor).
  void stop();

  // Bytes written into copies so far, as writes: through the data plane
  // (write_direct), and as requests to the copies' daemons.
  struct CopyWrites {
    uint64_t data_plane = 0;
    uint64_t through_daemon = 0;
  };
  CopyWrites copy_writes() const {
    return {m_direct_writes.load(std::memory_order_relaxed), m_daemon_writes.load(std::memory_order_relaxed)};
  }

 private:
  // Requests to the node of a copy, as its home, for `who`.
  ControlStub as_home(NodeId node, const Identity& who);
  struct Quorum {
    size_t members = 0;
    size_t reachable = 0;  // healthy or degraded, this node included
    std::string unreachable;  // "node 3 (unreachable 1200 ms)", for messages
  };
  Quorum quorum() const;
  // Whether the copy on `node` may be left behind: unreachable long enough,
  // and this node in a majority. *why says otherwise.
  bool may_drop(NodeId node, std::string* why) const;
  // Reachable nodes other than this one and those in `exclude`: healthy
  // ones first, then degraded ones.
  std::vector<NodeId> healthy_others(const std::vector<NodeId>& exclude) const;
  // The lock that serializes writes of the allocation at `base` (held by
  // the caller while it uses it, also past a concurrent free).
  std::shared_ptr<std::mutex> write_lock(uint64_t base);
  // Writes `length` bytes into the copy `copy` at `offset` from its base.
  Status write_copy(const ReplicaInfo& copy, uint64_t offset, const void* data, size_t length, const Identity& who);
  // Sends every live copy of the allocation at `base` the bytes; copies that
  // fail are dropped where allowed, else the write fails.
  Status write_copies(const AllocationInfo& info, uint64_t offset, const void* data, size_t length,
                      const Identity& who);
  Result<ReplicaInfo> make_copy(const AllocationInfo& info, NodeId node, bool ready, const Identity& who);
  void free_copy(const ReplicaInfo& copy, const Identity& who);
  void unplace(const AllocationInfo& info, const std::vector<ReplicaInfo>& copies, const Identity& who);
  // Tells the copy's node it is filled and listed: it may serve reads.
  Status mark_ready(const ReplicaInfo& copy, const Identity& who);
  // Records durably where the copies of the allocation at `base` are (its
  // policy, AddressSpace::change_policy).
  Status record_copies(Gva base, std::vector<ReplicaInfo> copies);
  // Fills a new copy of `info` on a healthy node (under its write lock).
  Status replace(const AllocationInfo& info);
  // Writes the lost pages of `info` (its memory did not survive a restart)
  // back from a copy.
  Status refill(const AllocationInfo& info);
  void forget_dropped(const AllocationInfo& info);
  void collect_orphan(const AllocationInfo& copy);
  void run();

  AddressSpace& m_space;
  PeerManager& m_peers;
  ReplicationOptions m_options;
  std::function<Status(Gva, void*, size_t)> m_read_home;
  WriteCopy m_write_direct;
  std::atomic<uint64_t> m_direct_writes{0}, m_daemon_writes{0};

  std::mutex m_locks_mutex;
  std::map<uint64_t, std::shared_ptr<std::mutex>> m_locks;  // per allocation base offset

  // Copies this node held when its daemon started (offset, generation), not yet
  // confirmed by their home: they serve nothing until the home says it
  // still lists them (collect_orphan), since it may have dropped them and
  // written on while this daemon was away (a daemon that comes back is a
  // new incarnation, re-admitted as such).
  mutable std::mutex m_unconfirmed_mutex;
  std::set<std::pair<uint64_t, uint32_t>> m_unconfirmed;

  std::mutex m_mutex;
  std::condition_variable m_wake;
  bool m_stop = false;
  std::thread m_thread;
};

}  // namespace tiermem
