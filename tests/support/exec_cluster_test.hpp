// The fixture of the executor's integration tests: two real daemons started
// for each case, connected, and their logs printed when the case failed.
// `daemon_options()` sizes their tiers.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "tests/support/failure_recap.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem::test {

class ExecClusterTest : public ::testing::Test {
 protected:
  virtual DaemonOptions daemon_options() const { return {.dram = "64MiB", .pmem = "8MiB"}; }
  void SetUp() override {
    m_cluster = std::make_unique<TestCluster>(2, daemon_options());
    ASSERT_TRUE(m_cluster->ready()) << m_cluster->logs();
    ASSERT_TRUE(m_cluster->wait_connected()) << m_cluster->logs();
    m_dir = m_cluster->dir();
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "%s\n%s", m_cluster->logs().c_str(), failure_recap().c_str());
  }

  std::unique_ptr<TestCluster> m_cluster;
  std::string m_dir;  // the cluster's directory: logs, losses, traces
};

}  // namespace tiermem::test
