// The fixture of the executor's integration tests: two real daemons started
// for each case, connected, and their logs printed when the case failed.
// `daemon_options()` sizes their tiers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/exec_rank.hpp"
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

  // config/models/NAME.pbtxt of the source tree.
  static std::string model(const std::string& name) {
    return std::string(TIERMEM_SOURCE_ROOT) + "/config/models/" + name + ".pbtxt";
  }
  std::string socket(int node) { return m_cluster->node(node).socket(); }

  // Runs `world` ranks of tiermem-exec with `args`, rank r next to node
  // r % 2 + 1, and waits for them; returns their logs. A rank that failed
  // fails the case unless `rc` takes the worst exit code.
  std::string run(int world, const std::vector<std::string>& args, int* rc = nullptr) {
    std::vector<std::unique_ptr<ExecRank>> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(std::make_unique<ExecRank>(r, world, m_cluster->node(r % 2 + 1).socket(), args,
                                                 m_dir + "/rank" + std::to_string(r) + "-" + std::to_string(m_runs) +
                                                     ".log"));
    }
    ++m_runs;
    int worst = 0;
    std::string logs;
    for (auto& rank : ranks) {
      worst = std::max(worst, rank->wait());
      logs += rank->log();
    }
    if (rc != nullptr) *rc = worst;
    else EXPECT_EQ(worst, 0) << logs;
    return logs;
  }

  std::unique_ptr<TestCluster> m_cluster;
  std::string m_dir;  // the cluster's directory: logs, losses, traces
  int m_runs = 0;     // run calls so far
};

}  // namespace tiermem::test
