#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs std::exchange

#include "daemon/metrics_server.hpp"

#include <atomic>
#include <chrono>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include "daemon/tcp_listener.hpp"

namespace tiermem {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

class MetricsServer::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::io_context& io, std::string listen, std::function<std::string()> render)
      : m_io(io), m_listen(std::move(listen)), m_render(std::move(render)), m_acceptor(io) {}

  Status listen() { return listen_tcp(m_acceptor, m_listen, "metrics.listen"); }

  std::string address() const {
    boost::system::error_code ec;
    const tcp::endpoint e = m_acceptor.local_endpoint(ec);
    if (ec) return m_listen;
    return e.address().to_string() + ":" + std::to_string(e.port());
  }

  void start() { asio::co_spawn(m_io, accept_loop(shared_from_this()), asio::detached); }

  void stop() {
    boost::system::error_code ec;
    m_acceptor.close(ec);
  }

 private:
  static asio::awaitable<void> accept_loop(std::shared_ptr<Impl> self) {
    asio::steady_timer pause(self->m_io);
    for (;;) {
      boost::system::error_code ec;
      tcp::socket socket(self->m_io);
      co_await self->m_acceptor.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
      if (ec == asio::error::operation_aborted || !self->m_acceptor.is_open()) co_return;
      if (ec) {  // out of descriptors: accepting again at once would fail again
        pause.expires_after(std::chrono::milliseconds(100));
        co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      if (self->m_connections.load() >= k_max_connections) {
        socket.close(ec);  // a scraper needs one; a flood gets nothing
        continue;
      }
      asio::co_spawn(self->m_io, serve(self, std::move(socket)), asio::detached);
    }
  }

  http::response<http::string_body> answer(const http::request<http::empty_body>& request) const {
    http::response<http::string_body> r;
    r.version(request.version());
    r.keep_alive(request.keep_alive());
    r.set(http::field::server, "tiermemd");
    const std::string_view target(request.target().data(), request.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    if (request.method() != http::verb::get && request.method() != http::verb::head) {
      r.result(http::status::method_not_allowed);
      r.set(http::field::allow, "GET, HEAD");
      r.set(http::field::content_type, "text/plain; charset=utf-8");
      r.body() = "only GET and HEAD are served here\n";
    } else if (path == "/metrics") {
      r.result(http::status::ok);
      r.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      r.body() = m_render();
    } else if (path == "/") {
      r.result(http::status::ok);
      r.set(http::field::content_type, "text/plain; charset=utf-8");
      r.body() = "tiermemd: Prometheus metrics at /metrics\n";
    } else {
      r.result(http::status::not_found);
      r.set(http::field::content_type, "text/plain; charset=utf-8");
      r.body() = "not found: " + std::string(path) + " (the metrics are at /metrics)\n";
    }
    r.prepare_payload();
    if (request.method() == http::verb::head) r.body().clear();  // the length stays that of the GET
    return r;
  }

  static asio::awaitable<void> serve(std::shared_ptr<Impl> self, tcp::socket socket) {
    ++self->m_connections;
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer(16 << 10);  // its limit: a request line and headers, no more
    for (;;) {
      stream.expires_after(std::chrono::milliseconds(k_timeout_ms));
      http::request_parser<http::empty_body> parser;
      parser.header_limit(8 << 10);
      boost::system::error_code ec;
      co_await http::async_read(stream, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
      if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::operation_aborted ||
          ec == asio::error::connection_reset || ec == asio::error::eof) {
        break;
      }
      http::response<http::string_body> response;
      if (ec) {
        const bool too_big = ec == http::error::header_limit || ec == http::error::buffer_overflow;
        response.result(too_big ? http::status::request_header_fields_too_large : http::status::bad_request);
        response.set(http::field::content_type, "text/plain; charset=utf-8");
        response.body() = "bad request: " + ec.message() + "\n";
        response.keep_alive(false);
        response.prepare_payload();
      } else {
        response = self->answer(parser.get());
      }
      co_await http::async_write(stream, response, asio::redirect_error(asio::use_awaitable, ec));
      if (ec || !response.keep_alive()) break;
    }
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
    --self->m_connections;
  }

  asio::io_context& m_io;
  std::string m_listen;
  std::function<std::string()> m_render;
  tcp::acceptor m_acceptor;
  std::atomic<int> m_connections{0};
};

MetricsServer::MetricsServer(asio::io_context& io, std::string listen, std::function<std::string()> render)
    : m_impl(std::make_shared<Impl>(io, std::move(listen), std::move(render))) {}
MetricsServer::~MetricsServer() { m_impl->stop(); }
Status MetricsServer::listen() { return m_impl->listen(); }
std::string MetricsServer::address() const { return m_impl->address(); }
void MetricsServer::start() { m_impl->start(); }
void MetricsServer::stop() { m_impl->stop(); }

}  // namespace tiermem
