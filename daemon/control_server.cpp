#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs std::exchange

#include "daemon/control_server.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include "common/frame.hpp"
#include "common/unique_fd.hpp"

namespace tiermem {
namespace asio = boost::asio;
using asio::local::stream_protocol;

namespace {

// True when a daemon is accepting on `path` right now.
bool someone_listens(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(stream_protocol::socket socket, RequestHandler& handler, const DaemonConfig& config,
          uint64_t id)
      : m_socket(std::move(socket)), m_handler(handler), m_config(config) {
    m_state.id = id;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(m_socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      m_state.uid = cred.uid;
      m_state.pid = cred.pid;
    }
    boost::system::error_code ec;
    m_socket.native_non_blocking(true, ec);
  }

  asio::awaitable<void> run() {
    spdlog::debug("session {} opened by pid {} uid {}", m_state.id, m_state.pid, m_state.uid);
    boost::system::error_code ec;
    std::array<unsigned char, wire::k_frame_header_bytes> header{};
    std::string body;
    for (;;) {
      co_await asio::async_read(m_socket, asio::buffer(header), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      const uint32_t length = wire::decode_frame_header(header.data());
      if (length > m_config.max_frame_bytes) {
        spdlog::warn("session {} (pid {}): frame of {} bytes exceeds max_frame_bytes {}; closing",
                     m_state.id, m_state.pid, length, m_config.max_frame_bytes);
        co_await send(RequestHandler::error_reply(
            0,
            Status(ErrorCode::frame_too_large,
                   "frame of " + std::to_string(length) + " bytes exceeds the daemon's limit of " +
                       std::to_string(m_config.max_frame_bytes) + " bytes"),
            true));
        break;
      }
      body.resize(length);
      co_await asio::async_read(m_socket, asio::buffer(body), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      proto::Request request;
      if (!request.ParseFromString(body)) {
        spdlog::warn("session {} (pid {}): undecodable frame of {} bytes; closing", m_state.id,
                     m_state.pid, length);
        co_await send(RequestHandler::error_reply(
            0, Status(ErrorCode::malformed_frame, "frame is not a valid tiermem request"), true));
        break;
      }
      const Reply reply = m_handler.handle(request, m_state);
      if (reply.close_after) {
        spdlog::warn("session {} (pid {}): {}; closing", m_state.id, m_state.pid,
                     reply.response.status().message());
      }
      if (!co_await send(reply) || reply.close_after) break;
    }
    m_handler.end_session(m_state);
    close();
    spdlog::debug("session {} closed", m_state.id);
  }

  void close() {
    boost::system::error_code ec;
    m_socket.close(ec);
  }

 private:
  asio::awaitable<bool> send(const Reply& reply) {
    std::string payload;
    reply.response.SerializeToString(&payload);
    const auto header = wire::encode_frame_header(static_cast<uint32_t>(payload.size()));
    std::string frame(reinterpret_cast<const char*>(header.data()), header.size());
    frame += payload;
    boost::system::error_code ec;
    size_t sent = 0;
    if (!reply.fds.empty()) {
      // Asio cannot attach descriptors, so the first bytes go by sendmsg.
      for (;;) {
        auto n = wire::send_with_fds(m_socket.native_handle(), frame.data(), frame.size(), reply.fds);
        if (n.ok()) {
          sent = *n;
          break;
        }
        if (n.status().code() != ErrorCode::busy) co_return false;
        co_await m_socket.async_wait(stream_protocol::socket::wait_write,
                                     asio::redirect_error(asio::use_awaitable, ec));
        if (ec) co_return false;
      }
    }
    co_await asio::async_write(m_socket, asio::buffer(frame.data() + sent, frame.size() - sent),
                               asio::redirect_error(asio::use_awaitable, ec));
    co_return !ec;
  }

  stream_protocol::socket m_socket;
  RequestHandler& m_handler;
  const DaemonConfig& m_config;
  SessionState m_state;
};

}  // namespace

class ControlServer::Impl {
 public:
  Impl(asio::io_context& io, RequestHandler& handler, const DaemonConfig& config)
      : m_io(io), m_handler(handler), m_config(config), m_acceptor(io) {}

  Status listen() {
    const std::string& path = m_config.socket_path;
    std::error_code fs_ec;
    const auto dir = std::filesystem::path(path).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir, fs_ec);
    if (std::filesystem::exists(path, fs_ec)) {
      if (someone_listens(path)) {
        return Status(ErrorCode::already_exists,
                      "another daemon is already serving on " + path + "; stop it or pick another control.socket");
      }
      ::unlink(path.c_str());  // left behind by a daemon that did not stop cleanly
    }
    boost::system::error_code ec;
    const stream_protocol::endpoint endpoint(path);
    m_acceptor.open(endpoint.protocol(), ec);
    if (!ec) m_acceptor.bind(endpoint, ec);
    if (ec) return Status(ErrorCode::io_error, "binding control socket " + path + ": " + ec.message());
    if (::chmod(path.c_str(), m_config.socket_mode) != 0) {
      return Status(ErrorCode::io_error, "chmod of " + path + ": " + std::strerror(errno));
    }
    m_acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Status(ErrorCode::io_error, "listening on " + path + ": " + ec.message());
    return Status();
  }

  void start() {
    asio::co_spawn(m_io, accept_loop(), asio::detached);
  }

  void stop() {
    boost::system::error_code ec;
    m_acceptor.close(ec);
    std::lock_guard lock(m_mutex);
    for (const auto& s : m_sessions) s->close();
    ::unlink(m_config.socket_path.c_str());
  }

 private:
  asio::awaitable<void> accept_loop() {
    for (;;) {
      boost::system::error_code ec;
      stream_protocol::socket socket(m_io);
      co_await m_acceptor.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
      if (ec == asio::error::operation_aborted || !m_acceptor.is_open()) co_return;
      if (ec) {
        spdlog::warn("accept on {} failed: {}", m_config.socket_path, ec.message());
        continue;
      }
      auto session = std::make_shared<Session>(std::move(socket), m_handler, m_config, ++m_next_id);
      {
        std::lock_guard lock(m_mutex);
        m_sessions.insert(session);
      }
      asio::co_spawn(m_io, run_session(session), asio::detached);
    }
  }

  asio::awaitable<void> run_session(std::shared_ptr<Session> session) {
    m_handler.session_opened();
    co_await session->run();
    m_handler.session_closed();
    std::lock_guard lock(m_mutex);
    m_sessions.erase(session);
  }

  asio::io_context& m_io;
  RequestHandler& m_handler;
  const DaemonConfig& m_config;
  stream_protocol::acceptor m_acceptor;
  std::mutex m_mutex;
  std::set<std::shared_ptr<Session>> m_sessions;
  uint64_t m_next_id = 0;
};

ControlServer::ControlServer(asio::io_context& io, RequestHandler& handler, const DaemonConfig& config)
    : m_impl(std::make_unique<Impl>(io, handler, config)) {}
ControlServer::~ControlServer() = default;
Status ControlServer::listen() { return m_impl->listen(); }
void ControlServer::start() { m_impl->start(); }
void ControlServer::stop() { m_impl->stop(); }

}  // namespace tiermem
