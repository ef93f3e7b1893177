#include "common/socket_owner.hpp"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "common/unique_fd.hpp"

namespace tiermem {

namespace {

// Copies the address and port of `a` into a sock_diag socket id's fields.
bool fill(const sockaddr_storage& a, __be32 (&address)[4], __be16* port) {
  std::memset(address, 0, sizeof address);
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    std::memcpy(address, &v4->sin_addr, sizeof v4->sin_addr);
    *port = v4->sin_port;
    return true;
  }
  if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    std::memcpy(address, &v6->sin6_addr, sizeof v6->sin6_addr);
    *port = v6->sin6_port;
    return true;
  }
  return false;
}

}  // namespace

std::optional<uid_t> local_socket_owner(const sockaddr_storage& peer, const sockaddr_storage& local) {
  if (peer.ss_family != local.ss_family) return std::nullopt;
  struct Request {
    nlmsghdr header;
    inet_diag_req_v2 body;
  } request{};
  request.header.nlmsg_len = sizeof request;
  request.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  request.header.nlmsg_flags = NLM_F_REQUEST;  // one socket by its id, not a dump
  request.body.sdiag_family = static_cast<__u8>(peer.ss_family);
  request.body.sdiag_protocol = IPPROTO_TCP;
  request.body.idiag_states = ~0u;
  // The socket at the other end: its own address is `peer`, its remote `local`.
  if (!fill(peer, request.body.id.idiag_src, &request.body.id.idiag_sport) ||
      !fill(local, request.body.id.idiag_dst, &request.body.id.idiag_dport)) {
    return std::nullopt;
  }
  request.body.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  request.body.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  UniqueFd fd(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!fd.valid()) return std::nullopt;
  timeval bound{0, 100000};  // never more than 100 ms for an answer
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd.get(), &request, sizeof request, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) !=
      static_cast<ssize_t>(sizeof request)) {
    return std::nullopt;
  }
  alignas(nlmsghdr) char answer[1024];
  const ssize_t n = ::recv(fd.get(), answer, sizeof answer, 0);
  if (n < static_cast<ssize_t>(sizeof(nlmsghdr))) return std::nullopt;
  const auto* h = reinterpret_cast<const nlmsghdr*>(answer);
  if (!NLMSG_OK(h, static_cast<unsigned>(n)) || h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
      h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
    return std::nullopt;  // NLMSG_ERROR: no such socket here
  }
  const auto* msg = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
  return static_cast<uid_t>(msg->idiag_uid);
}

std::string address_text(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&address)->sin_addr, text, sizeof text);
  } else if (address.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr, text, sizeof text);
  }
  return text;
}

uint16_t port_of(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  return 0;
}

std::string endpoint_text(const sockaddr_storage& address) {
  const std::string ip = address_text(address);
  return (address.ss_family == AF_INET6 ? "[" + ip + "]" : ip) + ":" + std::to_string(port_of(address));
}

}  // namespace tiermem
