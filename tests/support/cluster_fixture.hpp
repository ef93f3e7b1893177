// A cluster of real daemons for one test, over UCX `tls`: "tcp": the nodes
// stand for hosts of their own (UCX over TCP; clients reach other nodes'
// memory through the data plane, TIERMEM_MAP_SAME_HOST=0); "sm": daemons of
// one host (UCX's shared memory between them; clients map the memory of
// every daemon of the host). The environment is put back, and the daemons'
// logs printed when the test failed, by stop().
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "tests/support/test_daemon.hpp"

namespace tiermem::test {

class ClusterFixture {
 protected:
  // Starts `nodes` daemons and waits until they are connected; false (with
  // a failure that shows their logs) otherwise.
  bool start_cluster(const std::string& tls, int nodes, DaemonOptions options) {
    ::setenv("UCX_TLS", tls.c_str(), 1);
    if (tls == "tcp") ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);
    options.tls = tls;
    m_cluster = std::make_unique<TestCluster>(nodes, options);
    if (!m_cluster->ready() || !m_cluster->wait_connected()) {
      ADD_FAILURE() << "the cluster did not start\n" << m_cluster->logs();
      return false;
    }
    return true;
  }
  void stop_cluster() {
    if (m_cluster != nullptr && ::testing::Test::HasFailure()) std::fprintf(stderr, "%s\n", m_cluster->logs().c_str());
    m_cluster.reset();
    ::unsetenv("UCX_TLS");
    ::unsetenv("TIERMEM_MAP_SAME_HOST");
  }
  std::unique_ptr<TestCluster> m_cluster;
};

}  // namespace tiermem::test
