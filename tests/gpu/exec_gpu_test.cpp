// tiermem-exec on the GPU (suite gpu; exits 77 where no CUDA device is):
// the same model, seed and batches on --device cpu and --device cuda give
// the same losses within 1e-4 relative for 50 steps, for every model; a
// replayed (CUDA graph) step gives the bits of a launched one; digits and
// Fashion-MNIST reach the CPU's accuracy; pipelines and data-parallel ranks
// on one GPU; a job kept in VRAM is refused on the CPU; no VRAM tier is a
// clear error. Real daemons with a VRAM tier, real tiermem-exec processes.
//
// Models: $TIERMEM_MODELS (default: config/models of the source tree);
// datasets: $TIERMEM_DIGITS and $TIERMEM_FASHION (default: Debian's paths).
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/exec_rank.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using test::env_or;

std::string model(const std::string& name) {
  return env_or("TIERMEM_MODELS", std::string(TIERMEM_SOURCE_ROOT) + "/config/models") + "/" + name + ".pbtxt";
}

// A model of tests/data (the device machine: $TIERMEM_TEST_DATA).
std::string test_model(const std::string& name) {
  return env_or("TIERMEM_TEST_DATA", std::string(TIERMEM_SOURCE_ROOT) + "/tests/data") + "/" + name + ".pbtxt";
}

// --data for the model's dataset.
std::vector<std::string> data_args(const std::string& name) {
  // The GPT reads the repository's own docs: the device machine has no
  // fortunes package.
  if (name.rfind("gpt", 0) == 0) {
    return {"--data", env_or("TIERMEM_CORPUS", std::string(TIERMEM_SOURCE_ROOT) + "/tests/data/corpus.txt")};
  }
  const bool digits = name.find("digits") != std::string::npos;
  const char* var = digits ? "TIERMEM_DIGITS" : "TIERMEM_FASHION";
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return {};
  return {"--data", v};
}

std::vector<double> losses(const std::string& path) {
  std::vector<double> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(std::strtod(line.c_str(), nullptr));
  return out;
}

class ExecGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_cluster = std::make_unique<test::TestCluster>(
        1, test::DaemonOptions{.dram = "512MiB", .pmem = "8MiB", .vram = true, .vram_capacity = "2GiB"});
    ASSERT_TRUE(m_cluster->ready()) << m_cluster->logs();
    m_dir = m_cluster->dir();
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "%s\n", m_cluster->logs().c_str());
  }
  // Runs `world` ranks of `args` on the node; *log gets every rank's log.
  int run(int world, std::vector<std::string> args, std::string* log) {
    std::vector<std::unique_ptr<test::ExecRank>> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(std::make_unique<test::ExecRank>(
          r, world, m_cluster->node(1).socket(), args,
          m_dir + "/run" + std::to_string(m_runs) + ".rank" + std::to_string(r) + ".log"));
    }
    ++m_runs;
    int worst = 0;
    log->clear();
    for (auto& rank : ranks) {
      worst = std::max(worst, rank->wait());
      *log += rank->log();
    }
    return worst;
  }
  // Trains `name` on `device` (extra args after), returns rank 0's losses.
  std::vector<double> train(const std::string& name, const std::string& device, std::vector<std::string> extra,
                            int world = 1, std::string* log_out = nullptr) {
    const std::string job = name + "-" + std::to_string(m_runs);
    const std::string file = m_dir + "/" + job + ".losses";
    std::vector<std::string> args = {model(name), "--job", job, "--device", device, "--losses", file, "--seed", "7"};
    for (auto& a : data_args(name)) args.push_back(a);
    for (auto& a : extra) args.push_back(a);
    std::string log;
    const int rc = run(world, args, &log);
    EXPECT_EQ(rc, 0) << log;
    if (log_out != nullptr) *log_out = log;
    return losses(file);
  }

  std::unique_ptr<test::TestCluster> m_cluster;
  std::string m_dir;
  int m_runs = 0;
};

void expect_close(const std::vector<double>& cpu, const std::vector<double>& cuda, size_t steps, double rel,
                  const std::string& what) {
  ASSERT_EQ(cpu.size(), steps) << what;
  ASSERT_EQ(cuda.size(), steps) << what;
  for (size_t i = 0; i < steps; ++i) {
    EXPECT_LE(std::fabs(cpu[i] - cuda[i]), rel * std::fabs(cpu[i])) << what << " step " << i << ": cpu " << cpu[i]
                                                                     << " cuda " << cuda[i];
  }
}

TEST_F(ExecGpuTest, LossesMatchTheCpuFor50StepsOnEveryModel) {
  for (const char* name : {"mlp_digits", "mlp_fashion", "ffn_block_digits", "ffn4_fashion"}) {
    const auto cpu = train(name, "cpu", {"--steps", "50", "-q"});
    std::string log;
    const auto cuda = train(name, "cuda", {"--steps", "50"}, 1, &log);
    EXPECT_NE(log.find("computing on cuda:0"), std::string::npos) << log;
    EXPECT_NE(log.find("in VRAM of cuda:0"), std::string::npos) << log;
    expect_close(cpu, cuda, 50, 1e-4, name);
  }
}

TEST_F(ExecGpuTest, AReplayedStepGivesTheBitsOfALaunchedOne) {
  const auto graphs = train("ffn4_fashion", "cuda", {"--steps", "20", "-q"});
  const auto launched = train("ffn4_fashion", "cuda", {"--steps", "20", "-q", "--no-graphs"});
  ASSERT_EQ(graphs.size(), 20u);
  EXPECT_EQ(graphs, launched);
  // And again: the GPU is deterministic run to run.
  EXPECT_EQ(train("ffn4_fashion", "cuda", {"--steps", "20", "-q"}), graphs);
}

// The GPT (embeddings, causal attention on the GPU's own kernels): the
// CPU's losses within 1e-4 relative for 50 steps; a replayed step the bits
// of a launched one; the same bits run to run (no atomics in its kernels).
TEST_F(ExecGpuTest, GptLossesMatchTheCpuAndItsReplayIsDeterministic) {
  const auto cpu = train("gpt_tiny", "cpu", {"--steps", "50", "-q"});
  std::string log;
  const auto cuda = train("gpt_tiny", "cuda", {"--steps", "50"}, 1, &log);
  EXPECT_NE(log.find("computing on cuda:0"), std::string::npos) << log;
  expect_close(cpu, cuda, 50, 1e-4, "gpt_tiny");
  const auto launched = train("gpt_tiny", "cuda", {"--steps", "50", "-q", "--no-graphs"});
  EXPECT_EQ(launched, cuda);
  EXPECT_EQ(train("gpt_tiny", "cuda", {"--steps", "50", "-q"}), cuda);
}

// Mixed precision (--precision bf16): every GEMM's operands rounded to bf16
// (8 significant bits: 2^-9 relative each), products summed in fp32 into
// fp32 tensors. The losses follow fp32's within 2e-3 relative for 50 steps
// (1.6e-4 to 2.1e-4 measured on the H200; the worst is printed), are not fp32's bits (the GEMMs did round),
// and a replayed step gives the bits of a launched one.
TEST_F(ExecGpuTest, Bf16GptFollowsFp32AndItsReplayIsDeterministic) {
  const auto fp32 = train("gpt_tiny", "cuda", {"--steps", "50", "-q"});
  std::string log;
  const auto bf16 = train("gpt_tiny", "cuda", {"--steps", "50", "--precision", "bf16"}, 1, &log);
  EXPECT_NE(log.find("GEMMs in bf16"), std::string::npos) << log;
  expect_close(fp32, bf16, 50, 2e-3, "gpt_tiny bf16 against fp32");
  double worst = 0;
  for (size_t i = 0; i < std::min(fp32.size(), bf16.size()); ++i) {
    worst = std::max(worst, std::fabs(fp32[i] - bf16[i]) / std::fabs(fp32[i]));
  }
  std::printf("gpt_tiny bf16 against fp32, 50 steps: largest relative difference %.2e\n", worst);
  EXPECT_NE(bf16, fp32) << "bf16 gave fp32's bits: the GEMMs did not round";
  EXPECT_EQ(train("gpt_tiny", "cuda", {"--steps", "50", "-q", "--precision", "bf16", "--no-graphs"}), bf16);
}

// Offload (--vram-budget, executor/memory_plan.hpp): a GPT whose parameters,
// gradients and Adam's state (46 MiB) are 3x its budget keeps them in the
// DRAM tier and streams them through a VRAM window on the copy engines. The
// optimizer on the GPU (chunks through the window) gives the bits of the run
// all in VRAM; on the host (the CPU's Adam) its losses within 1e-4; in bf16,
// the bits of the bf16 run all in VRAM.
TEST_F(ExecGpuTest, AnOffloadedGptTrainsToTheBitsOfTheOneAllInVram) {
  auto run_wide = [&](std::vector<std::string> extra, std::string* log = nullptr) {
    const std::string job = "wide-" + std::to_string(m_runs);
    const std::string file = m_dir + "/" + job + ".losses";
    std::vector<std::string> args = {test_model("gpt_wide"), "--job", job, "--device", "cuda", "--losses", file,
                                     "--steps", "30"};
    for (auto& a : data_args("gpt_wide")) args.push_back(a);
    for (auto& a : extra) args.push_back(a);
    std::string out;
    EXPECT_EQ(run(1, args, &out), 0) << out;
    if (log != nullptr) *log = out;
    return losses(file);
  };
  const auto all_in = run_wide({"-q"});
  ASSERT_EQ(all_in.size(), 30u);
  std::string log;
  const auto offloaded = run_wide({"--vram-budget", "15MiB"}, &log);
  EXPECT_NE(log.find("offloaded: params 2 x"), std::string::npos) << log;
  EXPECT_NE(log.find("in dram; work"), std::string::npos) << log;
  EXPECT_NE(log.find("window"), std::string::npos) << log;
  EXPECT_EQ(log.find("could not page-lock"), std::string::npos) << log;
  EXPECT_EQ(offloaded, all_in) << "the optimizer on the GPU, offloaded: the bits of the run all in VRAM";
  expect_close(all_in, run_wide({"-q", "--vram-budget", "15MiB", "--offload-update", "host"}), 30, 1e-4,
               "the optimizer on the host");
  expect_close(all_in,
               run_wide({"-q", "--vram-budget", "15MiB", "--offload-update", "auto", "--offload-host-share", "0.5"}), 30,
               1e-4, "half the optimizer on the host, half through the window");
  const auto bf16 = run_wide({"-q", "--precision", "bf16"});
  EXPECT_EQ(run_wide({"-q", "--precision", "bf16", "--vram-budget", "15MiB"}), bf16) << "bf16, offloaded";
}

// The ops of imported models (tests/data/llama_tiny.pbtxt: RMS_NORM,
// ROTARY, grouped-query attention, SILU and MUL, LAYER_NORM without beta,
// GELU_EXACT, a tied head's MATMUL_NT, DROPOUT and the attention's, AdamW
// with its schedule and clipping) on the GPU's kernels: the CPU's losses
// (the same dropout masks) within 1e-4 relative for 50 steps; a replayed
// step the bits of a launched one; in bf16, within 2e-2 of fp32.
TEST_F(ExecGpuTest, TheOpsOfImportedModelsMatchTheCpu) {
  auto run_llama = [&](const std::string& device, std::vector<std::string> extra) {
    const std::string job = "llama-" + std::to_string(m_runs);
    const std::string file = m_dir + "/" + job + ".losses";
    std::vector<std::string> args = {test_model("llama_tiny"), "--job", job, "--device", device, "--losses", file,
                                     "--steps", "50", "--seed", "7", "-q"};
    for (auto& a : data_args("gpt_tiny")) args.push_back(a);
    for (auto& a : extra) args.push_back(a);
    std::string out;
    EXPECT_EQ(run(1, args, &out), 0) << out;
    return losses(file);
  };
  const auto cpu = run_llama("cpu", {});
  const auto cuda = run_llama("cuda", {});
  expect_close(cpu, cuda, 50, 1e-4, "llama_tiny");
  EXPECT_EQ(run_llama("cuda", {"--no-graphs"}), cuda);
  expect_close(cuda, run_llama("cuda", {"--precision", "bf16"}), 50, 2e-2, "llama_tiny bf16 against fp32");
}

double accuracy(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex("summary: .* test accuracy ([0-9.]+)%"))) return -1;
  return std::stod(m[1]);
}

TEST_F(ExecGpuTest, DigitsAndFashionReachTheAccuracyOfTheCpu) {
  for (auto [name, epochs] : {std::pair{"mlp_digits", "3"}, std::pair{"mlp_fashion", "1"}}) {
    std::string cpu_log, cuda_log;
    train(name, "cpu", {"--epochs", epochs}, 1, &cpu_log);
    train(name, "cuda", {"--epochs", epochs}, 1, &cuda_log);
    const double cpu = accuracy(cpu_log), cuda = accuracy(cuda_log);
    ASSERT_GT(cpu, 0) << cpu_log;
    ASSERT_GT(cuda, 0) << cuda_log;
    EXPECT_NEAR(cuda, cpu, 0.5) << name << ": cpu " << cpu << "%, cuda " << cuda << "%";
    EXPECT_GT(cuda, std::string(name) == "mlp_digits" ? 90.0 : 80.0) << cuda_log;
  }
}

TEST_F(ExecGpuTest, PipelineAndDataParallelRanksShareOneGpu) {
  // Two stages exchange activations and gradients through their mailboxes
  // (VRAM: written device to device, read in place by the kernels); two
  // replicas all-reduce their gradients through tiermem.
  const auto cpu_pipe = train("mlp_fashion", "cpu", {"--steps", "20", "-q", "--stages", "2"}, 2);
  std::string log;
  const auto cuda_pipe = train("mlp_fashion", "cuda", {"--steps", "20", "--stages", "2"}, 2, &log);
  expect_close(cpu_pipe, cuda_pipe, 20, 1e-4, "pipeline");
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r = "rank " + std::to_string(rank) + ": ";
    const size_t placed = log.find(r + "computing on cuda:0");
    ASSERT_NE(placed, std::string::npos) << log;
    const std::string placement = log.substr(placed, log.find('\n', placed) - placed);
    EXPECT_NE(placement.find(", messages 2 MiB in VRAM of cuda:0"), std::string::npos) << placement;
    // Every message, header read and control word went direct: the copy
    // engines and CPU atomics, nothing carried by the daemon.
    const size_t at = log.find(r + "tiermem calls: ");
    ASSERT_NE(at, std::string::npos) << log;
    const std::string line = log.substr(at, log.find('\n', at) - at);
    EXPECT_TRUE(line.ends_with(", 0 through the daemon")) << line;
    EXPECT_NE(line.find(", 0 with device buffers staged through host memory"), std::string::npos) << line;
  }
  const auto cpu_dp = train("mlp_fashion", "cpu", {"--steps", "20", "-q", "--stages", "1"}, 2);
  const auto cuda_dp = train("mlp_fashion", "cuda", {"--steps", "20", "-q", "--stages", "1"}, 2);
  expect_close(cpu_dp, cuda_dp, 20, 1e-4, "data parallel");
}

// `args` with the digits dataset's --data, if one is set.
std::vector<std::string> digits(std::vector<std::string> args) {
  for (auto& a : data_args("mlp_digits")) args.push_back(a);
  return args;
}

TEST_F(ExecGpuTest, AJobKeptInVramIsRefusedOnTheCpu) {
  std::string log;
  ASSERT_EQ(run(1, digits({model("mlp_digits"), "--job", "kept", "--device", "cuda", "--steps", "3", "--keep", "-q"}),
                &log),
            0)
      << log;
  EXPECT_EQ(run(1, digits({model("mlp_digits"), "--job", "kept", "--device", "cpu", "--steps", "6", "-q"}), &log), 1);
  EXPECT_NE(log.find("job kept's params are in VRAM but this run computes on cpu: run it with the --device it was "
                     "started with"),
            std::string::npos)
      << log;
  // On the GPU it goes on from step 3.
  EXPECT_EQ(run(1, digits({model("mlp_digits"), "--job", "kept", "--device", "cuda", "--steps", "6", "-q"}), &log), 0)
      << log;
  EXPECT_NE(log.find("resumed at step 3"), std::string::npos) << log;
}

TEST(ExecGpuNoVramTest, ADaemonWithoutVramIsAClearError) {
  test::TestCluster cluster(1, test::DaemonOptions{.dram = "64MiB", .pmem = "8MiB"});
  ASSERT_TRUE(cluster.ready()) << cluster.logs();
  test::ExecRank rank(0, 1, cluster.node(1).socket(),
                      digits({model("mlp_digits"), "--job", "novram", "--device", "cuda", "-q"}),
                      cluster.dir() + "/novram.log");
  EXPECT_EQ(rank.wait(), 1);
  EXPECT_NE(rank.log().find("keeps the tensors in the VRAM tier"), std::string::npos) << rank.log();
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device: skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
