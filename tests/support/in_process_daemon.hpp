// A daemon inside the test's own process, for unit tests of the parts above
// the client library (the executor's runtime): the real AddressSpace (DRAM
// and PMEM tiers in files of a temporary directory), RequestHandler and
// control server on a temporary Unix socket, served by threads of this
// process, and real Clients connected to it. No daemon process, no data
// plane, no peers: one node alone.
#pragma once

#include <memory>
#include <string>

#include <tiermem/client.h>

namespace tiermem::test {

class InProcessDaemon {
 public:
  // `dram`, `pmem`: tier capacities. Check ok() (and status()) after.
  explicit InProcessDaemon(uint64_t dram = 64 << 20, uint64_t pmem = 64 << 20);
  ~InProcessDaemon();
  InProcessDaemon(const InProcessDaemon&) = delete;
  InProcessDaemon& operator=(const InProcessDaemon&) = delete;

  bool ok() const { return m_status.ok(); }
  const Status& status() const { return m_status; }
  const std::string& socket() const { return m_socket; }
  // A client of it (null when it cannot connect).
  std::unique_ptr<Client> connect(const std::string& name = "test") const;

 private:
  struct State;
  std::unique_ptr<State> m_state;
  std::string m_dir;
  std::string m_socket;
  Status m_status;
};

}  // namespace tiermem::test
