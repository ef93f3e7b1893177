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
#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include <tiermem/status_macros.h>

#include "common/deadline.hpp"
#include "common/socket_owner.hpp"
#include "common/unique_fd.hpp"
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
  m_listen_addr = attr.sockaddr;
  // Far above any honest use, and within the descriptors this process may
  // open (each connection holds some): a flood runs out of budget, not the
  // process out of descriptors.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    m_max_unadmitted = std::clamp<size_t>(files.rlim_cur / 8, k_per_source, 4096);
  }
  while (m_admission == 0) m_admission = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  char text[128];
  std::snprintf(text, sizeof text, "%s %u %016" PRIx64, ip.c_str(), static_cast<unsigned>(port), m_admission);
  m_address = std::string(k_listener_prefix) + text;
  return Status();
}

std::string UcxTransport::source_of(ucp_conn_request_h request, std::string* peer) const {
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(request, &attr) != UCS_OK) return "an unknown address";
  *peer = endpoint_text(attr.client_address);
  std::string source = address_text(attr.client_address);
  // Users of one host all come from its addresses: a process of this host
  // is told apart by its uid.
  if (auto uid = local_socket_owner(attr.client_address, m_listen_addr)) source += " uid " + std::to_string(*uid);
  return source;
}

void UcxTransport::uncount_locked(const std::string& source) {
  auto it = m_unadmitted_by.find(source);
  if (it != m_unadmitted_by.end() && --it->second == 0) m_unadmitted_by.erase(it);
  m_unadmitted.fetch_sub(1);
}

bool UcxTransport::evict_oldest_locked(const std::string& source, std::vector<ucp_ep_h>* drop) {
  // The oldest of the source's: a pending request (oldest first in the
  // list) or an accepted endpoint, whichever came first.
  auto pending = std::find_if(m_conn_requests.begin(), m_conn_requests.end(),
                              [&](const Pending& p) { return p.source == source; });
  auto accepted = m_accepted.end();
  for (auto it = m_accepted.begin(); it != m_accepted.end(); ++it) {
    if (!it->second.admitted && it->second.source == source &&
        (accepted == m_accepted.end() || it->second.since < accepted->second.since)) {
      accepted = it;
    }
  }
  if (pending == m_conn_requests.end() && accepted == m_accepted.end()) return false;
  if (pending != m_conn_requests.end() &&
      (accepted == m_accepted.end() || pending->since <= accepted->second.since)) {
    m_refusing.push_back(std::move(*pending));
    m_conn_requests.erase(pending);
  } else {
    drop->push_back(accepted->first);
    m_accepted.erase(accepted);
  }
  uncount_locked(source);
  ++m_turned_away[source];
  return true;
}

// No UCX call is made under m_accept_lock: UCX may call back into us (a
// connection request, an endpoint's error) from inside any of its calls.
// Nor is a request rejected here: see m_refusing.
void UcxTransport::on_conn_request(ucp_conn_request_h request, void* arg) {
  auto& self = *static_cast<UcxTransport*>(arg);
  std::string peer;
  std::string source = self.source_of(request, &peer);
  std::vector<ucp_ep_h> drop;
  {
    std::lock_guard lock(self.m_accept_lock);
    bool room = true;
    if (self.m_unadmitted_by[source] >= k_per_source) {
      room = self.evict_oldest_locked(source, &drop);
    } else if (self.m_unadmitted.load() >= self.m_max_unadmitted) {
      // The source holding the most gives way.
      const auto busiest = std::max_element(self.m_unadmitted_by.begin(), self.m_unadmitted_by.end(),
                                            [](const auto& a, const auto& b) { return a.second < b.second; });
      room = busiest != self.m_unadmitted_by.end() && self.evict_oldest_locked(busiest->first, &drop);
    }
    Pending pending{request, source, std::chrono::steady_clock::now(), std::move(peer)};
    if (room) {
      self.m_conn_requests.push_back(std::move(pending));
      ++self.m_unadmitted_by[source];
      self.m_unadmitted.fetch_add(1);
    } else {
      ++self.m_turned_away[source];
      if (auto it = self.m_unadmitted_by.find(source); it != self.m_unadmitted_by.end() && it->second == 0) {
        self.m_unadmitted_by.erase(it);
      }
      self.m_refusing.push_back(std::move(pending));
    }
  }
  if (!drop.empty()) {
    std::lock_guard lock(self.m_origins_lock);
    for (ucp_ep_h ep : drop) self.m_disconnecting.push_back(ep);  // closed by the progress thread
  }
  // Accepted (or refused) by the progress thread, outside UCX's callback.
  const uint64_t one = 1;
  (void)::write(self.m_wake_fd, &one, sizeof one);
}

template <typename Fn>
void UcxTransport::for_each_listener_socket(Fn&& fn) {
  const uint16_t port = port_of(m_listen_addr);
  std::unique_ptr<DIR, int (*)(DIR*)> fds(::opendir("/proc/self/fd"), ::closedir);
  if (fds == nullptr) return;
  while (const dirent* e = ::readdir(fds.get())) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2) continue;
    // A copy, checked again: the number may be closed and reused meanwhile,
    // and the copy keeps the socket it names.
    UniqueFd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    if (!copy.valid()) continue;
    sockaddr_storage local{}, remote{};
    socklen_t length = sizeof local;
    if (::getsockname(copy.get(), reinterpret_cast<sockaddr*>(&local), &length) != 0 || port_of(local) != port ||
        (local.ss_family != AF_INET && local.ss_family != AF_INET6)) {
      continue;
    }
    length = sizeof remote;
    if (::getpeername(copy.get(), reinterpret_cast<sockaddr*>(&remote), &length) != 0) continue;  // the listener
    fn(std::move(copy), remote);
  }
}

bool UcxTransport::refuse_pending() {
  if (m_listener == nullptr) return false;
  const auto now = std::chrono::steady_clock::now();
  // Shut down at least k_refusal_settle ago, and the worker progressed
  // since (the loop's first call): UCX has seen each fail, and rejects it
  // without writing.
  size_t kept = 0;
  for (Pending& p : m_refused) {
    if (now - p.since >= k_refusal_settle) {
      (void)ucp_listener_reject(m_listener, p.request);
    } else {
      m_refused[kept++] = std::move(p);
    }
  }
  m_refused.resize(kept);
  std::vector<Pending> refusing;
  {
    std::lock_guard lock(m_accept_lock);
    refusing.swap(m_refusing);
  }
  if (!refusing.empty()) {
    std::set<std::string> peers;
    for (const Pending& p : refusing) peers.insert(p.peer);
    for_each_listener_socket([&](UniqueFd fd, const sockaddr_storage& remote) {
      if (peers.count(endpoint_text(remote)) != 0) ::shutdown(fd.get(), SHUT_RDWR);
    });
    for (Pending& p : refusing) {
      p.since = now;
      m_refused.push_back(std::move(p));
    }
  }
  return !m_refused.empty();
}

void UcxTransport::accept_pending() {
  std::vector<Pending> requests;
  {
    std::lock_guard lock(m_accept_lock);
    if (m_conn_requests.empty()) return;
    requests.swap(m_conn_requests);
  }
  for (Pending& request : requests) {
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.conn_request = request.request;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &UcxTransport::on_accepted_error;
    p.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    // Listed once made (outside the lock, see on_conn_request): an error
    // reported before it is listed finds nothing to drop, and the endpoint,
    // never admitted, is closed when its window ends.
    const bool made = ucp_ep_create(m_worker, &p, &ep) == UCS_OK;
    std::lock_guard lock(m_accept_lock);
    if (!made) {
      uncount_locked(request.source);
      continue;
    }
    // Its hello may have been run by another thread's progress already.
    const bool admitted = m_admitted_early.erase(ep) != 0;
    m_accepted[ep] = Accepted{request.since, admitted, std::move(request.source), std::move(request.peer)};
    if (admitted) uncount_locked(m_accepted[ep].source);
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
    if (!it->second.admitted) uncount_locked(it->second.source);
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
    if (m_admitted_early.size() < m_max_unadmitted) m_admitted_early.insert(ep);
    return;
  }
  if (it->second.admitted) return;
  it->second.admitted = true;
  uncount_locked(it->second.source);
}

size_t UcxTransport::reap_unproven(bool everything) {
  if (m_listener == nullptr) return 0;
  const auto now = std::chrono::steady_clock::now();
  // Every 100 ms while connections that never spoke are held, else every second.
  if (!everything && now - m_last_reap < (m_unproven_seen.empty() ? std::chrono::milliseconds(1000)
                                                                  : std::chrono::milliseconds(100))) {
    return 0;
  }
  m_last_reap = now;
  // Peers UCX turned into connection requests: ours to judge (admission).
  std::set<std::string> known, admitted;
  {
    std::lock_guard lock(m_accept_lock);
    for (const Pending& p : m_conn_requests) known.insert(p.peer);
    for (const Pending& p : m_refusing) known.insert(p.peer);
    for (const auto& [ep, a] : m_accepted) (a.admitted ? admitted : known).insert(a.peer);
  }
  for (const Pending& p : m_refused) known.insert(p.peer);
  std::map<std::string, std::chrono::steady_clock::time_point> seen;
  size_t shut = 0;
  const auto shut_down = [&](int fd, const sockaddr_storage& remote) {
    ::shutdown(fd, SHUT_RDWR);
    ++shut;
    std::string source = address_text(remote);
    if (auto uid = local_socket_owner(remote, m_listen_addr)) source += " uid " + std::to_string(*uid);
    std::lock_guard lock(m_accept_lock);
    ++m_turned_away[source];
  };
  struct Unproven {
    std::chrono::steady_clock::time_point first;
    std::string peer, address;
    sockaddr_storage remote;
    UniqueFd fd;
  };
  std::vector<Unproven> unproven;
  for_each_listener_socket([&](UniqueFd copy, const sockaddr_storage& remote) {
    const std::string peer = endpoint_text(remote);
    if (admitted.count(peer) != 0) return;
    if (!everything) {
      if (known.count(peer) != 0) return;  // its window runs (expire_unadmitted), or it is being refused
      auto it = m_unproven_seen.find(peer);
      const auto first = it == m_unproven_seen.end() ? now : it->second;
      seen[peer] = first;
      if (now - first <= k_admission_window) {
        // Within its window, but within its source's budget too.
        unproven.push_back({first, peer, address_text(remote), remote, std::move(copy)});
        return;
      }
    }
    shut_down(copy.get(), remote);
  });
  // A source past its budget of connections that never spoke loses its
  // oldest now, not when their window ends: a flood must not hold the
  // worker's descriptors for the window.
  // Sources are told apart by address, and on an address past the budget
  // (every local user comes from 127.0.0.1) by uid too: only then is the
  // kernel asked whose each connection is.
  std::map<std::string, size_t> per_address, per_source;
  for (const Unproven& u : unproven) ++per_address[u.address];
  std::sort(unproven.begin(), unproven.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (Unproven& u : unproven) {
    if (per_address[u.address] <= k_per_source) continue;
    std::string source = u.address;
    if (auto uid = local_socket_owner(u.remote, m_listen_addr)) source += " uid " + std::to_string(*uid);
    if (++per_source[source] > k_per_source) {
      shut_down(u.fd.get(), u.remote);
      seen.erase(u.peer);
    }
  }
  m_unproven_seen.swap(seen);
  return shut;
}

Transport::AdmissionReport UcxTransport::take_admission_report() {
  AdmissionReport r;
  std::lock_guard lock(m_accept_lock);
  r.sources.swap(m_turned_away);
  for (const auto& [source, n] : r.sources) r.turned_away += n;
  return r;
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
