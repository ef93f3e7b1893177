// The UCX transport's listener: connections through UCX's connection manager
// (UcxOptions::listen_ip) instead of worker addresses.
//
// Why: a worker address is something anyone who learns it can dial, and UCX
// 1.13's wire-up by worker address aborts the answering process when the
// dialing one dies at the wrong moment ("got REP message"). A listener is
// reached at ip:port; the address handed to peers adds a random admission
// token, and the daemon hands a tenant's address only to that tenant's
// clients (and to its authenticated peers). Every request carries the token;
// one without it is refused and its endpoint closed, and an accepted
// endpoint that has not said hello with it within k_admission_window is
// closed too (on RDMA that tears down its queue pair, which is what could
// otherwise try keys of the transport's protection domain).
//
// The address on the wire: "tmucx-listener <ip> <port> <token in hex>".
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>

#include <tiermem/status_macros.h>

#include "common/deadline.hpp"
#include "transport/ucx/ucx_internal.hpp"

namespace tiermem {
namespace {

constexpr std::string_view k_listener_prefix = "tmucx-listener ";

struct ListenerAddress {
  std::string ip;
  uint16_t port = 0;
  uint64_t token = 0;
};

bool parse(std::string_view address, ListenerAddress* out) {
  if (address.substr(0, k_listener_prefix.size()) != k_listener_prefix) return false;
  const std::string rest(address.substr(k_listener_prefix.size()));
  char ip[64] = {};
  unsigned port = 0;
  unsigned long long token = 0;
  if (std::sscanf(rest.c_str(), "%63s %u %llx", ip, &port, &token) != 3 || port == 0 || port > 65535 ||
      token == 0) {
    return false;
  }
  out->ip = ip;
  out->port = static_cast<uint16_t>(port);
  out->token = token;
  return true;
}

Status to_sockaddr(const std::string& ip, uint16_t port, sockaddr_storage* out, socklen_t* length) {
  std::memset(out, 0, sizeof *out);
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  if (::inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    *length = sizeof *v4;
    return Status();
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (::inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    *length = sizeof *v6;
    return Status();
  }
  return Status(ErrorCode::invalid_argument, "'" + ip + "' is not an IP address to listen on or connect to");
}

}  // namespace

bool is_listener_address(std::string_view address) {
  return address.substr(0, k_listener_prefix.size()) == k_listener_prefix;
}

namespace ucx_detail {

Status UcxTransport::listen(const std::string& ip) {
  sockaddr_storage addr{};
  socklen_t length = 0;
  TIERMEM_RETURN_IF_ERROR(to_sockaddr(ip, 0, &addr, &length));
  ucp_listener_params_t p{};
  p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  p.sockaddr.addrlen = length;
  p.conn_handler.cb = &UcxTransport::on_conn_request;
  p.conn_handler.arg = this;
  ucs_status_t st = ucp_listener_create(m_worker, &p, &m_listener);
  if (st != UCS_OK) {
    m_listener = nullptr;
    return ucx_error("a UCX listener on " + ip +
                         " (UCX's connection manager needs a socket transport, e.g. tcp, or rdmacm in UCX_TLS)",
                     st);
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(m_listener, &attr);
  if (st != UCS_OK) return ucx_error("asking the UCX listener its port", st);
  uint16_t port = 0;
  if (attr.sockaddr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  } else {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr)->sin6_port);
  }
  while (m_admission == 0) m_admission = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  char text[128];
  std::snprintf(text, sizeof text, "%s %u %016" PRIx64, ip.c_str(), static_cast<unsigned>(port), m_admission);
  m_address = std::string(k_listener_prefix) + text;
  return Status();
}

// No UCX call is made under m_accept_lock: UCX may call back into us (a
// connection request, an endpoint's error) from inside any of its calls.
void UcxTransport::on_conn_request(ucp_conn_request_h request, void* arg) {
  auto& self = *static_cast<UcxTransport*>(arg);
  bool full = false;
  {
    std::lock_guard lock(self.m_accept_lock);
    // Too many connections that have not proven anything yet?
    full = self.m_conn_requests.size() + self.m_unadmitted.load() >= k_max_unadmitted;
    if (!full) self.m_conn_requests.push_back(request);
  }
  if (full) {
    (void)ucp_listener_reject(self.m_listener, request);
    return;
  }
  // Accepted by the progress thread, outside UCX's callback.
  const uint64_t one = 1;
  (void)::write(self.m_wake_fd, &one, sizeof one);
}

void UcxTransport::accept_pending() {
  std::vector<ucp_conn_request_h> requests;
  {
    std::lock_guard lock(m_accept_lock);
    if (m_conn_requests.empty()) return;
    requests.swap(m_conn_requests);
  }
  for (ucp_conn_request_h request : requests) {
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.conn_request = request;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &UcxTransport::on_accepted_error;
    p.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    // Listed once made (outside the lock, see on_conn_request): an error
    // reported before it is listed finds nothing to drop, and the endpoint,
    // never admitted, is closed when its window ends.
    if (ucp_ep_create(m_worker, &p, &ep) != UCS_OK) continue;
    std::lock_guard lock(m_accept_lock);
    // Its hello may have been run by another thread's progress already.
    const bool admitted = m_admitted_early.erase(ep) != 0;
    m_accepted[ep] = Accepted{std::chrono::steady_clock::now(), admitted};
    if (!admitted) m_unadmitted.fetch_add(1);
  }
}

void UcxTransport::on_accepted_error(void* arg, ucp_ep_h ep, ucs_status_t) {
  static_cast<UcxTransport*>(arg)->drop_accepted(ep, false);
}

void UcxTransport::drop_accepted(ucp_ep_h ep, bool tell_peer) {
  {
    std::lock_guard lock(m_accept_lock);
    auto it = m_accepted.find(ep);
    if (it == m_accepted.end()) return;  // not ours, or dropped already
    if (!it->second.admitted) m_unadmitted.fetch_sub(1);
    m_accepted.erase(it);
  }
  std::lock_guard lock(m_origins_lock);
  (tell_peer ? m_disconnecting : m_closing).push_back(ep);  // closed by the progress thread
}

void UcxTransport::admit(ucp_ep_h ep) {
  std::lock_guard lock(m_accept_lock);
  auto it = m_accepted.find(ep);
  if (it == m_accepted.end()) {
    // Not listed yet (accept_pending lists it after ucp_ep_create returned);
    // bounded: only endpoints this transport just accepted say hello.
    if (m_admitted_early.size() < k_max_unadmitted) m_admitted_early.insert(ep);
    return;
  }
  if (it->second.admitted) return;
  it->second.admitted = true;
  m_unadmitted.fetch_sub(1);
}

bool UcxTransport::expire_unadmitted() {
  if (m_unadmitted.load() == 0) return false;
  const auto now = std::chrono::steady_clock::now();
  std::vector<ucp_ep_h> late;
  {
    std::lock_guard lock(m_accept_lock);
    for (const auto& [ep, a] : m_accepted) {
      if (!a.admitted && now - a.since > k_admission_window) late.push_back(ep);
    }
  }
  for (ucp_ep_h ep : late) drop_accepted(ep, true);
  return m_unadmitted.load() > 0;
}

Result<std::shared_ptr<Endpoint>> UcxTransport::connect_listener(std::string_view address) {
  ListenerAddress where;
  if (!parse(address, &where)) {
    return Status(ErrorCode::invalid_argument, "a malformed listener address: '" + std::string(address) + "'");
  }
  sockaddr_storage addr{};
  socklen_t length = 0;
  TIERMEM_RETURN_IF_ERROR(to_sockaddr(where.ip, where.port, &addr, &length));
  auto ep = std::make_shared<UcxEndpoint>(*this);
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  p.sockaddr.addrlen = length;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &UcxEndpoint::on_error;
  p.err_handler.arg = ep.get();
  const ucs_status_t st = ucp_ep_create(m_worker, &p, &ep->m_ep);
  if (st != UCS_OK) return ucx_error("connecting to " + where.ip + ":" + std::to_string(where.port), st);
  ep->m_listener = true;
  ep->m_messages = true;  // answers on the reply endpoint
  ep->m_admission = where.token;
  // The hello is the connection's first request: it proves the token, and
  // its answer that the connection is up.
  TIERMEM_RETURN_IF_ERROR(hello(*ep));
  // One-sided only where every lane is RDMA; over TCP (and shared memory)
  // operations go as our messages (see transport.hpp).
  const std::string lanes = describe(ep->m_ep);
  bool rdma = !lanes.empty();
  size_t at = 0;
  while (at < lanes.size()) {
    const size_t end = std::min(lanes.find(' ', at), lanes.size());
    const std::string tl = lanes.substr(at, lanes.find('/', at) - at);
    rdma = rdma && (tl.rfind("rc", 0) == 0 || tl.rfind("dc", 0) == 0 || tl.rfind("ud", 0) == 0);
    at = end + 1;
  }
  ep->m_rdma = rdma;
  return std::shared_ptr<Endpoint>(std::move(ep));
}

}  // namespace ucx_detail
}  // namespace tiermem
