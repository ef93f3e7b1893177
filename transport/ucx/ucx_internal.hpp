// Internals of the UCX transport, shared by its three parts:
//   ucx_transport.cpp   context, worker, regions, endpoints, the answer
//                       endpoints and the progress thread
//   ucx_operations.cpp  get/put/atomic/fence/wait on the asking side: native
//                       UCX, direct on a mapped peer segment, or as messages
//   ucx_answers.cpp     the target side of messages: check, run, answer
// Nothing here is part of the transport's interface (transport.hpp).
#pragma once

#include <algorithm>
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
#include <unordered_set>
#include <vector>

#include <sys/socket.h>

#include <ucp/api/ucp.h>

#include "transport/answer_records.hpp"
#include "transport/message_batch.hpp"
#include "transport/message_sequence.hpp"
#include "transport/message_target.hpp"
#include "transport/message_wire.hpp"
#include "transport/staging_pool.hpp"
#include "transport/transport.hpp"
#include "transport/wait_policy.hpp"

namespace tiermem::ucx_detail {

// What every fabric shares (transport/), under the names the UCX code uses.
using transport_detail::AnswerRecords;
using transport_detail::answer_status;
using transport_detail::make_op;
using transport_detail::run_request;
using transport_detail::TargetAnswer;
using transport_detail::SpinPolicy;
using transport_detail::StagingBuffer;
using transport_detail::StagingPool;
using transport_detail::Waiter;

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
  // Connected through a peer's listener (UcxOptions::listen_ip): answers
  // come on the reply endpoint, every request carries m_admission, and keys
  // are one-sided only when every lane is RDMA (m_rdma).
  bool m_listener = false;
  bool m_rdma = false;
  uint64_t m_admission = 0;
};

// --- request/reply messages (headers in transport/message_wire.hpp) --------
//
// Small requests and answers go eager; large ones by rendezvous over TCP (the
// receiver's buffers are posted first, and the bytes land in them: a large
// get's straight in the asker's buffer, a large put's in a staging buffer at
// the target, which runs the message only once all of it has arrived, so an
// asker that dies mid-send leaves nothing half-done). The target copies the
// bytes of a message's gets out of its memory while it runs the message, not
// when they are sent, so a read of words, bytes and words again is one
// snapshot.
// Over shared memory, answers go on an endpoint the target itself opened to
// the asking worker (whose address came in the connection's hello), not on
// UCX's reply endpoint: UCX 1.13 over shared memory sometimes resolves that to
// an endpoint to another peer, and the answer lands in the wrong process; and
// everything goes eager there (a rendezvous would have the target pull the
// bytes from the asker's buffer with process_vm_readv, which UCX treats as
// fatal when the buffer went away after a timeout).
// Over TCP answers go on the reply endpoint (k_answer_on_reply_ep): an endpoint
// the target opens itself means a new TCP connection to the asker, and when
// the asker has just died, UCX 1.13 fails that connection's wire-up with an
// assertion that aborts the target (ucp_request_send_state_ff, "got REP
// message").
//
// hello: by worker address its payload is the asking worker's address, to
// which the target connects to answer over shared memory; through a listener
// it has none (answers go on the reply endpoint) and it admits the connection
// (its header's token). sequence: the operations go in UCX's header after
// ours when they fit (k_ops_in_header; the payload is then the puts' bytes
// alone, one contiguous buffer for a single put, which a rendezvous sends
// without a copy; UCX 1.13 sends a scattered buffer by rendezvous at a third
// of the speed).

constexpr uint16_t k_request_id = 41;
constexpr uint16_t k_reply_id = 42;
constexpr uint16_t k_answer_on_reply_ep = 1;  // MessageRequest::flags: the bit message_wire.hpp leaves to the fabric

using sequence::Refusal;
using transport_detail::k_message_magic;
using transport_detail::k_ops_in_header;
using transport_detail::k_reply_aborted;
using transport_detail::MessageKind;
using transport_detail::MessageReply;
using transport_detail::MessageRequest;

// One message in flight. Owned by its batch; the fields after `sent` are
// shared with the progress callbacks under UcxTransport::m_ops_lock.
struct MessageOp {
  MessageRequest header;
  std::vector<std::byte> head;         // what goes as UCX's header: ours, and the operations when they fit
  UcxEndpoint* ep = nullptr;
  Waiter* waiter = nullptr;            // the thread waiting for it
  std::vector<sequence::Op> ops;
  std::vector<ucp_dt_iov_t> payload;   // the operations unless in the header, then each put's bytes
  std::vector<std::byte> gathered;     // the payload in one piece, when it was several (UcxTransport::gather)
  size_t put_bytes = 0;
  size_t get_bytes = 0;
  std::vector<void*> dst;              // per operation: a get's destination
  std::vector<uint64_t*> result;       // per operation: where its old value goes
  std::vector<uint64_t> words;         // the answer's words land here
  std::vector<ucp_dt_iov_t> landing;   // a rendezvous answer: words, then each get's destination
  bool sent = false;
  std::chrono::steady_clock::time_point sent_at;
  int resends = 0;
  void* send_request = nullptr;
  void* recv_request = nullptr;  // a rendezvous answer landing
  bool replied = false;
  ucs_status_t status = UCS_OK;
  Refusal refusal = Refusal::none;
  uint32_t refused_op = 0;
  uint32_t ran = 0;
  bool aborted = false;
};

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

class UcxRegion final : public RegisteredRegion {
 public:
  UcxRegion(ucp_context_h context, ucp_mem_h memh, std::string key, uint64_t base, uint64_t length,
            sequence::RegionTable& table, MemoryKind kind, uint64_t token)
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
  sequence::RegionTable& m_table;
};

class UcxBatch final : public transport_detail::MessageBatch<MessageOp, UcxEndpoint> {
 public:
  // Operations not completed yet.
  size_t pending() const override { return m_requests.size() + pending_messages(); }
  struct Pending {
    void* request;
    UcxEndpoint* ep;
  };
  std::vector<Pending> m_requests;
  std::deque<uint64_t> m_operands;  // atomic operands live until completion
  void clear() {
    m_requests.clear();
    m_operands.clear();
    clear_messages();
  }
};

class UcxTransport final : public Transport {
 public:
  UcxTransport() : m_spin(std::chrono::microseconds(50)), m_idle_spin(std::chrono::microseconds(50)) {}
  ~UcxTransport() override;
  Status init(const UcxOptions& options);
  std::string name() const override { return "ucx"; }
  const std::string& address() const override { return m_address; }

  Result<std::unique_ptr<RegisteredRegion>> register_region(void* base, size_t length,
                                                            MemoryKind kind) override;
  Result<std::shared_ptr<Endpoint>> connect(std::string_view address) override;
  Result<std::shared_ptr<RemoteKey>> unpack(const std::shared_ptr<Endpoint>& endpoint, std::string_view packed,
                                            uint64_t base) override;
  bool one_sided(const RemoteKey& key) const override { return !static_cast<const UcxRemoteKey&>(key).m_messages; }
  std::unique_ptr<TransportBatch> batch() override { return std::make_unique<UcxBatch>(); }

  Status get(TransportBatch& batch, Endpoint& ep, void* dst, size_t length, uint64_t remote_addr,
             RemoteKey& key) override;
  Status put(TransportBatch& batch, Endpoint& ep, const void* src, size_t length, uint64_t remote_addr,
             RemoteKey& key) override;
  Status atomic(TransportBatch& batch, Endpoint& ep, AtomicOp op, uint64_t operand, uint64_t compare,
                uint64_t remote_addr, RemoteKey& key, uint64_t* result) override;
  Status add_if(TransportBatch& batch, Endpoint& ep, WordCondition condition, uint64_t add, uint64_t undo,
                uint64_t remote_addr, RemoteKey& key, uint64_t* old) override;
  Status persist(TransportBatch& batch, Endpoint& ep, uint64_t remote_addr, size_t length, RemoteKey& key) override;
  Status end_group(TransportBatch& batch, Endpoint& ep, uint64_t* stopped) override;
  Status barrier(TransportBatch& batch, Endpoint& ep, uint64_t* stopped) override;
  Status reserve(TransportBatch& batch, Endpoint& ep, size_t ops, size_t put_bytes, size_t get_bytes) override;
  void send(TransportBatch& batch) override;
  Status fence(TransportBatch& batch, std::chrono::milliseconds timeout) override;
  Status wait(TransportBatch& batch, std::chrono::milliseconds timeout) override;
  Status flush(Endpoint& ep, std::chrono::milliseconds timeout) override;
  bool progress() override { return ucp_worker_progress(m_worker) != 0; }
  uint64_t requests_sent() const override { return m_requests_sent.load(std::memory_order_relaxed); }
  AdmissionReport take_admission_report() override;
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
  // --- the listener (UcxOptions::listen_ip) ------------------------------------
  Status listen(const std::string& ip);
  Result<std::shared_ptr<Endpoint>> connect_listener(std::string_view address);
  // A connection request: queued here, accepted by the progress thread.
  static void on_conn_request(ucp_conn_request_h request, void* arg);
  void accept_pending();
  // An accepted endpoint's peer failed, or it presented a wrong token, or it
  // said nothing for k_admission_window: closed (from the progress thread).
  static void on_accepted_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  // `tell_peer`: a live peer's connection (past its window), closed so that
  // it hears; else a failed one, closed at once.
  void drop_accepted(ucp_ep_h ep, bool tell_peer);
  void admit(ucp_ep_h ep);
  // Closes accepted endpoints that did not say hello in time; true while
  // some wait for theirs.
  bool expire_unadmitted();
  // Connections accepted on the listener's port that never became a
  // connection request (bare TCP: UCX's connection manager holds each
  // without a bound, and at its destruction UCX 1.13 crashes on them): shut
  // down once older than k_admission_window, or all of them and every
  // unadmitted one when `everything` (before the listener goes). UCX then
  // drops them through its own error path. Progress thread only; a look at
  // most every second unless `everything`. Returns how many it shut down.
  size_t reap_unproven(bool everything);

  static Status peer_failed() {
    return Status(ErrorCode::transport_error, "the peer's endpoint failed (peer down or unreachable)");
  }

  Status track(TransportBatch& batch, UcxEndpoint& ep, ucs_status_ptr_t request, const char* what);
  // The request parameters of a one-sided operation: its completion wakes
  // the waiting thread.
  static ucp_request_param_t one_sided_param();

  // Progresses until the batch's operations are done (polling, then sleeping
  // until the fabric or another thread wakes this one; see wait_policy.hpp);
  // failures go to *error. On timeout the batch is abandoned.
  Status drive(UcxBatch& b, std::chrono::milliseconds timeout, Status* error);
  // Sleeps until the worker has news or this thread is woken, at most until
  // `until`; false when the batch turned out to be done first.
  bool sleep(UcxBatch& b, Waiter& waiter, std::chrono::steady_clock::time_point until, Status* error);
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

  // Collects the batch's answered messages (sending again those unanswered
  // for long); true while some are left.
  bool reap_messages(UcxBatch& b, Status& result);
  // Adds an operation to the open message of `ep`.
  Status add_op(TransportBatch& batch, UcxEndpoint& ep, const sequence::Op& op, const void* src, void* dst, uint64_t* result);
  // Sends every open message of the batch.
  void send_open(UcxBatch& b);
  void send_message(MessageOp& op);
  Status issue(UcxBatch& b, UcxEndpoint& ep, std::unique_ptr<MessageOp> op);

  // Sends (or sends again) a request; the answer is matched by its id.
  void post_request(MessageOp& op);
  // Copies a payload of several pieces into one (MessageOp::gathered).
  static void gather(MessageOp& op);
  static constexpr size_t k_gather_bytes = 4 << 20;

  // Closes the endpoints of unfinished operations so UCX completes (cancels)
  // them and never writes the caller's buffers after wait() returns.
  void abandon(UcxBatch& b);

  // --- the answering side and the answers -------------------------------------

  // A request from a peer: check it, run it on our memory, answer.
  static ucs_status_t on_request(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                 const ucp_am_recv_param_t* param);
  // Checks and runs a whole message (its operations, the puts' bytes), and
  // answers.
  void run_message(ucp_ep_h ep, const MessageRequest& h, std::vector<sequence::Op> ops, const std::byte* puts,
                   size_t length, bool shared);

  // A large request's payload landing in a staging buffer.
  struct Landing {
    UcxTransport* self;
    ucp_ep_h ep;
    MessageRequest header;
    std::vector<sequence::Op> ops;  // from the header; else at the start of `bytes`
    StagingBuffer bytes;
    bool shared;
  };
  static void on_request_landed(void* request, ucs_status_t status, size_t, void* user_data);

  // Answers on `ep`; a dead peer only fails the send, which is dropped.
  // `answer` (results, then the gets' bytes) goes back to the pool once sent.
  void send_reply(ucp_ep_h ep, const MessageReply& reply, StagingBuffer answer, size_t length, bool shared);

  // An answer to one of our requests.
  static ucs_status_t on_reply(void* arg, const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param);
  static void on_reply_landed(void* request, ucs_status_t status, size_t, void* user_data);
  // Hands an answer's words to the operations' result pointers.
  static void deliver_words(MessageOp& op);

  // Closes answer endpoints replaced or forgotten since the last call (not
  // from inside a callback, where they are replaced), and frees the closes
  // that finished.
  void close_replaced_answer_eps();
  // Answers peers: progress while requests come, sleep on the worker's event
  // fd without a timeout once none came for a while (m_idle_spin).
  void progress_loop(int efd);

  ucp_context_h m_context = nullptr;
  ucp_worker_h m_worker = nullptr;
  std::string m_address;         // what peers connect to: the listener's or the worker's
  std::string m_worker_address;  // for answer endpoints over shared memory (hello)
  ucp_listener_h m_listener = nullptr;
  sockaddr_storage m_listen_addr{};  // where it listens (ip and port)
  uint64_t m_admission = 0;  // 0: no listener, requests need no token
  // Admission: connections that have proven nothing yet (no hello with the
  // token) are held at most k_admission_window, at most k_per_source of them
  // per source (its address and, for a process of this host, its uid), and
  // at most m_max_unadmitted in all. A source over its budget loses its own
  // oldest; over the total, the source holding the most loses its oldest.
  // So one source flooding the port turns away only its own connections.
  struct Pending {
    ucp_conn_request_h request = nullptr;
    std::string source;  // "127.0.0.1 uid 1001", "10.0.0.7"
    std::chrono::steady_clock::time_point since;
    std::string peer;    // its address and port, "127.0.0.1:41234"
  };
  struct Accepted {
    std::chrono::steady_clock::time_point since;
    bool admitted = false;
    std::string source;
    std::string peer;
  };
  std::map<std::string, std::chrono::steady_clock::time_point> m_unproven_seen;  // by peer (progress thread)
  std::chrono::steady_clock::time_point m_last_reap;
  std::mutex m_accept_lock;
  std::vector<Pending> m_conn_requests;                  // waiting to be accepted
  // Requests turned away, not yet rejected. UCX 1.13's reject registers its
  // socket for writing and closes it at once; an event the async thread saw
  // meanwhile is replayed later on whatever connection got the descriptor's
  // number next, and a fresh one aborts the process (tcp_sockcm_ep.c:416,
  // fixed upstream in UCX #11458). So a refused request's socket is shut
  // down first (refuse_pending) and rejected only once UCX has seen it fail
  // (k_refusal_settle later, past a progress): a failed one is rejected
  // without writing.
  std::vector<Pending> m_refusing;                       // to be shut down (under m_accept_lock)
  std::vector<Pending> m_refused;                        // shut down at .since (progress thread)
  static constexpr std::chrono::milliseconds k_refusal_settle{20};
  std::unordered_map<ucp_ep_h, Accepted> m_accepted;     // endpoints made from them
  std::unordered_set<ucp_ep_h> m_admitted_early;         // said hello before they were listed
  std::unordered_map<std::string, size_t> m_unadmitted_by;  // per source: pending and accepted, not admitted
  std::map<std::string, uint64_t> m_turned_away;         // per source, since take_admission_report
  std::atomic<size_t> m_unadmitted{0};
  size_t m_max_unadmitted = 4096;
  static constexpr std::chrono::milliseconds k_admission_window{2000};
  static constexpr size_t k_per_source = 64;
  // The source of a connection request (under no lock: a netlink lookup),
  // and its peer's address and port into *peer.
  std::string source_of(ucp_conn_request_h request, std::string* peer) const;
  // Takes the oldest unadmitted connection of `source` off the lists (caller
  // holds m_accept_lock): a pending request into m_refusing, or an accepted
  // endpoint into *drop. False when `source` has none that can be taken.
  bool evict_oldest_locked(const std::string& source, std::vector<ucp_ep_h>* drop);
  // Shuts down the sockets of requests turned away and rejects those shut
  // down k_refusal_settle ago (progress thread; see m_refusing). True while
  // some wait.
  bool refuse_pending();
  // Every socket accepted on the listener's port: fn(fd, its peer), on a
  // copy of the descriptor that keeps the socket it names.
  template <typename Fn>
  void for_each_listener_socket(Fn&& fn);
  // One fewer unadmitted connection of `source` (caller holds m_accept_lock).
  void uncount_locked(const std::string& source);
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
  sequence::RegionTable m_regions;
  // Message operations awaiting their answer, by id. Recursive: UCX may call
  // back into us from inside a call we make while holding it.
  std::recursive_mutex m_ops_lock;
  std::unordered_map<uint64_t, MessageOp*> m_ops;
  uint64_t m_next_op = 0;
  std::atomic<uint64_t> m_requests_sent{0};
  uint64_t m_origin = 0;  // random, names this transport in requests
  // Endpoints to the workers that said hello, by origin; the oldest are
  // closed beyond k_origins_remembered (m_closing, from the progress side).
  std::mutex m_origins_lock;
  std::unordered_map<uint64_t, ucp_ep_h> m_origin_eps;
  std::deque<uint64_t> m_origin_order;
  std::vector<ucp_ep_h> m_closing;
  std::vector<ucp_ep_h> m_disconnecting;  // closed telling the peer (listener connections past their window)
  std::vector<void*> m_close_requests;  // progress thread only
  static constexpr size_t k_origins_remembered = 4096;
  static constexpr std::chrono::milliseconds k_resend_after{500};
  // After a `busy` refusal (the target's staging memory was in use).
  static constexpr std::chrono::milliseconds k_busy_retry{2};
  // A message with effects is run once, however often it is asked.
  AnswerRecords m_records;
  // Staging memory for large requests' payloads, in all: a request beyond it
  // is refused `busy` (the asker asks again shortly).
  std::atomic<size_t> m_staged{0};
  static constexpr size_t k_staging_limit = 256 << 20;
  // Messages (and answers) up to this many bytes go eager; larger ones by
  // rendezvous, except over shared memory. Over TCP on one host a 64 KiB
  // answer took 35 us eager and 50 us by rendezvous (whose handshake is a
  // round trip more); at 1 MiB rendezvous was the faster (285 us against
  // 305-335), its bytes landing in the asker's buffer without a copy.
  static constexpr size_t k_eager_limit = 128 << 10;
  StagingPool m_pool;
  size_t m_max_header = sizeof(MessageRequest);  // UCX's limit on an active message's header
  int m_wake_fd = -1;
  int m_efd = -1;  // the worker's event fd
  SpinPolicy m_spin;       // waiting threads
  SpinPolicy m_idle_spin;  // the progress thread between requests
};

}  // namespace tiermem::ucx_detail
