// Internals of the libfabric transport (transport.hpp: OfiOptions), in three
// parts:
//   ofi_transport.cpp   fabric, domain, endpoint, capability checks; regions,
//                       addresses, connections (hello), keys
//   ofi_operations.cpp  the asking side: operations collected into messages,
//                       sent, waited for (poll, then sleep), abandoned
//   ofi_answers.cpp     the completion queue, the target side of messages
//                       (check, run, answer) and the progress thread
// Design and what was verified of each provider: docs/design/libfabric.md.
//
// Everything travels as tagged messages on one reliable-datagram (FI_EP_RDM)
// endpoint per transport:
//   request  tag 0: OfiHead, the operations, and the puts' bytes when all of
//            it fits a posted request buffer (k_request_buffer);
//   payload  tag k_tag_payload | id: the puts' bytes of a larger request, sent
//            right after it; the target posts a receive for them into staging
//            memory and runs the request once all of it has arrived (an asker
//            that dies mid-send leaves nothing half-done);
//   answer   tag k_tag_answer | id: MessageReply, the words, the gets' bytes,
//            into a receive the asker posted before it sent the request.
// Receives name their peer (FI_DIRECTED_RECV) where the provider offers it.
// Nothing the provider may still write or read after a wait gave up is the
// caller's memory: puts are copied into the message, answers land in its
// staging and are copied out by the waiting thread, and an abandoned message
// waits in quarantine until the provider has let go of its buffers.
#pragma once

#include <poll.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transport/answer_records.hpp"
#include "transport/message_batch.hpp"
#include "transport/message_sequence.hpp"
#include "transport/message_target.hpp"
#include "transport/message_wire.hpp"
#include "transport/staging_pool.hpp"
#include "transport/transport.hpp"
#include "transport/wait_policy.hpp"

namespace tiermem::ofi_detail {

using sequence::Op;
using sequence::OpKind;
using sequence::Refusal;
using transport_detail::AnswerRecords;
using transport_detail::k_message_magic;
using transport_detail::k_ops_in_header;
using transport_detail::k_reply_aborted;
using transport_detail::MessageKind;
using transport_detail::MessageReply;
using transport_detail::MessageRequest;
using transport_detail::SpinPolicy;
using transport_detail::StagingBuffer;
using transport_detail::StagingPool;
using transport_detail::Waiter;

constexpr uint64_t k_tag_request = 0;
constexpr uint64_t k_tag_payload = uint64_t{1} << 62;
constexpr uint64_t k_tag_answer = uint64_t{2} << 62;
constexpr uint64_t k_id_mask = (uint64_t{1} << 62) - 1;

// What a request starts with: our message header and where its puts are.
struct OfiHead {
  MessageRequest request;
  uint64_t payload_bytes = 0;  // the puts' bytes, sent as a payload message (0: after the operations)
};
static_assert(sizeof(OfiHead) == 48);  // the wire format

// Puts up to this many bytes go in the request itself.
constexpr size_t k_inline_puts = 64 << 10;
constexpr size_t k_request_buffer = sizeof(OfiHead) + sequence::k_max_ops * sizeof(Op) + k_inline_puts;
constexpr size_t k_request_buffers = 8;
constexpr size_t k_name_max = 256;  // an endpoint's name (fi_getname), in a hello

Status ofi_error(const std::string& what, int rc);

// Whether a completion error says the peer is gone or unreachable (as
// opposed to an operation it refused).
bool peer_failed(int error, int prov_errno);

// OfiOptions::one_sided, validated ("auto", "off", "unchecked").
std::string one_sided_mode(const OfiOptions& options);
// Whether the provider's hardware checks the keys of one-sided operations
// (efa, verbs, cxi), which tiermem requires of a one-sided path.
bool checks_keys(const std::string& provider);

// The first member of everything whose address goes to libfabric as an
// operation's context: the completion finds its owner by it.
enum class ContextKind : uint8_t {
  request_buffer, landing, answer_send, ping, rma, message_send, message_payload, message_answer
};
struct OfiContext {
  fi_context2 fi{};
  ContextKind kind;
  void* owner = nullptr;
};

class OfiTransport;

class OfiEndpoint final : public Endpoint, public std::enable_shared_from_this<OfiEndpoint> {
 public:
  OfiEndpoint(OfiTransport& owner, fi_addr_t addr, uint64_t admission, int pidfd)
      : m_owner(owner), m_addr(addr), m_admission(admission), m_pidfd(pidfd) {}
  ~OfiEndpoint() override;
  bool failed() const override { return m_failed.load(std::memory_order_acquire); }
  std::string transports() const override;
  // Whether the peer process is known to have exited (shm: its pidfd).
  bool exited() const {
    pollfd p{m_pidfd, POLLIN, 0};
    return m_pidfd >= 0 && ::poll(&p, 1, 0) > 0;
  }
  static constexpr const char* k_exited = "the peer process exited (shm reports no error for it)";

  OfiTransport& m_owner;
  const fi_addr_t m_addr;
  const uint64_t m_admission;  // the peer's token, in every request
  // The peer process, over shared memory (shm reports no error when a peer
  // dies: its operations never complete): readable once it exited.
  const int m_pidfd;
  std::atomic<bool> m_failed{false};
  // A ping is in flight (OfiTransport::ping).
  std::atomic<bool> m_pinging{false};
  // Since when sends to it are refused (-FI_EAGAIN); under the transport's m_lock.
  std::chrono::steady_clock::time_point m_blocked_since;
};

class OfiRemoteKey final : public RemoteKey {
 public:
  OfiRemoteKey(std::shared_ptr<Endpoint> ep, uint64_t token) : m_ep(std::move(ep)), m_token(token) {}
  std::shared_ptr<Endpoint> m_ep;
  uint64_t m_token;
  // One-sided (ofi_one_sided.cpp): the provider's key, and what is taken
  // off an address for a provider that addresses regions by offset.
  bool m_one_sided = false;
  uint64_t m_key = 0;
  uint64_t m_offset_base = 0;
};

// A packed key: version, flags, the region's token (the message path), and
// the provider's key of its registration (one-sided; 0 without). Both ends
// run the same code: host order.
struct PackedKey {
  static constexpr uint8_t k_one_sided = 1;  // flags: registered with the provider
  uint8_t version = 1;
  uint8_t flags = 0;
  uint8_t reserved[6] = {};
  uint64_t token = 0;
  uint64_t key = 0;
};
static_assert(sizeof(PackedKey) == 24);

// A one-sided operation in flight: a read, a write or an atomic, with its
// own staging (the provider never touches the caller's memory: a read is
// copied out by the waiting thread, a write was copied in).
struct OfiRma {
  OfiContext ctx{{}, ContextKind::rma, this};
  OfiEndpoint* ep = nullptr;
  Waiter* waiter = nullptr;
  StagingBuffer staging;
  void* dst = nullptr;         // a read's destination
  uint64_t* result = nullptr;  // an atomic's old value
  uint64_t operand = 0;
  uint64_t compare = 0;
  uint64_t fetched = 0;
  std::chrono::steady_clock::time_point sent_at = std::chrono::steady_clock::now();
  bool reaped = false;  // the waiting thread's: copied out
  // Shared with the completion under OfiTransport::m_lock:
  bool done = false;
  bool abandoned = false;
  Status status;
};

class OfiRegion final : public RegisteredRegion {
 public:
  OfiRegion(std::string key, uint64_t base, uint64_t length, sequence::RegionTable& table, MemoryKind kind,
            uint64_t token, fid_mr* mr)
      : m_key(std::move(key)), m_base(base), m_length(length), m_table(table), m_mr(mr) {
    m_table.add(base, length, kind, token);
  }
  ~OfiRegion() override {
    m_table.remove(m_base);
    if (m_mr != nullptr) fi_close(&m_mr->fid);
  }
  const std::string& packed_key() const override { return m_key; }
  uint64_t base() const override { return m_base; }
  uint64_t length() const override { return m_length; }

 private:
  std::string m_key;
  uint64_t m_base;
  uint64_t m_length;
  sequence::RegionTable& m_table;
  fid_mr* m_mr;  // one-sided registration, or null
};

// One request in flight and its answer. Owned by its batch (or, abandoned,
// by the transport's quarantine); the fields from `outstanding` on are
// shared with the completions under OfiTransport::m_lock.
struct OfiMessage {
  OfiContext send_ctx{{}, ContextKind::message_send, this};
  OfiContext payload_ctx{{}, ContextKind::message_payload, this};
  OfiContext answer_ctx{{}, ContextKind::message_answer, this};
  OfiHead head;
  OfiEndpoint* ep = nullptr;
  Waiter* waiter = nullptr;
  std::vector<Op> ops;
  std::vector<const void*> src;   // per operation: a put's bytes (read when it is sent)
  std::vector<void*> dst;         // per operation: a get's destination
  std::vector<uint64_t*> result;  // per operation: where its word goes
  size_t put_bytes = 0;
  size_t get_bytes = 0;
  std::vector<std::byte> wire;     // the request: head, operations (hello: our name), inline puts
  std::vector<std::byte> payload;  // the puts' bytes when they go apart
  StagingBuffer answer;            // where the answer lands
  bool sent = false;
  std::chrono::steady_clock::time_point sent_at;
  // Shared with the completions:
  int outstanding = 0;  // posted operations (sends, the answer's receive) not completed
  bool answer_posted = false;
  bool cancel_asked = false;
  bool answered = false;
  size_t answer_length = 0;
  Status status;  // what the fabric said of a failed send or receive
  bool abandoned = false;
};

class OfiBatch final : public transport_detail::MessageBatch<OfiMessage, OfiEndpoint> {
 public:
  size_t pending() const override { return m_rma.size() - m_rma_done + pending_messages(); }
  std::vector<std::unique_ptr<OfiRma>> m_rma;  // one-sided operations, in issue order
  size_t m_rma_done = 0;                       // how many are completed
  void clear() {
    m_rma.clear();
    m_rma_done = 0;
    clear_messages();
  }
};

// A posted receive for requests.
struct RequestBuffer {
  OfiContext ctx{{}, ContextKind::request_buffer, this};
  std::unique_ptr<std::byte[]> bytes{new std::byte[k_request_buffer]};
};

// A large request whose puts are arriving into staging.
struct Landing {
  OfiContext ctx{{}, ContextKind::landing, this};
  fi_addr_t from = FI_ADDR_UNSPEC;
  MessageRequest request;
  std::vector<Op> ops;
  StagingBuffer bytes;
  bool discard = false;  // a refused request's payload, received only to drop it
  bool cancel_asked = false;
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
};

// A ping: a request the target drops (MessageKind::ping), sent to a peer
// whose answers are late. A posted receive learns nothing of a peer that
// died (tcp;ofi_rxm fails sends to it, never receives); the ping's send does.
struct Ping {
  OfiContext ctx{{}, ContextKind::ping, this};
  OfiHead head;
  std::weak_ptr<OfiEndpoint> ep;
};

// An answer being sent.
struct Sending {
  OfiContext ctx{{}, ContextKind::answer_send, this};
  fi_addr_t to = FI_ADDR_UNSPEC;
  MessageReply reply;
  StagingBuffer answer;
};

class OfiTransport final : public Transport {
 public:
  OfiTransport() : m_spin(std::chrono::microseconds(30)), m_idle_spin(std::chrono::microseconds(30)) {}
  ~OfiTransport() override;
  Status init(const OfiOptions& options);

  std::string name() const override { return "libfabric/" + m_provider; }
  const std::string& address() const override { return m_address; }
  Result<std::unique_ptr<RegisteredRegion>> register_region(void* base, size_t length, MemoryKind kind) override;
  Result<std::shared_ptr<Endpoint>> connect(std::string_view address) override;
  Result<std::shared_ptr<RemoteKey>> unpack(const std::shared_ptr<Endpoint>& endpoint, std::string_view packed,
                                            uint64_t base) override;
  bool one_sided(const RemoteKey& key) const override { return static_cast<const OfiRemoteKey&>(key).m_one_sided; }
  std::unique_ptr<TransportBatch> batch() override { return std::make_unique<OfiBatch>(); }

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
  void send(TransportBatch& batch) override { send_open(static_cast<OfiBatch&>(batch)); }
  Status fence(TransportBatch& batch, std::chrono::milliseconds timeout) override;
  Status wait(TransportBatch& batch, std::chrono::milliseconds timeout) override;
  Status flush(Endpoint& ep, std::chrono::milliseconds timeout) override;
  bool progress() override { return progress_once(); }
  uint64_t requests_sent() const override { return m_requests_sent.load(std::memory_order_relaxed); }
  void on_failure(FailureHandler handler) override {
    std::lock_guard lock(m_failure_mutex);
    m_on_failure = std::move(handler);
  }
  void check_while_waiting(WaitCheck check, std::chrono::milliseconds interval) override {
    m_wait_check = std::move(check);
    m_check_interval = interval;
  }

  // The endpoint's peer failed: marked, and the handler told (once).
  void report_failure(OfiEndpoint& ep, const std::string& why);
  const std::string& domain_name() const { return m_domain_name; }
  const std::string& provider() const { return m_provider; }
  const std::string& one_sided_why() const { return m_one_sided_why; }

 private:
  // --- ofi_transport.cpp
  Status open_fabric(const OfiOptions& options);
  Status hello(OfiEndpoint& ep);

  // --- ofi_operations.cpp: the asking side
  Status add_op(TransportBatch& batch, OfiEndpoint& ep, const Op& op, const void* src, void* dst, uint64_t* result);
  void send_open(OfiBatch& b);
  void send_message(OfiMessage& m);
  // Posts the answer's receive and the request (and its payload); failures
  // go to m.status.
  void post_message(OfiMessage& m);
  // Posts with `post` until the provider takes it (progressing between
  // tries, at most until `until`); its return code.
  ssize_t post_retrying(const std::function<ssize_t()>& post, std::chrono::steady_clock::time_point until);
  Status drive(OfiBatch& b, std::chrono::milliseconds timeout, Status* error);
  bool sleep(OfiBatch& b, Waiter& waiter, std::chrono::steady_clock::time_point until, Status* error);
  // Completes the batch's answered messages (copying answers out); true
  // while some are left.
  bool reap(OfiBatch& b, Status& result);
  void finish(OfiMessage& m, Status& result);
  Status check_waiting(OfiBatch& b);
  std::string unfinished(OfiBatch& b);
  void abandon(OfiBatch& b);

  // --- ofi_one_sided.cpp
  // Whether this transport's keys are one-sided, and why (not).
  void choose_one_sided(const OfiOptions& options, bool rma_caps);
  Result<fid_mr*> register_one_sided(void* base, size_t length, uint64_t* key);
  Status rma_get(OfiBatch& b, OfiEndpoint& ep, void* dst, size_t length, uint64_t remote_addr, OfiRemoteKey& key);
  Status rma_put(OfiBatch& b, OfiEndpoint& ep, const void* src, size_t length, uint64_t remote_addr,
                 OfiRemoteKey& key);
  Status rma_atomic(OfiBatch& b, OfiEndpoint& ep, AtomicOp op, uint64_t operand, uint64_t compare,
                    uint64_t remote_addr, OfiRemoteKey& key, uint64_t* result);
  // Completes the batch's finished one-sided operations (in order); true
  // while some are left.
  bool reap_rma(OfiBatch& b, Status& result);
  void complete_rma(OfiContext* ctx, int error, int prov_errno, const std::string& why);

  // --- ofi_answers.cpp: completions, the target side, progress
 public:
  bool progress_once();

 private:
  void complete(OfiContext* ctx, size_t length, int error, int prov_errno, const std::string& why);
  void complete_message(OfiContext* ctx, size_t length, int error, int prov_errno, const std::string& why);
  void run(fi_addr_t from, const MessageRequest& request, const std::vector<Op>& ops, const std::byte* puts,
           size_t length);
  void sweep_landings();
  void post_request_buffer(RequestBuffer* buffer);
  void on_request(const std::byte* data, size_t length);
  void on_hello(const OfiHead& head, const std::byte* name, size_t name_length);
  // Receives (and drops) the payload of a request refused before it came.
  void discard_payload(fi_addr_t from, uint64_t id);
  void answer(fi_addr_t to, const MessageReply& reply, StagingBuffer answer, size_t length);
  void refuse(fi_addr_t to, const MessageRequest& request, Refusal refusal);
  fi_addr_t origin_addr(uint64_t origin);
  // A post that the provider could not take yet (-FI_EAGAIN), retried after
  // the next completions; returns false while it still cannot. Called with
  // true once it is given up (k_post_give_up): it frees what it holds.
  void post_later(std::function<bool(bool)> post);
  bool run_deferred();
  void progress_loop();
  // Liveness of the peers `b` waits on: over shared memory their process
  // (OfiEndpoint::m_pidfd), else a ping to those whose answers are late.
  void check_peers(OfiBatch& b);
  // Reports the peers that exited among those watched by their pidfd (shm),
  // whether or not anything is asked of them: what UCX learns from a reset
  // connection, the daemon's health graph learns before a heartbeat.
  void watch_exits();
  // Target side over shm: the askers that said hello, watched by pid; the
  // address of one that exited is removed from the address vector once
  // nothing in flight names it, which unmaps its queue (shm maps every
  // peer's 16 MiB queue, and the memory of a queue its owner unlinked is
  // held as long as anyone maps it). Under m_origins_lock.
  void watch_asker(fi_addr_t addr, const std::byte* name, size_t name_length);
  void forget_dead_askers();
  void ping(OfiEndpoint& ep);

  std::string m_provider;
  std::string m_domain_name;
  std::string m_address;
  fi_info* m_info = nullptr;
  fid_fabric* m_fabric = nullptr;
  fid_domain* m_domain = nullptr;
  fid_cq* m_cq = nullptr;
  fid_av* m_av = nullptr;
  fid_ep* m_ep = nullptr;
  int m_cq_fd = -1;  // the completion queue's wait fd (tcp); -1: the provider has none (shm, efa, cxi)
  bool m_directed = false;  // FI_DIRECTED_RECV: receives name their sender
  // One-sided keys (ofi_one_sided.cpp): whether, why, and how the provider
  // addresses and keys regions.
  bool m_one_sided = false;
  std::string m_one_sided_why;
  bool m_virt_addr = false;
  bool m_prov_key = false;
  bool m_mr_endpoint = false;
  std::atomic<uint64_t> m_next_key{1};
  std::string m_name;       // fi_getname
  uint64_t m_admission = 0;
  uint64_t m_origin = 0;
  std::atomic<uint64_t> m_next_id{0};
  std::atomic<uint64_t> m_requests_sent{0};
  std::atomic<uint64_t> m_next_token{0};

  // OfiMessage's shared fields, and what the provider holds buffers of:
  // abandoned messages, payloads landing, answers being sent.
  std::mutex m_lock;
  std::unordered_map<OfiMessage*, std::unique_ptr<OfiMessage>> m_quarantine;
  std::unordered_map<OfiRma*, std::unique_ptr<OfiRma>> m_rma_quarantine;
  std::unordered_map<Landing*, std::unique_ptr<Landing>> m_landings;
  std::unordered_map<Sending*, std::unique_ptr<Sending>> m_sendings;
  std::unordered_map<Ping*, std::unique_ptr<Ping>> m_pings;
  // Endpoints with a pidfd (watch_exits); the progress thread's.
  std::mutex m_watch_lock;
  std::vector<std::weak_ptr<OfiEndpoint>> m_watched;
  // A message unanswered this long has its peer pinged (once per check).
  static constexpr std::chrono::milliseconds k_ping_after{300};
  static constexpr std::chrono::milliseconds k_ping_blocked{1000};
  // A payload that has not arrived by then (its asker died mid-send) is
  // given up: its receive cancelled, its staging freed.
  static constexpr std::chrono::seconds k_landing_timeout{30};

  std::mutex m_origins_lock;
  std::unordered_map<uint64_t, fi_addr_t> m_origins;  // askers that said hello, by origin
  std::deque<uint64_t> m_origin_order;
  static constexpr size_t k_origins_remembered = 4096;
  // shm only: each asker's pid, and one pidfd per pid (a process saying
  // hello again and again holds one descriptor of the daemon's, not one per
  // hello).
  struct AskerProcess {
    int pidfd = -1;
    std::chrono::steady_clock::time_point exited;  // zero while it runs
  };
  std::unordered_map<fi_addr_t, pid_t> m_askers;
  std::unordered_map<pid_t, AskerProcess> m_asker_processes;
  // After its exit, an asker's address stays this long (deferred posts
  // naming it have been given up: k_post_give_up) before it is removed.
  static constexpr std::chrono::seconds k_dead_asker_grace{10};

  std::vector<std::unique_ptr<RequestBuffer>> m_request_buffers;
  struct Deferred {
    std::function<bool(bool)> post;
    std::chrono::steady_clock::time_point since;
  };
  std::mutex m_deferred_lock;
  std::deque<Deferred> m_deferred;
  static constexpr std::chrono::seconds k_post_give_up{5};
  std::atomic<size_t> m_staged{0};
  static constexpr size_t k_staging_limit = 256 << 20;
  static constexpr std::chrono::milliseconds k_busy_retry{2};
  // Without a wait fd (shm, efa, cxi), how long a waiting thread or the
  // progress thread polls after the last news before it naps.
  static constexpr std::chrono::milliseconds k_no_fd_spin{1};

  sequence::RegionTable m_regions;
  AnswerRecords m_records;
  StagingPool m_pool;

  std::thread m_progress;
  std::atomic<bool> m_stop{false};
  int m_wake_fd = -1;
  std::mutex m_failure_mutex;
  FailureHandler m_on_failure;
  WaitCheck m_wait_check;
  std::chrono::milliseconds m_check_interval{100};
  SpinPolicy m_spin;
  SpinPolicy m_idle_spin;
};

}  // namespace tiermem::ofi_detail
