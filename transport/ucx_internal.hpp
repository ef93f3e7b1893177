// Internals of the UCX transport, shared by its three parts:
//   ucx_transport.cpp   context, worker, regions, endpoints, the answer
//                       endpoints and the progress thread
//   ucx_operations.cpp  get/put/atomic/fence/wait on the asking side: native
//                       UCX, direct on a mapped peer segment, or as messages
//   ucx_answers.cpp     the target side of messages: check, run, answer
// Nothing here is part of the transport's interface (transport.hpp).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <ucp/api/ucp.h>

#include "transport/transport.hpp"

namespace tiermem::ucx_detail {

// Set while creating an endpoint with peer failure detection on trial: UCX
// logs the refusal of transports that cannot detect failures as an error, but
// here it is an expected answer (see log_to_stderr in ucx_transport.cpp).
extern thread_local bool t_probing_error_mode;

Status ucx_error(const std::string& what, ucs_status_t status);

class UcxTransport;

class UcxEndpoint final : public Endpoint {
 public:
  UcxEndpoint(UcxTransport& owner) : m_owner(owner) {}
  ~UcxEndpoint() override;

  bool failed() const override { return m_failed.load(std::memory_order_acquire); }
  std::string transports() const override;

  static void on_error(void* arg, ucp_ep_h, ucs_status_t status);

  UcxTransport& m_owner;
  ucp_ep_h m_ep = nullptr;
  std::atomic<bool> m_failed{false};
  // Every lane is TCP: no one-sided path at all (see transport.hpp); answers
  // come on UCX's reply endpoint.
  bool m_messages = false;
  // Every lane is shared memory: operations go as messages too (UCX 1.13
  // would mix its emulation with cross-memory copies its fences do not
  // order), answered on an endpoint the target opens; see unpack().
  bool m_shared = false;
};

// --- request/reply messages --------------------------------------------------
//
// A request names an address in one of the target's registered regions; the
// target checks it, runs the operation on its memory and replies with the
// request's id. Both sides run the same code, so headers are in host order.
// Over shared memory, answers go on an endpoint the target itself opened to
// the asking worker (whose address came in the connection's hello), not on
// UCX's reply endpoint: UCX 1.13 over shared memory sometimes resolves that to
// an endpoint to another peer, and the answer lands in the wrong process.
// Over TCP they go on the reply endpoint (k_answer_on_reply_ep): an endpoint
// the target opens itself means a new TCP connection to the asker, and when
// the asker has just died, UCX 1.13 fails that connection's wire-up with an
// assertion that aborts the target (ucp_request_send_state_ff, "got REP
// message").

constexpr uint16_t k_request_id = 41;
constexpr uint16_t k_reply_id = 42;
constexpr uint32_t k_message_magic = 0x544d5251;  // "QRMT"
constexpr uint16_t k_answer_on_reply_ep = 1;      // MessageRequest::flags

// hello: the first request on a connection; its payload is the asking
// worker's address, to which the target connects to answer.
enum class MessageKind : uint8_t { get = 1, put = 2, atomic = 3, hello = 4 };

// Why the target refused.
enum class Refusal : int32_t { none = 0, unregistered = 1, unaligned = 2, not_host = 3, malformed = 4 };

struct MessageRequest {
  uint32_t magic = k_message_magic;
  MessageKind kind = MessageKind::get;
  uint8_t op = 0;  // AtomicOp
  uint16_t flags = 0;  // k_answer_on_reply_ep
  uint64_t id = 0;
  uint64_t address = 0;
  uint64_t length = 0;
  uint64_t operand = 0;
  uint64_t compare = 0;
  uint64_t origin = 0;  // the asking transport (random): with id, names an atomic for de-duplication
  uint64_t token = 0;   // of the region the asker was given the key of: the address must lie in it
};

struct MessageReply {
  uint32_t magic = k_message_magic;
  Refusal refusal = Refusal::none;
  uint64_t origin = 0;  // echoed: an answer meant for another transport is dropped
  uint64_t id = 0;
  uint64_t value = 0;  // an atomic's old value
};

// One operation in flight as messages. Owned by its batch; the fields after
// `sent` are shared with the progress callbacks under UcxTransport::m_ops_lock.
struct MessageOp {
  MessageRequest header;
  UcxEndpoint* ep = nullptr;
  const void* src = nullptr;  // payload (put, hello)
  size_t payload = 0;
  void* dst = nullptr;        // get destination
  uint64_t* result = nullptr;
  bool sent = false;
  std::chrono::steady_clock::time_point sent_at;
  int resends = 0;
  void* send_request = nullptr;
  void* recv_request = nullptr;  // a rendezvous reply landing in dst
  bool replied = false;
  ucs_status_t status = UCS_OK;
  Refusal refusal = Refusal::none;
};

std::unique_ptr<MessageOp> message(MessageKind kind, uint64_t address, uint64_t length);

Status refusal_error(Refusal r, const MessageRequest& h);

// A packed key on the wire: our region token, then UCX's packed rkey.
inline constexpr size_t k_token_bytes = sizeof(uint64_t);

class UcxRemoteKey final : public RemoteKey {
 public:
  UcxRemoteKey(std::shared_ptr<Endpoint> ep, ucp_rkey_h key, uint64_t token)
      : m_ep(std::move(ep)), m_key(key), m_token(token) {}
  ~UcxRemoteKey() override { ucp_rkey_destroy(m_key); }
  std::shared_ptr<Endpoint> m_ep;  // keys go before their endpoint
  ucp_rkey_h m_key;
  uint64_t m_token;
  // Operations on this region go as request/reply messages (see connect()).
  bool m_messages = false;
};

uint64_t cpu_atomic(uint64_t* word, AtomicOp op, uint64_t operand, uint64_t compare);

// Registered regions by base address, for checking message requests: the
// range must lie inside the region whose token the request carries (the
// token came with the key, so holding a key to one region gives nothing of
// another).
class RegionTable {
 public:
  void add(uint64_t base, uint64_t length, MemoryKind kind, uint64_t token) {
    std::lock_guard lock(m_lock);
    m_regions[base] = {length, kind, token};
  }
  void remove(uint64_t base) {
    std::lock_guard lock(m_lock);
    m_regions.erase(base);
  }
  Refusal check(uint64_t address, uint64_t length, uint64_t token) const {
    std::lock_guard lock(m_lock);
    auto it = m_regions.upper_bound(address);
    if (it == m_regions.begin()) return Refusal::unregistered;
    --it;
    if (address + length < address || address + length > it->first + it->second.length) return Refusal::unregistered;
    if (it->second.token != token) return Refusal::unregistered;
    if (it->second.kind != MemoryKind::host) return Refusal::not_host;
    return Refusal::none;
  }

 private:
  struct Entry {
    uint64_t length;
    MemoryKind kind;
    uint64_t token;
  };
  mutable std::mutex m_lock;
  std::map<uint64_t, Entry> m_regions;
};

class UcxRegion final : public RegisteredRegion {
 public:
  UcxRegion(ucp_context_h context, ucp_mem_h memh, std::string key, uint64_t base, uint64_t length,
            RegionTable& table, MemoryKind kind, uint64_t token)
      : m_context(context), m_memh(memh), m_key(std::move(key)), m_base(base), m_length(length), m_table(table) {
    m_table.add(base, length, kind, token);
  }
  ~UcxRegion() override {
    m_table.remove(m_base);
    ucp_mem_unmap(m_context, m_memh);
  }
  const std::string& packed_key() const override { return m_key; }
  uint64_t base() const override { return m_base; }
  uint64_t length() const override { return m_length; }

 private:
  ucp_context_h m_context;
  ucp_mem_h m_memh;
  std::string m_key;
  uint64_t m_base;
  uint64_t m_length;
  RegionTable& m_table;
};

class UcxBatch final : public Batch {
 public:
  size_t pending() const override { return m_requests.size() + (m_messages.size() - m_done); }
  struct Pending {
    void* request;
    UcxEndpoint* ep;
  };
  std::vector<Pending> m_requests;
  std::deque<uint64_t> m_operands;  // atomic operands live until completion
  // Message operations in issue order; a fence waits until all are answered.
  std::vector<std::unique_ptr<MessageOp>> m_messages;
  std::vector<bool> m_is_done;
  size_t m_done = 0;  // how many are done
  Status m_error;     // the first failure seen by a fence, reported by wait()
  void clear() {
    m_requests.clear();
    m_operands.clear();
    m_messages.clear();
    m_is_done.clear();
    m_done = 0;
  }
};

class UcxTransport final : public Transport {
 public:
  ~UcxTransport() override;
  Status init(const UcxOptions& options);
  std::string name() const override { return "ucx"; }
  const std::string& address() const override { return m_address; }

  Result<std::unique_ptr<RegisteredRegion>> register_region(void* base, size_t length,
                                                            MemoryKind kind) override;
  Result<std::shared_ptr<Endpoint>> connect(std::string_view address) override;
  Result<std::shared_ptr<RemoteKey>> unpack(const std::shared_ptr<Endpoint>& endpoint, std::string_view packed,
                                            uint64_t base) override;
  std::unique_ptr<Batch> batch() override { return std::make_unique<UcxBatch>(); }

  Status get(Batch& batch, Endpoint& ep, void* dst, size_t length, uint64_t remote_addr,
             RemoteKey& key) override;
  Status put(Batch& batch, Endpoint& ep, const void* src, size_t length, uint64_t remote_addr,
             RemoteKey& key) override;
  Status atomic(Batch& batch, Endpoint& ep, AtomicOp op, uint64_t operand, uint64_t compare,
                uint64_t remote_addr, RemoteKey& key, uint64_t* result) override;
  Status fence(Batch& batch, std::chrono::milliseconds timeout) override;
  Status wait(Batch& batch, std::chrono::milliseconds timeout) override;
  Status flush(Endpoint& ep, std::chrono::milliseconds timeout) override;
  bool progress() override { return ucp_worker_progress(m_worker) != 0; }
  void check_while_waiting(WaitCheck check, std::chrono::milliseconds interval) override {
    m_wait_check = std::move(check);
    m_check_interval = interval;
  }
    void on_failure(FailureHandler handler) override {
    std::lock_guard lock(m_failure_mutex);  // waits out a handler running now
    m_on_failure = std::move(handler);
  }
  // An endpoint's peer failed (UcxEndpoint::on_error).
  void report_failure(const UcxEndpoint& ep, ucs_status_t status);

  // Closes an endpoint, waiting (bounded) for UCX to let go of it.
  void close_endpoint(ucp_ep_h ep, bool force);
  std::string describe(ucp_ep_h ep);

 private:
  static Status peer_failed() {
    return Status(ErrorCode::transport_error, "the peer's endpoint failed (peer down or unreachable)");
  }

  Status track(Batch& batch, UcxEndpoint& ep, ucs_status_ptr_t request, const char* what);

  // Progresses until the batch's operations (only its messages, or all)
  // are done; failures go to b.m_error. On timeout the batch is abandoned.
  Status drive(UcxBatch& b, std::chrono::milliseconds timeout, bool messages_only);
  Status hello(UcxEndpoint& ep);

  // The endpoint answers to `origin` go on, opened on its hello.
  ucp_ep_h answer_ep(uint64_t origin);

  // A new endpoint for every hello: the asker reconnects after its old
  // connection failed (a partition, say), and the old endpoint with it.
  ucp_ep_h open_answer_ep(uint64_t origin, const void* address);

  // What a timed-out batch was waiting for, for the error message.
  std::string unfinished(UcxBatch& b);

  // Frees the batch's completed UCX requests; true while some are left.
  bool reap_requests(UcxBatch& b, Status& result);

  // Collects the batch's answered message operations and sends those a fence
  // held back once everything before it is done; true while some are left.
  bool reap_messages(UcxBatch& b, Status& result);
  Status issue(Batch& batch, UcxEndpoint& ep, std::unique_ptr<MessageOp> op);
  void send_message(MessageOp& op);

  // Sends (or sends again) a request; the answer is matched by its id.
  void post_request(MessageOp& op);

  // Closes the endpoints of unfinished operations so UCX completes (cancels)
  // them and never writes the caller's buffers after wait() returns.
  void abandon(UcxBatch& b);

  // --- the answering side and the answers -------------------------------------

  // A request from a peer: check it, run it on our memory, answer.
  static ucs_status_t on_request(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                 const ucp_am_recv_param_t* param);

  struct PutLanding {
    UcxTransport* self;
    ucp_ep_h ep;
    MessageReply reply;
  };
  static void on_put_landed(void* request, ucs_status_t status, size_t, void* user_data);

  // Answers on `ep`; a dead peer only fails the send, which is dropped.
  void send_reply(ucp_ep_h ep, const MessageReply& reply, const void* data, size_t length);

  // An answer to one of our requests.
  static ucs_status_t on_reply(void* arg, const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param);
  static void on_reply_landed(void* request, ucs_status_t status, size_t, void* user_data);

  // Closes answer endpoints replaced or forgotten since the last call (not
  // from inside a callback, where they are replaced), and frees the closes
  // that finished.
  void close_replaced_answer_eps();
  // Answers peers: progress while there is work, otherwise sleep on the
  // worker's event fd. A short spin before sleeping keeps request/response
  // latency low without burning a core when idle.
  void progress_loop(int efd);

  ucp_context_h m_context = nullptr;
  ucp_worker_h m_worker = nullptr;
  std::string m_address;
  std::thread m_progress;
  std::atomic<bool> m_stop{false};
  std::atomic<bool> m_peer_errors{true};  // endpoints with peer failure detection
  std::mutex m_failure_mutex;             // held while the handler runs
  FailureHandler m_on_failure;
  WaitCheck m_wait_check;
  std::chrono::milliseconds m_check_interval{100};
  // Runs m_wait_check on the endpoints `b` waits on; its first error.
  Status check_waiting(UcxBatch& b);
  bool m_use_messages = true;
  RegionTable m_regions;
  // Message operations awaiting their answer, by id. Recursive: UCX may call
  // back into us from inside a call we make while holding it.
  std::recursive_mutex m_ops_lock;
  std::unordered_map<uint64_t, MessageOp*> m_ops;
  uint64_t m_next_op = 0;
  uint64_t m_origin = 0;  // random, names this transport in requests
  // Endpoints to the workers that said hello, by origin; the oldest are
  // closed beyond k_origins_remembered (m_closing, from the progress side).
  std::mutex m_origins_lock;
  std::unordered_map<uint64_t, ucp_ep_h> m_origin_eps;
  std::deque<uint64_t> m_origin_order;
  std::vector<ucp_ep_h> m_closing;
  std::vector<void*> m_close_requests;  // progress thread only
  static constexpr size_t k_origins_remembered = 4096;
  static constexpr std::chrono::milliseconds k_resend_after{500};
  // Atomics run for peers, by (origin, id), so a request asked again is not
  // run twice; the oldest are forgotten.
  struct PairHash {
    size_t operator()(const std::pair<uint64_t, uint64_t>& p) const { return p.first ^ (p.second * 0x9e3779b97f4a7c15ull); }
  };
  std::mutex m_atomics_lock;
  std::unordered_map<std::pair<uint64_t, uint64_t>, uint64_t, PairHash> m_atomics_done;
  std::deque<std::pair<uint64_t, uint64_t>> m_atomics_order;
  static constexpr size_t k_atomics_remembered = 1 << 16;
  int m_wake_fd = -1;
  int m_efd = -1;  // the worker's event fd
  // Empty progress calls before wait() sleeps on the event fd: a few
  // microseconds, so round trips on a fast fabric never sleep.
  static constexpr unsigned k_spins_before_sleep = 256;
};

}  // namespace tiermem::ucx_detail
