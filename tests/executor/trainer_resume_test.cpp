// tiermem-exec against real daemons, a job's life past one run: a rank or a
// daemon killed and the job resumed from its committed step with every loss
// undisturbed; a finished job's memory freed, a kept one refused unless
// restarted or resumed with the layout it was started with; snapshots of the
// committed state in PMEM.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
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
using Rank = test::ExecRank;

std::string slurp(const std::string& path) { return test::read_file(path); }

class TrainerResumeTest : public test::ExecClusterTest {
 protected:
  void resume_after(const std::string& job, const std::function<void(Rank&)>& disturb);
};

// Two data-parallel replicas of `job`; `disturb` runs once rank 0 is past
// step 60 and must leave rank 1 dead (it gets rank 1 to kill); rank 1 then
// starts again. It must resume at a committed step past 60, and every loss
// must be the one an undisturbed run saw.
void TrainerResumeTest::resume_after(const std::string& job, const std::function<void(Rank&)>& disturb) {
  const std::string reference = m_dir + "/" + job + "-ref.losses", resumed = m_dir + "/" + job + ".losses";
  const std::vector<std::string> common{model("mlp_digits"), "--stages", "1", "--steps", "300", "--log-every", "1"};
  auto args = [&](const std::string& name, const std::string& losses) {
    std::vector<std::string> a = common;
    a.insert(a.end(), {"--job", name, "--losses", losses});
    return a;
  };
  run(2, args(job + "-ref", reference));  // undisturbed

  Rank r0(0, 2, socket(1), args(job, resumed), m_dir + "/" + job + "0.log");
  Rank r1(1, 2, socket(2), args(job, resumed), m_dir + "/" + job + "1.log");
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (r0.log().find("step 60 ") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_NE(r0.log().find("step 60 "), std::string::npos) << r0.log();
  disturb(r1);
  Rank again(1, 2, socket(2), args(job, resumed), m_dir + "/" + job + "1b.log");
  EXPECT_EQ(again.wait(), 0) << again.log();
  EXPECT_EQ(r0.wait(), 0) << r0.log();
  std::smatch m;
  const std::string log = again.log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("resumed at step ([0-9]+)"))) << log;
  EXPECT_GE(std::stoi(m[1]), 60);
  // Same parameters at the resume point: every loss after it is what the
  // undisturbed run saw.
  EXPECT_EQ(slurp(resumed), slurp(reference));
}

TEST_F(TrainerResumeTest, AKilledRankResumesFromTheCommittedStep) {
  resume_after("kill", [](Rank& r1) {
    r1.kill();
    std::this_thread::sleep_for(200ms);
  });
}

// Rank 1 stops itself (a real SIGSTOP, TIERMEM_EXEC_STOP_AFTER_COMMIT) right
// after committing step 80, before raising its barrier word for it, and is
// killed there: rank 0 waits at that barrier. The replacement resumes at
// step 80 and must count as past that barrier, or each waits for the other.
TEST_F(TrainerResumeTest, ARankKilledBetweenCommittingAStepAndItsBarrierResumesWithoutADeadlock) {
  const std::vector<std::string> common{model("mlp_digits"), "--stages", "1", "--steps", "150", "--log-every", "1",
                                        "--timeout", "20"};
  auto args = [&](const std::string& name, const std::string& losses) {
    std::vector<std::string> a = common;
    a.insert(a.end(), {"--job", name, "--losses", losses});
    return a;
  };
  const std::string reference = m_dir + "/gap-ref.losses", resumed = m_dir + "/gap.losses";
  run(2, args("gap-ref", reference));
  Rank r0(0, 2, socket(1), args("gap", resumed), m_dir + "/gap0.log");
  ::setenv("TIERMEM_EXEC_STOP_AFTER_COMMIT", "80", 1);
  Rank r1(1, 2, socket(2), args("gap", resumed), m_dir + "/gap1.log");
  ::unsetenv("TIERMEM_EXEC_STOP_AFTER_COMMIT");
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (r1.log().find("stopping after committing step 80") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_NE(r1.log().find("stopping after committing step 80"), std::string::npos) << r1.log();
  std::this_thread::sleep_for(200ms);  // rank 0 reaches the barrier of step 80
  r1.kill();
  Rank again(1, 2, socket(2), args("gap", resumed), m_dir + "/gap1b.log");
  EXPECT_EQ(again.wait(), 0) << again.log();
  EXPECT_EQ(r0.wait(), 0) << r0.log();
  EXPECT_NE(again.log().find("resumed at step 80"), std::string::npos) << again.log();
  EXPECT_EQ(slurp(resumed), slurp(reference)) << "every loss is the undisturbed run's";
}

// The daemon of rank 1's node is SIGKILLed with rank 1 and started again:
// its memory (the job's parameters, optimizer state and committed step, in
// DRAM) comes back from the durable metadata and the shared memory it took
// over; rank 0 waits for the node meanwhile.
TEST_F(TrainerResumeTest, AJobResumesAfterItsDaemonIsKilledAndRestarted) {
  resume_after("crash", [this](Rank& r1) {
    m_cluster->node(2).kill();
    r1.kill();
    ASSERT_TRUE(m_cluster->node(2).restart()) << m_cluster->logs();
    ASSERT_TRUE(m_cluster->wait_connected()) << m_cluster->logs();
  });
}

// The names of the allocations on `socket`'s node that start with `prefix`.
std::vector<std::string> names_with(const std::string& socket, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& a : nlohmann::json::parse(test::run_ctl(socket, {"--json", "ls"}).out)) {
    const std::string name = a["name"].get<std::string>();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

// A job that ends frees its memory on every node; one kept with --keep is
// not "resumed" with nothing to train, and --restart trains it again.
TEST_F(TrainerResumeTest, AFinishedJobFreesItsMemoryAndAKeptOneIsRefusedUnlessRestarted) {
  std::string logs = run(2, {model("mlp_digits"), "--job", "tidy", "--steps", "12"});
  EXPECT_NE(logs.find("rank 0: freed the job's memory"), std::string::npos) << logs;
  EXPECT_NE(logs.find("rank 1: freed the job's memory"), std::string::npos) << logs;
  for (int node : {1, 2}) EXPECT_TRUE(names_with(socket(node), "tidy.").empty()) << "left on node " << node;

  run(1, {model("mlp_digits"), "--job", "kept", "--steps", "12", "-q", "--keep"});
  EXPECT_FALSE(names_with(socket(1), "kept.r0.").empty());
  int rc = 0;
  logs = run(1, {model("mlp_digits"), "--job", "kept", "--steps", "12", "-q"}, &rc);
  EXPECT_EQ(rc, 1) << logs;
  EXPECT_NE(logs.find("job 'kept' already finished: rank 0 committed step 12 of 12"), std::string::npos) << logs;
  EXPECT_NE(logs.find("--restart trains it again"), std::string::npos) << logs;
  logs = run(1, {model("mlp_digits"), "--job", "kept", "--steps", "12", "--restart"});
  EXPECT_NE(logs.find("--restart: freed"), std::string::npos) << logs;
  EXPECT_EQ(logs.find("resumed"), std::string::npos) << "trained from step 0: " << logs;
  EXPECT_TRUE(names_with(socket(1), "kept.").empty());
}

// A kept job's parameters and optimizer state are read back only as they
// were laid out: the same model with its parameters declared in another
// order (the same arena sizes, other offsets) is refused with what to do,
// not resumed into mixed-up tensors; the model it started with resumes.
TEST_F(TrainerResumeTest, AKeptJobResumesOnlyWithTheLayoutItWasStartedWith) {
  std::string text = slurp(model("mlp_digits"));
  const std::string b1 = "tensor { name: \"b1\"", w2 = "tensor { name: \"w2\"";
  const size_t at_b1 = text.find(b1), at_w2 = text.find(w2);
  ASSERT_NE(at_b1, std::string::npos);
  ASSERT_NE(at_w2, std::string::npos);
  const size_t end_b1 = text.find('\n', at_b1) + 1, end_w2 = text.find('\n', at_w2) + 1;
  ASSERT_EQ(end_b1, at_w2) << "b1 and w2 are declared one after the other";
  const std::string line_b1 = text.substr(at_b1, end_b1 - at_b1), line_w2 = text.substr(at_w2, end_w2 - at_w2);
  text.replace(at_b1, end_w2 - at_b1, line_w2 + line_b1);
  const std::string swapped = m_dir + "/mlp_digits_swapped.pbtxt";
  std::ofstream(swapped) << text;

  run(1, {model("mlp_digits"), "--job", "layout", "--steps", "12", "-q", "--keep"});
  int rc = 0;
  std::string logs = run(1, {swapped, "--job", "layout", "--steps", "24", "-q"}, &rc);
  EXPECT_EQ(rc, 1) << logs;
  EXPECT_NE(logs.find("job 'layout' kept its parameters and optimizer state laid out otherwise"), std::string::npos)
      << logs;
  EXPECT_NE(logs.find("(another model, or another version of the layout)"), std::string::npos) << logs;
  EXPECT_NE(logs.find("--restart"), std::string::npos) << logs;
  logs = run(1, {model("mlp_digits"), "--job", "layout", "--steps", "24"}, &rc);
  EXPECT_EQ(rc, 0) << logs;
  EXPECT_NE(logs.find("resumed at step 12"), std::string::npos) << logs;
}

// --snapshot-every N copies the committed parameters and optimizer state to
// a PMEM allocation of two slots: after 25 steps with N = 10 slot 0 holds
// step 20, with parameters bit for bit those a 20-step run commits, and
// slot 1 step 10.
TEST_F(TrainerResumeTest, SnapshotsTheCommittedStateToPmem) {
  run(1, {model("mlp_digits"), "--job", "snap_a", "--steps", "25", "--snapshot-every", "10", "-q", "--keep"});
  run(1, {model("mlp_digits"), "--job", "snap_b", "--steps", "20", "-q", "--keep"});
  const std::string sock = socket(1);
  const auto ls = nlohmann::json::parse(test::run_ctl(sock, {"--json", "ls"}).out);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& a : ls) by_name[a["name"].get<std::string>()] = a;
  ASSERT_TRUE(by_name.count("snap_a.r0.snapshot")) << ls.dump();
  EXPECT_EQ(by_name["snap_a.r0.snapshot"]["tier"], "pmem");
  auto parsed = Gva::parse(by_name["snap_a.r0.snapshot"]["gva"].get<std::string>());
  ASSERT_TRUE(parsed.ok());
  const Gva snapshot = *parsed;
  const std::string header = test::run_ctl(sock, {"read", snapshot.to_string(), "32"}).out;
  ASSERT_EQ(header.size(), 32u);
  uint64_t words[4];
  std::memcpy(words, header.data(), sizeof words);
  EXPECT_EQ(words[0], 0x323050414e534d54u) << "magic TMSNAP02";
  EXPECT_EQ(words[1], 20u) << "the last snapshot is of step 20";
  // The one before (step 10) stays whole in the other slot until the next.
  const uint64_t slot = (64 + words[2] + words[3] + 63) / 64 * 64;
  const std::string before = test::run_ctl(sock, {"read", snapshot.plus(slot).to_string(), "32"}).out;
  ASSERT_EQ(before.size(), 32u);
  std::memcpy(words + 1, before.data() + 8, 8);
  EXPECT_EQ(words[1], 10u) << "the other slot holds step 10";
  std::memcpy(words, header.data(), sizeof words);
  const std::string bytes = std::to_string(words[2]);
  const std::string snapped = test::run_ctl(sock, {"read", snapshot.plus(64).to_string(), bytes}).out;
  // The 20-step run's committed copy: step 20 is even, so the first half.
  const std::string committed =
      test::run_ctl(sock, {"read", by_name["snap_b.r0.params"]["gva"].get<std::string>(), bytes}).out;
  ASSERT_EQ(snapped.size(), words[2]);
  EXPECT_TRUE(snapped == committed) << "snapshot parameters differ from the committed ones of step 20";
  // Word 5: the XXH3 of the rest of the slot (what a reader checks).
  const std::string whole = test::run_ctl(sock, {"read", snapshot.to_string(), std::to_string(slot)}).out;
  ASSERT_EQ(whole.size(), slot);
  uint64_t sum = 0;
  std::memcpy(&sum, whole.data() + 40, 8);
  EXPECT_EQ(sum, XXH3_64bits(whole.data() + 64, whole.size() - 64));
}

// A job kept by a tiermem-exec from before the layout record (its info
// allocation's record zero, as such a binary left it) is refused as such,
// and --restart trains it again.
TEST_F(TrainerResumeTest, AKeptJobWithoutALayoutRecordIsRefusedAsKeptByAnOlderBinary) {
  run(1, {model("mlp_digits"), "--job", "older", "--steps", "12", "-q", "--keep"});
  const std::string sock = socket(1);
  std::string info_gva;
  for (const auto& a : nlohmann::json::parse(test::run_ctl(sock, {"--json", "ls"}).out)) {
    if (a["name"] == "older.r0.info") info_gva = a["gva"].get<std::string>();
  }
  ASSERT_FALSE(info_gva.empty()) << test::run_ctl(sock, {"ls"}).out;
  auto info = Gva::parse(info_gva);
  ASSERT_TRUE(info.ok());
  // executor/runtime/state/arenas.hpp: k_info_layout, two words.
  constexpr uint64_t k_info_layout = (34u << 10) + 24;
  const std::string record = test::run_ctl(sock, {"read", info->plus(k_info_layout).to_string(), "16"}).out;
  ASSERT_EQ(record.size(), 16u);
  EXPECT_EQ(record.substr(0, 8), std::string("\x01UOYALMT", 8)) << "this binary wrote its record";
  const auto wrote = test::run_ctl(sock, {"write", info->plus(k_info_layout).to_string(), "-"}, std::string(16, '\0'));
  ASSERT_EQ(wrote.exit_code, 0) << wrote.out << wrote.err;

  int rc = 0;
  std::string logs = run(1, {model("mlp_digits"), "--job", "older", "--steps", "24", "-q"}, &rc);
  EXPECT_EQ(rc, 1) << logs;
  EXPECT_NE(logs.find("job 'older' kept its parameters and optimizer state laid out otherwise"), std::string::npos)
      << logs;
  EXPECT_NE(logs.find("(kept by an older tiermem-exec)"), std::string::npos) << logs;
  logs = run(1, {model("mlp_digits"), "--job", "older", "--steps", "12", "--restart"});
  EXPECT_NE(logs.find("--restart: freed"), std::string::npos) << logs;
}

}  // namespace
}  // namespace tiermem
