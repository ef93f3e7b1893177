// The Prometheus endpoint (O4): HTTP/1.1 on `metrics.listen` (host:port),
// Boost.Beast over the daemon's io_context. GET or HEAD of /metrics answers
// the text exposition that `render` returns; / says where the metrics are;
// anything else is 404 (405 for another method, 400 for what does not parse,
// 431 for oversized headers). Each connection has a deadline and a request
// no body; at most k_max_connections at once. Nothing a scraper sends stops
// the daemon.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <tiermem/status.h>

namespace boost::asio {
class io_context;
}

namespace tiermem {

class MetricsServer {
 public:
  static constexpr int k_max_connections = 64;
  static constexpr int k_timeout_ms = 10000;

  MetricsServer(boost::asio::io_context& io, std::string listen, std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Resolves and binds `listen`. Errors: invalid_argument (not host:port,
  // unresolvable), io_error (bind: in use, no permission).
  Status listen();
  // The address bound (port 0 resolved), after listen().
  std::string address() const;
  void start();
  // Stops accepting and closes open connections.
  void stop();

 private:
  class Impl;
  std::shared_ptr<Impl> m_impl;
};

}  // namespace tiermem
