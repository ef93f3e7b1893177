// The state behind a Client (internal): the control connection, this node's
// memory of the client's tenant mapped into this process (the files of its
// domain: version words, DRAM and PMEM frames), the data plane to other
// nodes, and the cache of allocation layouts that lets reads, writes and
// atomics go straight to memory.
//
// Bound to one daemon incarnation: every direct write checks, once it holds
// its page locks, that the daemon it connected to still serves the memory
// (the segment header's incarnation) and is alive (its socket is watched), so
// a client of a dead daemon never writes into memory a new one may have
// handed to someone else; it gets `unavailable` instead.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <thread>
#include <vector>

#include <tiermem/client.h>

#include "access/remote_memory.hpp"
#include "client/batch_item.hpp"
#include "client/coherent_words.hpp"
#include "client/device_frames.hpp"
#include "client/local_regions.hpp"
#include "client/node_regions.hpp"
#include "client/qos_runner.hpp"
#include "client/remote_nodes.hpp"
#include "client/translation_cache.hpp"
#include "common/shared_memory.hpp"
#include "common/unique_fd.hpp"
#include "pages/lock_intents.hpp"
#include "pages/seqlock_copy.hpp"
#include "proto/control_stub.hpp"
#include "rpc_connection.hpp"

namespace tiermem::detail {

// Whether `s` says the home of an allocation could not be reached (or lost
// the bytes), so that a copy may serve a read instead.
bool home_unreachable(const Status& s);

// How an operation reaches a piece of an allocation (the home's version
// words, or an extent), slowest last: an operation takes the slowest path of
// the pieces it touches.
enum class Path : uint8_t {
  local,      // this node's memory, mapped (or VRAM imported)
  mapped,     // a daemon of this host's memory, mapped from the files it handed over
  one_sided,  // another node's memory through RDMA keys
  message,    // another node's memory through the data plane's checked message path
  daemon,     // no route but the daemon (VRAM of another node, no data plane to the node)
  failed,     // the node could not be reached when the route was decided (Routes::failure)
};

// The paths to every piece of one translation, decided once for it
// (ClientCore::routed) and again when keys were added since.
struct Routes {
  uint64_t epoch = 0;  // ClientCore's key epoch they were decided at
  // A piece goes through the daemon for want of a key the node may give
  // later: decided again after a while (k_forced_refresh).
  bool provisional = false;
  std::chrono::steady_clock::time_point decided;
  Path words = Path::local;
  std::vector<Path> extents;  // one per extent of the translation
  Status failure;             // why the first piece that failed did
};

// The path of an operation on bytes [offset, +length) of `a` (its routes
// decided): the slowest of the pieces it touches (the home's words, and the
// extents of the range).
Path path_of(const CachedAllocation& a, uint64_t offset, uint64_t length);
// The extent holding byte `offset` of `a`, or nullptr.
const Extent* extent_at(const CachedAllocation& a, uint64_t offset);

// A daemon of another node on this host (its NodeInfo's host id is this
// client's daemon's): the client maps that node's memory of its tenant, as
// its daemon hands it over, instead of reaching it through the fabric.
// `on_host` false: the node was found to be elsewhere (kept, so it is not
// asked again until the node is dropped).
struct SiblingNode {
  NodeId node = 0;
  bool on_host = false;
  std::unique_ptr<RpcConnection> connection;
  proto::HelloResponse hello;
  std::atomic<bool> lost{false};
  std::unique_ptr<NodeRegions> regions;
  // Its VRAM (another GPU of this host), imported chunk by chunk from its
  // daemon as this node's is: copies go GPU to GPU (peer to peer where the
  // GPUs reach each other), never through host memory. Opened on first use.
  std::mutex device_mutex;  // the connection, while a fetch uses it
  std::once_flag device_once;
  std::unique_ptr<DeviceFrameData> device;
  Status device_status;
};

class ClientCore {
 public:
  // A sibling's VRAM frames (SiblingNode::device). Errors: not_supported
  // (no VRAM shared, its GPU not visible here, no driver).
  static Result<FrameData*> sibling_vram(SiblingNode& s);

  // `mapped`: the allocations this process still maps (one entry per
  // mapping), whose pins the daemon may have kept for it (mapped_kept()).
  // `client_id`: the Client object's (the daemon keeps leases by it).
  static Result<std::shared_ptr<ClientCore>> connect(const ClientOptions& options, uint64_t client_id = 0,
                                                     const std::vector<Gva>& mapped = {});
  ~ClientCore();

  // Requests to the local daemon (which forwards what is for other nodes).
  ControlStub& control() { return m_stub; }
  NodeId node() const { return static_cast<NodeId>(m_hello.node_id()); }
  // The daemon's end of the connection closed: it is gone.
  bool lost() const { return m_daemon_lost.load(std::memory_order_seq_cst); }

  // Per `mapped` of connect(): the daemon kept that mapping's pin for this
  // process since its last session (the mapping is valid as it is).
  bool mapped_kept(size_t i) const { return static_cast<int>(i) < m_hello.mapped_kept_size() && m_hello.mapped_kept(static_cast<int>(i)); }
  // Called once, on the watcher thread, when the daemon's end of the
  // connection closes (at once if it already has).
  void on_lost(std::function<void(ClientCore*)> hook);
  // Whether the daemon this connection was made to is gone (its process
  // died, or another serves its memory now), as its segment headers say:
  // false while it lives (only the connection broke) or when unknown.
  bool daemon_died() const;
  uint64_t page_size() const { return m_hello.page_size(); }

  // `qos`: the call's class; none: the allocation's default (H3).
  Status write(Gva gva, const void* src, size_t length, std::optional<QosClass> qos = std::nullopt);
  Status read(Gva gva, void* dst, size_t length, std::optional<QosClass> qos = std::nullopt);
  Result<uint64_t> atomic(Gva gva, WordOp op, uint64_t operand, uint64_t compare,
                          std::optional<QosClass> qos = std::nullopt);
  // A client Batch's operations (no order holds among them) on the message
  // path to other nodes, as one message per node (each operation its own
  // group: Transport::end_group): start_batch posts those it can (marking
  // them in_flight) and sends every node's message; finish_batch waits for
  // them all and settles each that went through (`handled`: status and
  // value final). The caller runs every other one as its synchronous call,
  // between the two (this node's memory, a mapped one of this host, the
  // daemon's path, another QoS class) or after finish_batch (a write whose
  // page was taken, a read a writer spoiled, a stale translation, a node
  // that failed: the synchronous call then waits, refreshes or reconnects,
  // and names what failed). An atomic whose node failed mid-batch is
  // settled with its error: it may have run, and is never repeated.
  // finish_batch must follow every start_batch.
  struct BatchFlight;
  std::shared_ptr<BatchFlight> start_batch(std::span<BatchItem*> items);
  // Several epochs (items in posting order) as ONE message with a barrier
  // (Transport::barrier) at each fence, when every item goes by messages
  // to the same node and all fit in one message: reads then take their
  // pages like writes (a group that can stop, so that nothing after a fence
  // runs past a read that did not go through). nullptr (nothing sent) when
  // they do not qualify. finish_batch then settles what went through; the
  // caller runs the rest in posting order.
  std::shared_ptr<BatchFlight> start_chain(std::span<BatchItem*> items);
  void finish_batch(BatchFlight& flight);
  // A copy between `gva` and a CUDA device buffer through the copy engines
  // alone: not_supported unless every byte is this node's VRAM that this
  // client may import (the caller then stages through host memory).
  Status copy_device(Gva gva, std::byte* buf, size_t length, bool to_memory);
  // The device address of an allocation of this node's VRAM (its extents,
  // which must be frame-contiguous) in this process. Errors: not_supported.
  Result<std::byte*> device_address(const std::vector<Extent>& extents);
  // The CUDA device ordinal of imported VRAM in this process (-1: none).
  int device_ordinal() const { return m_local.device_ordinal(); }
  AccessCounters counters() const;
  // A device buffer copied through host memory (AccessCounters::staged_device).
  void count_staged() const { m_staged_device.fetch_add(1, std::memory_order_relaxed); }
  // The cached translation of the allocation holding `gva`, if any (no request).
  std::shared_ptr<const CachedAllocation> peek(Gva gva);
  // Drops a cached translation (after free or migration).
  void forget(Gva gva);
  // The short path for a word of a coherent allocation of the standard
  // class (coherent_words.hpp): true when it ran the atomic (*old is the
  // word before); false when the general path (atomic()) must.
  bool short_atomic(Gva gva, WordOp op, uint64_t operand, uint64_t compare, uint64_t* old);

  // The file of a local tier holding frames [frame_offset, +length): its
  // descriptor and the offset in it. Errors: not_supported.
  Result<std::pair<int, uint64_t>> tier_file(Tier tier, uint64_t frame_offset, uint64_t length);
  bool region_persistent(Tier tier) const;

  // The session's lock log, where every page lock this client takes is
  // recorded (pages/lock_intents.hpp). Errors: not_supported.
  Result<IntentLog> intents();
  // Accessors for copy_through_layout (see ClientAccess in the .cpp).
  Result<VersionWords*> local_versions(uint64_t first_page);
  Result<FrameData*> local_frames(Tier tier);
  // How this client reaches `node` through the data plane (RemoteNodes::get;
  // not_supported with direct access off).
  Result<std::shared_ptr<RemoteState>> remote(NodeId node, bool reconnect = false);
  // The mapped memory of `node` when its daemon runs on this host.
  // Errors: not_supported (another host, same-host mapping off, direct
  // access off), or why it could not be mapped.
  Result<std::shared_ptr<SiblingNode>> sibling(NodeId node);
  // Forgets how to reach `node` (after a transport failure); the next access
  // asks the daemon again.
  void drop_remote(NodeId node);

 private:
  ClientCore(std::unique_ptr<RpcConnection> connection, proto::HelloResponse hello, bool direct, std::string socket,
             std::chrono::milliseconds checkin_interval);
  // Connects to node `info`'s daemon on this host and maps what it hands.
  Result<std::shared_ptr<SiblingNode>> open_sibling(const proto::NodeInfo& info);

  // `a` with its routes decided (`a` itself while they are current), put in
  // the cache in its place. `again`: decide even if current (a copy was
  // refused on the route decided). A node that cannot be reached makes its
  // pieces Path::failed (Routes::failure says why).
  std::shared_ptr<const CachedAllocation> routed(std::shared_ptr<const CachedAllocation> a, bool again);
  // The path to `node`'s version words from `first` (`tier` none) or frames
  // of `tier` at [first, +length); a node whose keys may be stale is added
  // to `stale` (and the path is the daemon's until they are refreshed).
  Result<Path> path_to(NodeId node, std::optional<Tier> tier, uint64_t first, uint64_t length,
                       std::vector<NodeId>* stale);
  // Counts a successful direct operation on `path`.
  void count(Path path);

  Result<std::shared_ptr<const CachedAllocation>> cached(Gva gva, bool refresh);
  // What copy_through_layout needs of a cached translation.
  LayoutView layout_of(const CachedAllocation& a) const;
  // Frames the translation places on other nodes are of the memory (and
  // daemon) it was made for: else the translation is stale.
  Status check_remote_extents(const CachedAllocation& a);
  // The same for frames other nodes lent it.
  Status check_lent_extents(const CachedAllocation& a);
  void forget_node(NodeId node);
  // `fallback`: a read the home cannot serve is read from a copy.
  Status copy(Gva gva, std::byte* buf, size_t length, bool to_memory, bool fallback = true);
  Status copy_rpc(Gva gva, std::byte* buf, size_t length, bool to_memory, bool from_replica = false);
  // A read the home could not serve (`failed`), from a copy of the
  // allocation (replicated memory): `failed` when there is none either.
  Status read_copy(Gva gva, std::byte* buf, size_t length, const Status& failed);
  Result<uint64_t> atomic_rpc(Gva gva, WordOp op, uint64_t operand, uint64_t compare);
  Result<uint64_t> atomic_once(Gva gva, WordOp op, uint64_t operand, uint64_t compare);
  // After atomic_once ran on `gva` by `path` in extent `x` of `a`: keeps
  // the route for short_atomic where the word is mapped memory of a
  // coherent allocation.
  void learn_coherent(Gva gva, const std::shared_ptr<const CachedAllocation>& a, const Extent& x, Path path);
  // QoS (H3): the class a call on `gva` runs in (asked, else the
  // allocation's default); calls of other classes than standard run under
  // m_qos.
  QosClass class_of(Gva gva, std::optional<QosClass> asked);
  // Posts `item` into `flight` (client_batch.cpp); not_supported (nothing
  // posted) when it does not go by the message path.
  // `locked_reads`: a read takes its pages (start_chain).
  Status post_batch_item(BatchItem& item, BatchFlight& flight, bool locked_reads = false);
  Status daemon_gone() const;
  void watch_daemon();

  std::unique_ptr<RpcConnection> m_connection;
  // Its requests go through call() (which notices the daemon going).
  Result<proto::Response> call(proto::Request& request, std::vector<UniqueFd>* fds);
  ControlStub m_stub{[this](proto::Request& request, std::vector<UniqueFd>* fds) { return call(request, fds); }};
  proto::HelloResponse m_hello;
  bool m_direct;
  std::string m_socket;
  std::chrono::milliseconds m_lock_timeout{10000};

  // Set (never cleared) when the daemon's end of the control socket closed.
  std::atomic<bool> m_daemon_lost{false};
  UniqueFd m_watch_stop;  // eventfd that ends the watcher
  std::chrono::milliseconds m_checkin_interval{0};  // the watcher checks in this often (0: never)
  std::thread m_watcher;

  // This node's memory of the tenant, mapped on first use.
  LocalRegions m_local{m_stub, m_hello, m_socket, &m_daemon_lost};


  bool m_map_same_host = true;  // ClientOptions::map_same_host
  uint64_t m_client_id = 0;
  std::string m_client_name;
  std::mutex m_sibling_mutex;
  std::map<NodeId, std::shared_ptr<SiblingNode>> m_siblings;


  // Successful operations by path (access_counters()).
  std::atomic<uint64_t> m_direct_local{0}, m_direct_remote{0}, m_message{0}, m_through_daemon{0};
  mutable std::atomic<uint64_t> m_staged_device{0};

  std::mutex m_lost_mutex;
  std::function<void(ClientCore*)> m_on_lost;
  bool m_lost_told = false;
  // Tells m_on_lost (once) that the daemon's end closed.
  void tell_lost();

  TranslationCache m_cache{m_hello.page_size()};
  CoherentWords m_coherent;
  // Other nodes through the data plane; a node that restarted voids its
  // translations.
  RemoteNodes m_nodes{m_stub, node(), [this](NodeId n) { forget_node(n); }};
  QosRunner m_qos{m_stub, node()};
};

}  // namespace tiermem::detail
