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
#include <mutex>
#include <set>
#include <thread>

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
};

class UcxRemoteKey final : public RemoteKey {
 public:
  UcxRemoteKey(std::shared_ptr<Endpoint> ep, ucp_rkey_h key) : m_ep(std::move(ep)), m_key(key) {}
  ~UcxRemoteKey() override { ucp_rkey_destroy(m_key); }
  std::shared_ptr<Endpoint> m_ep;  // keys go before their endpoint
  ucp_rkey_h m_key;
};

class UcxRegion final : public RegisteredRegion {
 public:
  UcxRegion(ucp_context_h context, ucp_mem_h memh, std::string key, uint64_t base, uint64_t length)
      : m_context(context), m_memh(memh), m_key(std::move(key)), m_base(base), m_length(length) {}
  ~UcxRegion() override { ucp_mem_unmap(m_context, m_memh); }
  const std::string& packed_key() const override { return m_key; }
  uint64_t base() const override { return m_base; }
  uint64_t length() const override { return m_length; }

 private:
  ucp_context_h m_context;
  ucp_mem_h m_memh;
  std::string m_key;
  uint64_t m_base;
  uint64_t m_length;
};

class UcxBatch final : public Batch {
 public:
  size_t pending() const override { return m_requests.size(); }
  struct Pending {
    void* request;
    UcxEndpoint* ep;
  };
  std::vector<Pending> m_requests;
  std::deque<uint64_t> m_operands;  // atomic operands live until completion
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
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AMO32 | UCP_FEATURE_WAKEUP;
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
        m_context, memh, std::move(packed), reinterpret_cast<uint64_t>(base), length));
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
                                   attr.length));
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
    return std::shared_ptr<Endpoint>(std::move(ep));
  }

  Result<std::shared_ptr<RemoteKey>> unpack(const std::shared_ptr<Endpoint>& endpoint,
                                            std::string_view packed) override {
    auto& ep = static_cast<UcxEndpoint&>(*endpoint);
    ucp_rkey_h key = nullptr;
    const ucs_status_t st = ucp_ep_rkey_unpack(ep.m_ep, packed.data(), &key);
    if (st != UCS_OK) return ucx_error("unpacking a remote key", st);
    return std::shared_ptr<RemoteKey>(new UcxRemoteKey(endpoint, key));
  }

  std::unique_ptr<Batch> batch() override { return std::make_unique<UcxBatch>(); }

  Status get(Batch& batch, Endpoint& ep, void* dst, size_t length, uint64_t remote_addr,
             RemoteKey& key) override {
    auto& e = static_cast<UcxEndpoint&>(ep);
    if (e.failed()) return peer_failed();
    ucp_request_param_t p{};
    return track(batch, e,
                 ucp_get_nbx(e.m_ep, dst, length, remote_addr, static_cast<UcxRemoteKey&>(key).m_key, &p),
                 "get");
  }

  Status put(Batch& batch, Endpoint& ep, const void* src, size_t length, uint64_t remote_addr,
             RemoteKey& key) override {
    auto& e = static_cast<UcxEndpoint&>(ep);
    if (e.failed()) return peer_failed();
    ucp_request_param_t p{};
    return track(batch, e,
                 ucp_put_nbx(e.m_ep, src, length, remote_addr, static_cast<UcxRemoteKey&>(key).m_key, &p),
                 "put");
  }

  Status atomic(Batch& batch, Endpoint& ep, AtomicOp op, uint64_t operand, uint64_t compare,
                uint64_t remote_addr, RemoteKey& key, uint64_t* result) override {
    auto& e = static_cast<UcxEndpoint&>(ep);
    if (e.failed()) return peer_failed();
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

  Status fence() override {
    const ucs_status_t st = ucp_worker_fence(m_worker);
    return st == UCS_OK ? Status() : ucx_error("fence", st);
  }

  Status wait(Batch& batch, std::chrono::milliseconds timeout) override {
    auto& b = static_cast<UcxBatch&>(batch);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    Status result;
    unsigned idle = 0;
    while (!b.m_requests.empty()) {
      auto& back = b.m_requests.back();
      const ucs_status_t st = ucp_request_check_status(back.request);
      if (st != UCS_INPROGRESS) {
        if (st != UCS_OK && result.ok()) result = ucx_error("remote operation", st);
        ucp_request_free(back.request);
        b.m_requests.pop_back();
        continue;
      }
      if (ucp_worker_progress(m_worker) != 0) {
        idle = 0;
        continue;
      }
      if (++idle < k_spins_before_sleep) continue;
      idle = 0;
      if (std::chrono::steady_clock::now() > deadline) {
        abandon(b);
        return Status(ErrorCode::timeout, "remote operations did not complete within " +
                                              std::to_string(timeout.count()) + " ms");
      }
      // Nothing moved for a while: sleep until the fabric has news instead of
      // burning a core the peer (or its daemon) may need.
      if (ucp_worker_arm(m_worker) == UCS_OK) {
        pollfd p{m_efd, POLLIN, 0};
        (void)::poll(&p, 1, 1);
      }
    }
    b.m_operands.clear();
    return result;
  }

  Status flush(Endpoint& ep, std::chrono::milliseconds timeout) override {
    auto& e = static_cast<UcxEndpoint&>(ep);
    if (e.failed()) return peer_failed();
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

  // Closes the endpoints of unfinished requests so UCX completes (cancels)
  // them and never writes the caller's buffers after wait() returns.
  void abandon(UcxBatch& b) {
    std::set<UcxEndpoint*> eps;
    for (const auto& r : b.m_requests) eps.insert(r.ep);
    for (UcxEndpoint* ep : eps) {
      ep->m_failed.store(true);
      close_endpoint(ep->m_ep, true);
      ep->m_ep = nullptr;
    }
    for (const auto& r : b.m_requests) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (ucp_request_check_status(r.request) == UCS_INPROGRESS &&
             std::chrono::steady_clock::now() < deadline) {
        ucp_worker_progress(m_worker);
      }
      ucp_request_free(r.request);
    }
    b.m_requests.clear();
    b.m_operands.clear();
  }

  // Answers peers: progress while there is work, otherwise sleep on the
  // worker's event fd. A short spin before sleeping keeps request/response
  // latency low without burning a core when idle.
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
  Status s = t->init(options);
  if (!s.ok()) return s;
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace tiermem
