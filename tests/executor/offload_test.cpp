// Training beyond the compute tier (X4, executor/memory_plan.hpp): with a
// budget its per-step tensors do not fit, a rank keeps parameters,
// gradients and Adam's state one tier down and streams them through a
// window (executor/runtime/param_stream.hpp). On the CPU the compute tier is
// DRAM and the home PMEM: the same plan, schedule and copies a GPU rank runs
// with VRAM over DRAM. The losses must be the very bits of the run without
// a budget (the op-major schedule computes every tensor from the same
// inputs, and sums every gradient in the same order).
#include <gtest/gtest.h>

#include <cstdio>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <thread>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <tiermem/client.h>
#include <tiermem/units.h>

#include "executor/step_report.hpp"
#include "tests/support/exec_cluster_test.hpp"
#include "tests/support/exec_rank.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

std::string source(const std::string& path) { return std::string(TIERMEM_SOURCE_ROOT) + "/" + path; }

std::vector<double> values(const std::string& text) {
  std::vector<double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(std::strtod(line.c_str(), nullptr));
  return out;
}

class OffloadTest : public test::ExecClusterTest {
 protected:
  test::DaemonOptions daemon_options() const override { return {.dram = "128MiB", .pmem = "256MiB"}; }
  // Runs `world` ranks (rank r on node r % 2 + 1); rank 0's log.
  std::string run(int world, const std::string& job, std::vector<std::string> extra, int* rc = nullptr) {
    std::vector<std::string> args{source("tests/data/gpt_wide.pbtxt"), "--job", job, "--losses", losses(job)};
    if (std::find(extra.begin(), extra.end(), "--data") == extra.end()) {
      args.insert(args.end(), {"--data", source("tests/data/corpus.txt")});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<std::unique_ptr<test::ExecRank>> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(std::make_unique<test::ExecRank>(r, world, m_cluster->node(r % 2 + 1).socket(), args,
                                                       m_dir + "/" + job + ".rank" + std::to_string(r) + ".log"));
    }
    int worst = 0;
    std::string logs;
    for (auto& rank : ranks) {
      worst = std::max(worst, rank->wait());
      logs += rank->log();
    }
    if (rc != nullptr) {
      *rc = worst;
    } else {
      EXPECT_EQ(worst, 0) << logs;
    }
    return logs;
  }
  std::string losses(const std::string& job) const { return m_dir + "/" + job + ".losses"; }
  int m_jobs = 0;
};

TEST_F(OffloadTest, AJobThreeTimesItsBudgetTrainsToTheBitsOfTheOneThatFits) {
  // The plan: what it would take, where everything lives.
  auto plan = test::run_command({test::exec_path(), "plan", source("tests/data/gpt_wide.pbtxt"), "--budget", "15MiB"});
  ASSERT_EQ(plan.exit_code, 0) << plan.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(plan.out, m, std::regex(R"(would take ([0-9.]+) MiB \(([0-9.]+)x the budget\))")))
      << plan.out;
  EXPECT_GE(std::stod(m[2].str()), 3.0) << "its state is at least 3x the budget";
  EXPECT_NE(plan.out.find("arena params    pmem"), std::string::npos) << plan.out;
  EXPECT_NE(plan.out.find("arena window    dram"), std::string::npos) << plan.out;
  EXPECT_TRUE(std::regex_search(plan.out, std::regex(R"(b1\.fc\.w +window +dram .* loaded from home)"))) << plan.out;
  EXPECT_TRUE(std::regex_search(plan.out, std::regex(R"(grad/b1\.fc\.w +window .* drained home)"))) << plan.out;
  EXPECT_TRUE(std::regex_search(plan.out, std::regex(R"(b1\.fc\.w +params +pmem)"))) << plan.out;
  EXPECT_TRUE(std::regex_search(plan.out, std::regex(R"(a step moves [0-9.]+ MiB in \(parameters, each phase\) and [0-9.]+ MiB out \(gradients\); the optimizer adds [0-9.]+ MiB through the window)")))
      << plan.out;

  const std::vector<std::string> steps{"--steps", "24", "--log-every", "8"};
  const std::string whole_logs = run(1, "whole", steps);
  std::vector<std::string> offloaded = steps;
  offloaded.insert(offloaded.end(), {"--budget", "15MiB"});
  const std::string logs = run(1, "offloaded", offloaded);
  EXPECT_NE(logs.find("offloaded: params 2 x"), std::string::npos) << logs;
  const std::string whole = test::read_file(losses("whole")), streamed = test::read_file(losses("offloaded"));
  const std::vector<double> l = values(streamed);
  ASSERT_EQ(l.size(), 24u) << streamed;
  EXPECT_EQ(streamed, whole) << "offloaded, the same bits\n" << whole_logs << logs;
  EXPECT_LT(l.back(), l.front() - 0.5) << "it learns";
  // The optimizer on the host over the home tier (ZeRO-Offload's way)
  // instead of chunk by chunk through the window: the same kernels here.
  offloaded.insert(offloaded.end(), {"--offload-update", "host", "-q"});
  run(1, "offloaded-host", offloaded);
  EXPECT_EQ(test::read_file(losses("offloaded-host")), whole) << "the optimizer on the host: the same bits";
  // Per parameter (--offload-update auto): the host's updates of the first
  // two steps measured with a copy through the window, then each parameter
  // where the step is shortest; or the share asked for. The same bits.
  std::vector<std::string> split = steps;
  split.insert(split.end(), {"--budget", "15MiB", "--offload-update", "auto"});
  const std::string chosen = run(1, "offloaded-auto", split);
  EXPECT_TRUE(std::regex_search(chosen, std::regex(R"(rank 0: the optimizer where the step is shortest \(--offload-update auto\): .* parameters on the host, .* through the window; measured: the host's Adam [0-9.]+ G parameters/s, the link [0-9.]+ GB/s)")))
      << chosen;
  EXPECT_EQ(test::read_file(losses("offloaded-auto")), whole) << "the optimizer where the step is shortest: the same bits";
  split.insert(split.end(), {"--offload-host-share", "0.5"});
  const std::string halves = run(1, "offloaded-half", split);
  std::smatch shares;
  ASSERT_TRUE(std::regex_search(halves, shares, std::regex(R"(as asked \(--offload-host-share\): ([0-9.]+) M parameters on the host, ([0-9.]+) M through the window)")))
      << halves;
  const double host = std::stod(shares[1]), device = std::stod(shares[2]);
  EXPECT_GT(host, 0) << halves;
  EXPECT_GT(device, 0) << halves;
  EXPECT_LE(host, device + 0.1) << "at most half on the host";
  EXPECT_NE(halves.find("optimizer on the host for"), std::string::npos) << halves;
  EXPECT_EQ(test::read_file(losses("offloaded-half")), whole) << "half on the host, half through the window: the same bits";

  // Two stages, each offloaded on its own node: the bits of the same two
  // stages whole (a rank of two on a host takes half its cores, and
  // OpenBLAS's sums follow its threads: compared at the same threads).
  run(2, "whole2", {"--steps", "24", "-q"});
  const std::string two = run(2, "offloaded2", {"--steps", "24", "--budget", "8MiB"});
  EXPECT_NE(two.find("offloaded: params 2 x"), std::string::npos) << two;
  EXPECT_EQ(test::read_file(losses("offloaded2")), test::read_file(losses("whole2"))) << "two offloaded stages: the bits of two whole ones";
  // Two data-parallel replicas (their gradients drained home, then summed
  // through tiermem), and two tensor-parallel ranks: the bits of the same
  // ranks whole, with a snapshot every 4 steps on the way.
  for (const std::vector<std::string>& how : {std::vector<std::string>{"--stages", "1"},
                                              std::vector<std::string>{"--tensor-parallel", "2"}}) {
    const std::string tag = how[0].substr(2, 4);
    std::vector<std::string> args{"--steps", "12", "-q"};
    args.insert(args.end(), how.begin(), how.end());
    run(2, tag + "-whole", args);
    args.insert(args.end(), {"--budget", "15MiB", "--snapshot-every", "4"});
    run(2, tag + "-offloaded", args);
    EXPECT_EQ(test::read_file(losses(tag + "-offloaded")), test::read_file(losses(tag + "-whole"))) << how[0];
  }
}

TEST_F(OffloadTest, EvaluationAndAResumeWorkOffloaded) {
  // A corpus of 4 KB: epochs of some 50 steps, each ending in an evaluation
  // (its ops load their parameters outside the schedule).
  const std::string corpus = m_dir + "/small.txt";
  std::ofstream(corpus) << test::read_file(source("tests/data/corpus.txt")).substr(0, 4096);
  const std::vector<std::string> args{"--data", corpus, "--epochs", "3", "--log-every", "1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = args;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const std::string whole = run(1, "epochs-whole", args);
  const std::string offloaded = run(1, "epochs", with({"--budget", "15MiB"}));
  auto accuracies = [](const std::string& log) {
    std::string out;
    const std::regex line("test acc[a-z]* [0-9.]+%");
    for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator(); ++it) {
      out += it->str() + "\n";
    }
    return out;
  };
  EXPECT_FALSE(accuracies(offloaded).empty()) << offloaded;
  EXPECT_EQ(accuracies(offloaded), accuracies(whole)) << offloaded << whole;
  const std::string reference = test::read_file(losses("epochs"));
  EXPECT_EQ(reference, test::read_file(losses("epochs-whole")));

  // Killed past step 60, started again: it resumes at its committed step
  // and every loss after is the undisturbed run's.
  std::vector<std::string> resumed = with({"--budget", "15MiB"});
  resumed.insert(resumed.begin(), {source("tests/data/gpt_wide.pbtxt"), "--job", "resumed", "--losses",
                                   losses("resumed")});
  {
    test::ExecRank first(0, 1, m_cluster->node(1).socket(), resumed, m_dir + "/resumed-a.log");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (first.log().find("step 60 ") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_NE(first.log().find("step 60 "), std::string::npos) << first.log();
    first.kill();
  }
  test::ExecRank again(0, 1, m_cluster->node(1).socket(), resumed, m_dir + "/resumed-b.log");
  EXPECT_EQ(again.wait(), 0) << again.log();
  std::smatch m;
  const std::string log = again.log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("resumed at step ([0-9]+)"))) << log;
  EXPECT_GE(std::stoi(m[1]), 60);
  EXPECT_EQ(test::read_file(losses("resumed")), reference);
}

// Activation checkpointing (--checkpoint, autodiff.cpp): 8 micro-batches of
// gpt_wide keep 9.0 MiB of activations for the backward pass; over three
// segments far less, so that 8 micro-batches fit a budget they do not fit
// without it. The losses are the bits of the run without: all in DRAM, and
// offloaded with the optimizer on the compute and on the host.
TEST_F(OffloadTest, CheckpointedSegmentsFitMoreMicroBatchesToTheSameBits) {
  auto work_mib = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv{test::exec_path(), "plan", source("tests/data/gpt_wide.pbtxt"), "--micro-batches", "8"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto plan = test::run_command(argv);
    EXPECT_EQ(plan.exit_code, 0) << plan.out << plan.err;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(plan.out, m, std::regex(R"(arena work +dram +([0-9.]+) MiB)"))) << plan.out;
    return m.empty() ? 0.0 : std::stod(m[1].str());
  };
  const double plain = work_mib({}), checkpointed = work_mib({"--checkpoint", "3"});
  EXPECT_LT(checkpointed * 3, plain) << "three segments keep a third of the activations or less";
  auto tight = test::run_command({test::exec_path(), "plan", source("tests/data/gpt_wide.pbtxt"), "--micro-batches",
                                  "8", "--budget", "11MiB", "--checkpoint", "1"});
  EXPECT_NE(tight.exit_code, 0) << "8 micro-batches do not fit 11 MiB without checkpointing: " << tight.out;
  EXPECT_GT(work_mib({"--budget", "11MiB", "--checkpoint", "3"}), 0) << "with it they do";
  auto chosen = test::run_command({test::exec_path(), "plan", source("tests/data/gpt_wide.pbtxt"), "--micro-batches",
                                   "8", "--budget", "11MiB"});
  EXPECT_EQ(chosen.exit_code, 0) << chosen.out << chosen.err;
  EXPECT_NE(chosen.out.find("activations do not fit the budget: checkpointed over 4 segments"), std::string::npos)
      << "the planner checkpoints when nothing else fits: " << chosen.out;

  const std::vector<std::string> steps{"--steps", "12", "--micro-batches", "8", "--log-every", "100"};
  run(1, "ckpt-whole", steps);
  const std::string whole = test::read_file(losses("ckpt-whole"));
  ASSERT_EQ(values(whole).size(), 12u) << whole;
  for (const auto& extra : std::vector<std::vector<std::string>>{
           {"--checkpoint", "3"},
           {"--checkpoint", "3", "--budget", "11MiB"},
           {"--checkpoint", "3", "--budget", "11MiB", "--offload-update", "host"},
           {"--budget", "11MiB", "--offload-update", "host"}}) {
    std::vector<std::string> args = steps;
    args.insert(args.end(), extra.begin(), extra.end());
    const std::string job = "ckpt" + std::to_string(++m_jobs);
    const std::string log = run(1, job, args);
    EXPECT_EQ(test::read_file(losses(job)), whole) << job << " (" << extra.size() << " more arguments): the same bits";
    if (std::find(extra.begin(), extra.end(), "--checkpoint") == extra.end()) {
      EXPECT_NE(log.find("checkpointed over 4 segments"), std::string::npos) << "chosen by the planner: " << log;
    }
    if (std::find(extra.begin(), extra.end(), "host") != extra.end()) {
      // Each parameter updated as soon as its gradient is home (no clipping here).
      EXPECT_TRUE(std::regex_search(log, std::regex(R"(optimizer on the host; [1-9][0-9]* parameter updates a step beside the backward pass)")))
          << log;
    }
  }
  int rc = 0;
  const std::string refused = run(2, "ckpt-stages", {"--steps", "2", "--checkpoint", "2"}, &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(refused.find("activation checkpointing runs on one stage for now"), std::string::npos) << refused;
}

// Where a job's tensors live and what its steps move, for the people
// watching it: the progress line counts the bytes through the window a
// step, and `tiermemctl job` shows each tensor class's tier with the step
// report the rank keeps in its own memory (executor/step_report.hpp).
TEST_F(OffloadTest, TiermemctlShowsWhereAJobsTensorsLiveAndWhatItsStepsMove) {
  const std::string logs = run(1, "shown", {"--steps", "6", "--log-every", "3", "--budget", "15MiB", "--keep"});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(logs, m, std::regex(R"(step 6 .* offload ([0-9.]+ [KMG]iB) in, ([0-9.]+ [KMG]iB) out a step)")))
      << logs;
  ASSERT_TRUE(std::regex_search(logs, m, std::regex(R"(offload: ([0-9.]+ [KMG]iB) loaded and ([0-9.]+ [KMG]iB) drained per step)")))
      << logs;
  const std::string loaded = m[1].str(), drained = m[2].str();

  const std::string socket = m_cluster->node(1).socket();
  auto shown = test::run_command({test::tiermemctl_path(), "-s", socket, "--json", "job", "shown"});
  ASSERT_EQ(shown.exit_code, 0) << shown.out << shown.err;
  const auto j = nlohmann::json::parse(shown.out);
  ASSERT_EQ(j["ranks"].size(), 1u) << shown.out;
  const auto& rank = j["ranks"][0];
  std::map<std::string, nlohmann::json> classes;
  for (const auto& c : rank["classes"]) classes[c["class"].get<std::string>()] = c;
  // Offloaded on the CPU: the per-step state one tier down (PMEM), the
  // activations and the window where the kernels run (DRAM).
  for (const char* home : {"params", "grads", "optimizer"}) {
    ASSERT_TRUE(classes.count(home)) << home << "\n" << shown.out;
    EXPECT_EQ(classes[home]["tier"], "pmem") << home;
  }
  for (const char* hot : {"work", "window"}) {
    ASSERT_TRUE(classes.count(hot)) << hot << "\n" << shown.out;
    EXPECT_EQ(classes[hot]["tier"], "dram") << hot;
  }
  const auto& step = rank["step"];
  ASSERT_TRUE(step.is_object()) << shown.out;
  EXPECT_EQ(step["steps_done"], 6);
  EXPECT_EQ(step["total_steps"], 6);
  EXPECT_GT(step["step_ms"].get<double>(), 0);
  // Every parameter is read by the forward pass: at least the parameters
  // (one of the arena's two copies) come through the window each step, and
  // the rank's figures are the ones its log printed.
  const auto params = classes["params"]["bytes"].get<int64_t>();
  EXPECT_GE(step["loaded_bytes"].get<int64_t>(), params / 2) << shown.out;
  EXPECT_GT(step["drained_bytes"].get<int64_t>(), 0) << shown.out;
  EXPECT_EQ(format_size(step["loaded_bytes"].get<uint64_t>()), loaded) << shown.out;
  EXPECT_EQ(format_size(step["drained_bytes"].get<uint64_t>()), drained) << shown.out;

  auto text = test::run_command({test::tiermemctl_path(), "-s", socket, "job", "shown"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_TRUE(std::regex_search(text.out, std::regex(R"(0 +params +pmem .*parameters)"))) << text.out;
  EXPECT_NE(text.out.find("rank 0 (stage 0, replica 0): step 6 of 6"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("offloaded: " + loaded + " loaded into the window and " + drained + " written home a step"),
            std::string::npos)
      << text.out;

  // A rank that died while writing its report leaves the sequence word odd:
  // the report is shown as not read, and why, not as "no step yet".
  {
    ASSERT_TRUE(classes.count("info")) << shown.out;
    auto info = Gva::parse(classes["info"]["gva"].get<std::string>());
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    auto c = m_cluster->node(1).connect("half-writer");
    const uint64_t odd = 13;
    ASSERT_TRUE(c->write(info->plus(exec::k_step_report_offset), &odd, sizeof odd).ok());
    auto half = test::run_command({test::tiermemctl_path(), "-s", socket, "job", "shown"});
    EXPECT_EQ(half.exit_code, 0) << half.err;
    EXPECT_NE(half.out.find("rank 0: step report not read: it changed under 8 pairs of reads or is half written"),
              std::string::npos)
        << half.out;
    auto half_json = test::run_command({test::tiermemctl_path(), "-s", socket, "--json", "job", "shown"});
    ASSERT_EQ(half_json.exit_code, 0) << half_json.err;
    const auto hj = nlohmann::json::parse(half_json.out);
    EXPECT_TRUE(hj["ranks"][0]["step"].is_null()) << half_json.out;
    EXPECT_NE(hj["ranks"][0].value("step_error", "").find("half written"), std::string::npos) << half_json.out;
  }

  auto none = test::run_command({test::tiermemctl_path(), "-s", socket, "job", "nosuch"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("no allocation of a job named 'nosuch'"), std::string::npos) << none.err;
  auto freed = test::run_command({test::tiermemctl_path(), "-s", socket, "free", "--name-prefix", "shown."});
  EXPECT_EQ(freed.exit_code, 0) << freed.err;
  auto gone = test::run_command({test::tiermemctl_path(), "-s", socket, "job", "shown"});
  EXPECT_EQ(gone.exit_code, 1) << gone.out;
}

TEST_F(OffloadTest, ABudgetTooSmallForTheActivationsIsRefusedBeforeAnythingIsAllocated) {
  int rc = 0;
  const std::string logs = run(1, "tiny", {"--steps", "2", "--budget", "1MiB"}, &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(logs.find("does not fit a budget of 1 MiB of dram even offloaded"), std::string::npos) << logs;
  EXPECT_NE(logs.find("give it at least"), std::string::npos) << logs;
  auto client = Client::connect({.socket_path = m_cluster->node(1).socket()});
  ASSERT_TRUE(client.ok());
  auto list = (*client)->list();
  ASSERT_TRUE(list.ok());
  for (const AllocationInfo& a : *list) EXPECT_EQ(a.name.find("tiny"), std::string::npos) << a.name << " was made";
  const std::string share = run(1, "share", {"--steps", "2", "--budget", "15MiB", "--offload-host-share", "0.5"}, &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(share.find("--offload-host-share splits the optimizer between host and device: it needs --offload-update auto"),
            std::string::npos)
      << share;
  auto bad = test::run_command({test::exec_path(), "plan", source("tests/data/gpt_wide.pbtxt"), "--budget", "lots"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--vram-budget 'lots' is not a size"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace tiermem
