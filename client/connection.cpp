#include "client/connection.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "common/frame.hpp"
#include "convert.hpp"

namespace tiermem::detail {

Result<std::unique_ptr<Connection>> Connection::open(const std::string& path,
                                                     const std::string& client_name) {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) {
    return Status(ErrorCode::invalid_argument, "socket path " + path + " is too long for a Unix socket");
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status(ErrorCode::connection_failed, std::string("socket: ") + std::strerror(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Status(ErrorCode::connection_failed,
                  "cannot connect to tiermemd at " + path + ": " + std::strerror(errno) +
                      " (is the daemon running? set TIERMEM_SOCKET or --socket to its control socket)");
  }
  std::unique_ptr<Connection> conn(new Connection(std::move(fd), path));
  proto::Request request;
  request.mutable_hello()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  request.mutable_hello()->set_client_name(client_name);
  auto response = conn->call(request);
  if (!response.ok()) return response.status();
  conn->m_hello = response->hello();
  if (conn->m_hello.max_frame_bytes() > 0) {
    conn->m_max_frame = static_cast<uint32_t>(conn->m_hello.max_frame_bytes());
  }
  return conn;
}

Result<proto::Response> Connection::call(proto::Request& request, std::vector<UniqueFd>* fds) {
  std::lock_guard lock(m_mutex);
  if (!m_fd.valid()) {
    return Status(ErrorCode::connection_closed, "the connection to tiermemd at " + m_path + " was lost");
  }
  request.set_id(m_next_id++);
  std::string payload;
  request.SerializeToString(&payload);
  if (payload.size() > m_max_frame) {
    return Status(ErrorCode::frame_too_large, "request of " + std::to_string(payload.size()) +
                                                  " bytes exceeds the daemon's frame limit");
  }
  Status s = wire::send_frame(m_fd.get(), payload);
  std::vector<UniqueFd> received;
  std::string reply;
  // The daemon answers even a refused request, so a response can still be read
  // after a failed send (e.g. it closed after telling us why).
  Status r = wire::recv_frame(m_fd.get(), m_max_frame + 64, &reply, &received);
  if (!r.ok()) {
    m_fd.reset();
    if (!s.ok()) return s.with_context("tiermemd at " + m_path);
    return r.with_context("tiermemd at " + m_path);
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

}  // namespace tiermem::detail
