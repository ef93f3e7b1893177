#include "daemon/replicator.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

#include <tiermem/status_macros.h>

#include "convert.hpp"
#include "daemon/peer_manager.hpp"

namespace tiermem {
namespace {

constexpr uint64_t k_fill_chunk = 1 << 20;

uint64_t now_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

Identity owner_of(const AllocationInfo& info) {
  Identity who;
  who.tenant = info.tenant;
  who.uid = info.owner_uid;
  return who;
}

bool live(const ReplicaInfo& r) { return r.state != ReplicaState::dropped; }

}  // namespace

bool replicated(const AllocationInfo& info) {
  return std::any_of(info.replicas.begin(), info.replicas.end(), live) || info.replicas_wanted > 0;
}

Replicator::Replicator(AddressSpace& space, PeerManager& peers, ReplicationOptions options,
                       std::function<Status(Gva, void*, size_t)> read_home, WriteCopy write_direct)
    : m_space(space),
      m_peers(peers),
      m_options(options),
      m_read_home(std::move(read_home)),
      m_write_direct(std::move(write_direct)) {
  for (const AllocationInfo& info : m_space.replicated()) {
    if (info.replica_of.node != 0) m_unconfirmed.insert({info.gva.offset, info.gva.generation});
  }
  if (!m_unconfirmed.empty()) {
    spdlog::info("{} copy(ies) held from before this start serve once their homes confirm them",
                 m_unconfirmed.size());
  }
  m_thread = std::thread([this] { run(); });
}

Replicator::~Replicator() { stop(); }

void Replicator::stop() {
  {
    std::lock_guard lock(m_mutex);
    m_stop = true;
  }
  m_wake.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

// --- who may do what -----------------------------------------------------------

Replicator::Quorum Replicator::quorum() const {
  Quorum q;
  q.members = 1;
  q.reachable = 1;  // this node
  const uint64_t now = now_ms();
  for (const PeerHealth& p : m_peers.health()) {
    ++q.members;
    if (p.health == NodeHealth::healthy || p.health == NodeHealth::degraded) {
      ++q.reachable;
    } else {
      if (!q.unreachable.empty()) q.unreachable += ", ";
      q.unreachable += "node " + std::to_string(p.node) + " (" + std::string(node_health_name(p.health)) + " " +
                       std::to_string(p.since_ms > 0 && now > p.since_ms ? now - p.since_ms : 0) + " ms)";
    }
  }
  return q;
}

bool Replicator::may_drop(NodeId node, std::string* why) const {
  for (const PeerHealth& p : m_peers.health()) {
    if (p.node != node) continue;
    if (p.health != NodeHealth::unreachable && p.health != NodeHealth::unknown) {
      *why = "node " + std::to_string(node) + " is " + std::string(node_health_name(p.health)) +
             ", not unreachable: its copy is not given up on";
      return false;
    }
    // Silent for drop_after (default twice unreachable_after): the copy's
    // node, cut off as well, has stopped serving one unreachable_after after
    // it last heard from the majority (its health goes by the clock, as
    // ours does), and the difference between the two sides' last answers
    // (a heartbeat interval, or a stall) is covered by the rest.
    // A node whose daemon is gone (the kernel refused the connection) serves
    // nothing, so that grace is not needed: its copies go at once. When its
    // daemon comes back it is a new incarnation, whose copies serve nothing
    // until their home confirms them (collect_orphan).
    if (!p.gone && p.silent_ms < static_cast<uint64_t>(m_options.drop_after.count())) {
      *why = "node " + std::to_string(node) + " has been silent for " + std::to_string(p.silent_ms) +
             " ms; its copy is dropped after " + std::to_string(m_options.drop_after.count()) + " ms";
      return false;
    }
    const Quorum q = quorum();
    if (2 * q.reachable <= q.members) {
      *why = "node " + std::to_string(m_space.node()) + " reaches only " + std::to_string(q.reachable) + " of " +
             std::to_string(q.members) + " nodes (" + q.unreachable +
             "): it may be on the minority side of a partition, where it must not write on alone";
      return false;
    }
    return true;
  }
  *why = "node " + std::to_string(node) + " is not in the cluster";
  return true;  // a node gone from the cluster file holds nothing we can wait for
}

Status Replicator::may_serve(const AllocationInfo& copy) const {
  if (!copy.replica_ready) {
    return Status(ErrorCode::unavailable, "the copy of " + copy.replica_of.to_string() + " on node " +
                                              std::to_string(m_space.node()) + " is still being filled");
  }
  {
    std::lock_guard lock(m_unconfirmed_mutex);
    if (m_unconfirmed.count({copy.gva.offset, copy.gva.generation}) != 0) {
      return Status(ErrorCode::unavailable,
                    "node " + std::to_string(m_space.node()) + " held its copy of " + copy.replica_of.to_string() +
                        " before its daemon restarted, and the home (node " +
                        std::to_string(copy.replica_of.node) +
                        ") has not confirmed it since: the home may have dropped it and written on");
    }
  }
  const Quorum q = quorum();
  if (2 * q.reachable < q.members) {
    return Status(ErrorCode::unavailable,
                  "node " + std::to_string(m_space.node()) + " holds a copy of " + copy.replica_of.to_string() +
                      " but reaches only " + std::to_string(q.reachable) + " of " + std::to_string(q.members) +
                      " nodes (" + q.unreachable +
                      "): on the minority side of a partition the home may have written on without it");
  }
  return Status();
}

std::vector<NodeId> Replicator::healthy_others(const std::vector<NodeId>& exclude) const {
  // Healthy nodes first, then degraded ones (a missed heartbeat or two on a
  // busy machine: they answered moments ago).
  std::vector<NodeId> out, degraded;
  for (const PeerHealth& p : m_peers.health()) {
    if (std::find(exclude.begin(), exclude.end(), p.node) != exclude.end()) continue;
    if (p.health == NodeHealth::healthy) out.push_back(p.node);
    if (p.health == NodeHealth::degraded) degraded.push_back(p.node);
  }
  out.insert(out.end(), degraded.begin(), degraded.end());
  return out;
}

std::shared_ptr<std::mutex> Replicator::write_lock(uint64_t base) {
  std::lock_guard lock(m_locks_mutex);
  auto& m = m_locks[base];
  if (!m) m = std::make_shared<std::mutex>();
  return m;
}

ControlStub Replicator::as_home(NodeId node, const Identity& who) {
  return m_peers.stub(node, who, /*by_home=*/true, m_options.peer_timeout);
}

// --- copies ------------------------------------------------------------------------

Result<ReplicaInfo> Replicator::make_copy(const AllocationInfo& info, NodeId node, bool ready, const Identity& who) {
  TIERMEM_ASSIGN_OR_RETURN(const AllocationInfo made, as_home(node, who).alloc_copy(info, ready));
  ReplicaInfo copy;
  copy.node = node;
  copy.gva = made.gva;
  copy.state = ReplicaState::in_sync;
  return copy;
}

void Replicator::free_copy(const ReplicaInfo& copy, const Identity& who) {
  const Status response = as_home(copy.node, who).free(copy.gva);
  if (!response.ok() && response.code() != ErrorCode::not_allocated && response.code() != ErrorCode::stale_generation) {
    spdlog::warn("the copy {} on node {} was not freed ({}); its node frees it once it sees it is no longer listed",
                 copy.gva.to_string(), copy.node, response.to_string());
  }
}

Status Replicator::mark_ready(const ReplicaInfo& copy, const Identity& who) {
  return as_home(copy.node, who).replica_ready(copy.gva);
}

Status Replicator::place(const AllocationInfo& info, uint32_t count, const Identity& who) {
  // Under the allocation's write lock, and counting the copies it has: the
  // allocation is in the space before its copies are placed, so the
  // background loop may have seen it short of copies and made some already
  // (a copy made there and then written over here would stay ready but
  // unlisted: it would serve reads of bytes no write reaches).
  const auto mutex = write_lock(info.gva.offset);
  std::lock_guard serialize(*mutex);
  TIERMEM_ASSIGN_OR_RETURN(auto t, m_space.translate(info.gva));
  std::vector<ReplicaInfo> copies;
  std::vector<NodeId> holding;
  for (const ReplicaInfo& c : t.allocation.replicas) {
    if (!live(c)) continue;
    copies.push_back(c);
    holding.push_back(c.node);
  }
  const size_t had = copies.size();
  std::vector<NodeId> candidates = healthy_others(holding);
  if (had + candidates.size() < count) {
    const Quorum q = quorum();
    Status s(ErrorCode::unavailable, std::to_string(count) + " copies of a new allocation need as many healthy "
                                         "nodes besides node " + std::to_string(m_space.node()) + "; " +
                                         std::to_string(had + candidates.size()) + " are" +
                                         (q.unreachable.empty() ? std::string() : " (" + q.unreachable + ")"));
    unplace(info, copies, who);
    return s;
  }
  // Spread allocations over the nodes: start at one chosen by the address.
  if (!candidates.empty()) {
    std::rotate(candidates.begin(),
                candidates.begin() + (info.gva.offset / m_space.page_size()) % candidates.size(), candidates.end());
  }
  std::string tried;
  for (NodeId node : candidates) {
    if (copies.size() >= count) break;
    // Not ready until listed: a copy its home never listed serves nothing.
    auto copy = make_copy(info, node, false, who);
    if (copy.ok()) {
      copies.push_back(*copy);
    } else {
      tried += "; node " + std::to_string(node) + ": " + copy.status().message();
    }
  }
  Status s = copies.size() >= count
                 ? record_copies(info.gva, copies)
                 : Status(ErrorCode::unavailable, "only " + std::to_string(copies.size()) + " of " +
                                                      std::to_string(count) + " copies could be made" + tried);
  for (size_t i = had; s.ok() && i < copies.size(); ++i) s = mark_ready(copies[i], who);
  if (!s.ok()) unplace(info, copies, who);
  return s;
}

Status Replicator::record_copies(Gva base, std::vector<ReplicaInfo> copies) {
  return m_space.change_policy(base, [&](AllocationPolicy& p) { p.replicas = std::move(copies); });
}

void Replicator::unplace(const AllocationInfo& info, const std::vector<ReplicaInfo>& copies, const Identity& who) {
  // The allocation is freed next: none of its copies is left behind.
  (void)record_copies(info.gva, {});
  for (const ReplicaInfo& c : copies) free_copy(c, who);
}

void Replicator::freed(const AllocationInfo& info, const Identity& who) {
  for (const ReplicaInfo& c : info.replicas) free_copy(c, who);
  std::lock_guard lock(m_locks_mutex);
  m_locks.erase(info.gva.offset);
}

// --- writes ------------------------------------------------------------------------

Status Replicator::write_copy(const ReplicaInfo& copy, uint64_t offset, const void* data, size_t length,
                              const Identity& who) {
  if (m_write_direct) {
    // Through the data plane; a timeout there would be waited for again
    // through the copy's daemon: it is the answer.
    Status s = m_write_direct(copy, offset, data, length, who);
    if (s.ok()) m_direct_writes.fetch_add(1, std::memory_order_relaxed);
    if (s.ok() || s.code() == ErrorCode::timeout || s.code() == ErrorCode::deadline_exceeded) return s;
    spdlog::debug("the copy {} on node {} written through its daemon: {}", copy.gva.to_string(), copy.node,
                  s.to_string());
  }
  m_daemon_writes.fetch_add(1, std::memory_order_relaxed);
  return as_home(copy.node, who).write(copy.gva.plus(offset), {static_cast<const std::byte*>(data), length});
}

Status Replicator::write_copies(const AllocationInfo& info, uint64_t offset, const void* data, size_t length,
                                const Identity& who) {
  std::vector<ReplicaInfo> copies = info.replicas;
  bool dropped = false;
  for (ReplicaInfo& c : copies) {
    if (!live(c)) continue;
    Status s = write_copy(c, offset, data, length, who);
    if (s.ok()) continue;
    std::string why;
    if (!may_drop(c.node, &why)) {
      return Status(ErrorCode::unavailable, "write to " + info.gva.plus(offset).to_string() +
                                                " not acknowledged: its copy on node " + std::to_string(c.node) +
                                                " did not take it (" + s.to_string() + "), and " + why +
                                                "; the bytes may be on some copies: retry");
    }
    spdlog::warn("dropping the copy {} of {} on node {}: {} ({}); writing on without it", c.gva.to_string(),
                 info.gva.to_string(), c.node, s.to_string(), "unreachable long enough, this node in a majority");
    c.state = ReplicaState::dropped;
    dropped = true;
  }
  if (dropped) {
    TIERMEM_RETURN_IF_ERROR(record_copies(info.gva, copies));
    m_wake.notify_all();  // replace it
  }
  return Status();
}

Status Replicator::write(Gva gva, const void* data, size_t length, const Identity& who,
                         const std::function<Status()>& local) {
  TIERMEM_ASSIGN_OR_RETURN(auto t, m_space.translate(gva));
  const auto mutex = write_lock(t.allocation.gva.offset);
  std::lock_guard serialize(*mutex);
  // Read again under the lock: the set may have changed meanwhile.
  TIERMEM_ASSIGN_OR_RETURN(t, m_space.translate(gva));
  const uint64_t offset = gva.offset - t.allocation.gva.offset;
  if (offset > t.allocation.size || length > t.allocation.size - offset) return local();  // its error
  TIERMEM_RETURN_IF_ERROR(write_copies(t.allocation, offset, data, length, who));
  return local();
}

Result<uint64_t> Replicator::atomic(Gva gva, WordOp op, uint64_t operand, uint64_t compare, const Identity& who,
                                    const std::function<Result<uint64_t>()>& local) {
  TIERMEM_ASSIGN_OR_RETURN(auto t, m_space.translate(gva));
  const auto mutex = write_lock(t.allocation.gva.offset);
  std::lock_guard serialize(*mutex);
  TIERMEM_ASSIGN_OR_RETURN(t, m_space.translate(gva));
  TIERMEM_ASSIGN_OR_RETURN(const uint64_t old, local());
  uint64_t now = old;
  if (op == WordOp::fetch_add) now = old + operand;
  if (op == WordOp::compare_swap && old == compare) now = operand;
  if (now == old) return old;
  const uint64_t offset = gva.offset - t.allocation.gva.offset;
  Status s = write_copies(t.allocation, offset, &now, sizeof now, who);
  if (!s.ok()) return s.with_context("the atomic was applied on the home node only (its outcome is unknown)");
  return old;
}

// --- background: replacing dropped copies, freeing orphans ------------------------

Status Replicator::replace(const AllocationInfo& seen) {
  const auto mutex = write_lock(seen.gva.offset);
  std::lock_guard serialize(*mutex);
  TIERMEM_ASSIGN_OR_RETURN(auto t, m_space.translate(seen.gva));
  const AllocationInfo& info = t.allocation;
  std::vector<NodeId> holding{m_space.node()};
  size_t alive = 0;
  for (const ReplicaInfo& c : info.replicas) {
    if (live(c)) {
      holding.push_back(c.node);
      ++alive;
    }
  }
  if (alive >= info.replicas_wanted) return Status();
  const std::vector<NodeId> candidates = healthy_others(holding);
  if (candidates.empty()) return Status(ErrorCode::unavailable, "no healthy node without a copy");
  const Identity who = owner_of(info);
  TIERMEM_ASSIGN_OR_RETURN(ReplicaInfo copy, make_copy(info, candidates.front(), false, who));
  // Writes wait on the lock held here: the copy gets the bytes as they are.
  std::vector<std::byte> chunk(std::min<uint64_t>(k_fill_chunk, info.size));
  Status s;
  for (uint64_t offset = 0; s.ok() && offset < info.size; offset += chunk.size()) {
    const size_t n = std::min<uint64_t>(chunk.size(), info.size - offset);
    s = m_read_home(info.gva.plus(offset), chunk.data(), n);
    if (s.ok()) s = write_copy(copy, offset, chunk.data(), n, who);
  }
  // Listed before it is ready: a copy that is ready is always listed (one
  // left unlisted by a crash here serves nothing, and is freed as an orphan).
  std::vector<ReplicaInfo> copies = info.replicas;
  copies.push_back(copy);
  if (s.ok()) s = record_copies(info.gva, copies);
  if (s.ok()) s = mark_ready(copy, who);
  if (!s.ok()) {
    (void)record_copies(info.gva, info.replicas);
    free_copy(copy, who);
    return s;
  }
  spdlog::info("made a new copy of {} on node {} ({}), {} bytes", info.gva.to_string(), copy.node,
               copy.gva.to_string(), info.size);
  return Status();
}

Status Replicator::refill(const AllocationInfo& seen) {
  const auto mutex = write_lock(seen.gva.offset);
  std::lock_guard serialize(*mutex);
  TIERMEM_ASSIGN_OR_RETURN(auto t, m_space.translate(seen.gva));
  const AllocationInfo& info = t.allocation;
  if (info.lost_pages == 0) return Status();
  const Identity who = owner_of(info);
  std::string tried;
  for (const ReplicaInfo& c : info.replicas) {
    if (!live(c)) continue;
    // No write was acknowledged while the home was away (it is the only
    // writer): the copy holds every acknowledged byte.
    std::vector<std::byte> bytes(info.size);
    Status s;
    for (uint64_t offset = 0; s.ok() && offset < info.size; offset += k_fill_chunk) {
      const size_t n = std::min<uint64_t>(k_fill_chunk, info.size - offset);
      s = as_home(c.node, who).read(c.gva.plus(offset), {bytes.data() + offset, n}, false);
    }
    if (s.ok()) {
      TIERMEM_ASSIGN_OR_RETURN(const uint64_t pages, m_space.refill_lost(info.gva, bytes));
      spdlog::info("refilled {} lost page(s) of {} from its copy on node {}", pages, info.gva.to_string(), c.node);
      return Status();
    }
    tried += "; node " + std::to_string(c.node) + ": " + s.to_string();
  }
  return Status(ErrorCode::unavailable, "no copy could refill the lost pages" + tried);
}

void Replicator::forget_dropped(const AllocationInfo& seen) {
  // A dropped copy whose node answers again is forgotten: that node then
  // finds it listed nowhere and frees it.
  if (std::all_of(seen.replicas.begin(), seen.replicas.end(), live)) return;
  const auto mutex = write_lock(seen.gva.offset);
  std::lock_guard serialize(*mutex);
  auto t = m_space.translate(seen.gva);
  if (!t.ok()) return;
  const AllocationInfo& info = t->allocation;
  std::vector<ReplicaInfo> kept;
  bool changed = false;
  const std::vector<NodeId> healthy = healthy_others({});
  for (const ReplicaInfo& c : info.replicas) {
    if (!live(c) && std::find(healthy.begin(), healthy.end(), c.node) != healthy.end()) {
      changed = true;
      continue;
    }
    kept.push_back(c);
  }
  if (changed) (void)record_copies(info.gva, kept);
}

void Replicator::collect_orphan(const AllocationInfo& copy) {
  bool unconfirmed = false;
  {
    std::lock_guard lock(m_unconfirmed_mutex);
    unconfirmed = m_unconfirmed.count({copy.gva.offset, copy.gva.generation}) != 0;
  }
  const bool old_enough = copy.created_unix_ms + static_cast<uint64_t>(m_options.orphan_min_age.count()) <= now_ms();
  if (!old_enough && !unconfirmed) return;
  ControlStub home_node = m_peers.stub(copy.replica_of.node, owner_of(copy), false, m_options.peer_timeout);
  auto response = home_node.translate(copy.replica_of);
  bool orphan = false;
  if (!response.ok()) {
    const ErrorCode code = response.status().code();
    orphan = code == ErrorCode::not_allocated || code == ErrorCode::stale_generation;
  } else {
    const AllocationInfo& home = response->allocation;
    orphan = std::none_of(home.replicas.begin(), home.replicas.end(), [&](const ReplicaInfo& c) {
      return live(c) && c.node == m_space.node() && c.gva.offset == copy.gva.offset &&
             c.gva.generation == copy.gva.generation;
    });
  }
  if (!orphan) {
    if (unconfirmed && response.ok()) {
      std::lock_guard lock(m_unconfirmed_mutex);
      m_unconfirmed.erase({copy.gva.offset, copy.gva.generation});
      spdlog::debug("{}, a copy of {} held from before this start, is confirmed by its home", copy.gva.to_string(),
                    copy.replica_of.to_string());
    }
    return;  // or its home cannot say now: asked again next time
  }
  if (!old_enough) return;  // its home may be recording it still
  spdlog::info("freeing {}, a copy of {} that its home no longer lists", copy.gva.to_string(),
               copy.replica_of.to_string());
  Status s = m_space.free(copy.gva);
  if (!s.ok()) spdlog::warn("freeing the orphaned copy {}: {}", copy.gva.to_string(), s.to_string());
  std::lock_guard lock(m_unconfirmed_mutex);
  m_unconfirmed.erase({copy.gva.offset, copy.gva.generation});
}

void Replicator::run() {
  std::unique_lock lock(m_mutex);
  while (!m_stop) {
    m_wake.wait_for(lock, m_options.repair_interval);
    if (m_stop) break;
    lock.unlock();
    for (const AllocationInfo& info : m_space.replicated()) {
      if (info.replica_of.node != 0) {
        collect_orphan(info);
        continue;
      }
      if (info.lost_pages > 0) {
        Status s = refill(info);
        if (!s.ok()) spdlog::debug("{} stays lost for now: {}", info.gva.to_string(), s.to_string());
      }
      forget_dropped(info);
      const size_t alive = std::count_if(info.replicas.begin(), info.replicas.end(), live);
      if (alive < info.replicas_wanted) {
        Status s = replace(info);
        if (!s.ok()) spdlog::debug("no new copy of {} yet: {}", info.gva.to_string(), s.to_string());
      }
    }
    lock.lock();
  }
}

}  // namespace tiermem
