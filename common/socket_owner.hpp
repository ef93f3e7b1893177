// Who owns the other end of a TCP connection to this host: the uid of the
// local process whose socket is `peer` connected to `local` (the kernel's
// sock_diag, one exact lookup). Used by listeners to give each local user its
// own admission budget: the source address alone cannot tell the users of
// one host apart, which all connect from 127.0.0.1 or the host's address.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace tiermem {

// The uid owning the TCP socket whose local address is `peer` and remote
// address `local` (both AF_INET or AF_INET6, as the listener saw them); none
// when the socket is not on this host (or not visible: another network
// namespace), or the kernel cannot say. Blocking, one netlink round trip
// (some microseconds).
std::optional<uid_t> local_socket_owner(const sockaddr_storage& peer, const sockaddr_storage& local);

// "127.0.0.1" / "::1" for an AF_INET or AF_INET6 address ("?" otherwise).
std::string address_text(const sockaddr_storage& address);
// The same with the port: "127.0.0.1:41234", "[::1]:41234".
std::string endpoint_text(const sockaddr_storage& address);
// The port of an AF_INET or AF_INET6 address (0 otherwise).
uint16_t port_of(const sockaddr_storage& address);

}  // namespace tiermem
