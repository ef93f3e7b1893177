// A blocking request/response connection speaking the control protocol, over a
// Unix socket (client to its daemon) or TCP (daemon to daemon).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <tiermem/status.h>

#include "common/unique_fd.hpp"
#include "control.pb.h"

namespace tiermem {

// call() sends a request and waits for its response. Thread-safe: calls are
// serialised. Once an I/O error occurs the connection stays broken (every
// later call fails with connection_closed).
class RpcConnection {
 public:
  // Errors: connection_failed with the reason and the address.
  static Result<std::unique_ptr<RpcConnection>> connect_unix(const std::string& path);
  // `address` is host:port. Errors: connection_failed, invalid_argument.
  static Result<std::unique_ptr<RpcConnection>> connect_tcp(const std::string& address,
                                                            std::chrono::milliseconds timeout);

  // Sends `request` (its id is set here) and returns the response; a non-OK
  // status in the response becomes the returned error. Descriptors that came
  // with the response are appended to *fds when given (closed otherwise).
  // Errors: the response's, connection_closed, frame_too_large, timeout.
  Result<proto::Response> call(proto::Request& request, std::vector<UniqueFd>* fds = nullptr);

  // The largest frame the peer accepts (learned from its hello).
  void set_max_frame(uint32_t bytes) { m_max_frame = bytes; }
  // Bounds every later call (0: wait forever).
  void set_timeout(std::chrono::milliseconds timeout);
  bool broken() const;
  const std::string& address() const { return m_address; }
  // A descriptor of the same socket, the caller's to close (to watch it).
  int duplicate_fd() const;

 private:
  RpcConnection(UniqueFd fd, std::string address) : m_fd(std::move(fd)), m_address(std::move(address)) {}

  mutable std::mutex m_mutex;
  UniqueFd m_fd;
  std::string m_address;
  uint64_t m_next_id = 1;
  uint32_t m_max_frame = 64u << 20;
  // The last request's frame and response, kept for the next call (up to
  // k_kept_buffer_bytes each).
  static constexpr size_t k_kept_buffer_bytes = 16u << 20;
  std::string m_send, m_reply;
  std::chrono::milliseconds m_timeout{0};
};

}  // namespace tiermem
