// Device-aware partitioning (X3, executor/partitioner.hpp, runtime/profile.hpp):
// the ranks of a pipeline measure their devices at start and cut the stages
// by predicted time. Here the devices are CPU ranks, one of them slowed on
// purpose (--slowdown: every kernel it runs takes that many times as long),
// as a CPU stage is beside a GPU one. Whatever the cut, the losses are those
// of one rank training alone: to 1e-5 relative, not to the bit, because a
// GPT's pipeline sums a residual's gradient contributions in the order the
// stages' messages arrive, which the cut decides (so does the FLOP-balanced
// cut, tested alike).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>
#include <cstdio>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/exec_cluster_test.hpp"
#include "tests/support/exec_rank.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

std::string source(const std::string& path) { return std::string(TIERMEM_SOURCE_ROOT) + "/" + path; }

// stage -> its share of the FLOPs (%), from rank 0's "  stage S on ...: N
// forward op(s), P% of the FLOPs" lines.
std::map<int, double> shares(const std::string& log) {
  std::map<int, double> out;
  const std::regex line(R"(  stage ([0-9]+) on ([^\n]*?) \([^\n]*\): [0-9]+ forward op\(s\), ([0-9.]+)% of the FLOPs)");
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) {
    out[std::stoi((*it)[1])] = std::stod((*it)[3]);
  }
  return out;
}

// Both files hold `steps` losses, each within 1e-5 relative of the other's.
void expect_close(const std::string& ours, const std::string& reference, int steps) {
  std::istringstream a(ours), b(reference);
  int n = 0;
  for (std::string x, y; std::getline(a, x) && std::getline(b, y); ++n) {
    const double u = std::strtod(x.c_str(), nullptr), v = std::strtod(y.c_str(), nullptr);
    EXPECT_NEAR(u, v, 1e-5 * std::abs(v)) << "step " << n;
  }
  EXPECT_EQ(n, steps) << ours;
}

class BalanceTest : public test::ExecClusterTest {
 protected:
  std::vector<std::string> args(const std::string& job, int steps) const {
    return {source("config/models/gpt_tiny.pbtxt"), "--data", source("tests/data/corpus.txt"), "--steps",
            std::to_string(steps), "--log-every", "1", "--job", job, "--losses", losses(job),
            // Whole ops: a matmul split into column blocks sums in another order.
            "--no-split"};
  }
  std::string losses(const std::string& job) const { return m_dir + "/" + job + ".losses"; }
  std::unique_ptr<test::ExecRank> start(int rank, int world, const std::string& job, int steps,
                                        const std::vector<std::string>& extra, const std::string& tag = "") {
    std::vector<std::string> a = args(job, steps);
    a.insert(a.end(), extra.begin(), extra.end());
    return std::make_unique<test::ExecRank>(rank, world, m_cluster->node(rank % 2 + 1).socket(), a,
                                            m_dir + "/" + job + tag + ".rank" + std::to_string(rank) + ".log");
  }
  // `world` ranks of `job`, rank r with extra[r]; every rank's log, rank 0's first.
  std::vector<std::string> run(int world, const std::string& job, int steps,
                               const std::vector<std::vector<std::string>>& extra) {
    std::vector<std::unique_ptr<test::ExecRank>> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(start(r, world, job, steps, extra[static_cast<size_t>(r)]));
    std::vector<std::string> logs;
    for (auto& rank : ranks) {
      EXPECT_EQ(rank->wait(), 0) << rank->log();
      logs.push_back(rank->log());
    }
    return logs;
  }
};

TEST_F(BalanceTest, ASlowedRankGetsAStageSizedToItsSpeedAndTrainsAsOneRankDoes) {
  run(1, "alone", 30, {{}});
  const std::string reference = test::read_file(losses("alone"));
  ASSERT_EQ(std::count(reference.begin(), reference.end(), '\n'), 30);

  // Three stages, the middle one on a device three times slower.
  const auto logs = run(3, "mixed", 30, {{}, {"--slowdown", "3"}, {}});
  const std::string& log = logs[0];
  EXPECT_NE(log.find("partition by time"), std::string::npos) << log;
  const auto share = shares(log);
  ASSERT_EQ(share.size(), 3u) << log;
  EXPECT_LT(share.at(1), share.at(0)) << "the slowed stage takes less of the work: " << log;
  EXPECT_LT(share.at(1), share.at(2)) << log;
  EXPECT_LT(share.at(1), 25.0) << "a third of the others' speed: about a seventh of the FLOPs, not a third: " << log;
  EXPECT_NE(log.find("slowed 3x"), std::string::npos) << log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex(R"(slowest stage predicted ([0-9.]+) ms per step, against ([0-9.]+) ms balancing FLOPs)")))
      << log;
  EXPECT_LT(std::stod(m[1]), 0.8 * std::stod(m[2])) << "the prediction improves on the FLOP-balanced cut: " << log;
  for (size_t r = 0; r < logs.size(); ++r) {
    EXPECT_TRUE(std::regex_search(logs[r], std::regex("rank " + std::to_string(r) + ": stage " + std::to_string(r) +
                                                      " on .*: predicted [0-9.]+ ms per step, measured [0-9.]+ ms computing")))
        << "every rank reports its predicted and measured stage time: " << logs[r];
  }
  expect_close(test::read_file(losses("mixed")), reference, 30);

  // The same devices everywhere: FLOPs are time, and the METIS cut stays.
  const auto even = run(3, "even", 30, {{}, {}, {}});
  EXPECT_NE(even[0].find("partition by FLOPs (the stages run on one kind of device)"), std::string::npos) << even[0];
  expect_close(test::read_file(losses("even")), reference, 30);

  // --balance flops: no measuring; the slowed rank then holds up the others
  // but computes the same.
  const auto flops = run(3, "flops", 30, {{"--balance", "flops"}, {"--balance", "flops", "--slowdown", "3"}, {"--balance", "flops"}});
  EXPECT_EQ(flops[0].find("partition by"), std::string::npos) << flops[0];
  EXPECT_EQ(flops[1].find("computes GEMMs at"), std::string::npos) << flops[1];
  expect_close(test::read_file(losses("flops")), reference, 30);
}

// A rank killed part way resumes with the partition it started with: it
// keeps the figures it published (measuring again could cut other stages
// than its arenas were laid out for: the run would fail its shape check or
// compute garbage) and training goes on to the same losses.
TEST_F(BalanceTest, AKilledRankOfADeviceAwarePipelineResumesWithItsPartition) {
  run(1, "ref", 150, {{}});
  const std::string reference = test::read_file(losses("ref"));
  auto r0 = start(0, 2, "kill", 150, {});
  auto r1 = start(1, 2, "kill", 150, {"--slowdown", "3"});
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  // The loss's stage (the last) reports the steps.
  while (r1->log().find("step 40 ") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_NE(r1->log().find("step 40 "), std::string::npos) << r1->log();
  const auto before = shares(r0->log());
  ASSERT_EQ(before.size(), 2u) << r0->log();
  EXPECT_LT(before.at(1), before.at(0)) << r0->log();
  r1->kill();
  auto again = start(1, 2, "kill", 150, {"--slowdown", "3"}, "-again");
  EXPECT_EQ(again->wait(), 0) << again->log();
  EXPECT_EQ(r0->wait(), 0) << r0->log();
  const std::string log = again->log();
  EXPECT_NE(log.find("resumed at step"), std::string::npos) << log;
  EXPECT_EQ(log.find("computes GEMMs at"), std::string::npos) << "the restarted rank kept its published figures: " << log;
  expect_close(test::read_file(losses("kill")), reference, 150);
}

TEST_F(BalanceTest, BadBalanceOptionsAreClearErrors) {
  auto bad = [&](const std::vector<std::string>& extra, const std::string& says) {
    auto r = start(0, 1, "bad", 5, extra);
    EXPECT_NE(r->wait(), 0) << r->log();
    EXPECT_NE(r->log().find(says), std::string::npos) << r->log();
  };
  bad({"--balance", "fastest"}, "--balance");
  bad({"--slowdown", "0.5"}, "--slowdown");
  bad({"--slowdown", "2", "--device", "cuda"}, "--slowdown");
}

}  // namespace
}  // namespace tiermem
