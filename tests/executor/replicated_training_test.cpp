// tiermem-exec with --replicas 1 on three real daemons: a rank whose node
// died resumes on another node from the copy of its snapshot, at the step it
// committed, and the job ends as an undisturbed run does (RPO 0) — also when
// it died with the snapshot of its last step on its way and that snapshot
// torn (the replacement takes the one before).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/support/exec_rank.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;
using Rank = test::ExecRank;

constexpr int64_t k_steps = 150;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The committed parameters (the first or second half of the params arena,
// by the parity of the step) of every allocation named `<job>.r<rank>.params`
// on `socket`'s node, by name.
std::map<std::string, std::string> committed_params(const std::string& socket, int64_t steps) {
  std::map<std::string, std::string> out;
  for (const auto& a : nlohmann::json::parse(test::run_ctl(socket, {"--json", "ls"}).out)) {
    const std::string name = a["name"].get<std::string>();
    if (name.size() < 7 || name.compare(name.size() - 7, 7, ".params") != 0 || a.contains("replica_of")) continue;
    const uint64_t half = a["size"].get<uint64_t>() / 2;
    auto gva = Gva::parse(a["gva"].get<std::string>());
    if (!gva.ok()) continue;
    out[name] = test::run_ctl(socket, {"read", gva->plus(steps % 2 * half).to_string(), std::to_string(half)}).out;
  }
  return out;
}

bool wait_for(const std::function<bool()>& done, std::chrono::seconds limit = 60s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// Three daemons, three data-parallel ranks (one per node) with --replicas 1,
// and an undisturbed reference run ("ref") of the same steps.
class ReplicatedTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test::DaemonOptions o{.dram = "64MiB", .pmem = "16MiB", .page_size = "64KiB"};
    o.cluster_timing = "reconnect_interval_ms = 10\nheartbeat_interval_ms = 10\npeer_timeout_ms = 200\n";
    o.extra_toml = "[health]\nunreachable_after_ms = 100\n[replication]\nrepair_interval_ms = 50\n";
    m_cluster = std::make_unique<test::TestCluster>(3, o);
    ASSERT_TRUE(m_cluster->ready()) << m_cluster->logs();
    ASSERT_TRUE(m_cluster->wait_connected()) << m_cluster->logs();
    m_dir = m_cluster->dir();
    std::vector<std::unique_ptr<Rank>> ref;
    for (int r = 0; r < 3; ++r) {
      ref.push_back(std::make_unique<Rank>(r, 3, socket(r + 1), args("ref"), m_dir + "/ref" + std::to_string(r) + ".log"));
    }
    for (auto& r : ref) ASSERT_EQ(r->wait(), 0) << r->log();
  }
  std::string socket(int node) { return m_cluster->node(node).socket(); }
  std::vector<std::string> args(const std::string& job) {
    return {TIERMEM_SOURCE_ROOT "/config/models/mlp_digits.pbtxt", "--stages", "1", "--steps", std::to_string(k_steps),
            "--replicas", "1", "--log-every", "1", "--timeout", "60", "--job", job, "--losses",
            m_dir + "/" + job + ".losses", "--keep"};
  }
  // Node 2 (its daemon, and rank 1 with it) SIGKILLed for good; once node 3
  // sees it unreachable (an orchestrator), rank 1 starts again on node 3.
  std::unique_ptr<Rank> replace_rank1(Rank& r1, const std::string& job) {
    m_cluster->node(2).kill();
    r1.kill();
    auto watcher = m_cluster->node(3).connect("watcher");
    EXPECT_NE(watcher, nullptr);
    if (watcher == nullptr) return nullptr;
    EXPECT_TRUE(wait_for([&] { return test::health_of(*watcher, 2) == NodeHealth::unreachable; }));
    return std::make_unique<Rank>(1, 3, socket(3), args(job), m_dir + "/" + job + "1b.log");
  }
  // The step the replacement resumed at, from its log (-1: it did not say).
  static int64_t resumed_at(const std::string& log) {
    std::smatch m;
    if (!std::regex_search(log, m, std::regex("resumed at step ([0-9]+) on node 3, restored from the replicated "
                                              "snapshot"))) {
      return -1;
    }
    return std::stoll(m[1]);
  }
  // Every loss as undisturbed, and every rank's parameters at the end.
  void expect_undisturbed(const std::string& job) {
    EXPECT_EQ(slurp(m_dir + "/" + job + ".losses"), slurp(m_dir + "/ref.losses"));
    auto on1 = committed_params(socket(1), k_steps), on3 = committed_params(socket(3), k_steps);
    ASSERT_EQ(on1.count("ref.r0.params"), 1u);
    const std::string& reference = on1["ref.r0.params"];
    EXPECT_FALSE(reference.empty());
    EXPECT_TRUE(on1[job + ".r0.params"] == reference) << "rank 0 ended elsewhere";
    ASSERT_EQ(on3.count(job + ".r1.params"), 1u) << "the replacement's parameters are not on node 3";
    EXPECT_TRUE(on3[job + ".r1.params"] == reference) << "the replacement ended elsewhere";
    EXPECT_TRUE(on3[job + ".r2.params"] == reference) << "rank 2 ended elsewhere";
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "%s\n", m_cluster->logs().c_str());
  }

  std::unique_ptr<test::TestCluster> m_cluster;
  std::string m_dir;
};

// Node 2 (its daemon and rank 1) is SIGKILLed mid-run and stays dead; a
// replacement rank 1 on node 3 resumes from the copy of rank 1's snapshot at
// the last committed step, ranks 0 and 2 follow it to its new memory, and the
// job ends with every rank's parameters bit for bit those of an undisturbed
// run of the same steps: RPO 0 steps.
TEST_F(ReplicatedTrainingTest, ARankWhoseNodeDiedResumesOnAnotherNodeAtTheCommittedStep) {
  Rank r0(0, 3, socket(1), args("moved"), m_dir + "/moved0.log");
  Rank r1(1, 3, socket(2), args("moved"), m_dir + "/moved1.log");
  Rank r2(2, 3, socket(3), args("moved"), m_dir + "/moved2.log");
  ASSERT_TRUE(wait_for([&] { return r0.log().find("step 50 ") != std::string::npos; })) << r0.log() << r1.log();
  const auto killed = std::chrono::steady_clock::now();
  auto again = replace_rank1(r1, "moved");
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->wait(), 0) << again->log() << m_cluster->logs();
  EXPECT_EQ(r0.wait(), 0) << r0.log();
  EXPECT_EQ(r2.wait(), 0) << r2.log();
  std::printf("replacement done %.2f s after the kill\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count());
  EXPECT_GE(resumed_at(again->log()), 50) << again->log();
  EXPECT_NE(r0.log().find("moved.r1.ctl moved from"), std::string::npos) << "rank 0 never followed rank 1\n" << r0.log();
  expect_undisturbed("moved");
  if (HasFailure()) {
    std::fprintf(stderr, "--- replacement\n%s\n--- rank 0\n%s\n--- rank 2\n%s\n", again->log().c_str(),
                 r0.log().c_str(), r2.log().c_str());
  }
}

// The snapshot of a step travels while the next step computes, and the step
// is committed once it is whole. Rank 1 stops (a real SIGSTOP,
// TIERMEM_EXEC_STOP_IN_SNAPSHOT) with step 60 done and its barrier raised —
// the others go on into step 61 — and the snapshot of step 60 sent but not
// known whole; that slot is then torn (bytes of its state overwritten, as a
// write cut short by the node's death leaves it) and node 2 dies. The
// replacement must refuse the torn slot by its checksum, resume at step 59
// from the slot before, and the job end as undisturbed.
TEST_F(ReplicatedTrainingTest, ATornSnapshotIsRefusedAndTheReplacementResumesFromTheOneBefore) {
  Rank r0(0, 3, socket(1), args("torn"), m_dir + "/torn0.log");
  ::setenv("TIERMEM_EXEC_STOP_IN_SNAPSHOT", "60", 1);
  Rank r1(1, 3, socket(2), args("torn"), m_dir + "/torn1.log");
  ::unsetenv("TIERMEM_EXEC_STOP_IN_SNAPSHOT");
  Rank r2(2, 3, socket(3), args("torn"), m_dir + "/torn2.log");
  ASSERT_TRUE(wait_for([&] { return r1.log().find("stopping with the snapshot of step 60 unsettled") != std::string::npos; }))
      << r1.log();
  std::this_thread::sleep_for(300ms);  // what was on its way lands; ranks 0 and 2 wait at its barrier
  EXPECT_EQ(r0.log().find("step 61 "), std::string::npos) << "rank 0 passed a barrier rank 1 never raised\n" << r0.log();

  // Slot 0 (steps 0, 2, ..., 60) of rank 1's snapshot: its state torn, on
  // the home and the copy alike (a write through the daemon).
  const auto found = nlohmann::json::parse(test::run_ctl(socket(2), {"--json", "lookup", "torn.r1.snapshot"}).out);
  auto gva = Gva::parse(found["gva"].get<std::string>());
  ASSERT_TRUE(gva.ok()) << found.dump();
  const std::string header = test::run_ctl(socket(2), {"read", gva->to_string(), "16"}).out;
  const std::string garbage = m_dir + "/garbage";
  std::ofstream(garbage) << std::string(512, '\xab');
  auto wrote = test::run_ctl(socket(2), {"write", gva->plus(64).to_string(), garbage});
  ASSERT_EQ(wrote.exit_code, 0) << wrote.err;

  auto again = replace_rank1(r1, "torn");
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->wait(), 0) << again->log() << m_cluster->logs();
  EXPECT_EQ(r0.wait(), 0) << r0.log();
  EXPECT_EQ(r2.wait(), 0) << r2.log();
  EXPECT_EQ(resumed_at(again->log()), 59) << again->log();
  if (header.size() == 16 && static_cast<unsigned char>(header[8]) == 60) {
    // The slot said step 60: refused for its checksum, by name.
    EXPECT_NE(again->log().find("rank snapshot of step 60 not taken"), std::string::npos) << again->log();
    EXPECT_NE(again->log().find("fails its checksum"), std::string::npos) << again->log();
  }
  expect_undisturbed("torn");
  if (HasFailure()) {
    std::fprintf(stderr, "--- replacement\n%s\n--- rank 0\n%s\n--- rank 2\n%s\n", again->log().c_str(),
                 r0.log().c_str(), r2.log().c_str());
  }
}

// A replacement that finds only snapshots of the format before (TMSNAP01,
// four ordered writes without a checksum) must refuse to resume, by name:
// starting the rank from step 0 while the others are at step 60 would
// diverge the job.
TEST_F(ReplicatedTrainingTest, SnapshotsOfTheOlderFormatAreRefusedNotTakenForAFreshStart) {
  Rank r0(0, 3, socket(1), args("older"), m_dir + "/older0.log");
  ::setenv("TIERMEM_EXEC_STOP_IN_SNAPSHOT", "60", 1);
  Rank r1(1, 3, socket(2), args("older"), m_dir + "/older1.log");
  ::unsetenv("TIERMEM_EXEC_STOP_IN_SNAPSHOT");
  Rank r2(2, 3, socket(3), args("older"), m_dir + "/older2.log");
  ASSERT_TRUE(wait_for([&] { return r1.log().find("stopping with the snapshot of step 60 unsettled") != std::string::npos; }))
      << r1.log();
  std::this_thread::sleep_for(300ms);
  const auto found = nlohmann::json::parse(test::run_ctl(socket(2), {"--json", "lookup", "older.r1.snapshot"}).out);
  auto gva = Gva::parse(found["gva"].get<std::string>());
  ASSERT_TRUE(gva.ok()) << found.dump();
  const uint64_t slot = found["size"].get<uint64_t>() / 2;
  const std::string magic = m_dir + "/magic";
  std::ofstream(magic) << "TMSNAP01";
  for (uint64_t at : {uint64_t{0}, slot}) {
    auto wrote = test::run_ctl(socket(2), {"write", gva->plus(at).to_string(), magic});
    ASSERT_EQ(wrote.exit_code, 0) << wrote.err;
  }
  auto again = replace_rank1(r1, "older");
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again->wait(), 0) << again->log();
  EXPECT_NE(again->log().find("snapshots elsewhere are of an older format (TMSNAP01"), std::string::npos)
      << again->log();
  EXPECT_EQ(again->log().find("resumed at step"), std::string::npos) << again->log();
  // And nothing of it left on node 3 for a later start to take as a rank at
  // step 0.
  const std::string ls = test::run_ctl(socket(3), {"ls"}).out;
  EXPECT_EQ(ls.find("older.r1.ctl"), std::string::npos) << ls;
  r0.kill();
  r2.kill();
}

}  // namespace
}  // namespace tiermem
