// Plain value types shared by the client API, the daemon and the tools.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tiermem/export.h>
#include <tiermem/gva.h>
#include <tiermem/status.h>

namespace tiermem {

// Memory tiers, fastest first. The numeric values travel on the wire.
enum class Tier : uint8_t {
  automatic = 0,  // requests only: placement picks the fastest tier with room
  vram = 1,
  dram = 2,
  pmem = 3,
};
inline constexpr Tier k_tiers_fastest_first[] = {Tier::vram, Tier::dram, Tier::pmem};

// "vram", "dram", "pmem" or "auto".
TIERMEM_EXPORT std::string_view tier_name(Tier tier);
// Inverse of tier_name (case-insensitive); invalid_argument otherwise.
TIERMEM_EXPORT Result<Tier> parse_tier(std::string_view text);

// Page flags (M2). A page of an allocation always has read and write; pinned
// while a client has it mapped (migration refused); durable on PMEM; torn
// when a writer died holding its lock (the bytes may be partly that write's,
// which was never acknowledged); lost when its frames went with a node whose
// memory was made anew (reads and writes then fail with data_lost).
enum PageFlag : uint32_t {
  k_page_read = 1u << 0,
  k_page_write = 1u << 1,
  k_page_coherent = 1u << 2,
  k_page_pinned = 1u << 3,
  k_page_durable = 1u << 4,
  k_page_torn = 1u << 5,
  k_page_lost = 1u << 6,
};
// "RW-PD--" style text: R W C P D T L, '-' for a cleared flag.
TIERMEM_EXPORT std::string page_flags_text(uint32_t flags);

enum class Lifetime : uint8_t { persistent = 0, session = 1 };

// Quality of service of a read, write or atomic (H3), chosen per call or as
// an allocation's default. standard: the client's timeouts (seconds), and a
// read falls back to a copy of a replicated allocation when its home cannot
// be reached. strict: the call ends within its deadline (50 ms), failing
// with deadline_exceeded naming the node and the state it is in; no
// fallback. best_effort: tried again (2 retries) within 200 ms, then
// deadline_exceeded. graceful_degrade: within 800 ms the home, or else a
// fallback: a copy's bytes for a read (an allocation falls back to a lower
// tier when the chosen one is full, as every non-strict alloc does).
// Deadlines and retries: ClientOptions::qos.
enum class QosClass : uint8_t { standard = 0, strict = 1, best_effort = 2, graceful_degrade = 3 };
// "standard", "strict", "best_effort", "graceful_degrade".
TIERMEM_EXPORT std::string_view qos_class_name(QosClass qos);
// Inverse of qos_class_name; invalid_argument otherwise.
TIERMEM_EXPORT Result<QosClass> parse_qos_class(std::string_view text);

struct AllocOptions {
  Tier tier = Tier::automatic;
  bool strict = false;  // fail instead of falling back to a slower tier
  std::string name;     // optional, unique on its node; find it with lookup()
  // The node to allocate on; 0: this node, or another with room when this
  // one has none (placement policy).
  NodeId node = 0;
  // The allocation holds words for fetch_add/compare_swap from many clients:
  // its pages are never migrated, so atomics go one-sided at full rate.
  bool coherent = false;
  // Lifetime. Persistent (the default) allocations stay until freed: through
  // the end of the session that made them, a client crash, and a daemon
  // restart (recorded in the node's durable metadata; DRAM ones until the
  // node's shared memory goes, i.e. a reboot). Session ones are freed by the
  // daemon when the session that made them ends (the client exits or
  // disconnects), are never recorded and never come back after a daemon
  // restart: scratch memory that must not leak. Only on the client's own
  // node.
  Lifetime lifetime = Lifetime::persistent;
  // Copies kept on other nodes (H2; at most k_max_replicas), placed on
  // reachable nodes other than the home (healthy ones first). A write is acknowledged once the home
  // and every replica hold it (writes and atomics then go through the home
  // daemon); a read goes to the home, and to a replica when the home cannot
  // be reached. A replica that dies is replaced in the background. Only
  // persistent allocations of the home node (node 0 or the client's) ask.
  uint32_t replicas = 0;
  // The QoS class of calls on it that name none.
  QosClass qos = QosClass::standard;
  // Its cold pages may move to the next tier down (VRAM -> DRAM -> PMEM)
  // when their tier passes the daemon's high-water mark (M7, [demotion] in
  // tiermemd.toml), while it is used; its GVA and contents stay. Not for
  // coherent or sub-page allocations, nor while a client maps it.
  bool demotable = false;
};

inline constexpr uint32_t k_max_replicas = 4;

// A copy of a replicated allocation on another node, as its home knows it.
// in_sync: holds every acknowledged write (a write needs it); dropped: its
// node was unreachable and the home went on without it (its node frees it
// once it sees it is no longer listed). A copy being filled is not listed
// until it is full; the copy itself says whether it is ready
// (AllocationInfo::replica_ready).
enum class ReplicaState : uint8_t { in_sync = 0, dropped = 2 };
// "in_sync", "dropped".
TIERMEM_EXPORT std::string_view replica_state_name(ReplicaState state);

struct ReplicaInfo {
  NodeId node = 0;
  Gva gva;  // the copy's own address on that node
  ReplicaState state = ReplicaState::in_sync;
};

struct AllocationInfo {
  Gva gva;
  uint64_t size = 0;
  Tier tier = Tier::automatic;
  std::string name;
  uint64_t pages = 0;      // pages it spans (a sub-page allocation: 1, shared with others)
  // A sub-page allocation (M10): the size class of its slot in a page it
  // shares with other small allocations of its tenant; 0: whole pages.
  uint32_t slot_bytes = 0;
  uint32_t map_count = 0;  // clients holding a Mapping of it
  uint64_t created_unix_ms = 0;
  uint32_t owner_uid = 0;
  std::string tenant;  // the owner: only it (and operators) may touch the memory
  uint64_t lost_pages = 0;  // on frames of a node whose memory was made anew
  uint64_t torn_pages = 0;  // a writer died holding the page's lock (flag T)
  Lifetime lifetime = Lifetime::persistent;
  uint32_t replicas_wanted = 0;        // AllocOptions::replicas
  std::vector<ReplicaInfo> replicas;   // where the copies are (the home's view)
  Gva replica_of;                      // of a copy: the allocation it copies (node 0: none)
  bool replica_ready = false;          // of a copy: filled (it may serve reads)
  QosClass qos = QosClass::standard;   // the default class of calls on it
  bool demotable = false;              // AllocOptions::demotable
};

struct TierStat {
  Tier tier = Tier::automatic;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  bool persistent = false;
  bool shareable = false;  // co-located clients can map it
  std::string backing;     // memfd name, pool file, or device
  uint64_t allocations = 0;
};

struct NodeStat {
  NodeId node = 0;
  uint64_t page_size = 0;
  std::vector<TierStat> tiers;
  uint64_t allocations = 0;
  uint64_t sessions = 0;
  uint64_t uptime_ms = 0;
  std::string daemon_version;
  std::string socket_path;
  // The fabric of the node's data plane: "ucx" or "libfabric/<provider>"
  // (every node of a cluster alike); "none" without one.
  std::string fabric;
  // Damage a client did, undone: page locks of clients that died holding
  // them, broken (their pages flagged T); memory files a client truncated,
  // extended again (the cut-off part reads as zeros).
  uint64_t locks_broken = 0;
  uint64_t truncations_repaired = 0;
  // Memory files a tenant grew past what it was given (its quota), cut back,
  // and the storage that gave back to the file system.
  uint64_t files_trimmed = 0;
  uint64_t trimmed_bytes = 0;
  // What the daemon's start found in its durable metadata (H5).
  struct Recovery {
    bool durable = false;         // changes are recorded (metadata.enabled)
    bool memory_adopted = false;  // every tenant's shared memory on the node survived the restart
    uint64_t starts = 0;          // daemon starts on the metadata pool
    uint64_t allocations = 0;     // recovered, lost ones included
    uint64_t lost_allocations = 0;
    uint64_t lost_pages = 0;
    uint64_t dropped = 0;         // records that did not fit the tiers (the log says why)
    uint64_t lent_frames = 0;
    uint64_t locks_broken = 0;
    double elapsed_ms = 0;
    std::vector<std::string> lost;  // "'name' gva of tenant 't': why" of lost allocations, the first 100
    std::string pool;
    // Tenants' domains whose shared memory was made anew at this start (their
    // DRAM allocations are lost), one line each: "domain 3 (tenant 'x'): why".
    std::vector<std::string> domains_made_anew;
  } recovery;
};

// One page-table entry as seen from outside (M2, M3).
struct PageInfo {
  uint64_t page_index = 0;  // virtual page number in the home node's range
  Tier tier = Tier::automatic;
  NodeId node = 0;          // where the frame physically is
  uint64_t frame_offset = 0;
  uint32_t flags = 0;
  uint64_t version = 0;     // the page's version word (M4), as below
  uint16_t epoch = 0;       // of the version word: bumped by every translation change
  uint64_t sequence = 0;    // of the version word: even stable, odd being written
  bool locked = false;      // a writer holds the page (sequence odd)
  bool exclusive_pending = false;  // the daemon waits to take the page (migration, free)
  uint64_t valid_mask = 0;  // L3: sub-blocks ever written
  uint64_t dirty_mask = 0;  // L3: sub-blocks written since last persist/migration
};

// A physically contiguous run of an allocation.
struct Extent {
  Tier tier = Tier::automatic;
  NodeId node = 0;
  uint64_t frame_offset = 0;  // byte offset in the tier region
  uint64_t gva_offset = 0;    // from the allocation's base
  uint64_t length = 0;
  // Of `node`'s memory when the frames were placed there (frames lent by a
  // node other than the home); 0 for the home's own.
  uint64_t memory_generation = 0;
};

struct Translation {
  AllocationInfo allocation;
  uint64_t offset_in_allocation = 0;
  PageInfo page;                // the page holding the translated address
  std::vector<Extent> extents;  // the whole allocation's layout
};

enum class NodeState : uint8_t { self = 0, connected = 1, connecting = 2, down = 3 };
// "self", "connected", "connecting", "down".
TIERMEM_EXPORT std::string_view node_state_name(NodeState state);

// Health of an edge of the health graph (H1): from a daemon to a node, by
// its heartbeats. Healthy: answering. Degraded: `health.degraded_after_missed`
// heartbeats in a row unanswered. Unreachable: none answered for
// `health.unreachable_after_ms` (or never).
enum class NodeHealth : uint8_t { unknown = 0, healthy = 1, degraded = 2, unreachable = 3 };
// "unknown", "healthy", "degraded", "unreachable".
TIERMEM_EXPORT std::string_view node_health_name(NodeHealth health);

// A member of the cluster as the local daemon sees it.
struct NodeInfo {
  NodeId node = 0;
  std::string control_address;  // host:port of its peer listener ("" when alone)
  NodeState state = NodeState::down;
  uint64_t incarnation = 0;     // changes when the daemon restarts
  std::string transports;       // what the data plane uses to reach it
  std::string last_error;
  uint64_t state_since_ms = 0;  // unix ms of the last state change
  // The edge from the answering daemon to this node (healthy for itself).
  NodeHealth health = NodeHealth::unknown;
  uint64_t health_since_ms = 0;    // unix ms of the last health change
  uint64_t last_heartbeat_ms = 0;  // unix ms of the last answered heartbeat (0: never)
  uint32_t missed_heartbeats = 0;  // unanswered in a row
  uint64_t heartbeat_rtt_us = 0;   // of the last answered heartbeat
};

// One edge of the health graph: what daemon `from` knows of node `to`.
struct HealthEdge {
  NodeId from = 0;
  NodeInfo to;
};

// A check-in edge of the health graph: a client session (a trainer, an
// executor rank, a tool) to daemon `node`. Healthy while it checks in every
// `interval_ms` (ClientOptions::checkin_interval; any request counts);
// degraded after health.degraded_after_missed intervals without; unreachable
// after health.unreachable_after_ms (and one interval after degraded at the
// earliest). It ends when the connection closes.
struct CheckInEdge {
  NodeId node = 0;  // the daemon
  uint64_t session = 0;
  std::string client_name;
  uint32_t pid = 0;
  uint32_t uid = 0;
  std::string tenant;
  NodeHealth health = NodeHealth::unknown;
  uint64_t health_since_ms = 0;  // unix ms of the last change
  uint64_t last_checkin_ms = 0;  // unix ms of its last check-in or request
  uint32_t missed = 0;           // whole intervals since
  uint32_t interval_ms = 0;      // 0: it does not check in
};

// The cluster's health graph (H1): every node, and every edge that a
// reachable daemon reports; a daemon that could not be asked is named in
// `unasked` with the reason.
struct HealthGraph {
  std::vector<NodeInfo> nodes;  // as the local daemon sees them, itself first
  std::vector<HealthEdge> edges;
  std::vector<CheckInEdge> check_ins;  // of every daemon asked (your tenant's clients; an operator's: all)
  std::vector<std::string> unasked;
};

struct MappingDump {
  NodeId node = 0;
  uint64_t page_size = 0;
  uint64_t l2_pages = 0;  // pages per L2 table (storage domain)
  std::vector<AllocationInfo> allocations;
  std::vector<PageInfo> pages;
};

}  // namespace tiermem
