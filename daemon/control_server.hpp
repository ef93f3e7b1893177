// The control server: a Unix-domain stream socket for clients on this node and,
// in a cluster, a TCP listener for peer daemons, served with Boost.Asio
// coroutines, one per connection. Blocking work (Reply::deferred) runs on a
// thread pool so the control threads keep serving. What the sessions hold
// is bounded: frames claim room in a frame budget (daemon/frame_budget.hpp)
// and requests to a peer a slot of it (daemon/peer_slots.hpp), and both
// wait for it without holding a thread.
#pragma once

#include <memory>

#include <tiermem/status.h>

#include "daemon/config.hpp"
#include "daemon/request_handler.hpp"

namespace boost::asio {
class io_context;
class thread_pool;
}

namespace tiermem {

class PeerSlots;

class ControlServer {
 public:
  // `tcp_listen` is host:port for peers, or empty for none; `slots` are the
  // peers' (null without peers), which forwarded requests wait for.
  ControlServer(boost::asio::io_context& io, boost::asio::thread_pool& pool, RequestHandler& handler,
                const DaemonConfig& config, std::string tcp_listen, PeerSlots* slots = nullptr);
  ~ControlServer();

  // Binds the socket (removing a stale one left by a crashed daemon), sets its
  // mode and listens; binds the TCP listener. Errors: already_exists (another
  // daemon answers there), io_error (bind, chmod), invalid_argument (address).
  Status listen();
  // Starts accepting; sessions run on the io_context.
  void start();
  // Stops accepting, closes every session and removes the socket file.
  void stop();

 private:
  class Impl;
  std::unique_ptr<Impl> m_impl;
};

}  // namespace tiermem
