#include "rpc_connection.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <fcntl.h>

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/frame.hpp"
#include "convert.hpp"

namespace tiermem {
namespace {

Status failed(const std::string& address, const std::string& why) {
  return Status(ErrorCode::connection_failed, "cannot connect to tiermemd at " + address + ": " + why);
}

std::string group_text(gid_t gid) {
  const group* g = ::getgrgid(gid);
  return g != nullptr ? "'" + std::string(g->gr_name) + "'" : std::to_string(gid);
}

// The socket (or its directory) does not let this user in: say whose it is.
Status denied(const std::string& path) {
  const std::string dir = path.substr(0, path.rfind('/') == std::string::npos ? 0 : path.rfind('/'));
  struct stat st {};
  std::string what = "the socket";
  if (!dir.empty() && ::stat(dir.c_str(), &st) == 0 && ::access(dir.c_str(), X_OK) != 0) {
    what = "its directory " + dir;
  } else if (::stat(path.c_str(), &st) != 0) {
    return Status(ErrorCode::permission_denied, "cannot connect to tiermemd at " + path + ": permission denied");
  }
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return Status(ErrorCode::permission_denied,
                "cannot connect to tiermemd at " + path + ": permission denied: " + what + " (mode " + mode +
                    ", group " + group_text(st.st_gid) + ") admits its owner and members of its group only, and uid " +
                    std::to_string(::getuid()) + " is neither; an operator adds you to group " +
                    group_text(st.st_gid) + " (the daemon's control.socket_group)");
}

}  // namespace

Result<std::unique_ptr<RpcConnection>> RpcConnection::connect_unix(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) {
    return Status(ErrorCode::invalid_argument, "socket path " + path + " is too long for a Unix socket");
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return failed(path, std::strerror(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno == EACCES) return denied(path);
    return failed(path, std::string(std::strerror(errno)) +
                            " (is the daemon running? set TIERMEM_SOCKET or --socket to its control socket)");
  }
  return std::unique_ptr<RpcConnection>(new RpcConnection(std::move(fd), path));
}

Result<std::unique_ptr<RpcConnection>> RpcConnection::connect_tcp(const std::string& address,
                                                                  std::chrono::milliseconds timeout) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return Status(ErrorCode::invalid_argument, "'" + address + "' is not host:port");
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return failed(address, ::gai_strerror(rc));
  }
  std::string why = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) continue;
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = std::strerror(errno);
      continue;
    }
    pollfd p{fd.get(), POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) {
      why = "timed out after " + std::to_string(timeout.count()) + " ms";
      continue;
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      why = std::strerror(err);
      continue;
    }
    // Back to blocking; small requests go out at once.
    ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
    const int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::freeaddrinfo(found);
    auto conn = std::unique_ptr<RpcConnection>(new RpcConnection(std::move(fd), address));
    conn->set_timeout(timeout);
    return conn;
  }
  ::freeaddrinfo(found);
  return failed(address, why);
}

int RpcConnection::duplicate_fd() const {
  std::lock_guard lock(m_mutex);
  return m_fd.valid() ? ::fcntl(m_fd.get(), F_DUPFD_CLOEXEC, 0) : -1;
}

void RpcConnection::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard lock(m_mutex);
  m_timeout = timeout;
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  ::setsockopt(m_fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(m_fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

bool RpcConnection::broken() const {
  std::lock_guard lock(m_mutex);
  return !m_fd.valid();
}

Result<proto::Response> RpcConnection::call(proto::Request& request, std::vector<UniqueFd>* fds) {
  std::lock_guard lock(m_mutex);
  if (!m_fd.valid()) {
    return Status(ErrorCode::connection_closed, "the connection to tiermemd at " + m_address + " was lost");
  }
  request.set_id(m_next_id++);
  // Into buffers kept from call to call: a large frame in fresh memory
  // takes a page fault per page, which costs more than the copy itself
  // (a large one of the call before is given back).
  for (std::string* b : {&m_send, &m_reply}) {
    if (b->capacity() > k_kept_buffer_bytes) std::string().swap(*b);
  }
  m_send.resize(wire::k_frame_header_bytes);
  request.AppendToString(&m_send);
  const size_t payload = m_send.size() - wire::k_frame_header_bytes;
  if (payload > m_max_frame) {
    return Status(ErrorCode::frame_too_large, "request of " + std::to_string(payload) +
                                                  " bytes exceeds the daemon's frame limit");
  }
  Status s = wire::send_framed(m_fd.get(), m_send);
  std::vector<UniqueFd> received;
  std::string& reply = m_reply;
  // The daemon answers even a refused request, so a response can still be read
  // after a failed send (e.g. it closed after telling us why).
  Status r = wire::recv_frame(m_fd.get(), m_max_frame + 64, &reply, &received);
  if (!r.ok()) {
    m_fd.reset();
    if (r.code() == ErrorCode::timeout) {
      return Status(ErrorCode::timeout, "tiermemd at " + m_address + " did not answer within " +
                                            std::to_string(m_timeout.count()) +
                                            " ms (is it stopped or overloaded?); this connection is closed");
    }
    if (!s.ok()) return s.with_context("tiermemd at " + m_address);
    return r.with_context("tiermemd at " + m_address);
  }
  proto::Response response;
  if (!response.ParseFromString(reply)) {
    m_fd.reset();
    return Status(ErrorCode::malformed_frame, "tiermemd sent a response that does not decode");
  }
  if (response.id() != request.id() && response.id() != 0) {
    m_fd.reset();
    return Status(ErrorCode::unexpected_message, "tiermemd answered request " + std::to_string(response.id()) +
                                                     " while " + std::to_string(request.id()) + " was asked");
  }
  Status status = wire::from_proto(response.status());
  if (!status.ok()) return status;
  if (fds != nullptr) {
    for (auto& f : received) fds->push_back(std::move(f));
  }
  return response;
}

}  // namespace tiermem
