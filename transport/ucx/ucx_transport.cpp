// The UCX transport: context, worker, registered regions, endpoints (and the
// endpoints we answer on), and the progress thread. See ucx_internal.hpp.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>

#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>

#include <tiermem/status_macros.h>

#include "common/deadline.hpp"

#include "transport/ucx/ucx_internal.hpp"

namespace tiermem {
namespace ucx_detail {

thread_local bool t_probing_error_mode = false;

namespace {

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

// True when a UCX_TLS list names shared-memory transports only.
bool shared_memory_only(const std::string& tls) {
  if (tls.empty() || tls[0] == '^') return false;
  size_t at = 0;
  while (at <= tls.size()) {
    const size_t end = std::min(tls.find(',', at), tls.size());
    const std::string t = tls.substr(at, end - at);
    if (t != "sm" && t != "shm" && t != "posix" && t != "sysv" && t != "cma" && t != "knem" && t != "xpmem" &&
        t != "self") {
      return false;
    }
    at = end + 1;
  }
  return true;
}

}  // namespace

Status ucx_error(const std::string& what, ucs_status_t status) {
  return Status(ErrorCode::transport_error, what + ": " + ucs_status_string(status));
}

UcxTransport::~UcxTransport() {
  if (m_progress.joinable()) {
    m_stop.store(true);
    const uint64_t one = 1;
    (void)::write(m_wake_fd, &one, sizeof one);
    m_progress.join();
  }
  if (m_listener != nullptr) {
    // Before the listener goes, no connection of its port may be half made
    // in UCX's connection manager: UCX 1.13 crashes destroying the listener
    // and the worker with such ones (a bare TCP connection that never spoke,
    // or one whose request arrives after the listener is gone). Every
    // connection not admitted is shut down, UCX drops them on its own error
    // path while the worker progresses, and the requests still queued are
    // rejected while their listener exists.
    if (reap_unproven(true) > 0) {
      // Until UCX has had 20 ms without news (at most 1 s).
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      auto quiet_since = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() < give_up &&
             std::chrono::steady_clock::now() - quiet_since < std::chrono::milliseconds(20)) {
        if (ucp_worker_progress(m_worker) != 0) {
          quiet_since = std::chrono::steady_clock::now();
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
    }
    for (const Pending& p : m_conn_requests) (void)ucp_listener_reject(m_listener, p.request);
    for (const Pending& p : m_refusing) (void)ucp_listener_reject(m_listener, p.request);
    for (const Pending& p : m_refused) (void)ucp_listener_reject(m_listener, p.request);
    m_conn_requests.clear();
    m_refusing.clear();
    m_refused.clear();
    ucp_listener_destroy(m_listener);
    m_listener = nullptr;
  }
  if (m_wake_fd >= 0) ::close(m_wake_fd);
  for (auto& [ep, accepted] : m_accepted) m_closing.push_back(ep);
  for (auto& [origin, ep] : m_origin_eps) m_closing.push_back(ep);
  for (ucp_ep_h ep : m_disconnecting) m_closing.push_back(ep);
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

Status UcxTransport::init(const UcxOptions& options) {
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
  // Version words are changed by local CPU atomics (daemon, co-located
  // clients) and by remote atomics: these must be atomic with each other,
  // which "cpu" mode guarantees (falling back to emulation where a NIC's
  // atomics are not coherent with the CPU's). An explicit UCX_ATOMIC_MODE wins.
  if (std::getenv("UCX_ATOMIC_MODE") == nullptr) (void)ucp_config_modify(config, "ATOMIC_MODE", "cpu");
  // The worker is shared by every thread of the process (UCS_THREAD_MODE_MULTI),
  // and UCX 1.13 guards it with a spinlock by default, held across send
  // system calls: with more waiting threads than cores, a preempted holder
  // made the others spin through their time slices (8 threads of one client
  // over TCP: each operation ~20x slower than one alone, bench/batch_bench).
  // A mutex puts them to sleep instead (8 threads: 0.05 -> 0.76 of one at a
  // time on two cores; one thread unchanged). An explicit UCX_USE_MT_MUTEX wins.
  if (std::getenv("UCX_USE_MT_MUTEX") == nullptr) (void)ucp_config_modify(config, "USE_MT_MUTEX", "y");
  if (options.keepalive_interval_ms > 0 && std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
    (void)ucp_config_modify(config, "KEEPALIVE_INTERVAL",
                            (std::to_string(options.keepalive_interval_ms) + "ms").c_str());
  }
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
  m_worker_address.assign(reinterpret_cast<const char*>(address), length);
  m_address = m_worker_address;
  ucp_worker_release_address(m_worker, address);
  ucp_worker_attr_t worker_attr{};
  worker_attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  if (ucp_worker_query(m_worker, &worker_attr) == UCS_OK) {
    // Operations in the header up to 64 (a 31-page locked copy); more go in
    // the payload.
    m_max_header = std::min(worker_attr.max_am_header, sizeof(MessageRequest) + 64 * sizeof(sequence::Op));
  }
  st = ucp_worker_get_efd(m_worker, &m_efd);
  if (st != UCS_OK) return ucx_error("ucp_worker_get_efd", st);
  m_use_messages = options.emulation != "ucx";
  const auto spin = std::chrono::microseconds(options.spin_us < 0 ? 30 : options.spin_us);
  m_spin.set_limit(spin);
  m_idle_spin.set_limit(transport_detail::serving_spin(spin));
  // Where only shared-memory transports are allowed, endpoints cannot detect
  // peer failures, and asking for it first (and being refused) leaves UCX
  // 1.13 with an endpoint whose first multi-fragment message never arrives:
  // do not ask.
  const char* env_tls = std::getenv("UCX_TLS");
  const bool shm_only = shared_memory_only(!options.tls.empty() ? options.tls : env_tls != nullptr ? env_tls : "");
  if (shm_only) m_peer_errors.store(false);
  if (shm_only && !options.listen_ip.empty()) {
    // UCX 1.13 makes the listener, but a connection through it finds no
    // lane ("Destination is unreachable"): say so now.
    return Status(ErrorCode::not_supported,
                  "UCX's transports here are shared memory only, which a listener's connections cannot use");
  }
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
  m_wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (!options.listen_ip.empty()) TIERMEM_RETURN_IF_ERROR(listen(options.listen_ip));
  if (options.progress_thread) m_progress = std::thread([this] { progress_loop(m_efd); });
  return Status();
}

Result<std::unique_ptr<RegisteredRegion>> UcxTransport::register_region(void* base, size_t length, MemoryKind kind) {
  if (kind == MemoryKind::cuda) {
    // One-sided access to device memory needs a UCX built with CUDA
    // (cuda_copy, cuda_ipc, gdr_copy); without it (Debian's) peers reach
    // that memory through its daemon, which stages it in host memory.
    ucp_context_attr_t attr{};
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(m_context, &attr) != UCS_OK || (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) == 0) {
      return Status(ErrorCode::not_supported,
                    "this UCX has no CUDA support: device memory is reached through its daemon (staged in host memory)");
    }
  }
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
  // The token makes the key a capability for this region alone where
  // operations travel as messages (see RegionTable).
  uint64_t token = 0;
  while (token == 0) token = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  std::string packed(reinterpret_cast<const char*>(&token), k_token_bytes);
  packed.append(static_cast<const char*>(key), key_size);
  ucp_rkey_buffer_release(key);
  return std::unique_ptr<RegisteredRegion>(new UcxRegion(
      m_context, memh, std::move(packed), reinterpret_cast<uint64_t>(base), length, m_regions, kind, token));
}

Result<std::shared_ptr<Endpoint>> UcxTransport::connect(std::string_view address) {
  if (is_listener_address(address)) return connect_listener(address);
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
    TIERMEM_RETURN_IF_ERROR(hello(*ep));
  }
  return std::shared_ptr<Endpoint>(std::move(ep));
}

Result<std::shared_ptr<RemoteKey>> UcxTransport::unpack(const std::shared_ptr<Endpoint>& endpoint,
                                                        std::string_view packed, uint64_t /*base*/) {
  auto& ep = static_cast<UcxEndpoint&>(*endpoint);
  if (packed.size() <= k_token_bytes) return Status(ErrorCode::transport_error, "a remote key too short to unpack");
  uint64_t token = 0;
  std::memcpy(&token, packed.data(), k_token_bytes);
  ucp_rkey_h key = nullptr;
  const ucs_status_t st = ucp_ep_rkey_unpack(ep.m_ep, packed.data() + k_token_bytes, &key);
  if (st != UCS_OK) return ucx_error("unpacking a remote key", st);
  auto out = std::make_shared<UcxRemoteKey>(endpoint, key, token);
  // Over TCP and over shared memory alone operations go as messages: UCX
  // 1.13 mixes its emulation there with cross-memory copies, which its
  // fences do not order (a read validated by version words could be torn),
  // which can assert on a closing endpoint, and whose process_vm_readv fails
  // when a buffer went away.
  out->m_messages = ep.m_listener ? !ep.m_rdma : ep.m_messages || ep.m_shared;
  return std::shared_ptr<RemoteKey>(std::move(out));
}

void UcxTransport::close_endpoint(ucp_ep_h ep, bool force) {
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

std::string UcxTransport::describe(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = ::open_memstream(&text, &size);
  if (stream == nullptr) return {};
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  // Lines like "#                 lane[0]:  3:tcp/lo.0 md[1] ... rma_bw#0" name the
  // transport/device of each lane; collect the distinct ones. A connection
  // manager's lane ("lane[0]: cm rdmacm", through a listener) moves no data.
  std::set<std::string> found;
  const std::string all(text, size);
  std::free(text);
  size_t line = 0;
  while (line < all.size()) {
    const size_t eol = std::min(all.find('\n', line), all.size());
    const std::string l = all.substr(line, eol - line);
    line = eol + 1;
    const size_t lane = l.find("lane[");
    const size_t colon = lane == std::string::npos ? std::string::npos : l.find("]:", lane);
    if (colon == std::string::npos) continue;
    size_t at = l.find_first_not_of(' ', colon + 2);
    if (at == std::string::npos || l.compare(at, 3, "cm ") == 0) continue;
    const size_t index_end = l.find(':', at);  // " 3:tcp/lo.0"
    if (index_end == std::string::npos) continue;
    const size_t end = l.find_first_of(" \t", index_end + 1);
    std::string tl = l.substr(index_end + 1, end == std::string::npos ? std::string::npos : end - index_end - 1);
    const size_t dot = tl.rfind('.');
    if (dot != std::string::npos) tl.resize(dot);
    if (!tl.empty()) found.insert(tl);
  }
  std::string out;
  for (const auto& t : found) out += (out.empty() ? "" : " ") + t;
  return out;
}

Status UcxTransport::hello(UcxEndpoint& ep) {
  UcxBatch b;
  auto op = std::make_unique<MessageOp>();
  op->header.kind = MessageKind::hello;
  // Where to answer it over shared memory; through a listener the reply
  // endpoint, and the header's admission token is what counts.
  if (!ep.m_listener) op->payload.push_back({const_cast<char*>(m_worker_address.data()), m_worker_address.size()});
  Status error;
  Status s = issue(b, ep, std::move(op));
  // At most 10 s, or the caller's deadline (QoS).
  if (s.ok()) s = drive(b, ScopedDeadline::bound(std::chrono::seconds(10)), &error);
  if (s.ok()) s = std::move(error);
  b.clear();
  return s.ok() ? s : s.with_context("the peer did not answer the hello of a new connection");
}

ucp_ep_h UcxTransport::answer_ep(uint64_t origin) {
  std::lock_guard lock(m_origins_lock);
  auto it = m_origin_eps.find(origin);
  return it == m_origin_eps.end() ? nullptr : it->second;
}

ucp_ep_h UcxTransport::open_answer_ep(uint64_t origin, const void* address) {
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

void UcxTransport::close_replaced_answer_eps() {
  std::vector<ucp_ep_h> closing, disconnecting;
  {
    std::lock_guard lock(m_origins_lock);
    closing.swap(m_closing);
    disconnecting.swap(m_disconnecting);
  }
  for (ucp_ep_h ep : disconnecting) {
    // Its peer lives: a close that tells it (a forced one would leave its
    // side of the connection up until its keepalive).
    ucp_request_param_t p{};
    void* request = ucp_ep_close_nbx(ep, &p);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) m_close_requests.push_back(request);
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

void UcxTransport::progress_loop(int efd) {
  using clock = std::chrono::steady_clock;
  auto last_news = clock::now();
  auto budget = m_idle_spin.budget();
  bool idle = false;  // nothing happened since last_news
  while (!m_stop.load(std::memory_order_relaxed)) {
    if (ucp_worker_progress(m_worker) != 0) {
      const auto now = clock::now();
      // News while polling: polling paid for this gap.
      if (idle) m_idle_spin.record(now - last_news, now - last_news, false);
      idle = false;
      last_news = now;
      continue;
    }
    if (!idle) {
      idle = true;
      budget = m_idle_spin.budget();
    }
    // Poll on while requests have been coming sooner than the poll lasts
    // (SpinPolicy); a daemon nobody asks sleeps at once.
    if (clock::now() - last_news < budget) continue;
    accept_pending();
    const bool refusing = refuse_pending();
    const bool waiting_for_hellos = expire_unadmitted();
    reap_unproven(false);
    close_replaced_answer_eps();
    if (ucp_worker_arm(m_worker) == UCS_ERR_BUSY) continue;
    // No timeout: a request (its bytes on a socket, or UCX's own events:
    // keepalive timer, wire-up) makes the event fd readable, and stopping or
    // a connection request writes m_wake_fd. Idle, this thread costs nothing
    // (but while accepted connections have yet to say hello: then it looks
    // every 100 ms to close those past their window).
    pollfd fds[2] = {{efd, POLLIN, 0}, {m_wake_fd, POLLIN, 0}};
    // A listener's looks every second for bare connections to reap.
    (void)::poll(fds, 2,
                 refusing                                          ? static_cast<int>(k_refusal_settle.count())
                 : waiting_for_hellos || !m_unproven_seen.empty() ? 100
                 : m_listener != nullptr                          ? 1000
                                                                  : -1);
    if ((fds[1].revents & POLLIN) != 0) {
      uint64_t n = 0;
      (void)::read(m_wake_fd, &n, sizeof n);
    }
    const auto now = clock::now();
    m_idle_spin.record(now - last_news, budget, true);
    idle = false;
    last_news = now;
  }
}

void UcxEndpoint::on_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* ep = static_cast<UcxEndpoint*>(arg);
  if (ep->m_failed.exchange(true, std::memory_order_acq_rel)) return;  // reported once
  ep->m_owner.report_failure(*ep, status);
}

void UcxTransport::report_failure(const UcxEndpoint& ep, ucs_status_t status) {
  std::lock_guard lock(m_failure_mutex);
  if (m_on_failure) m_on_failure(ep, std::string("UCX reports the peer failed: ") + ucs_status_string(status));
}

UcxEndpoint::~UcxEndpoint() {
  if (m_ep != nullptr) m_owner.close_endpoint(m_ep, failed());
}

std::string UcxEndpoint::transports() const {
  return m_ep == nullptr ? std::string("closed") : m_owner.describe(m_ep);
}

}  // namespace ucx_detail

Result<std::unique_ptr<Transport>> make_ucx_transport(const UcxOptions& options) {
  using namespace ucx_detail;
  static std::once_flag log_once;
  std::call_once(log_once, [] {
    ucs_log_push_handler(&log_to_stderr);
    // UCX 1.13 serves at most UCX_ASYNC_MAX_EVENTS (1024) descriptors per
    // worker: past that a listener's connection manager fails to take new
    // connections (every client after is reset) and crashes at its
    // destruction, so 1,100 bare connections to a listener took a plane
    // down. The bound follows this process's descriptor limit instead
    // (each connection costs a descriptor first), unless the operator set it.
    if (std::getenv("UCX_ASYNC_MAX_EVENTS") == nullptr) {
      rlimit files{};
      size_t events = 16384;
      if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
        events = std::clamp<size_t>(files.rlim_cur, 1024, 65536);
      }
      (void)ucs_global_opts_set_value("ASYNC_MAX_EVENTS", std::to_string(events).c_str());
    }
  });
  auto t = std::make_unique<UcxTransport>();
  UcxOptions o = options;
  if (const char* e = std::getenv("TIERMEM_RMA_EMULATION"); e != nullptr && *e != '\0') o.emulation = e;
  if (const char* e = std::getenv("TIERMEM_SPIN_US"); e != nullptr && *e != '\0' && o.spin_us < 0) {
    o.spin_us = std::clamp(std::atoi(e), 0, 10000);
  }
  Status s = t->init(o);
  if (!s.ok()) return s;
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace tiermem
