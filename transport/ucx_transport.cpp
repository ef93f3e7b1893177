// Transport over UCX's ucp API.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

#include "transport/transport.hpp"

namespace tiermem {
namespace {

// Set while connecting with peer failure detection on trial: UCX logs the
// refusal of transports that cannot detect failures as an error, but here it
// is an expected answer.
thread_local bool t_probing_error_mode = false;

// UCX logs to stdout by default, which would mix with a program's output (the
// bytes `tiermemctl read` prints, say). Its messages go to stderr instead.
ucs_log_func_rc_t log_to_stderr(const char* file, unsigned line, const char*, ucs_log_level_t level,
                                const ucs_log_component_config_t*, const char* message, va_list ap) {
  if (t_probing_error_mode) return UCS_LOG_FUNC_RC_STOP;
  char text[1024];
  std::vsnprintf(text, sizeof text, message, ap);
  std::fprintf(stderr, "UCX %s %s:%u: %s\n", ucs_log_level_names[level], file, line, text);
  return UCS_LOG_FUNC_RC_STOP;
}

Status ucx_error(const std::string& what, ucs_status_t status) {
  return Status(ErrorCode::transport_error, what + ": " + ucs_status_string(status));
}

class UcxTransport;
int descriptor_of(void* address);

class UcxEndpoint final : public Endpoint {
 public:
  UcxEndpoint(UcxTransport& owner) : m_owner(owner) {}
  ~UcxEndpoint() override;

  bool failed() const override { return m_failed.load(std::memory_order_acquire); }
  std::string transports() const override;

  static void on_error(void* arg, ucp_ep_h, ucs_status_t) {
    static_cast<UcxEndpoint*>(arg)->m_failed.store(true, std::memory_order_release);
  }

  UcxTransport& m_owner;
  ucp_ep_h m_ep = nullptr;
  std::atomic<bool> m_failed{false};
  // Every lane is TCP: no one-sided path at all (see transport.hpp).
  bool m_messages = false;
  // Every lane is shared memory: one-sided only into memory UCX allocated
  // (which the peer maps); see unpack().
  bool m_shared = false;
};

// --- request/reply messages --------------------------------------------------
//
// A request names an address in one of the target's registered regions; the
// target checks it, runs the operation on its memory and replies with the
// request's id. Both sides run the same code, so headers are in host order.
// Answers go on an endpoint the target itself opened to the asking worker
// (whose address came in the connection's hello), not on UCX's reply
// endpoint: UCX 1.13 over shared memory sometimes resolves that to an
// endpoint to another peer, and the answer lands in the wrong process.

constexpr uint16_t k_request_id = 41;
constexpr uint16_t k_reply_id = 42;
constexpr uint32_t k_message_magic = 0x544d5251;  // "QRMT"

// hello: the first request on a connection; its payload is the asking
// worker's address, to which the target connects to answer.
enum class MessageKind : uint8_t { get = 1, put = 2, atomic = 3, hello = 4 };

// Why the target refused.
enum class Refusal : int32_t { none = 0, unregistered = 1, unaligned = 2, not_host = 3, malformed = 4 };

struct MessageRequest {
  uint32_t magic = k_message_magic;
  MessageKind kind = MessageKind::get;
  uint8_t op = 0;  // AtomicOp
  uint16_t reserved = 0;
  uint64_t id = 0;
  uint64_t address = 0;
  uint64_t length = 0;
  uint64_t operand = 0;
  uint64_t compare = 0;
  uint64_t origin = 0;  // the asking transport (random): with id, names an atomic for de-duplication
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

std::unique_ptr<MessageOp> message(MessageKind kind, uint64_t address, uint64_t length) {
  auto op = std::make_unique<MessageOp>();
  op->header.kind = kind;
  op->header.address = address;
  op->header.length = length;
  return op;
}

Status refusal_error(Refusal r, const MessageRequest& h) {
  std::string what;
  switch (r) {
    case Refusal::unregistered: what = "the range is not in a registered region"; break;
    case Refusal::unaligned: what = "the atomic word is not 8-byte aligned"; break;
    case Refusal::not_host: what = "the region is device memory, which messages cannot reach"; break;
    default: what = "malformed request"; break;
  }
  char where[64];
  std::snprintf(where, sizeof where, "0x%llx+%llu", static_cast<unsigned long long>(h.address),
                static_cast<unsigned long long>(h.length));
  return Status(ErrorCode::out_of_range, std::string("peer refused remote access to ") + where + ": " + what);
}

class UcxRemoteKey final : public RemoteKey {
 public:
  UcxRemoteKey(std::shared_ptr<Endpoint> ep, ucp_rkey_h key) : m_ep(std::move(ep)), m_key(key) {}
  ~UcxRemoteKey() override { ucp_rkey_destroy(m_key); }
  std::shared_ptr<Endpoint> m_ep;  // keys go before their endpoint
  ucp_rkey_h m_key;
  // Operations on this region go as request/reply messages (see connect()).
  bool m_messages = false;
  // The region is mapped here (a shared-memory peer's UCX-allocated segment):
  // operations are plain loads, stores and CPU atomics at m_local + offset.
  std::byte* m_local = nullptr;
  uint64_t m_base = 0;
  std::byte* local(uint64_t remote_addr) const { return m_local + (remote_addr - m_base); }
};

// Copies between a mapped peer segment and local memory. Aligned words go one
// by one with atomic loads/stores, so a version word is never read or written
// in halves against the peer's CPU atomics; bulk data is memcpy'd.
void copy_words_or_bytes(std::byte* to, const std::byte* from, size_t length) {
  const bool words = reinterpret_cast<uintptr_t>(to) % 8 == 0 && reinterpret_cast<uintptr_t>(from) % 8 == 0 &&
                     length % 8 == 0 && length <= 4096;
  if (!words) {
    std::memcpy(to, from, length);
    return;
  }
  auto* t = reinterpret_cast<uint64_t*>(to);
  auto* f = reinterpret_cast<const uint64_t*>(from);
  for (size_t i = 0; i < length / 8; ++i) __atomic_store_n(&t[i], __atomic_load_n(&f[i], __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
}

uint64_t cpu_atomic(uint64_t* word, AtomicOp op, uint64_t operand, uint64_t compare) {
  switch (op) {
    case AtomicOp::fetch_add: return __atomic_fetch_add(word, operand, __ATOMIC_SEQ_CST);
    case AtomicOp::swap: return __atomic_exchange_n(word, operand, __ATOMIC_SEQ_CST);
    case AtomicOp::compare_swap: {
      uint64_t expected = compare;
      __atomic_compare_exchange_n(word, &expected, operand, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      return expected;
    }
  }
  return 0;
}

// Registered regions by base address, for checking message requests.
class RegionTable {
 public:
  void add(uint64_t base, uint64_t length, MemoryKind kind) {
    std::lock_guard lock(m_lock);
    m_regions[base] = {length, kind};
  }
  void remove(uint64_t base) {
    std::lock_guard lock(m_lock);
    m_regions.erase(base);
  }
  Refusal check(uint64_t address, uint64_t length) const {
    std::lock_guard lock(m_lock);
    auto it = m_regions.upper_bound(address);
    if (it == m_regions.begin()) return Refusal::unregistered;
    --it;
    if (address + length < address || address + length > it->first + it->second.length) return Refusal::unregistered;
    if (it->second.kind != MemoryKind::host) return Refusal::not_host;
    return Refusal::none;
  }

 private:
  struct Entry {
    uint64_t length;
    MemoryKind kind;
  };
  mutable std::mutex m_lock;
  std::map<uint64_t, Entry> m_regions;
};

class UcxRegion final : public RegisteredRegion {
 public:
  UcxRegion(ucp_context_h context, ucp_mem_h memh, std::string key, uint64_t base, uint64_t length,
            RegionTable& table, MemoryKind kind)
      : m_context(context), m_memh(memh), m_key(std::move(key)), m_base(base), m_length(length), m_table(table) {
    m_table.add(base, length, kind);
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
  ~UcxTransport() override {
    if (m_progress.joinable()) {
      m_stop.store(true);
      const uint64_t one = 1;
      (void)::write(m_wake_fd, &one, sizeof one);
      m_progress.join();
    }
    if (m_wake_fd >= 0) ::close(m_wake_fd);
    for (auto& [origin, ep] : m_origin_eps) m_closing.push_back(ep);
    for (ucp_ep_h ep : m_closing) close_endpoint(ep, true);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (void* request : m_close_requests) {
      while (ucp_request_check_status(request) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
        ucp_worker_progress(m_worker);
      }
      ucp_request_free(request);
    }
    if (m_worker != nullptr) ucp_worker_destroy(m_worker);
    if (m_context != nullptr) ucp_cleanup(m_context);
  }

  Status init(const UcxOptions& options) {
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) return ucx_error("reading UCX configuration", st);
    if (!options.tls.empty()) {
      st = ucp_config_modify(config, "TLS", options.tls.c_str());
      if (st != UCS_OK) {
        ucp_config_release(config);
        return ucx_error("UCX transports '" + options.tls + "'", st);
      }
    }
    if (!options.devices.empty()) {
      st = ucp_config_modify(config, "NET_DEVICES", options.devices.c_str());
      if (st != UCS_OK) {
        ucp_config_release(config);
        return ucx_error("UCX network devices '" + options.devices + "'", st);
      }
    }
    // Allocations (allocate_shared) from a POSIX shared-memory segment first:
    // it has a descriptor, and shared-memory peers map it directly.
    (void)ucp_config_modify(config, "ALLOC_PRIO", "md:posix,md:sysv,huge,thp,md:*,mmap,heap");
    // Version words are changed by local CPU atomics (daemon, co-located
    // clients) and by remote atomics: these must be atomic with each other,
    // which "cpu" mode guarantees (falling back to emulation where a NIC's
    // atomics are not coherent with the CPU's). An explicit UCX_ATOMIC_MODE wins.
    if (std::getenv("UCX_ATOMIC_MODE") == nullptr) (void)ucp_config_modify(config, "ATOMIC_MODE", "cpu");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    // Wakeup for everyone: the daemon's progress thread sleeps on the event
    // fd, and a waiting client stops spinning after a while (see wait()).
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AMO32 | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;
    st = ucp_init(&params, config, &m_context);
    ucp_config_release(config);
    if (st != UCS_OK) return ucx_error("ucp_init", st);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;
    st = ucp_worker_create(m_context, &wp, &m_worker);
    if (st != UCS_OK) return ucx_error("ucp_worker_create", st);
    ucp_address_t* address = nullptr;
    size_t length = 0;
    st = ucp_worker_get_address(m_worker, &address, &length);
    if (st != UCS_OK) return ucx_error("ucp_worker_get_address", st);
    m_address.assign(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(m_worker, address);
    st = ucp_worker_get_efd(m_worker, &m_efd);
    if (st != UCS_OK) return ucx_error("ucp_worker_get_efd", st);
    m_use_messages = options.emulation != "ucx";
    m_origin = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
               static_cast<uint64_t>(::getpid());
    for (const auto& [id, cb] : {std::pair{k_request_id, &UcxTransport::on_request},
                                 std::pair{k_reply_id, &UcxTransport::on_reply}}) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
      hp.id = id;
      hp.cb = cb;
      hp.arg = this;
      st = ucp_worker_set_am_recv_handler(m_worker, &hp);
      if (st != UCS_OK) return ucx_error("ucp_worker_set_am_recv_handler", st);
    }
    if (options.progress_thread) {
      m_wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
      m_progress = std::thread([this] { progress_loop(m_efd); });
    }
    return Status();
  }

  std::string name() const override { return "ucx"; }
  const std::string& address() const override { return m_address; }

  Result<std::unique_ptr<RegisteredRegion>> register_region(void* base, size_t length,
                                                            MemoryKind kind) override {
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                   UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    p.address = base;
    p.length = length;
    p.memory_type = kind == MemoryKind::cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    ucp_mem_h memh = nullptr;
    ucs_status_t st = ucp_mem_map(m_context, &p, &memh);
    if (st != UCS_OK) return ucx_error("registering " + std::to_string(length) + " bytes", st);
    void* key = nullptr;
    size_t key_size = 0;
    st = ucp_rkey_pack(m_context, memh, &key, &key_size);
    if (st != UCS_OK) {
      ucp_mem_unmap(m_context, memh);
      return ucx_error("packing a remote key", st);
    }
    std::string packed(static_cast<const char*>(key), key_size);
    ucp_rkey_buffer_release(key);
    return std::unique_ptr<RegisteredRegion>(new UcxRegion(
        m_context, memh, std::move(packed), reinterpret_cast<uint64_t>(base), length, m_regions, kind));
  }

  Result<SharedAllocation> allocate_shared(size_t length) override {
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    p.length = length;
    p.flags = UCP_MEM_MAP_ALLOCATE;
    ucp_mem_h memh = nullptr;
    ucs_status_t st = ucp_mem_map(m_context, &p, &memh);
    if (st != UCS_OK) return ucx_error("allocating " + std::to_string(length) + " bytes", st);
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    ucp_mem_query(memh, &attr);
    // Only a segment backed by a file (UCX's POSIX shared memory) can be
    // handed to other processes; anything else is given back.
    const int fd = descriptor_of(attr.address);
    if (fd < 0) {
      ucp_mem_unmap(m_context, memh);
      return Status(ErrorCode::not_supported, "UCX did not allocate file-backed shared memory here");
    }
    void* key = nullptr;
    size_t key_size = 0;
    st = ucp_rkey_pack(m_context, memh, &key, &key_size);
    if (st != UCS_OK) {
      ::close(fd);
      ucp_mem_unmap(m_context, memh);
      return ucx_error("packing a remote key", st);
    }
    std::string packed(static_cast<const char*>(key), key_size);
    ucp_rkey_buffer_release(key);
    SharedAllocation out;
    out.base = static_cast<std::byte*>(attr.address);
    out.length = attr.length;
    out.fd = fd;
    out.region.reset(new UcxRegion(m_context, memh, std::move(packed), reinterpret_cast<uint64_t>(attr.address),
                                   attr.length, m_regions, MemoryKind::host));
    return out;
  }

  Result<std::shared_ptr<Endpoint>> connect(std::string_view address) override {
    auto ep = std::make_shared<UcxEndpoint>(*this);
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = reinterpret_cast<const ucp_address_t*>(address.data());
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &UcxEndpoint::on_error;
    p.err_handler.arg = ep.get();
    ucs_status_t st = UCS_ERR_UNREACHABLE;
    if (m_peer_errors.load()) {
      t_probing_error_mode = true;
      st = ucp_ep_create(m_worker, &p, &ep->m_ep);
      t_probing_error_mode = false;
    }
    if (st == UCS_ERR_UNREACHABLE) {
      // UCX 1.13's shared-memory transports cannot report peer failures, and
      // refuse endpoints that ask for it. Connect without: a dead peer then
      // shows as a timeout in wait() (and the control plane notices it).
      p.field_mask &= ~static_cast<uint64_t>(UCP_EP_PARAM_FIELD_ERR_HANDLER);
      p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      st = ucp_ep_create(m_worker, &p, &ep->m_ep);
      // Ask once per process, not on every connect (UCX logs each refusal).
      if (st == UCS_OK) m_peer_errors.store(false);
    }
    if (st != UCS_OK) return ucx_error("connecting to a peer", st);
    // Where UCX would emulate operations with its own messages (see
    // transport.hpp) we send ours: over TCP always, over shared memory for
    // regions the peer cannot map (unpack() decides).
    if (m_use_messages) {
      const std::string lanes = describe(ep->m_ep);
      ep->m_messages = lanes.find("tcp") != std::string::npos;
      bool shared = !lanes.empty();
      size_t at = 0;
      while (at < lanes.size()) {
        const size_t end = std::min(lanes.find(' ', at), lanes.size());
        const std::string tl = lanes.substr(at, lanes.find('/', at) - at);
        shared = shared && (tl == "posix" || tl == "sysv" || tl == "cma" || tl == "knem" || tl == "xpmem" || tl == "self");
        at = end + 1;
      }
      ep->m_shared = shared;
      // The target learns where to answer us; its answer proves the path.
      if (Status s = hello(*ep); !s.ok()) return s;
    }
    return std::shared_ptr<Endpoint>(std::move(ep));
  }

  Result<std::shared_ptr<RemoteKey>> unpack(const std::shared_ptr<Endpoint>& endpoint, std::string_view packed,
                                            uint64_t base) override {
    auto& ep = static_cast<UcxEndpoint&>(*endpoint);
    ucp_rkey_h key = nullptr;
    const ucs_status_t st = ucp_ep_rkey_unpack(ep.m_ep, packed.data(), &key);
    if (st != UCS_OK) return ucx_error("unpacking a remote key", st);
    auto out = std::make_shared<UcxRemoteKey>(endpoint, key);
    out->m_messages = ep.m_messages;
    if (ep.m_shared) {
      // A UCX-allocated segment of a shared-memory peer maps here: we load,
      // store and run CPU atomics on it ourselves. Anything else goes as
      // messages: there UCX 1.13 mixes its emulation with cross-memory
      // copies, which its fences do not order (a read validated by version
      // words could be torn), which can assert on a closing endpoint, and
      // whose process_vm_readv fails when a buffer went away.
      void* local = nullptr;
      if (ucp_rkey_ptr(key, base, &local) == UCS_OK) {
        out->m_local = static_cast<std::byte*>(local);
        out->m_base = base;
      } else {
        out->m_messages = true;
      }
    }
    return std::shared_ptr<RemoteKey>(std::move(out));
  }

  std::unique_ptr<Batch> batch() override { return std::make_unique<UcxBatch>(); }

  Status get(Batch& batch, Endpoint& ep, void* dst, size_t length, uint64_t remote_addr,
             RemoteKey& key) override {
    auto& e = static_cast<UcxEndpoint&>(ep);
    if (e.failed()) return peer_failed();
    auto& k = static_cast<UcxRemoteKey&>(key);
    if (k.m_local != nullptr) {
      copy_words_or_bytes(static_cast<std::byte*>(dst), k.local(remote_addr), length);
      return Status();
    }
    if (k.m_messages) {
      auto op = message(MessageKind::get, remote_addr, length);
      op->dst = dst;
      return issue(batch, e, std::move(op));
    }
    ucp_request_param_t p{};
    return track(batch, e,
                 ucp_get_nbx(e.m_ep, dst, length, remote_addr, static_cast<UcxRemoteKey&>(key).m_key, &p),
                 "get");
  }

  Status put(Batch& batch, Endpoint& ep, const void* src, size_t length, uint64_t remote_addr,
             RemoteKey& key) override {
    auto& e = static_cast<UcxEndpoint&>(ep);
    if (e.failed()) return peer_failed();
    auto& k = static_cast<UcxRemoteKey&>(key);
    if (k.m_local != nullptr) {
      copy_words_or_bytes(k.local(remote_addr), static_cast<const std::byte*>(src), length);
      return Status();
    }
    if (k.m_messages) {
      auto op = message(MessageKind::put, remote_addr, length);
      op->src = src;
      op->payload = length;
      return issue(batch, e, std::move(op));
    }
    ucp_request_param_t p{};
    return track(batch, e,
                 ucp_put_nbx(e.m_ep, src, length, remote_addr, static_cast<UcxRemoteKey&>(key).m_key, &p),
                 "put");
  }

  Status atomic(Batch& batch, Endpoint& ep, AtomicOp op, uint64_t operand, uint64_t compare,
                uint64_t remote_addr, RemoteKey& key, uint64_t* result) override {
    auto& e = static_cast<UcxEndpoint&>(ep);
    if (e.failed()) return peer_failed();
    auto& k = static_cast<UcxRemoteKey&>(key);
    if (k.m_local != nullptr) {
      *result = cpu_atomic(reinterpret_cast<uint64_t*>(k.local(remote_addr)), op, operand, compare);
      return Status();
    }
    if (k.m_messages) {
      auto m = message(MessageKind::atomic, remote_addr, sizeof(uint64_t));
      m->header.op = static_cast<uint8_t>(op);
      m->header.operand = operand;
      m->header.compare = compare;
      m->result = result;
      return issue(batch, e, std::move(m));
    }
    auto& b = static_cast<UcxBatch&>(batch);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
    p.datatype = ucp_dt_make_contig(8);
    p.reply_buffer = result;
    ucp_atomic_op_t opcode = UCP_ATOMIC_OP_ADD;
    if (op == AtomicOp::compare_swap) {
      // UCX: Result = Y; if (X == Y) Y = Z, with X in buffer and Z in reply.
      opcode = UCP_ATOMIC_OP_CSWAP;
      *result = operand;
      b.m_operands.push_back(compare);
    } else {
      opcode = op == AtomicOp::swap ? UCP_ATOMIC_OP_SWAP : UCP_ATOMIC_OP_ADD;
      b.m_operands.push_back(operand);
    }
    return track(batch, e,
                 ucp_atomic_op_nbx(e.m_ep, opcode, &b.m_operands.back(), 1, remote_addr,
                                   static_cast<UcxRemoteKey&>(key).m_key, &p),
                 "atomic");
  }

  Status fence(Batch& batch, std::chrono::milliseconds timeout) override {
    auto& b = static_cast<UcxBatch&>(batch);
    // Message operations are ordered by waiting for their answers: the
    // target has run them then.
    if (b.m_done < b.m_messages.size()) {
      Status s = drive(b, timeout, true);
      if (!s.ok()) return s;
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);  // direct accesses
    const ucs_status_t st = ucp_worker_fence(m_worker);
    return st == UCS_OK ? Status() : ucx_error("fence", st);
  }

  Status wait(Batch& batch, std::chrono::milliseconds timeout) override {
    auto& b = static_cast<UcxBatch&>(batch);
    Status s = drive(b, timeout, false);
    if (!s.ok()) return s;
    s = std::move(b.m_error);
    b.m_error = Status();
    b.clear();
    return s;
  }

  Status flush(Endpoint& ep, std::chrono::milliseconds timeout) override {
    auto& e = static_cast<UcxEndpoint&>(ep);
    if (e.failed()) return peer_failed();
    // A message operation completes only when the target has answered.
    if (e.m_messages) return Status();
    ucp_request_param_t p{};
    UcxBatch b;
    Status s = track(b, e, ucp_ep_flush_nbx(e.m_ep, &p), "flush");
    if (!s.ok()) return s;
    return wait(b, timeout);
  }

  bool progress() override { return ucp_worker_progress(m_worker) != 0; }

  // Closes an endpoint, waiting (bounded) for UCX to let go of it.
  void close_endpoint(ucp_ep_h ep, bool force) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* req = ucp_ep_close_nbx(ep, &p);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (ucp_request_check_status(req) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(m_worker);
    }
    ucp_request_free(req);
  }

  std::string describe(ucp_ep_h ep) {
    char* text = nullptr;
    size_t size = 0;
    FILE* stream = ::open_memstream(&text, &size);
    if (stream == nullptr) return {};
    ucp_ep_print_info(ep, stream);
    std::fclose(stream);
    // Lines like "#                 lane[0]:  3:tcp/lo.0 md[1] ... rma_bw#0" name the
    // transport/device of each lane; collect the distinct ones.
    std::set<std::string> found;
    const std::string all(text, size);
    std::free(text);
    size_t at = 0;
    while ((at = all.find("lane[", at)) != std::string::npos) {
      const size_t colon = all.find(':', all.find(']', at));
      const size_t start = all.find(':', colon + 1);
      const size_t end = all.find_first_of(" \n", start + 1);
      if (start != std::string::npos && end != std::string::npos) {
        std::string tl = all.substr(start + 1, end - start - 1);
        const size_t dot = tl.rfind('.');
        if (dot != std::string::npos) tl.resize(dot);
        found.insert(tl);
      }
      at = end == std::string::npos ? all.size() : end;
    }
    std::string out;
    for (const auto& t : found) out += (out.empty() ? "" : " ") + t;
    return out;
  }

 private:
  static Status peer_failed() {
    return Status(ErrorCode::transport_error, "the peer's endpoint failed (peer down or unreachable)");
  }

  Status track(Batch& batch, UcxEndpoint& ep, ucs_status_ptr_t request, const char* what) {
    if (request == nullptr) return Status();
    if (UCS_PTR_IS_ERR(request)) return ucx_error(std::string("issuing ") + what, UCS_PTR_STATUS(request));
    static_cast<UcxBatch&>(batch).m_requests.push_back({request, &ep});
    return Status();
  }

  // Progresses until the batch's operations (only its messages, or all)
  // are done; failures go to b.m_error. On timeout the batch is abandoned.
  Status drive(UcxBatch& b, std::chrono::milliseconds timeout, bool messages_only) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    unsigned idle = 0;
    for (;;) {
      const bool requests_left = !messages_only && reap_requests(b, b.m_error);
      const bool messages_left = reap_messages(b, b.m_error);
      if (!requests_left && !messages_left) return Status();
      if (ucp_worker_progress(m_worker) != 0) {
        idle = 0;
        continue;
      }
      if (++idle < k_spins_before_sleep) continue;
      idle = 0;
      if (std::chrono::steady_clock::now() > deadline) {
        const std::string what = unfinished(b);
        abandon(b);
        b.m_error = Status();
        return Status(ErrorCode::timeout, "remote operations did not complete within " +
                                              std::to_string(timeout.count()) + " ms (" + what + ")");
      }
      // Nothing moved for a while: sleep until the fabric has news instead of
      // burning a core the peer (or its daemon) may need.
      if (ucp_worker_arm(m_worker) == UCS_OK) {
        pollfd p{m_efd, POLLIN, 0};
        (void)::poll(&p, 1, 1);
      }
    }
  }

  Status hello(UcxEndpoint& ep) {
    UcxBatch b;
    auto op = message(MessageKind::hello, 0, 0);
    op->src = m_address.data();
    op->payload = m_address.size();
    Status s = issue(b, ep, std::move(op));
    if (s.ok()) s = drive(b, std::chrono::seconds(10), false);
    if (s.ok()) s = std::move(b.m_error);
    b.clear();
    return s.ok() ? s : s.with_context("the peer did not answer the hello of a new connection");
  }

  // The endpoint answers to `origin` go on, opened on its hello.
  ucp_ep_h answer_ep(uint64_t origin) {
    std::lock_guard lock(m_origins_lock);
    auto it = m_origin_eps.find(origin);
    return it == m_origin_eps.end() ? nullptr : it->second;
  }

  // A new endpoint for every hello: the asker reconnects after its old
  // connection failed (a partition, say), and the old endpoint with it.
  ucp_ep_h open_answer_ep(uint64_t origin, const void* address) {
    std::lock_guard lock(m_origins_lock);
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = static_cast<const ucp_address_t*>(address);
    // Failure detection where the transport has it (see connect()); a failed
    // answer endpoint only makes answers fail, which are then dropped.
    p.err_mode = m_peer_errors.load() ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    p.err_handler.cb = [](void*, ucp_ep_h, ucs_status_t) {};
    p.err_handler.arg = nullptr;
    ucp_ep_h ep = nullptr;
    t_probing_error_mode = true;
    ucs_status_t st = ucp_ep_create(m_worker, &p, &ep);
    t_probing_error_mode = false;
    if (st == UCS_ERR_UNREACHABLE && p.err_mode == UCP_ERR_HANDLING_MODE_PEER) {
      p.field_mask &= ~static_cast<uint64_t>(UCP_EP_PARAM_FIELD_ERR_HANDLER);
      p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      st = ucp_ep_create(m_worker, &p, &ep);
    }
    if (st != UCS_OK) return nullptr;
    if (auto it = m_origin_eps.find(origin); it != m_origin_eps.end()) {
      m_closing.push_back(it->second);
      it->second = ep;
      return ep;
    }
    m_origin_eps.emplace(origin, ep);
    m_origin_order.push_back(origin);
    if (m_origin_order.size() > k_origins_remembered) {
      // The longest-known asker, most likely long gone.
      m_closing.push_back(m_origin_eps[m_origin_order.front()]);
      m_origin_eps.erase(m_origin_order.front());
      m_origin_order.pop_front();
    }
    return ep;
  }

  // What a timed-out batch was waiting for, for the error message.
  std::string unfinished(UcxBatch& b) {
    size_t sending = 0, unanswered = 0, landing = 0;
    for (size_t i = 0; i < b.m_messages.size(); ++i) {
      if (b.m_is_done[i]) continue;
      const MessageOp& op = *b.m_messages[i];
      std::lock_guard lock(m_ops_lock);
      if (op.recv_request != nullptr) ++landing;
      else if (op.send_request != nullptr) ++sending;
      else ++unanswered;
    }
    return std::to_string(b.m_requests.size()) + " one-sided, " + std::to_string(sending) + " request(s) being sent, " +
           std::to_string(unanswered) + " unanswered, " + std::to_string(landing) + " answer(s) landing";
  }

  // Frees the batch's completed UCX requests; true while some are left.
  bool reap_requests(UcxBatch& b, Status& result) {
    for (size_t i = 0; i < b.m_requests.size();) {
      const ucs_status_t st = ucp_request_check_status(b.m_requests[i].request);
      if (st == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      if (st != UCS_OK && result.ok()) result = ucx_error("remote operation", st);
      ucp_request_free(b.m_requests[i].request);
      b.m_requests[i] = b.m_requests.back();
      b.m_requests.pop_back();
    }
    return !b.m_requests.empty();
  }

  // Collects the batch's answered message operations and sends those a fence
  // held back once everything before it is done; true while some are left.
  bool reap_messages(UcxBatch& b, Status& result) {
    for (size_t i = 0; i < b.m_messages.size(); ++i) {
      if (b.m_is_done[i]) continue;
      MessageOp& op = *b.m_messages[i];
      if (op.send_request != nullptr) {
        const ucs_status_t st = ucp_request_check_status(op.send_request);
        if (st == UCS_INPROGRESS) continue;
        ucp_request_free(op.send_request);
        op.send_request = nullptr;
        if (st != UCS_OK) {
          std::lock_guard lock(m_ops_lock);
          if (op.status == UCS_OK) op.status = st;
          op.replied = op.recv_request == nullptr;  // no answer will come
        }
      }
      bool resend = false;
      {
        std::lock_guard lock(m_ops_lock);
        if (!op.replied && op.recv_request == nullptr && op.ep->failed()) {
          op.replied = true;
          if (op.status == UCS_OK) op.status = UCS_ERR_CONNECTION_RESET;
        }
        // Unanswered for long: the request or its answer was lost (UCX 1.13
        // over shared memory now and then drops an answer sent on the reply
        // endpoint). Ask again; the target runs an atomic only once.
        resend = !op.replied && op.recv_request == nullptr &&
                 std::chrono::steady_clock::now() - op.sent_at > k_resend_after * (1 << std::min(op.resends, 3));
        if (!resend && (!op.replied || op.recv_request != nullptr)) continue;
        if (!resend) m_ops.erase(op.header.id);
      }
      if (resend) {
        ++op.resends;
        m_resends.fetch_add(1, std::memory_order_relaxed);
        post_request(op);
        continue;
      }
      b.m_is_done[i] = true;
      ++b.m_done;
      if (result.ok()) {
        if (op.refusal != Refusal::none) result = refusal_error(op.refusal, op.header);
        else if (op.status != UCS_OK) result = ucx_error("remote operation", op.status);
      }
    }
    return b.m_done < b.m_messages.size();
  }

  Status issue(Batch& batch, UcxEndpoint& ep, std::unique_ptr<MessageOp> op) {
    auto& b = static_cast<UcxBatch&>(batch);
    op->ep = &ep;
    b.m_messages.push_back(std::move(op));
    b.m_is_done.push_back(false);
    send_message(*b.m_messages.back());
    return Status();
  }

  void send_message(MessageOp& op) {
    {
      std::lock_guard lock(m_ops_lock);
      op.header.id = ++m_next_op;
      m_ops.emplace(op.header.id, &op);
    }
    op.header.origin = m_origin;
    op.sent = true;
    post_request(op);
  }

  // Sends (or sends again) a request; the answer is matched by its id.
  void post_request(MessageOp& op) {
    op.sent_at = std::chrono::steady_clock::now();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // Eager only: with rendezvous the target would pull the payload from our
    // buffer later (over shared memory with process_vm_readv, which UCX
    // treats as fatal when the buffer is gone after a timeout).
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    void* request = op.ep->m_ep == nullptr
                        ? UCS_STATUS_PTR(UCS_ERR_CONNECTION_RESET)
                        : ucp_am_send_nbx(op.ep->m_ep, k_request_id, &op.header, sizeof op.header, op.src, op.payload, &p);
    if (UCS_PTR_IS_ERR(request)) {
      std::lock_guard lock(m_ops_lock);
      op.status = UCS_PTR_STATUS(request);
      op.replied = true;
    } else {
      op.send_request = request;
    }
  }

  // Closes the endpoints of unfinished operations so UCX completes (cancels)
  // them and never writes the caller's buffers after wait() returns.
  void abandon(UcxBatch& b) {
    std::set<UcxEndpoint*> eps;
    for (const auto& r : b.m_requests) eps.insert(r.ep);
    for (size_t i = 0; i < b.m_messages.size(); ++i) {
      if (!b.m_is_done[i]) eps.insert(b.m_messages[i]->ep);
    }
    for (UcxEndpoint* ep : eps) {
      ep->m_failed.store(true);
      if (ep->m_ep != nullptr) close_endpoint(ep->m_ep, true);
      ep->m_ep = nullptr;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (const auto& r : b.m_requests) {
      while (ucp_request_check_status(r.request) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
        ucp_worker_progress(m_worker);
      }
      ucp_request_free(r.request);
    }
    b.m_requests.clear();
    for (size_t i = 0; i < b.m_messages.size(); ++i) {
      MessageOp& op = *b.m_messages[i];
      if (b.m_is_done[i]) continue;
      if (op.send_request != nullptr) {
        while (ucp_request_check_status(op.send_request) == UCS_INPROGRESS &&
               std::chrono::steady_clock::now() < deadline) {
          ucp_worker_progress(m_worker);
        }
        ucp_request_free(op.send_request);
        op.send_request = nullptr;
      }
      for (;;) {
        {
          std::lock_guard lock(m_ops_lock);
          if (op.recv_request == nullptr || std::chrono::steady_clock::now() >= deadline) {
            // Late answers find no operation and are dropped.
            m_ops.erase(op.header.id);
            break;
          }
        }
        ucp_worker_progress(m_worker);
      }
    }
    b.clear();
  }

  // --- the answering side and the answers -------------------------------------

  // A request from a peer: check it, run it on our memory, answer.
  static ucs_status_t on_request(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                 const ucp_am_recv_param_t* param) {
    auto& self = *static_cast<UcxTransport*>(arg);
    if (header_length != sizeof(MessageRequest)) return UCS_OK;  // not ours
    MessageRequest h;
    std::memcpy(&h, header, sizeof h);
    if (h.magic != k_message_magic) return UCS_OK;
    MessageReply r;
    r.origin = h.origin;
    r.id = h.id;
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (h.kind == MessageKind::hello) {
      ucp_ep_h ep = rndv ? nullptr : self.open_answer_ep(h.origin, data);
      if (ep != nullptr) self.send_reply(ep, r, nullptr, 0);
      return UCS_OK;
    }
    ucp_ep_h ep = self.answer_ep(h.origin);
    if (ep == nullptr) return UCS_OK;  // no hello from it: nowhere to answer
    Refusal refusal = self.m_regions.check(h.address, h.length);
    if (h.kind == MessageKind::atomic && (h.address % 8 != 0 || h.length != 8)) refusal = Refusal::unaligned;
    if (h.kind == MessageKind::put && length != h.length) refusal = Refusal::malformed;
    if (h.kind != MessageKind::get && h.kind != MessageKind::put && h.kind != MessageKind::atomic) {
      refusal = Refusal::malformed;
    }
    if (refusal != Refusal::none) {
      r.refusal = refusal;
      self.send_reply(ep, r, nullptr, 0);
      return UCS_OK;  // a rendezvous payload is dropped
    }
    auto* target = reinterpret_cast<void*>(h.address);
    switch (h.kind) {
      case MessageKind::get:
        self.send_reply(ep, r, target, h.length);
        break;
      case MessageKind::put:
        if (rndv) {
          auto* landing = new PutLanding{&self, ep, r};
          ucp_request_param_t p{};
          p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
          p.cb.recv_am = &UcxTransport::on_put_landed;
          p.user_data = landing;
          void* request = ucp_am_recv_data_nbx(self.m_worker, data, target, length, &p);
          if (request == nullptr) {
            self.send_reply(ep, r, nullptr, 0);
            delete landing;
          } else if (UCS_PTR_IS_ERR(request)) {
            delete landing;  // the peer's send fails; it sees that
          }
        } else {
          std::memcpy(target, data, length);
          self.send_reply(ep, r, nullptr, 0);
        }
        break;
      case MessageKind::atomic: {
        // An atomic asked again (its answer was lost) is answered from the
        // record of its first run, not run twice.
        std::lock_guard lock(self.m_atomics_lock);
        const std::pair<uint64_t, uint64_t> key{h.origin, h.id};
        if (auto it = self.m_atomics_done.find(key); it != self.m_atomics_done.end()) {
          r.value = it->second;
        } else {
          r.value = cpu_atomic(static_cast<uint64_t*>(target), static_cast<AtomicOp>(h.op), h.operand, h.compare);
          self.m_atomics_done.emplace(key, r.value);
          self.m_atomics_order.push_back(key);
          if (self.m_atomics_order.size() > k_atomics_remembered) {
            self.m_atomics_done.erase(self.m_atomics_order.front());
            self.m_atomics_order.pop_front();
          }
        }
        self.send_reply(ep, r, nullptr, 0);
        break;
      }
    }
    return UCS_OK;
  }

  struct PutLanding {
    UcxTransport* self;
    ucp_ep_h ep;
    MessageReply reply;
  };

  static void on_put_landed(void* request, ucs_status_t status, size_t, void* user_data) {
    auto* landing = static_cast<PutLanding*>(user_data);
    // A failed receive means the peer is gone: nobody to answer.
    if (status == UCS_OK) landing->self->send_reply(landing->ep, landing->reply, nullptr, 0);
    delete landing;
    ucp_request_free(request);
  }

  // Answers on `ep`; a dead peer only fails the send, which is dropped.
  void send_reply(ucp_ep_h ep, const MessageReply& reply, const void* data, size_t length) {
    auto* header = new MessageReply(reply);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;  // see send_message()
    p.cb.send = [](void* request, ucs_status_t, void* user_data) {
      delete static_cast<MessageReply*>(user_data);
      ucp_request_free(request);
    };
    p.user_data = header;
    void* request = ucp_am_send_nbx(ep, k_reply_id, header, sizeof *header, data, length, &p);
    if (request == nullptr || UCS_PTR_IS_ERR(request)) delete header;
  }

  // An answer to one of our requests.
  static ucs_status_t on_reply(void* arg, const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto& self = *static_cast<UcxTransport*>(arg);
    if (header_length != sizeof(MessageReply)) return UCS_OK;
    MessageReply r;
    std::memcpy(&r, header, sizeof r);
    if (r.magic != k_message_magic) return UCS_OK;
    if (r.origin != self.m_origin) return UCS_OK;  // not an answer to us
    std::lock_guard lock(self.m_ops_lock);
    auto it = self.m_ops.find(r.id);
    if (it == self.m_ops.end()) return UCS_OK;  // abandoned
    MessageOp& op = *it->second;
    if (op.replied) return UCS_OK;
    if (r.refusal != Refusal::none) {
      op.refusal = r.refusal;
      op.replied = true;
      return UCS_OK;
    }
    if (op.header.kind != MessageKind::get) {
      if (op.result != nullptr) *op.result = r.value;
      op.replied = true;
      return UCS_OK;
    }
    if (length != op.header.length) {
      op.status = UCS_ERR_MESSAGE_TRUNCATED;
      op.replied = true;
      return UCS_OK;
    }
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
      std::memcpy(op.dst, data, length);
      op.replied = true;
      return UCS_OK;
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &UcxTransport::on_reply_landed;
    p.user_data = &op;
    void* request = ucp_am_recv_data_nbx(self.m_worker, data, op.dst, length, &p);
    if (request == nullptr) {
      op.replied = true;
    } else if (UCS_PTR_IS_ERR(request)) {
      op.status = UCS_PTR_STATUS(request);
      op.replied = true;
    } else if (!op.replied) {
      op.recv_request = request;
    }
    return UCS_OK;
  }

  static void on_reply_landed(void* request, ucs_status_t status, size_t, void* user_data) {
    auto& op = *static_cast<MessageOp*>(user_data);
    {
      std::lock_guard lock(op.ep->m_owner.m_ops_lock);
      if (status != UCS_OK && op.status == UCS_OK) op.status = status;
      op.replied = true;
      op.recv_request = nullptr;
    }
    ucp_request_free(request);
  }

  // Answers peers: progress while there is work, otherwise sleep on the
  // worker's event fd. A short spin before sleeping keeps request/response
  // latency low without burning a core when idle.
  // Closes answer endpoints replaced or forgotten since the last call (not
  // from inside a callback, where they are replaced), and frees the closes
  // that finished.
  void close_replaced_answer_eps() {
    std::vector<ucp_ep_h> closing;
    {
      std::lock_guard lock(m_origins_lock);
      closing.swap(m_closing);
    }
    for (ucp_ep_h ep : closing) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* request = ucp_ep_close_nbx(ep, &p);
      if (request != nullptr && !UCS_PTR_IS_ERR(request)) m_close_requests.push_back(request);
    }
    for (size_t i = 0; i < m_close_requests.size();) {
      if (ucp_request_check_status(m_close_requests[i]) == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      ucp_request_free(m_close_requests[i]);
      m_close_requests[i] = m_close_requests.back();
      m_close_requests.pop_back();
    }
  }

  void progress_loop(int efd) {
    constexpr int k_idle_spins = 200;
    int idle = 0;
    while (!m_stop.load(std::memory_order_relaxed)) {
      if (ucp_worker_progress(m_worker) != 0) {
        idle = 0;
        continue;
      }
      if (++idle < k_idle_spins) continue;
      idle = 0;
      close_replaced_answer_eps();
      const ucs_status_t st = ucp_worker_arm(m_worker);
      if (st == UCS_ERR_BUSY) continue;
      pollfd fds[2] = {{efd, POLLIN, 0}, {m_wake_fd, POLLIN, 0}};
      (void)::poll(fds, 2, 1000);
    }
  }

  ucp_context_h m_context = nullptr;
  ucp_worker_h m_worker = nullptr;
  std::string m_address;
  std::thread m_progress;
  std::atomic<bool> m_stop{false};
  std::atomic<bool> m_peer_errors{true};  // endpoints with peer failure detection
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
  std::atomic<uint64_t> m_resends{0};
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

// A new descriptor of the file mapped at `address` (found by its inode among
// this process's open descriptors), or -1 when the mapping has no file.
int descriptor_of(void* address) {
  const auto a = reinterpret_cast<uintptr_t>(address);
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return -1;
  char line[512];
  unsigned long inode = 0;
  unsigned dev_major = 0, dev_minor = 0;
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long start = 0, end = 0, ino = 0;
    char perms[8];
    unsigned long long off = 0;
    unsigned mj = 0, mn = 0;
    if (std::sscanf(line, "%lx-%lx %7s %llx %x:%x %lu", &start, &end, perms, &off, &mj, &mn, &ino) == 7 &&
        a >= start && a < end) {
      inode = ino;
      dev_major = mj;
      dev_minor = mn;
      break;
    }
  }
  std::fclose(maps);
  if (inode == 0) return -1;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* e = ::readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    struct stat st {};
    if (e->d_name[0] == '.' || ::fstat(fd, &st) != 0) continue;
    if (S_ISREG(st.st_mode) && st.st_ino == inode && major(st.st_dev) == dev_major &&
        minor(st.st_dev) == dev_minor) {
      found = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      break;
    }
  }
  ::closedir(dir);
  return found;
}

UcxEndpoint::~UcxEndpoint() {
  if (m_ep != nullptr) m_owner.close_endpoint(m_ep, failed());
}

std::string UcxEndpoint::transports() const {
  return m_ep == nullptr ? std::string("closed") : m_owner.describe(m_ep);
}

}  // namespace

Result<std::unique_ptr<Transport>> make_ucx_transport(const UcxOptions& options) {
  static std::once_flag log_once;
  std::call_once(log_once, [] { ucs_log_push_handler(&log_to_stderr); });
  auto t = std::make_unique<UcxTransport>();
  UcxOptions o = options;
  if (const char* e = std::getenv("TIERMEM_RMA_EMULATION"); e != nullptr && *e != '\0') o.emulation = e;
  Status s = t->init(o);
  if (!s.ok()) return s;
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace tiermem
