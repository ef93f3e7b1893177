// The one-sided data plane (C1): register memory, connect to peers, and move
// bytes and 64-bit atomics to and from their registered memory without their
// CPU in the data path where the fabric allows (RDMA, shared memory).
//
// Over TCP there is no one-sided access: the peer's progress thread must
// answer. UCX 1.13 emulates gets, puts and atomics itself there (and over
// shared memory for memory it did not allocate), but aborts the answering
// process when the asking one dies with an operation in flight, does not order
// that emulation with its fences, and over shared memory sometimes answers to
// the wrong peer. This transport therefore sends its own request/reply active
// messages on such endpoints and regions (the target checks the range against
// the region its key names and runs a repeated atomic only once; it answers
// on UCX's reply endpoint over TCP, and over shared memory on an endpoint it
// opened to the asker, see ucx_internal.hpp). Where the fabric is one-sided
// (InfiniBand, RoCE) operations are UCX's own.
//
// The fabric only: bytes and 64-bit words at addresses of registered memory.
// Pages, versions and the seqlock protocol are above it (access/).
//
// Operations are issued into a Batch and complete together in wait(), so
// several can be in flight at once (over TCP a single outstanding get costs a
// full round trip of the emulation; overlapping them is most of the speed).
//
// Thread-safe: every method may be called from any thread. A Batch belongs to
// one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
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

// Operations issued together; wait() completes them.
class Batch {
 public:
  virtual ~Batch() = default;
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

  virtual std::unique_ptr<Batch> batch() = 0;
  // Copies `length` bytes from the peer's `remote_addr` into `dst`.
  virtual Status get(Batch& batch, Endpoint& ep, void* dst, size_t length, uint64_t remote_addr,
                     RemoteKey& key) = 0;
  virtual Status put(Batch& batch, Endpoint& ep, const void* src, size_t length,
                     uint64_t remote_addr, RemoteKey& key) = 0;
  // 64-bit atomic on the peer's word at `remote_addr`; *result receives the
  // old value. compare_swap stores `operand` when the word equals `compare`.
  virtual Status atomic(Batch& batch, Endpoint& ep, AtomicOp op, uint64_t operand,
                        uint64_t compare, uint64_t remote_addr, RemoteKey& key,
                        uint64_t* result) = 0;
  // Orders the batch's operations: those issued before complete at their
  // target before those issued after (on the same endpoint). May wait for
  // earlier operations (up to `timeout`; then as wait() on timeout).
  virtual Status fence(Batch& batch, std::chrono::milliseconds timeout) = 0;
  // Completes every operation of the batch, driving progress. Errors:
  // transport_error (a peer failed), timeout (then the endpoints of the
  // unfinished operations are closed, so no buffer is written later).
  virtual Status wait(Batch& batch, std::chrono::milliseconds timeout) = 0;
  // Remote completion of everything issued on `ep` so far.
  virtual Status flush(Endpoint& ep, std::chrono::milliseconds timeout) = 0;

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
  // while they wait).
  bool progress_thread = false;
  // How operations reach peers without one-sided hardware (TCP): "messages"
  // (our request/reply, the default) or "ucx" (UCX's own emulation, which
  // aborts the target if the initiator dies mid-operation; for comparison).
  std::string emulation = "messages";
  // UCX's keepalive on endpoints with peer-failure detection (UCX_KEEPALIVE_INTERVAL):
  // a peer that stops answering at the fabric's level is reported failed.
  // 0: UCX's default (20 s); an explicit $UCX_KEEPALIVE_INTERVAL wins.
  uint32_t keepalive_interval_ms = 0;
};

// Errors: transport_error (UCX could not start).
Result<std::unique_ptr<Transport>> make_ucx_transport(const UcxOptions& options);

}  // namespace tiermem
