// libtiermem: a trainer's view of tiermem memory, on this node and on every
// other node of the cluster.
//
//   auto client = tiermem::Client::connect({});
//   auto a = (*client)->alloc(64 << 20, {.tier = tiermem::Tier::dram});
//   (*client)->write(a->gva, buf.data(), buf.size());
//
// Every call returns a Status or Result; nothing throws. A Client is safe to use
// from several threads at once. Data written with write() and read with read()
// is copied straight into the tier's memory: with memcpy when it is on this
// node (DRAM, PMEM), one-sided through the data plane (UCX) when it is on
// another node, and through a daemon only where neither reaches (VRAM). Every
// path follows the page versions (seqlock), so a read never returns bytes torn
// by a concurrent write, migration or free, and an acknowledged write is never
// lost to a migration.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <tiermem/export.h>
#include <tiermem/gva.h>
#include <tiermem/status.h>
#include <tiermem/types.h>

namespace tiermem {

// What each QoS class may take (QosClass in types.h).
struct QosOptions {
  std::chrono::milliseconds strict{50};
  std::chrono::milliseconds best_effort{200};
  uint32_t best_effort_retries = 2;  // tries after the first, within the deadline
  std::chrono::milliseconds graceful_degrade{800};
};

struct ClientOptions {
  // Daemon control socket. Empty: $TIERMEM_SOCKET, else
  // /run/tiermem/tiermemd.sock.
  std::string socket_path;
  // Shown in the daemon's log.
  std::string client_name = "libtiermem";
  // Map DRAM/PMEM tiers into this process to copy directly (zero-copy path).
  // When false every read and write goes through the daemon.
  bool direct_access = true;
  // Memory homed on another node whose daemon runs on this host (several
  // daemons per host: one per GPU or NUMA node) is mapped from the files
  // that daemon hands this client after checking who it is, and copied
  // directly, as this node's is. False (or $TIERMEM_MAP_SAME_HOST=0): such
  // memory is reached through the data plane like any other node's.
  bool map_same_host = true;
  // How long one request to the daemon may take before the call fails with
  // timeout (and the connection is closed); 0: wait as long as it takes.
  // It also bounds each one-sided operation on another node's memory (to
  // at most 10 s; 0: 10 s).
  std::chrono::milliseconds timeout{30000};
  // How long a read or write waits for a page another writer holds locked
  // before it fails with busy naming the page.
  std::chrono::milliseconds lock_timeout{10000};
  // When the daemon goes away (a crash, a restart, an upgrade), how long a
  // call keeps trying to connect to the one that comes back on the socket
  // before it fails with unavailable; 0: it fails at once. After the
  // reconnect every cached translation is checked again. A call in flight
  // when the daemon went is repeated when doing it twice is harmless
  // (reads, writes of the same bytes, lookups, stat); an alloc, free,
  // migrate or atomic instead fails with unavailable, since it may or may
  // not have happened: look before repeating it. While the client holds
  // Mappings it connects again at once, without waiting for a call, and
  // pins them again on the new connection (see Mapping).
  std::chrono::milliseconds reconnect_timeout{30000};
  // Deadlines of the QoS classes (H3, QosClass in types.h).
  QosOptions qos;
  // How often the client checks in with its daemon (the check-in edge of
  // the health graph, CheckInEdge), from its watcher thread. Negative:
  // $TIERMEM_CHECKIN_INTERVAL_MS, else 30 s (the seed's: two missed, 60 s,
  // make it degraded); 0: no check-ins.
  std::chrono::milliseconds checkin_interval{-1};
  // Told of every Mapping revoked (see Mapping::status): its allocation and
  // why. Called on a thread of the library, with no lock of the Client
  // held (it may call the Client); it must not block for long.
  std::function<void(Gva, const Status&)> on_mapping_revoked;
  // Told when memory of another node that this client would reach through
  // the data plane goes through its daemon instead because the node's plane
  // could not be used: it did not answer (a flood of unproven connections
  // at its listener, say), or it is not one this process may attach to. The
  // node and why; the plane is tried again a second later, and told again
  // if it fails again. Unset: one line on stderr the first time per node.
  // Called as on_mapping_revoked is.
  std::function<void(NodeId, const Status&)> on_data_plane_fallback;
};

// How a client's reads, writes and atomics travelled (C3), one count per
// call that succeeded. A test or a trainer can check that memory it was
// promised zero-copy access to really was reached directly.
struct AccessCounters {
  uint64_t direct_local = 0;    // memcpy / CPU atomics / copy engines on this node's tiers, mapped here
  // Another node's memory reached directly: mapped from the files its daemon
  // handed over (a daemon of this host), or one-sided with RDMA keys.
  uint64_t direct_remote = 0;
  uint64_t through_daemon = 0;  // carried by the local daemon (VRAM atomics, or direct access off)
  // Another node's memory through the data plane's checked message path
  // (TCP: the home's progress thread checks and runs each operation).
  uint64_t message = 0;
  // Data-plane requests this client sent to other nodes: one per message
  // operation, and one per node for the operations of a Batch between two
  // fences that go by messages.
  uint64_t requests_sent = 0;
  // Reads and writes of CUDA device buffers that went through host memory
  // (no direct path from the buffer's GPU to where the bytes live).
  uint64_t staged_device = 0;
  // Times a node's data plane could not be used and its memory went through
  // the daemon instead (ClientOptions::on_data_plane_fallback says why).
  uint64_t plane_fallbacks = 0;
};

namespace detail {
class ClientCore;
class MappedSet;
struct ClientLink;
struct BatchItem;
struct BatchState;
}

// Memory of one allocation mapped into this process. The bytes are the tier's
// memory itself: writes through the span are visible to every other mapping at
// once, with no versioning (the allocation is pinned while mapped, so it is
// never migrated underneath). For PMEM call persist() to make writes durable.
// Unmaps on destruction. Movable, not copyable; keeps its Client's connection
// alive.
//
// A mapping never outlives the allocation it shows. While this process
// lives its daemon keeps the allocation pinned, also across a broken
// connection. When the daemon restarts (or dies), the library pins every
// mapping again on the new daemon as soon as it is back; a mapping whose
// allocation did not come back (a session allocation, one freed or moved
// meanwhile, one whose memory was lost), or that cannot be pinned again
// (the daemon does not come back within reconnect_timeout, or the client
// does not reconnect), is revoked: its memory is replaced with inaccessible
// memory, so the next access through it faults (SIGSEGV) instead of reading
// or writing whatever the frames hold now, status() says why, persist()
// fails with that error, and ClientOptions::on_mapping_revoked is told.
// Mappings of session allocations are revoked as soon as the library sees
// that their daemon died. A mapping of VRAM keeps the device memory it
// imported (nobody else is given it) and is only marked.
class TIERMEM_EXPORT Mapping {
 public:
  Mapping() = default;
  Mapping(Mapping&&) noexcept;
  Mapping& operator=(Mapping&&) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  std::span<std::byte> bytes() const { return {m_data, m_size}; }
  std::byte* data() const { return m_data; }
  size_t size() const { return m_size; }
  const AllocationInfo& allocation() const { return m_allocation; }
  // The CUDA device (this process's ordinal) whose memory data() is, for a
  // mapping of VRAM: a device pointer, for kernels and cudaMemcpy, never to
  // be dereferenced on the host. -1 for host memory (DRAM, PMEM).
  int device() const { return m_device; }

  // Flushes [offset, offset+length) to persistence (PMEM); no-op on DRAM.
  // Errors: out_of_range, io_error, and why the mapping was revoked.
  Status persist(size_t offset, size_t length) const;
  // Ok while the mapping is usable; once revoked, why (the allocation's
  // error on the new daemon, e.g. not_allocated for a session allocation
  // that ended with its daemon, or unavailable when it could not be pinned
  // again).
  Status status() const;

 private:
  friend class Client;
  void release();

  std::shared_ptr<detail::MappedSet> m_set;
  uint64_t m_id = 0;
  AllocationInfo m_allocation;
  std::byte* m_data = nullptr;
  size_t m_size = 0;
  bool m_persistent = false;
  int m_device = -1;
};

class TIERMEM_EXPORT Client {
 public:
  // Connects to the daemon and exchanges protocol versions. Errors:
  // connection_failed (no daemon on the socket), protocol_mismatch.
  static Result<std::unique_ptr<Client>> connect(const ClientOptions& options);

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  NodeId node() const;        // the local daemon's node id
  uint64_t page_size() const;

  // Allocates `size` bytes (rounded up to pages). Errors: invalid_argument
  // (size 0), already_exists (name taken), tier_exhausted, tier_unavailable.
  Result<AllocationInfo> alloc(uint64_t size, const AllocOptions& options = {});
  // Frees the allocation that starts at `gva`. Errors: not_allocated (unknown
  // or already freed; says when), stale_generation, failed_precondition
  // (still mapped by someone).
  Status free(Gva gva);
  // Finds a named allocation on `node` (0: the local one).
  Result<AllocationInfo> lookup(std::string_view name, NodeId node = 0);
  Result<Translation> translate(Gva gva);

  // Copies into / out of the allocation holding `gva`. The range must lie
  // inside one allocation (out_of_range otherwise). `data` may be host memory
  // (pageable or pinned) or CUDA device memory: the library asks the driver
  // the process loaded and never reads device memory on the host; VRAM of
  // this node is copied by the copy engines, after the work queued on the
  // legacy default stream (as cudaMemcpy). invalid_argument for a pointer
  // that is neither (a freed device pointer).
  Status write(Gva gva, const void* data, size_t length);
  Status read(Gva gva, void* data, size_t length);
  // The same in QoS class `qos` instead of the allocation's default (H3).
  // Errors: also deadline_exceeded (which class, which deadline, the home
  // node's state, what was tried).
  Status write(Gva gva, const void* data, size_t length, QosClass qos);
  Status read(Gva gva, void* data, size_t length, QosClass qos);
  Status write(Gva gva, std::span<const std::byte> data) {
    return write(gva, data.data(), data.size());
  }
  Status read(Gva gva, std::span<std::byte> out) { return read(gva, out.data(), out.size()); }

  // 64-bit atomics on the 8-byte aligned word at `gva`; return the value
  // before. On a coherent allocation (AllocOptions::coherent) they are one
  // one-sided operation; elsewhere the page is locked around them so that a
  // concurrent migration cannot lose them. Errors: invalid_argument
  // (unaligned), out_of_range, as read().
  Result<uint64_t> fetch_add(Gva gva, uint64_t value);
  // Stores `desired` when the word equals `expected`; returns the old value
  // (== expected on success).
  Result<uint64_t> compare_swap(Gva gva, uint64_t expected, uint64_t desired);
  // In QoS class `qos`; an atomic is never tried twice (best_effort runs it
  // once within its deadline), since it may have been applied.
  Result<uint64_t> fetch_add(Gva gva, uint64_t value, QosClass qos);
  Result<uint64_t> compare_swap(Gva gva, uint64_t expected, uint64_t desired, QosClass qos);

  // Maps the whole allocation starting at `gva` into this process (VRAM: a
  // device pointer, Mapping::device()). Errors: not_supported (a tier that
  // cannot be shared, e.g. VRAM where this process has no CUDA driver or
  // cannot see the daemon's GPU, VRAM frames that are not contiguous, or
  // memory of another node).
  Result<Mapping> map(Gva gva);

  // Moves the allocation holding `gva` to `tier` on node `to_node` (0: its
  // home node) while readers and writers go on. Errors: failed_precondition
  // (mapped, or coherent), tier_exhausted, transport_error.
  Result<AllocationInfo> migrate(Gva gva, Tier tier, NodeId to_node = 0);

  // Counts of this client's operations by the path they took (thread-safe).
  AccessCounters access_counters() const;

  // The cluster as the local daemon sees it, this node first.
  Result<std::vector<NodeInfo>> nodes();
  // The health graph (H1): every node as the local daemon sees it, and the
  // edges every reachable daemon reports (its view of each other node).
  Result<HealthGraph> health();

  // Of node `node` (0: the local one).
  Result<NodeStat> stat(NodeId node = 0);
  Result<std::vector<AllocationInfo>> list(NodeId node = 0);
  Result<MappingDump> dump(NodeId node = 0);
  // Node `node`'s counters and gauges in Prometheus' text format, as its
  // metrics endpoint serves them (O4). Errors: permission_denied (operators
  // only: they name every tenant), failed_precondition (metrics.enabled is
  // false there).
  Result<std::string> metrics(NodeId node = 0);

 private:
  friend struct detail::BatchState;
  // A Batch's submitted operations, in posting order (client/batch.cpp):
  // runs the first epoch (those on the message path as one message per
  // node, the others as their calls), or every epoch as one message with
  // barriers when all go to one node by messages; returns how many of
  // `items` it completed.
  TIERMEM_NO_EXPORT size_t run_batch(std::span<detail::BatchItem*> items);
  TIERMEM_NO_EXPORT Client(std::shared_ptr<detail::ClientCore> core, const ClientOptions& options,
                           uint64_t client_id);
  TIERMEM_NO_EXPORT std::shared_ptr<detail::ClientCore> core() const;
  // Runs `op` on the connection to the daemon, connecting again first when
  // the daemon went away; when it goes away during `op`, connects again and
  // repeats `op` if `repeatable`, else fails with unavailable.
  TIERMEM_NO_EXPORT Status run(const char* what, bool repeatable,
                               const std::function<Status(detail::ClientCore&)>& op);
  // A new connection in place of `lost` (unless another thread made one).
  // A copy between `gva` and a CUDA device buffer through the copy engines
  // alone (not_supported where the range is not this node's VRAM).
  TIERMEM_NO_EXPORT Status copy_device(Gva gva, void* data, size_t length, bool to_memory);
  TIERMEM_NO_EXPORT Status reconnect(const detail::ClientCore* lost);
  // The connection's watcher saw the daemon's end close: revokes what can no
  // longer be trusted, and has the keeper connect again at once while
  // mappings are held.
  TIERMEM_NO_EXPORT void daemon_lost(const detail::ClientCore* lost);
  // The keeper thread's loop.
  TIERMEM_NO_EXPORT void keep();
  // Hooks a new connection's loss to daemon_lost.
  TIERMEM_NO_EXPORT void watch(const std::shared_ptr<detail::ClientCore>& core);

  ClientOptions m_options;
  uint64_t m_client_id = 0;  // random: the daemon keeps this client's leases by it
  mutable std::mutex m_core_mutex;
  std::shared_ptr<detail::ClientCore> m_core;
  std::atomic<const detail::ClientCore*> m_current{nullptr};  // m_core, read without its mutex
  AccessCounters m_earlier;  // of connections before this one
  std::shared_ptr<detail::MappedSet> m_mapped;
  std::shared_ptr<detail::ClientLink> m_link;
  // Connects again when the daemon went away while mappings are held.
  struct Keeper;
  std::unique_ptr<Keeper> m_keeper;
};

}  // namespace tiermem
