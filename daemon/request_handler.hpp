// Turns one control request into one response, against the node's
// AddressSpace. Independent of the socket code so it reads as the protocol.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <tiermem/gva.h>

#include "control.pb.h"
#include "daemon/config.hpp"
#include "mapping/address_space.hpp"

namespace tiermem {

// What the daemon knows about one client connection.
struct SessionState {
  uint64_t id = 0;
  uid_t uid = 0;
  pid_t pid = 0;
  std::string client_name;
  bool greeted = false;        // hello exchanged
  std::vector<Gva> pins;       // allocations this session has mapped
};

struct Reply {
  proto::Response response;
  std::vector<int> fds;        // sent with the response (SCM_RIGHTS); not owned
  bool close_after = false;    // protocol error: end the session after replying
};

class RequestHandler {
 public:
  RequestHandler(AddressSpace& space, const DaemonConfig& config);

  // Handles a decoded request. Never throws; every failure becomes a status
  // in the response.
  Reply handle(const proto::Request& request, SessionState& session);
  // Releases what a closing session still held (its mappings).
  void end_session(SessionState& session);

  // A response carrying only an error, for frames that could not be decoded.
  static Reply error_reply(uint64_t id, const Status& status, bool close_after);

  void session_opened() { ++m_sessions; }
  void session_closed() { --m_sessions; }

 private:
  Status hello(const proto::HelloRequest& r, SessionState& s, proto::HelloResponse* out);
  Status alloc(const proto::AllocRequest& r, const SessionState& s, proto::AllocResponse* out);
  Status translate(const proto::TranslateRequest& r, proto::TranslateResponse* out);
  Status read(const proto::ReadRequest& r, proto::ReadResponse* out);
  Status write(const proto::WriteRequest& r, proto::WriteResponse* out);
  Status open_regions(proto::OpenRegionsResponse* out, std::vector<int>* fds);
  Status map(const proto::MapRequest& r, SessionState& s, proto::MapResponse* out);
  Status unmap(const proto::UnmapRequest& r, SessionState& s);
  void stat(proto::StatResponse* out);
  void dump(proto::DumpResponse* out);

  AddressSpace& m_space;
  const DaemonConfig& m_config;
  std::chrono::steady_clock::time_point m_started;
  std::atomic<uint64_t> m_sessions{0};
};

}  // namespace tiermem
