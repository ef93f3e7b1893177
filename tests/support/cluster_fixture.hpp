// A cluster of real daemons for one test, over the fabric its parameter
// names: "tcp": UCX over TCP, the nodes standing for hosts of their own
// (clients reach other nodes' memory through the data plane,
// TIERMEM_MAP_SAME_HOST=0); "sm": daemons of one host (UCX's shared memory
// between them; clients map the memory of every daemon of the host).
// "ofi-tcp" and "ofi-shm" are the same two over libfabric ([transport]
// fabric = "libfabric", provider "tcp;ofi_rxm" or "shm"). The environment is
// put back, and the daemons' logs printed when the test failed, by stop().
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "tests/support/failure_recap.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem::test {

class ClusterFixture {
 public:
  // Whether clients of a `param` cluster reach other nodes through the data
  // plane ("tcp", "ofi-tcp"), rather than mapping their memory ("sm",
  // "ofi-shm").
  static bool across_hosts(const std::string& param) { return param == "tcp" || param == "ofi-tcp"; }
  // A test's name for `param` (GoogleTest's names take no '-').
  static std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
    std::string name = info.param;
    std::replace(name.begin(), name.end(), '-', '_');
    return name;
  }

 protected:
  // Starts `nodes` daemons over `param`'s fabric and waits until they are
  // connected; false (with a failure that shows their logs) otherwise.
  bool start_cluster(const std::string& param, int nodes, DaemonOptions options) {
    if (param.rfind("ofi-", 0) == 0) {
      // tls is UCX's (refused with libfabric); clients follow the daemons'
      // fabric by their addresses.
      options.tls.clear();
      options.fabric = "libfabric";
      options.provider = param == "ofi-tcp" ? "tcp;ofi_rxm" : param.substr(4);
    } else {
      ::setenv("UCX_TLS", param.c_str(), 1);
      options.tls = param;
    }
    if (across_hosts(param)) ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);
    m_cluster = std::make_unique<TestCluster>(nodes, options);
    if (!m_cluster->ready() || !m_cluster->wait_connected()) {
      ADD_FAILURE() << "the cluster did not start\n" << m_cluster->logs();
      return false;
    }
    return true;
  }
  void stop_cluster() {
    if (m_cluster != nullptr && ::testing::Test::HasFailure()) {
      std::fprintf(stderr, "%s\n%s", m_cluster->logs().c_str(), failure_recap().c_str());
    }
    m_cluster.reset();
    ::unsetenv("UCX_TLS");
    ::unsetenv("TIERMEM_MAP_SAME_HOST");
  }
  std::unique_ptr<TestCluster> m_cluster;
};

}  // namespace tiermem::test
