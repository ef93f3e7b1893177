// The control server: a Unix-domain stream socket served with Boost.Asio
// coroutines, one coroutine per client connection.
#pragma once

#include <memory>

#include <tiermem/status.h>

#include "daemon/config.hpp"
#include "daemon/request_handler.hpp"

namespace boost::asio {
class io_context;
}

namespace tiermem {

class ControlServer {
 public:
  ControlServer(boost::asio::io_context& io, RequestHandler& handler, const DaemonConfig& config);
  ~ControlServer();

  // Binds the socket (removing a stale one left by a crashed daemon), sets its
  // mode and listens. Errors: already_exists (another daemon answers there),
  // io_error (bind, chmod).
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
