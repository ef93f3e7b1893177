// Binding a TCP listener from "host:port" (the peer port, the metrics
// endpoint), with errors that name the configuration key.
#pragma once

#include <string>

#include <boost/asio/ip/tcp.hpp>

#include <tiermem/status.h>

namespace tiermem {

// Resolves `address` ("host:port", "[v6]:port"), opens, binds (reusing the
// address) and listens on `acceptor`. `key` names the setting in errors.
// Errors: invalid_argument (not host:port, unresolvable), io_error (bind:
// in use, no permission).
Status listen_tcp(boost::asio::ip::tcp::acceptor& acceptor, const std::string& address, const std::string& key);

}  // namespace tiermem
