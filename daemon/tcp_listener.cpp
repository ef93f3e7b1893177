#include "daemon/tcp_listener.hpp"

#include <boost/asio.hpp>

namespace tiermem {

Status listen_tcp(boost::asio::ip::tcp::acceptor& acceptor, const std::string& address, const std::string& key) {
  namespace asio = boost::asio;
  using asio::ip::tcp;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return Status(ErrorCode::invalid_argument, key + " '" + address + "' is not host:port");
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  boost::system::error_code ec;
  tcp::resolver resolver(acceptor.get_executor());
  const auto found = resolver.resolve(host, address.substr(colon + 1), ec);
  if (ec || found.empty()) {
    return Status(ErrorCode::invalid_argument, "cannot resolve " + key + " '" + address + "': " + ec.message());
  }
  const tcp::endpoint endpoint = found.begin()->endpoint();
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status(ErrorCode::io_error, "listening on " + address + " (" + key + "): " + ec.message());
  return Status();
}

}  // namespace tiermem
