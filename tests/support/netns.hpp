// Network namespaces joined by veth pairs to a bridge, for tests and
// benchmarks of daemons on a real (virtual) network: node i lives in its own
// namespace with address 10.213.T.i on device tmeth0, this process reaches
// every namespace through the bridge, and a partition is node i's link going
// down. Needs root and iproute2 (netns_unavailable() says why not).
#pragma once

#include <string>
#include <vector>

#include "tests/support/test_daemon.hpp"

namespace tiermem::test {

// Empty when namespaces can be made here; else why not.
std::string netns_unavailable();

class Network {
 public:
  explicit Network(int nodes);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  bool ok() const { return m_ok; }
  std::string ns(int i) const;
  std::string address(int i) const { return m_subnet + std::to_string(i); }
  std::string host(int i) const;
  const std::string& bridge() const { return m_bridge; }
  // Node i's link up or down (down: cut off from every other node and from
  // this process's bridge).
  bool link(int i, bool up);
  // The prefix that runs a command in node i's namespace, with UCX on its
  // veth (`env` drops what this process set for the bridge).
  std::vector<std::string> exec_in(int i) const;
  // `o` for a daemon of node i in its namespace: its wrapper, TCP over the
  // veth (keys of [transport], put before o.extra_toml's tables).
  void place(int i, DaemonOptions& o) const;
  // Lets this process's clients reach the namespaces (UCX over the bridge).
  void use_bridge() const;

 private:
  int m_nodes;
  bool m_ok = false;
  std::string m_subnet, m_bridge;
};

// Three (or `nodes`) daemons, one per namespace of `net`, with one cluster
// file of their veth addresses.
std::unique_ptr<TestCluster> cluster_in(const Network& net, int nodes, const DaemonOptions& base);

}  // namespace tiermem::test
