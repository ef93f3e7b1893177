// NCCL between GPU ranks (suite gpu, issue 25; exits 77 with fewer than two
// CUDA devices): two daemons on one host, each with the VRAM tier of its own
// GPU, and a rank on each GPU.
// - Two data-parallel replicas all-reduce their gradients through NCCL in
//   buckets beside the backward pass: the bits of the same replicas
//   reducing through tiermem (two members sum a + b either way), and the
//   CPU replicas' losses within 1e-4 relative for 50 steps; the rank says
//   the bus bandwidth its all-reduce reached. Two replicas of two
//   micro-batches each train as one GPU with four (the doubled batch): the
//   same test loss after an epoch, within 1e-4 relative (the losses file is
//   replica 0's own half of each batch, so the epoch's test loss is the
//   comparable figure).
// - Tensor-parallel GPT on two GPUs: one GPU's losses within 1e-4 relative.
// - Two pipeline stages on two GPUs: boundary tensors go GPU to GPU (the
//   receiver's VRAM mailbox imported by the sender, the copy engines peer
//   to peer): no device buffer staged through host memory, nothing through
//   a daemon; the CPU pipeline's losses within 1e-4.
// - Two ranks on one GPU reduce through tiermem (NCCL takes one GPU per
//   member); --collectives nccl is refused for them, naming both.
// - A member killed mid-run: the other gives up within the job's timeout
//   (its group aborted, the reason said); both started again resume and
//   finish with the losses of an undisturbed run.
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/exec_rank.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;
using test::env_or;

std::string model(const std::string& name) {
  return env_or("TIERMEM_MODELS", std::string(TIERMEM_SOURCE_ROOT) + "/config/models") + "/" + name + ".pbtxt";
}

std::vector<std::string> data_args(const std::string& name) {
  if (name.rfind("gpt", 0) == 0) {
    return {"--data", env_or("TIERMEM_CORPUS", std::string(TIERMEM_SOURCE_ROOT) + "/tests/data/corpus.txt")};
  }
  const char* v = std::getenv(name.find("digits") != std::string::npos ? "TIERMEM_DIGITS" : "TIERMEM_FASHION");
  if (v == nullptr || *v == '\0') return {};
  return {"--data", v};
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<double> losses(const std::string& text) {
  std::vector<double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(std::strtod(line.c_str(), nullptr));
  return out;
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b, size_t steps, double rel,
                  const std::string& what) {
  ASSERT_EQ(a.size(), steps) << what;
  ASSERT_EQ(b.size(), steps) << what;
  for (size_t i = 0; i < steps; ++i) {
    EXPECT_LE(std::fabs(a[i] - b[i]), rel * std::fabs(a[i])) << what << " step " << i << ": " << a[i] << " against "
                                                             << b[i];
  }
}

class NcclGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_cluster = std::make_unique<test::TestCluster>(
        2, test::DaemonOptions{.dram = "1GiB", .pmem = "8MiB", .vram = true, .vram_capacity = "4GiB"},
        [](int) { return "127.0.0.1:" + std::to_string(test::free_port()); },
        [](int id, test::DaemonOptions& o) { o.vram_device = id - 1; });
    ASSERT_TRUE(m_cluster->ready()) << m_cluster->logs();
    ASSERT_TRUE(m_cluster->wait_connected()) << m_cluster->logs();
    m_dir = m_cluster->dir();
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "%s\n", m_cluster->logs().c_str());
  }

  // Rank r on GPU gpu(r) through that GPU's daemon (node gpu(r) + 1).
  std::unique_ptr<test::ExecRank> start(int rank, int world, int gpu, std::vector<std::string> args,
                                        const std::string& tag) {
    args.insert(args.end(), {"--device", gpu < 0 ? "cpu" : "cuda:" + std::to_string(gpu)});
    return std::make_unique<test::ExecRank>(rank, world, m_cluster->node(std::max(gpu, 0) + 1).socket(), args,
                                            m_dir + "/" + tag + ".rank" + std::to_string(rank) + ".log");
  }
  // Runs `world` ranks, rank r on GPU gpus[r] (-1: the CPU, on node 1);
  // returns the worst exit status, *log every rank's log.
  int run(const std::vector<int>& gpus, const std::vector<std::string>& args, std::string* log) {
    std::vector<std::unique_ptr<test::ExecRank>> ranks;
    const std::string tag = "run" + std::to_string(m_runs++);
    for (size_t r = 0; r < gpus.size(); ++r) {
      ranks.push_back(start(static_cast<int>(r), static_cast<int>(gpus.size()), gpus[r], args, tag));
    }
    int worst = 0;
    log->clear();
    for (auto& rank : ranks) {
      worst = std::max(worst, rank->wait());
      *log += rank->log();
    }
    return worst;
  }
  // The losses file of a run of `name` (rank 0's), its log in *log.
  std::string train(const std::string& name, const std::vector<int>& gpus, std::vector<std::string> extra,
                    std::string* log_out = nullptr) {
    const std::string job = name + "-" + std::to_string(m_runs);
    const std::string file = m_dir + "/" + job + ".losses";
    std::vector<std::string> args = {model(name), "--job", job, "--losses", file, "--seed", "7"};
    for (auto& a : data_args(name)) args.push_back(a);
    args.insert(args.end(), extra.begin(), extra.end());
    std::string log;
    EXPECT_EQ(run(gpus, args, &log), 0) << log;
    if (log_out != nullptr) *log_out = log;
    return slurp(file);
  }

  std::unique_ptr<test::TestCluster> m_cluster;
  std::string m_dir;
  int m_runs = 0;
};

TEST_F(NcclGpuTest, DataParallelReplicasAllReduceThroughNcclToTheBitsOfTiermem) {
  const std::vector<std::string> args{"--steps", "50", "--stages", "1", "--bucket-mib", "1"};
  std::string log;
  const std::string nccl = train("mlp_fashion", {0, 1}, args, &log);
  EXPECT_NE(log.find("NCCL 2."), std::string::npos) << log;
  EXPECT_NE(log.find("all-reduces the gradients of 2 replicas (group dp.s0.t0, checked)"), std::string::npos) << log;
  EXPECT_NE(log.find("gradient bucket(s)"), std::string::npos) << log;
  std::smatch bus;
  ASSERT_TRUE(std::regex_search(log, bus, std::regex("bus bandwidth ([0-9.]+) GB/s"))) << log;
  EXPECT_GT(std::stod(bus[1]), 0.0);
  auto tiermem_args = args;
  tiermem_args.insert(tiermem_args.end(), {"--collectives", "tiermem", "-q"});
  const std::string tiermem = train("mlp_fashion", {0, 1}, tiermem_args);
  ASSERT_EQ(std::count(nccl.begin(), nccl.end(), '\n'), 50);
  EXPECT_EQ(nccl, tiermem) << "two members: a + b through NCCL and through tiermem";
  auto cpu_args = args;
  cpu_args.push_back("-q");
  expect_close(losses(train("mlp_fashion", {-1, -1}, cpu_args)), losses(nccl), 50, 1e-4, "NCCL against the CPU");
  // A GPT (residuals, layer norms: many gradients, several buckets).
  const std::string gpt = train("gpt_tiny", {0, 1}, {"--steps", "50", "--stages", "1", "--bucket-mib", "1", "-q"});
  EXPECT_EQ(gpt, train("gpt_tiny", {0, 1}, {"--steps", "50", "--stages", "1", "--collectives", "tiermem", "-q"}));
}

double test_loss(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex("summary: .* test loss ([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

TEST_F(NcclGpuTest, TwoReplicasTrainAsOneGpuWithTheDoubledBatch) {
  std::string one_log, two_log;
  train("mlp_digits", {0}, {"--epochs", "1", "--micro-batches", "4"}, &one_log);
  train("mlp_digits", {0, 1}, {"--epochs", "1", "--micro-batches", "2", "--stages", "1"}, &two_log);
  EXPECT_NE(two_log.find("all-reduces the gradients of 2 replicas"), std::string::npos) << two_log;
  const double one = test_loss(one_log), two = test_loss(two_log);
  ASSERT_GT(one, 0) << one_log;
  ASSERT_GT(two, 0) << two_log;
  // Printed to four decimals: 1e-4 relative, or the print's own step.
  EXPECT_LE(std::fabs(one - two), std::max(1e-4 * one, 1e-4)) << "one GPU " << one << ", two " << two;
}

TEST_F(NcclGpuTest, TensorParallelGptOnTwoGpusFollowsOneGpu) {
  std::string log;
  const std::string one = train("gpt_tiny", {0}, {"--steps", "50", "-q"});
  const std::string two = train("gpt_tiny", {0, 1}, {"--steps", "50", "--tensor-parallel", "2"}, &log);
  EXPECT_NE(log.find("sums the parts of 2 tensor-parallel ranks (group tp.s0.d0, checked)"), std::string::npos)
      << log;
  expect_close(losses(one), losses(two), 50, 1e-4, "two tensor-parallel GPUs against one");
}

TEST_F(NcclGpuTest, PipelineStagesOnTwoGpusPassTheirTensorsGpuToGpu) {
  std::string log;
  const std::string gpus = train("mlp_fashion", {0, 1}, {"--steps", "50", "--stages", "2"}, &log);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r = "rank " + std::to_string(rank) + ": ";
    EXPECT_NE(log.find(r + "computing on cuda:" + std::to_string(rank)), std::string::npos) << log;
    const size_t at = log.find(r + "tiermem calls: ");
    ASSERT_NE(at, std::string::npos) << log;
    const std::string line = log.substr(at, log.find('\n', at) - at);
    EXPECT_NE(line.find(", 0 with device buffers staged through host memory"), std::string::npos) << line;
    EXPECT_TRUE(line.ends_with(", 0 through the daemon")) << line;
  }
  expect_close(losses(train("mlp_fashion", {-1, -1}, {"--steps", "50", "--stages", "2", "-q"})), losses(gpus), 50,
               1e-4, "two GPU stages against two CPU stages");
}

TEST_F(NcclGpuTest, TwoRanksOnOneGpuReduceThroughTiermemAndNcclIsRefusedForThem) {
  std::string log;
  const std::string shared = train("mlp_fashion", {0, 0}, {"--steps", "20", "--stages", "1"}, &log);
  EXPECT_EQ(log.find("NCCL"), std::string::npos) << log;
  EXPECT_EQ(std::count(shared.begin(), shared.end(), '\n'), 20);
  const int rc = run({0, 0}, {model("mlp_fashion"), "--job", "shared-nccl", "--stages", "1", "--steps", "5",
                              "--collectives", "nccl"}, &log);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(log.find("ranks 0 and 1 compute on the same GPU"), std::string::npos) << log;
}

TEST_F(NcclGpuTest, AKilledMemberStopsItsGroupWithinTheTimeoutAndTheJobResumes) {
  const std::string reference =
      train("mlp_digits", {0, 1}, {"--steps", "300", "--stages", "1", "--bucket-mib", "1", "-q"});
  const std::string file = m_dir + "/killed.losses";
  const std::vector<std::string> args{model("mlp_digits"), "--job", "killed", "--losses", file, "--seed", "7",
                                      "--steps", "300", "--stages", "1", "--bucket-mib", "1", "--log-every", "1",
                                      "--timeout", "10"};
  std::vector<std::string> with_data = args;
  for (auto& a : data_args("mlp_digits")) with_data.push_back(a);
  auto r0 = start(0, 2, 0, with_data, "killed");
  auto r1 = start(1, 2, 1, with_data, "killed");
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (r0->log().find("step 60 ") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_NE(r0->log().find("step 60 "), std::string::npos) << r0->log();
  r1->kill();
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_EQ(r0->wait(), 1) << r0->log();
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 40s);
  const std::string said = r0->log();
  EXPECT_TRUE(said.find("did not finish within 10 s") != std::string::npos || said.find("NCCL group") != std::string::npos)
      << said;
  auto again0 = start(0, 2, 0, with_data, "again");
  auto again1 = start(1, 2, 1, with_data, "again");
  EXPECT_EQ(again0->wait(), 0) << again0->log();
  EXPECT_EQ(again1->wait(), 0) << again1->log();
  EXPECT_NE(again0->log().find("resumed at step"), std::string::npos) << again0->log();
  EXPECT_EQ(slurp(file), reference) << "every loss of the resumed job is the undisturbed run's";
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::fprintf(stderr, "fewer than two CUDA devices (%d): skipped\n", devices);
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
