// The fuzz target: what a daemon does with the bytes one connection sends,
// minus the sockets. An input is a stream of frames (4-byte length, body);
// each is checked as the control server checks it (check_frame_length,
// parse_request; a bad one ends the "connection", as it does there), then
// handed to a RequestHandler over a real AddressSpace (DRAM and PMEM tiers in
// files under a directory of its own), and work the server would run on its
// pool runs inline. Each input is one session, client or TCP peer as its
// first byte says, ended after its last frame (its mappings released).
//
// The same target runs under libFuzzer (fuzz/libfuzzer_main.cpp, clang) and
// under our own structured mutator (fuzz/structured_fuzz.cpp, any compiler),
// which is what CI runs for a bounded time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "control.pb.h"
#include "daemon/config.hpp"
#include "daemon/request_handler.hpp"
#include "daemon/tenants.hpp"
#include "mapping/address_space.hpp"
#include "tiers/segment_file.hpp"

namespace tiermem::fuzz {

class RequestTarget {
 public:
  // Makes its tiers in a new directory under $TMPDIR (or /dev/shm).
  static std::unique_ptr<RequestTarget> create();
  ~RequestTarget();

  // One input. Never throws; a crash or a hang is a finding.
  void run(const uint8_t* data, size_t size);
  // The responses of the last run(), for the structured driver, which learns
  // GVAs from them.
  const std::vector<proto::Response>& responses() const { return m_responses; }
  uint64_t requests() const { return m_requests; }
  // Frees everything (the space fills up over a long run otherwise).
  void reset();

 private:
  RequestTarget() = default;
  // True when the server would close the connection after the reply.
  bool handle(const proto::Request& request, SessionState& session);

  std::string m_dir;
  DirectoryLock m_lock;
  DaemonConfig m_config;
  std::optional<TenantMap> m_tenants;
  std::unique_ptr<AddressSpace> m_space;
  std::unique_ptr<RequestHandler> m_handler;
  std::vector<proto::Response> m_responses;
  uint64_t m_sessions = 0;
  uint64_t m_requests = 0;
};

}  // namespace tiermem::fuzz
