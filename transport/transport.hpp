// The data plane (C1): register memory, connect to peers, and move bytes and
// 64-bit atomics to and from their registered memory.
//
// Two ways an operation reaches a peer's memory, chosen per key (one_sided()):
// - one-sided (InfiniBand, RoCE): UCX's own operations; the NIC runs them and
//   checks the key, the peer's CPU is not involved;
// - as messages (TCP, and shared memory for memory UCX did not allocate): the
//   operations of a batch to one endpoint travel as ONE request that the
//   peer's progress thread checks whole (message_sequence.hpp) and then runs
//   in issue order, answering once. A batch of any length costs one round
//   trip, fences within it cost nothing, and a conditional add (add_if) can
//   stop the rest of its message, undoing the conditional adds before it.
//   UCX 1.13's own emulation of one-sided operations there aborts the
//   answering process when the asking one dies mid-operation and does not
//   order its fences, which is why these are our own messages.
// Small messages and answers go eager (inline); large ones by rendezvous,
// landing straight in the asker's buffers (see ucx_internal.hpp).
//
// The fabric only: bytes and 64-bit words at addresses of registered memory.
// Pages, versions and the seqlock protocol are above it (access/).
//
// Thread-safe: every method may be called from any thread. A TransportBatch belongs to
// one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <tiermem/status.h>

namespace tiermem {

// Where registered memory lives.
enum class MemoryKind { host, cuda };

// A region registered for remote access; deregistered when destroyed.
class RegisteredRegion {
 public:
  virtual ~RegisteredRegion() = default;
  // The key peers unpack to address this region (opaque bytes). It is a
  // capability: whoever holds it may read and write the region, and only
  // the region (the fabric's remote key, and for operations carried as
  // messages a random token the target checks). Hand it out accordingly.
  virtual const std::string& packed_key() const = 0;
  virtual uint64_t base() const = 0;
  virtual uint64_t length() const = 0;
};

// A connection to one peer's transport address. Operations on an endpoint
// whose peer failed return transport_error.
class Endpoint {
 public:
  virtual ~Endpoint() = default;
  virtual bool failed() const = 0;
  // What the fabric chose, e.g. "tcp/lo" or "posix/memory cma/memory".
  virtual std::string transports() const = 0;
};

// A peer's key, unpacked for one endpoint.
class RemoteKey {
 public:
  virtual ~RemoteKey() = default;
};

enum class AtomicOp { fetch_add, compare_swap, swap };

// What one message may carry: a batch with more operations, or more bytes of
// puts or of gets, to one endpoint is split into several messages (and an
// add_if then stops only the rest of its own).
inline constexpr size_t k_message_max_ops = 4096;
inline constexpr size_t k_message_max_bytes = 16 << 20;

// Holds for a word when (word & mask) == value.
struct WordCondition {
  uint64_t mask = ~uint64_t{0};
  uint64_t value = 0;
};

// Operations issued together; wait() completes them. Operations on message
// keys are sent when the batch is waited for, one message per endpoint.
class TransportBatch {
 public:
  virtual ~TransportBatch() = default;
  virtual size_t pending() const = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string name() const = 0;
  // This process's address, to hand to peers (opaque bytes).
  virtual const std::string& address() const = 0;

  // Registers [base, base+length). Errors: transport_error.
  virtual Result<std::unique_ptr<RegisteredRegion>> register_region(void* base, size_t length,
                                                                    MemoryKind kind) = 0;

  // Connects to the peer at `address`. Errors: transport_error.
  virtual Result<std::shared_ptr<Endpoint>> connect(std::string_view address) = 0;
  // Unpacks a peer's packed key, for its region at `base`, for use on
  // `endpoint`.
  virtual Result<std::shared_ptr<RemoteKey>> unpack(const std::shared_ptr<Endpoint>& endpoint,
                                                    std::string_view packed_key, uint64_t base) = 0;

  // Whether operations with `key` are one-sided (the fabric runs them without
  // the peer's CPU); else they travel as messages its progress thread runs.
  virtual bool one_sided(const RemoteKey& key) const = 0;

  virtual std::unique_ptr<TransportBatch> batch() = 0;
  // Copies `length` bytes from the peer's `remote_addr` into `dst`.
  virtual Status get(TransportBatch& batch, Endpoint& ep, void* dst, size_t length, uint64_t remote_addr,
                     RemoteKey& key) = 0;
  virtual Status put(TransportBatch& batch, Endpoint& ep, const void* src, size_t length,
                     uint64_t remote_addr, RemoteKey& key) = 0;
  // 64-bit atomic on the peer's word at `remote_addr`; *result receives the
  // old value. compare_swap stores `operand` when the word equals `compare`.
  virtual Status atomic(TransportBatch& batch, Endpoint& ep, AtomicOp op, uint64_t operand,
                        uint64_t compare, uint64_t remote_addr, RemoteKey& key,
                        uint64_t* result) = 0;
  // A conditional add, on message keys only (not_supported on one-sided
  // ones): when `condition` holds for the peer's word at `remote_addr` it gets
  // `add` added, atomically. When it does not, nothing issued after it in its
  // message (its group: end_group) runs, each add_if before it in its
  // message (group) gets its own `undo` added (latest first), and wait()
  // returns failed_precondition (not for a group). *old receives the word as the peer saw it (for those
  // that ran). A compare-and-swap that must succeed for the rest to run is
  // compare_swap_or_abort() below.
  virtual Status add_if(TransportBatch& batch, Endpoint& ep, WordCondition condition, uint64_t add, uint64_t undo,
                        uint64_t remote_addr, RemoteKey& key, uint64_t* old) = 0;
  // Makes [remote_addr, remote_addr + length), written by the puts issued
  // before it, durable at the peer (msync of a file mapping) before what is
  // issued after it runs. Message keys only (not_supported on one-sided ones).
  virtual Status persist(TransportBatch& batch, Endpoint& ep, uint64_t remote_addr, size_t length, RemoteKey& key) = 0;
  // Groups (message keys only; not_supported on one-sided endpoints): closes
  // the group of the operations issued on `ep` since the last end_group (or
  // the batch's start). An add_if that fails then stops the rest of its
  // group only, undoing the add_ifs of its group before it; what follows the
  // group runs, and wait() does not fail for it. *stopped receives 0 when
  // the group ran whole, else 1 + the index in the group of the add_if that
  // stopped it. Many independent operations (a client Batch's) share one
  // message this way, each its own group.
  virtual Status end_group(TransportBatch& batch, Endpoint& ep, uint64_t* stopped) = 0;
  // A fence that costs nothing within one message (message keys only): when
  // a group issued on `ep` since the previous barrier was stopped, nothing
  // issued after it in its message runs and *stopped receives 1 (wait()
  // does not fail for it; what did not run answers nothing). The caller
  // keeps what must be ordered in one message (reserve()).
  virtual Status barrier(TransportBatch& batch, Endpoint& ep, uint64_t* stopped) = 0;
  // The next `ops` operations on `ep`, with `put_bytes` of puts and
  // `get_bytes` of gets, travel in one message (the message collected so
  // far goes now if they would not fit in it). invalid_argument when they
  // cannot fit in any message; nothing to do on one-sided endpoints.
  virtual Status reserve(TransportBatch& batch, Endpoint& ep, size_t ops, size_t put_bytes, size_t get_bytes) = 0;
  // Sends the messages collected so far without waiting (wait() still
  // completes them): the batches of several endpoints go out together, then
  // each is waited for.
  virtual void send(TransportBatch& batch) = 0;
  Status compare_swap_or_abort(TransportBatch& batch, Endpoint& ep, uint64_t expected, uint64_t desired,
                               uint64_t remote_addr, RemoteKey& key, uint64_t* old) {
    return add_if(batch, ep, {~uint64_t{0}, expected}, desired - expected, expected - desired, remote_addr, key, old);
  }
  // Orders the batch's operations: those issued before complete at their
  // target before those issued after (on the same endpoint). Free on message
  // keys (the target runs a message in order); on one-sided ones the fabric's
  // fence.
  virtual Status fence(TransportBatch& batch, std::chrono::milliseconds timeout) = 0;
  // Sends the batch's messages and completes every operation of the batch,
  // driving progress; the calling thread sleeps while nothing happens and is
  // woken by the answer itself (see UcxTransport::drive). Errors:
  // transport_error (a peer failed), timeout (then the endpoints of the
  // unfinished operations are closed, so no buffer is written later),
  // failed_precondition (an add_if stopped its message), a refusal by the
  // peer (out_of_range, invalid_argument: nothing of that message ran).
  virtual Status wait(TransportBatch& batch, std::chrono::milliseconds timeout) = 0;
  // Remote completion of everything issued on `ep` so far.
  virtual Status flush(Endpoint& ep, std::chrono::milliseconds timeout) = 0;

  // Requests sent to peers as messages (resends not counted).
  virtual uint64_t requests_sent() const { return 0; }
  // Connections a listening transport turned away before they proved
  // anything (its admission budget per source, or its window), for its owner
  // to log: what happened since the last call. `sources`: per source, how
  // many ("127.0.0.1 uid 1001" for a process of this host).
  struct AdmissionReport {
    uint64_t turned_away = 0;
    std::map<std::string, uint64_t> sources;
  };
  virtual AdmissionReport take_admission_report() { return {}; }

  // Drives progress once; true when something happened.
  virtual bool progress() = 0;

  // Called when the fabric reports that the peer of `endpoint` failed (UCX's
  // peer-failure error handling: a closed TCP connection, a keepalive that
  // went unanswered, a NIC's error), from whichever thread was driving
  // progress: it must be quick and must not wait for a lock that a caller of
  // this transport may hold while it waits. Setting another (or none) waits
  // for a handler that runs now.
  using FailureHandler = std::function<void(const Endpoint& endpoint, const std::string& why)>;
  virtual void on_failure(FailureHandler handler) = 0;

  // A check for what knows more than the fabric: while operations wait,
  // about every `interval`, it is asked about each endpoint they wait on; an
  // error ends the wait with that error, the operations are abandoned (as on
  // a timeout) and the endpoint counts as failed from then on. A client asks
  // its daemon whether the node is UNREACHABLE: in a partition TCP says
  // nothing until its own timeouts, seconds later. Called from the waiting
  // thread, which may hold the caller's locks. Set before operations start.
  using WaitCheck = std::function<Status(const Endpoint& endpoint)>;
  virtual void check_while_waiting(WaitCheck check, std::chrono::milliseconds interval) = 0;
};

struct UcxOptions {
  // UCX transports to use (UCX_TLS syntax); empty: UCX's default or $UCX_TLS.
  std::string tls;
  // Network devices (UCX_NET_DEVICES syntax); empty: UCX's default or the
  // environment's.
  std::string devices;
  // Start a thread that answers peers (the daemon needs one; clients progress
  // while they wait). It polls while requests come and sleeps on the
  // worker's event fd, without a timeout, once none came for a while.
  bool progress_thread = false;
  // How long a waiting thread, or the progress thread after its last request,
  // polls before it sleeps: at most this long, and only while answers (or
  // requests) have been coming sooner than that (see SpinPolicy). 0: sleep at
  // once. Negative: the default (30 us; $TIERMEM_SPIN_US overrides it).
  int spin_us = -1;
  // How operations reach peers without one-sided hardware (TCP): "messages"
  // (our request/reply, the default) or "ucx" (UCX's own emulation, which
  // aborts the target if the initiator dies mid-operation; for comparison).
  std::string emulation = "messages";
  // UCX's keepalive on endpoints with peer-failure detection (UCX_KEEPALIVE_INTERVAL):
  // a peer that stops answering at the fabric's level is reported failed.
  // 0: UCX's default (20 s); an explicit $UCX_KEEPALIVE_INTERVAL wins.
  uint32_t keepalive_interval_ms = 0;
  // Accept connections on a UCX listener at this IP address (any free port),
  // and only those: address() is then the listener's address and a random
  // admission token, every request must carry the token (a peer that does
  // not present it is refused and its endpoint closed), and no worker
  // address is handed out for anyone to dial. Empty: no listener; address()
  // is the worker's address (peers of one host over shared memory, which UCX
  // 1.13 cannot reach through a listener). Errors at start when UCX has no
  // connection manager for it (see listening()).
  std::string listen_ip;
};

// Whether `address` is a listener's address (UcxOptions::listen_ip), which
// connect() reaches through UCX's connection manager, presenting its token.
bool is_listener_address(std::string_view address);

// Errors: transport_error (UCX could not start).
Result<std::unique_ptr<Transport>> make_ucx_transport(const UcxOptions& options);

// The libfabric transport (transport/ofi/, docs/design/libfabric.md): one
// reliable-datagram endpoint per transport, in a fabric domain of its own
// (a tenant plane is a transport, so each tenant gets its own domain).
// Operations travel as our messages (message_sequence.hpp) over tagged
// sends; on providers whose NIC checks keys and that have RMA and 64-bit
// atomics (efa, verbs;ofi_rxm, cxi) gets, puts and atomics are one-sided
// (fi_read, fi_write, fi_fetch_atomic, fi_compare_atomic), as on UCX over
// RDMA. shm checks no keys and tcp;ofi_rxm runs RMA in software at the
// target: messages there.
struct OfiOptions {
  // The provider, as fi_info names it: "tcp;ofi_rxm", "shm", "efa",
  // "verbs;ofi_rxm", "cxi", ...
  std::string provider = "tcp;ofi_rxm";
  // Start a thread that answers peers (the daemon needs one).
  bool progress_thread = false;
  // As UcxOptions::spin_us.
  int spin_us = -1;
  // The IP address whose interface the endpoint uses (FI_SOURCE); empty:
  // the provider's choice. There is no listener: address() carries a random
  // admission token that every request must present.
  std::string listen_ip;
  // "auto": one-sided where the provider checks keys (above); "off":
  // messages only; "unchecked": one-sided on any provider with RMA and
  // atomics, keys checked or not (tests and benchmarks of the one-sided
  // path on shm and tcp;ofi_rxm only: on shm any peer reads any memory).
  // $TIERMEM_OFI_ONE_SIDED overrides it.
  std::string one_sided = "auto";
};

// Whether `address` is a libfabric transport's address, and its provider.
bool is_ofi_address(std::string_view address);
std::string ofi_provider_of(std::string_view address);

// Errors: not_supported (built without libfabric, or the provider lacks a
// capability tiermem needs: the message says which), transport_error.
Result<std::unique_ptr<Transport>> make_ofi_transport(const OfiOptions& options);
// The libfabric this build was linked with ("" when none).
std::string libfabric_version();

// The fabric of a cluster: "ucx" or "libfabric" with its provider.
struct FabricChoice {
  std::string fabric = "ucx";
  std::string provider;  // libfabric only
  // The name peers compare at the handshake: "ucx" or "libfabric/<provider>".
  std::string name() const { return fabric == "ucx" ? fabric : fabric + "/" + provider; }
};

// A transport of `choice`, from the options of each fabric (the common ones,
// progress_thread, spin_us and listen_ip, are taken from `ucx`).
Result<std::unique_ptr<Transport>> make_transport(const FabricChoice& choice, const UcxOptions& ucx);
// A client's transport for reaching a peer at `address` (a libfabric address
// names its provider; anything else is UCX's).
Result<std::unique_ptr<Transport>> make_transport_for(std::string_view address, const UcxOptions& ucx);

}  // namespace tiermem
