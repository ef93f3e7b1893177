// A blocking control connection to the local tiermemd (internal).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <tiermem/status.h>

#include "common/unique_fd.hpp"
#include "control.pb.h"

namespace tiermem::detail {

// One Unix-socket connection; call() sends a request and waits for its
// response. Thread-safe: calls are serialised.
class Connection {
 public:
  // Connects and exchanges hello. Errors: connection_failed,
  // protocol_mismatch, connection_closed.
  static Result<std::unique_ptr<Connection>> open(const std::string& socket_path,
                                                  const std::string& client_name);

  // Sends `request` (its id is set here) and returns the response; a non-OK
  // status in the response becomes the returned error. Descriptors that came
  // with the response are appended to *fds when given (closed otherwise).
  Result<proto::Response> call(proto::Request& request, std::vector<UniqueFd>* fds = nullptr);

  const proto::HelloResponse& hello() const { return m_hello; }
  const std::string& socket_path() const { return m_path; }

 private:
  Connection(UniqueFd fd, std::string path) : m_fd(std::move(fd)), m_path(std::move(path)) {}

  std::mutex m_mutex;
  UniqueFd m_fd;
  std::string m_path;
  uint64_t m_next_id = 1;
  uint32_t m_max_frame = 64u << 20;  // until the daemon says
  proto::HelloResponse m_hello;
};

}  // namespace tiermem::detail
