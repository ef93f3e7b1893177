// Micro-batch schedules (executor/memory_plan.hpp): 1F1B against GPipe on
// real daemons, the plan's work arena and the losses' bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/exec_cluster_test.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

class ScheduleTest : public test::ExecClusterTest {};

// --schedule 1f1b: one backward after each forward once the pipeline is
// full. The plan keeps fewer micro-batches' activations (one on a single
// stage), and the losses are GPipe's to the bit: alone, over two and three
// stages (METIS's cut of this GPT feeds its stages both ways: cut
// contiguously instead, and said), and with dropout, a tied head and
// clipping (llama_tiny, one stage: the masks are per micro-batch).
TEST_F(ScheduleTest, OneForwardOneBackwardKeepsFewerActivationsAndGivesGpipesBits) {
  ::setenv("TIERMEM_LOCAL_WORLD_SIZE", "3", 1);
  struct Unset {
    ~Unset() { ::unsetenv("TIERMEM_LOCAL_WORLD_SIZE"); }
  } unset;
  auto work_arenas = [](const std::string& m, const std::string& stages, const std::string& schedule) {
    auto plan = test::run_command({test::exec_path(), "plan", m, "--stages", stages, "--micro-batches", "8",
                                   "--schedule", schedule});
    EXPECT_EQ(plan.exit_code, 0) << plan.out;
    EXPECT_NE(plan.out.find("micro-batch(es), " + schedule), std::string::npos) << plan.out;
    std::vector<double> mib;
    const std::regex line(R"(arena work +dram +([0-9.]+) MiB)");
    for (auto it = std::sregex_iterator(plan.out.begin(), plan.out.end(), line); it != std::sregex_iterator(); ++it) {
      mib.push_back(std::stod((*it)[1].str()));
    }
    EXPECT_EQ(mib.size(), static_cast<size_t>(std::stoi(stages))) << plan.out;
    return mib;
  };
  const auto gpipe1 = work_arenas(model("gpt_tiny"), "1", "gpipe"), f1b1 = work_arenas(model("gpt_tiny"), "1", "1f1b");
  ASSERT_EQ(gpipe1.size(), 1u);
  ASSERT_EQ(f1b1.size(), 1u);
  EXPECT_LT(f1b1[0] * 4, gpipe1[0]) << "one stage: one micro-batch's activations of 8, not all 8";
  const auto gpipe2 = work_arenas(model("gpt_tiny"), "2", "gpipe"), f1b2 = work_arenas(model("gpt_tiny"), "2", "1f1b");
  ASSERT_EQ(gpipe2.size(), 2u);
  ASSERT_EQ(f1b2.size(), 2u);
  for (size_t s = 0; s < 2; ++s) EXPECT_LT(f1b2[s] * 1.5, gpipe2[s]) << "stage " << s;

  const std::string corpus = std::string(TIERMEM_SOURCE_ROOT) + "/tests/data/corpus.txt";
  auto losses = [&](const std::string& m, int ranks, const std::string& schedule, std::string* log = nullptr) {
    const std::string job = "s" + std::to_string(m_runs), file = m_dir + "/" + job + ".losses";
    std::vector<std::string> args{m,          "--job",    job,   "--data", corpus, "--steps", "12", "--micro-batches", "4",
                                  "--schedule", schedule, "--losses", file};
    if (log == nullptr) args.push_back("-q");
    const std::string out_log = run(ranks, args);
    if (log != nullptr) *log = out_log;
    const std::string out = test::read_file(file);
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 12) << job << ": " << out_log;
    return out;
  };
  const std::string gpt = losses(model("gpt_tiny"), 1, "gpipe");
  EXPECT_EQ(losses(model("gpt_tiny"), 1, "1f1b"), gpt) << "one stage, 1F1B: GPipe's bits";
  std::string two;
  EXPECT_EQ(losses(model("gpt_tiny"), 2, "1f1b", &two), gpt) << "two stages, 1F1B: the bits of one stage";
  EXPECT_NE(two.find("cut contiguously along it instead"), std::string::npos) << two;
  EXPECT_EQ(losses(model("gpt_tiny"), 3, "1f1b"), gpt) << "three stages, 1F1B: the bits of one stage";
  const std::string llama = std::string(TIERMEM_SOURCE_ROOT) + "/tests/data/llama_tiny.pbtxt";
  EXPECT_EQ(losses(llama, 1, "1f1b"), losses(llama, 1, "gpipe")) << "dropout, a tied head, clipping: the same bits";
}

}  // namespace
}  // namespace tiermem
