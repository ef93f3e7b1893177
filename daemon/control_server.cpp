#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs std::exchange

#include "daemon/control_server.hpp"

#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <map>
#include <set>

#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include <tiermem/status_macros.h>

#include "common/frame.hpp"
#include "common/unique_fd.hpp"
#include "daemon/frame_budget.hpp"
#include "daemon/peer_slots.hpp"
#include "daemon/request_checks.hpp"
#include "daemon/tcp_listener.hpp"
#include "daemon/tenants.hpp"

namespace tiermem {
namespace asio = boost::asio;
using asio::ip::tcp;
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

using Clock = std::chrono::steady_clock;

// Runs blocking work as a coroutine. A named function, not a lambda: its
// parameter lives in the coroutine frame (Boost 1.74's co_spawn destroys a
// coroutine lambda's captures too early).
asio::awaitable<Reply> run_deferred(std::function<Reply()> work) { co_return work(); }

// What a coroutine waits for without holding a thread, until a deadline:
// room in the frame budget, a peer's slot. notify() comes from any thread;
// the timer is touched only under the mutex, so a notify() never races the
// start of the wait (it then completes at once).
class Wakeup {
 public:
  explicit Wakeup(const asio::any_io_executor& executor) : m_timer(executor) {}

  // True when notified before `until`.
  asio::awaitable<bool> wait_until(Clock::time_point until) {
    boost::system::error_code ec;
    auto token = asio::redirect_error(asio::use_awaitable, ec);
    co_await asio::async_initiate<decltype(token), void(boost::system::error_code)>(
        [this, until](auto handler) {
          std::lock_guard lock(m_mutex);
          m_timer.expires_at(m_notified ? Clock::now() : until);
          m_timer.async_wait(std::move(handler));
        },
        token);
    std::lock_guard lock(m_mutex);
    co_return m_notified;
  }

  void notify() {
    std::lock_guard lock(m_mutex);
    m_notified = true;
    m_timer.cancel();
  }

 private:
  std::mutex m_mutex;
  bool m_notified = false;
  asio::steady_timer m_timer;
};

// The bytes of one frame as they arrive. Its capacity is exactly what it
// was grown to (std::string and std::vector round growth up themselves).
class FrameBuffer {
 public:
  char* data() { return m_data.get(); }
  uint64_t capacity() const { return m_capacity; }
  // Grows to `capacity`, keeping the first `keep` bytes.
  void grow(uint64_t capacity, uint64_t keep) {
    auto bigger = std::make_unique_for_overwrite<char[]>(capacity);
    if (keep > 0) std::memcpy(bigger.get(), m_data.get(), keep);
    m_data = std::move(bigger);
    m_capacity = capacity;
  }
  // After a frame: a large buffer is given back, a small one kept for the next.
  void trim() {
    if (m_capacity > k_kept_bytes) {
      m_data.reset();
      m_capacity = 0;
    }
  }

 private:
  static constexpr uint64_t k_kept_bytes = 16 << 10;
  std::unique_ptr<char[]> m_data;
  uint64_t m_capacity = 0;
};

// The budget's name for a session's uid; TCP connections that have not
// authenticated share one of their own.
constexpr uid_t k_unauthenticated = static_cast<uid_t>(-1);

class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual void close() = 0;
  virtual uid_t uid() const = 0;
  virtual bool remote() const = 0;
};

// One connection: reads framed requests, answers each in turn. Every read
// that has begun (a frame's header arrived, or the session has not said
// hello yet) has a deadline, so a client that declares more than it sends, or
// connects and says nothing, costs a connection for that long only; so does
// every reply the client is slow to take. A frame's buffer grows with the
// bytes that arrive; a large one claims its size from the frame budget
// first, and while it waits its socket is not read (the sender is slowed
// by the kernel's buffers filling up, not refused).
template <typename Protocol>
class Session final : public SessionBase, public std::enable_shared_from_this<Session<Protocol>> {
 public:
  using Socket = typename Protocol::socket;

  Session(Socket socket, RequestHandler& handler, const DaemonConfig& config, asio::thread_pool& pool,
          std::shared_ptr<FrameBudget> budget, PeerSlots* slots, uint64_t id)
      : m_socket(std::move(socket)), m_handler(handler), m_config(config), m_pool(pool), m_budget(std::move(budget)),
        m_slots(slots), m_deadline(m_socket.get_executor()) {
    m_state.id = id;
    if constexpr (std::is_same_v<Protocol, stream_protocol>) {
      ucred cred{};
      socklen_t len = sizeof cred;
      if (::getsockopt(m_socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        m_state.uid = cred.uid;
        m_state.gid = cred.gid;
        m_state.pid = cred.pid;
      }
      m_state.groups = peer_groups(m_socket.native_handle());
    } else {
      m_state.remote = true;
      boost::system::error_code ec;
      m_socket.set_option(tcp::no_delay(true), ec);
    }
    boost::system::error_code ec;
    m_socket.native_non_blocking(true, ec);
    // Synchronous reads and writes (what the socket takes at once) return
    // would_block instead of waiting.
    m_socket.non_blocking(true, ec);
  }
  ~Session() override { release_claims(); }

  uid_t uid() const override { return m_state.uid; }
  bool remote() const override { return m_state.remote; }

  asio::awaitable<void> run() {
    spdlog::debug("session {} opened by pid {} uid {}", m_state.id, m_state.pid, m_state.uid);
    for (;;) {
      proto::Request request;
      const Status got = co_await read_request(&request);
      if (!got.ok()) {
        if (got.code() != ErrorCode::connection_closed) {
          spdlog::warn("session {} ({}): {}; closing", m_state.id, who(), got.message());
          co_await send(error_reply(0, got, true));
        }
        break;
      }
      Reply reply = co_await answer(request);
      if (reply.close_after) {
        spdlog::warn("session {} ({}): {}; closing", m_state.id, who(), reply.response.status().message());
      }
      const bool sent = co_await send(reply);
      release_claims();  // the frame and its reply are gone
      if (!sent || reply.close_after) break;
    }
    m_deadline.cancel();
    m_handler.end_session(m_state);
    close();
    spdlog::debug("session {} closed", m_state.id);
  }

  // Once, from whichever thread comes first: the session's own coroutine
  // when it ends, or ControlServer::stop() on another io thread (two closes
  // of one socket at once deregistered it twice, and a SIGTERM that came as
  // a client hung up crashed the daemon in asio's reactor).
  void close() override {
    std::lock_guard lock(m_close_mutex);
    if (m_closed) return;
    m_closed = true;
    boost::system::error_code ec;
    m_socket.close(ec);
  }

  // Sends one refusal and closes (too many connections).
  asio::awaitable<void> refuse(Status why) {
    co_await send(error_reply(0, why, true));
    close();
  }

 private:
  std::string who() const {
    if (m_state.peer) return m_state.client_name;
    return m_state.remote ? std::string("tcp") : "pid " + std::to_string(m_state.pid);
  }

  // The reply to a decoded request: room for a read's data first, then the
  // handler; blocking work goes to the pool, with a slot of the peer it
  // calls taken first.
  asio::awaitable<Reply> answer(const proto::Request& request) {
    const uint64_t reply_bytes = request.has_read() ? std::min(request.read().length(), m_config.max_inline_bytes) : 0;
    if (reply_bytes > k_unclaimed_frame_bytes) {
      // The session may hold its frame's claim while it waits here: only a
      // read request padded past 64 KiB does, and it waits at most
      // frame_timeout_ms like any claim.
      if (Status s = co_await claim(reply_bytes, "a read's reply"); !s.ok()) {
        co_return error_reply(request.id(), s, false);
      }
    }
    Reply reply = m_handler.handle(request, m_state);
    if (!reply.deferred) co_return reply;
    if (reply.peer != 0 && m_slots != nullptr) reply.deferred = co_await with_peer_slot(reply, request);
    // Blocking work (a peer's answer, a migration, one-sided copies) runs on
    // the pool; this coroutine resumes on its own executor after.
    co_return co_await asio::co_spawn(m_pool, run_deferred(std::move(reply.deferred)), asio::use_awaitable);
  }

  // Waits, without a thread, for a slot of the peer `reply`'s work calls,
  // until the request's deadline (else the peer timeout). The work then
  // calls with that slot, or fails as the wait did: by its own error path.
  asio::awaitable<std::function<Reply()>> with_peer_slot(Reply& reply, const proto::Request& request) {
    const auto now = Clock::now();
    const uint64_t ms = request.deadline_ms() > 0 ? request.deadline_ms() : m_config.peer_timeout_ms;
    PeerSlots::Deadline deadline{now + std::chrono::milliseconds(ms),
                                 request.deadline_ms() > 0 ? "the request's deadline of " + std::to_string(ms) + " ms"
                                                           : "cluster.peer_timeout_ms (" + std::to_string(ms) + " ms)"};
    auto wakeup = std::make_shared<Wakeup>(m_socket.get_executor());
    PeerSlots::Wait wait = m_slots->wait(reply.peer, deadline, [wakeup] { wakeup->notify(); });
    if (!wait.ready()) co_await wakeup->wait_until(deadline.until);
    auto slot = wait.take();
    const NodeId node = reply.peer;
    if (!slot.ok()) {
      co_return [work = std::move(reply.deferred), node, refused = slot.status()]() {
        PeerSlots::Use use(node, refused);
        return work();
      };
    }
    auto held = std::make_shared<PeerSlots::Slot>(std::move(slot).value());
    co_return [work = std::move(reply.deferred), held]() {
      Reply out;
      {
        PeerSlots::Use use(*held);
        out = work();
      }
      *held = PeerSlots::Slot();  // the next request to the peer may go
      return out;
    };
  }

  // Peer daemons, once authenticated, are not counted (ARCHITECTURE.md,
  // "Control plane"); unauthenticated TCP connections share one account.
  bool counted() const { return !m_state.peer; }
  uid_t account() const { return m_state.remote ? k_unauthenticated : m_state.uid; }
  std::string account_name() const {
    return m_state.remote ? std::string("unauthenticated TCP connections") : "uid " + std::to_string(m_state.uid);
  }

  // Claims `bytes` of the frame budget, waiting up to frame_timeout_ms.
  // Errors: busy (saying which budget and its figures).
  asio::awaitable<Status> claim(uint64_t bytes, const char* what) {
    if (!counted()) co_return Status();
    auto wakeup = std::make_shared<Wakeup>(m_socket.get_executor());
    auto claimed = m_budget->claim(account(), account_name(), bytes, [wakeup] { wakeup->notify(); });
    if (!claimed->granted()) {
      spdlog::debug("session {} ({}): {} of {} bytes is waiting for the frame budget", m_state.id, who(), what, bytes);
      co_await wakeup->wait_until(Clock::now() + std::chrono::milliseconds(m_config.frame_timeout_ms));
    }
    Status s = m_budget->settle(claimed);
    if (s.ok()) {
      m_claimed += bytes;
      m_claimed_by = account();
    }
    co_return s;
  }

  void release_claims() {
    if (m_claimed == 0) return;
    m_budget->release(m_claimed_by, m_claimed);
    m_claimed = 0;
  }

  // Closes the socket when `ms` pass before disarm() (a pending read or
  // write then fails): the session's own timer, which never outlives it.
  void arm(uint64_t ms) {
    m_deadline.expires_after(std::chrono::milliseconds(ms));
    std::weak_ptr<Session> self = this->shared_from_this();
    m_deadline.async_wait([self](const boost::system::error_code& ec) {
      if (ec) return;
      if (auto s = self.lock()) {
        s->m_timed_out = true;
        s->close();
      }
    });
  }
  void disarm() { m_deadline.cancel(); }

  // One request. Errors: connection_closed (the peer went, or a deadline
  // closed it: then timeout), frame_too_large, malformed_frame, busy (no
  // room in the frame budget within frame_timeout_ms).
  asio::awaitable<Status> read_request(proto::Request* request) {
    boost::system::error_code ec;
    std::array<unsigned char, wire::k_frame_header_bytes> header{};
    if (!m_state.greeted) arm(m_config.frame_timeout_ms);  // say who you are in time
    co_await asio::async_read(m_socket, asio::buffer(header), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return timed_out_or_closed("before a request");
    const uint32_t length = wire::decode_frame_header(header.data());
    if (Status s = check_frame_length(length, m_state.greeted, m_config.max_frame_bytes); !s.ok()) {
      disarm();
      co_return s;
    }
    Status got = co_await read_body(length);
    disarm();
    if (got.ok()) got = parse_request(std::string_view(m_body.data(), length), request);
    m_body.trim();
    co_return got;
  }

  // The `length` bytes of a frame's body into m_body. Most frames are in
  // the socket already: what is there is taken without a timer (arming one
  // per frame cost the round trip more than the rest). The rest of the
  // frame must arrive within frame_timeout_ms; the time it waits for the
  // budget is the daemon's, not counted.
  asio::awaitable<Status> read_body(uint32_t length) {
    boost::system::error_code ec;
    bool armed = !m_state.greeted;
    uint64_t have = 0;
    while (have < length) {
      if (have == m_body.capacity()) {
        const uint64_t next = next_frame_capacity(have, m_socket.available(ec), length);
        if (next > k_unclaimed_frame_bytes && m_claimed == 0) {
          if (armed && m_state.greeted) disarm();
          if (Status s = co_await claim(length, "a frame"); !s.ok()) co_return s;
          if (armed && m_state.greeted) arm(m_config.frame_timeout_ms);
        }
        m_body.grow(next, have);
      }
      const size_t n = m_socket.read_some(asio::buffer(m_body.data() + have, std::min(m_body.capacity(), uint64_t{length}) - have), ec);
      if (!ec) {
        have += n;
        continue;
      }
      if (ec != asio::error::would_block && ec != asio::error::try_again) break;
      if (!armed) arm(m_config.frame_timeout_ms);
      armed = true;
      ec.clear();
      co_await m_socket.async_wait(Socket::wait_read, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
    }
    if (have < length) {
      co_return timed_out_or_closed("in the middle of a frame of " + std::to_string(length) + " bytes");
    }
    co_return Status();
  }

  Status timed_out_or_closed(const std::string& where) const {
    if (!m_timed_out) return Status(ErrorCode::connection_closed, "closed");
    return Status(ErrorCode::timeout, "nothing arrived for " + std::to_string(m_config.frame_timeout_ms) + " ms " +
                                          where + " (control.frame_timeout_ms)");
  }

  // Sends one reply. What the socket does not take at once must be taken
  // within frame_timeout_ms (a client that stops reading holds its
  // reply's bytes that long at most).
  asio::awaitable<bool> send(const Reply& reply) {
    const size_t size = reply.response.ByteSizeLong();
    std::string frame(wire::k_frame_header_bytes + size, '\0');
    const auto header = wire::encode_frame_header(static_cast<uint32_t>(size));
    std::memcpy(frame.data(), header.data(), header.size());
    reply.response.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(frame.data() + header.size()));
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
        co_await m_socket.async_wait(Socket::wait_write, asio::redirect_error(asio::use_awaitable, ec));
        if (ec) co_return false;
      }
    }
    while (sent < frame.size()) {
      const size_t n = m_socket.write_some(asio::buffer(frame.data() + sent, frame.size() - sent), ec);
      if (ec) break;
      sent += n;
    }
    if (sent == frame.size()) co_return true;
    if (ec != asio::error::would_block && ec != asio::error::try_again) co_return false;
    arm(m_config.frame_timeout_ms);
    ec.clear();
    co_await asio::async_write(m_socket, asio::buffer(frame.data() + sent, frame.size() - sent),
                               asio::redirect_error(asio::use_awaitable, ec));
    disarm();
    co_return !ec;
  }

  Socket m_socket;
  std::mutex m_close_mutex;  // close() once
  bool m_closed = false;
  RequestHandler& m_handler;
  const DaemonConfig& m_config;
  asio::thread_pool& m_pool;
  std::shared_ptr<FrameBudget> m_budget;
  PeerSlots* m_slots;  // null: no peers
  asio::steady_timer m_deadline;
  bool m_timed_out = false;
  FrameBuffer m_body;
  uint64_t m_claimed = 0;  // bytes of the frame budget the current request holds
  uid_t m_claimed_by = 0;
  SessionState m_state;
};

}  // namespace

class ControlServer::Impl {
 public:
  Impl(asio::io_context& io, asio::thread_pool& pool, RequestHandler& handler, const DaemonConfig& config,
       std::string tcp_listen, PeerSlots* slots)
      : m_io(io), m_pool(pool), m_handler(handler), m_config(config), m_tcp_listen(std::move(tcp_listen)),
        m_slots(slots),
        m_budget(std::make_shared<FrameBudget>(config.frame_budget_bytes, config.frame_budget_per_uid_bytes)),
        m_unix(io), m_tcp(io) {}

  Status listen() {
    TIERMEM_RETURN_IF_ERROR(listen_unix());
    if (!m_tcp_listen.empty()) return listen_tcp(m_tcp, m_tcp_listen, "the peer listen address");
    return Status();
  }

  void start() {
    asio::co_spawn(m_io, accept_loop<stream_protocol>(m_unix), asio::detached);
    if (m_tcp.is_open()) asio::co_spawn(m_io, accept_loop<tcp>(m_tcp), asio::detached);
  }

  void stop() {
    boost::system::error_code ec;
    m_unix.close(ec);
    m_tcp.close(ec);
    m_budget->close();
    std::lock_guard lock(m_mutex);
    for (const auto& s : m_sessions) s->close();
    ::unlink(m_config.socket_path.c_str());
  }

 private:
  Status listen_unix() {
    const std::string& path = m_config.socket_path;
    std::error_code fs_ec;
    const auto dir = std::filesystem::path(path).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir, fs_ec);
    if (std::filesystem::exists(path, fs_ec)) {
      if (someone_listens(path)) {
        return Status(ErrorCode::already_exists,
                      "another daemon is already serving on " + path + "; stop it or pick another control.socket");
      }
      // Left behind by a daemon that did not stop cleanly; anything but a
      // socket is not ours to remove (check_config_here refuses it first).
      if (!std::filesystem::is_socket(path, fs_ec)) {
        return Status(ErrorCode::config_error, m_config.source + ": control.socket = \"" + path +
                                                   "\": is not a socket, and the daemon replaces nothing else");
      }
      ::unlink(path.c_str());
    }
    boost::system::error_code ec;
    const stream_protocol::endpoint endpoint(path);
    m_unix.open(endpoint.protocol(), ec);
    if (!ec) m_unix.bind(endpoint, ec);
    if (ec) return Status(ErrorCode::io_error, "binding control socket " + path + ": " + ec.message());
    if (!m_config.socket_group.empty()) {
      TIERMEM_ASSIGN_OR_RETURN(const uint32_t gid,
                               resolve_group(m_config.socket_group, "control.socket_group", m_config.source));
      if (::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
        return Status(ErrorCode::io_error, "giving " + path + " to group " + m_config.socket_group + " (" +
                                               std::to_string(gid) + "): " + std::strerror(errno) +
                                               " (the daemon's user must be root or in that group)");
      }
    }
    if (::chmod(path.c_str(), m_config.socket_mode) != 0) {
      return Status(ErrorCode::io_error, "chmod of " + path + ": " + std::strerror(errno));
    }
    m_unix.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Status(ErrorCode::io_error, "listening on " + path + ": " + ec.message());
    return Status();
  }

  template <typename Protocol>
  asio::awaitable<void> accept_loop(typename Protocol::acceptor& acceptor) {
    asio::steady_timer pause(m_io);
    auto last_warning = std::chrono::steady_clock::time_point{};
    auto last_refusal = std::chrono::steady_clock::time_point{};
    uint64_t failures = 0, refusals = 0;
    for (;;) {
      boost::system::error_code ec;
      typename Protocol::socket socket(m_io);
      co_await acceptor.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
      if (ec) {
        // Out of descriptors (EMFILE) or memory: accepting again at once
        // would fail again at once. Back off, and say so once a while.
        ++failures;
        const auto now = std::chrono::steady_clock::now();
        if (now - last_warning > std::chrono::seconds(5)) {
          spdlog::warn("accept failed: {} ({} time(s) since the last warning); backing off", ec.message(), failures);
          last_warning = now;
          failures = 0;
        }
        pause.expires_after(std::chrono::milliseconds(100));
        co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      auto session = std::make_shared<Session<Protocol>>(std::move(socket), m_handler, m_config, m_pool, m_budget,
                                                         m_slots, ++m_next_id);
      if (Status full = admit(session); !full.ok()) {
        // A flood is told each time, the log once in a while.
        ++refusals;
        const auto now = std::chrono::steady_clock::now();
        if (now - last_refusal > std::chrono::seconds(5)) {
          spdlog::warn("refused {} connection(s) since the last warning: {}", refusals, full.message());
          last_refusal = now;
          refusals = 0;
        }
        asio::co_spawn(m_io, refuse<Protocol>(session, full), asio::detached);
        continue;
      }
      asio::co_spawn(m_io, run_session<Protocol>(session), asio::detached);
    }
  }

  // Counts the session in, or says why it may not come in. Counted here,
  // not when its coroutine first runs, so a burst of connections accepted
  // before any of them ran is counted in full.
  Status admit(const std::shared_ptr<SessionBase>& s) {
    SessionBase& session = *s;
    std::lock_guard lock(m_mutex);
    if (m_sessions.size() >= m_config.max_connections) {
      return Status(ErrorCode::busy, "tiermemd has " + std::to_string(m_sessions.size()) +
                                         " connections, its limit (control.max_connections); try again later");
    }
    if (!session.remote() && m_per_uid[session.uid()] >= m_config.max_connections_per_uid) {
      return Status(ErrorCode::busy, "uid " + std::to_string(session.uid()) + " has " +
                                         std::to_string(m_per_uid[session.uid()]) +
                                         " connections, its limit (control.max_connections_per_uid)");
    }
    m_sessions.insert(s);
    if (!session.remote()) ++m_per_uid[session.uid()];
    return Status();
  }

  // The coroutine's parameter keeps the session alive until it is told.
  template <typename Protocol>
  static asio::awaitable<void> refuse(std::shared_ptr<Session<Protocol>> session, Status why) {
    co_await session->refuse(std::move(why));
  }

  template <typename Protocol>
  asio::awaitable<void> run_session(std::shared_ptr<Session<Protocol>> session) {
    m_handler.session_opened();
    co_await session->run();
    m_handler.session_closed();
    std::lock_guard lock(m_mutex);
    m_sessions.erase(session);
    if (!session->remote() && --m_per_uid[session->uid()] == 0) m_per_uid.erase(session->uid());
  }

  asio::io_context& m_io;
  asio::thread_pool& m_pool;
  RequestHandler& m_handler;
  const DaemonConfig& m_config;
  std::string m_tcp_listen;
  PeerSlots* m_slots;
  std::shared_ptr<FrameBudget> m_budget;  // shared with the sessions, which may outlive this
  stream_protocol::acceptor m_unix;
  tcp::acceptor m_tcp;
  std::mutex m_mutex;
  std::set<std::shared_ptr<SessionBase>> m_sessions;
  std::map<uid_t, uint64_t> m_per_uid;
  std::atomic<uint64_t> m_next_id{0};
};

ControlServer::ControlServer(asio::io_context& io, asio::thread_pool& pool, RequestHandler& handler,
                             const DaemonConfig& config, std::string tcp_listen, PeerSlots* slots)
    : m_impl(std::make_unique<Impl>(io, pool, handler, config, std::move(tcp_listen), slots)) {}
ControlServer::~ControlServer() = default;
Status ControlServer::listen() { return m_impl->listen(); }
void ControlServer::start() { m_impl->start(); }
void ControlServer::stop() { m_impl->stop(); }

}  // namespace tiermem
