// tiermem-exec against real daemons: pipeline training across two daemons,
// determinism, the same losses with and without a pipeline, gradient topology
// mismatch, and loss parity with PyTorch (resuming: trainer_resume_test.cpp).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/support/exec_cluster_test.hpp"
#include "tests/support/exec_rank.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

std::string slurp(const std::string& path) { return test::read_file(path); }

using Rank = test::ExecRank;

class TrainerTest : public test::ExecClusterTest {};

TEST_F(TrainerTest, PipelineOfTwoRanksOnTwoDaemonsLearnsTheDigits) {
  const std::string trace = m_dir + "/trace.json";
  const std::string logs = run(2, {model("mlp_digits"), "--job", "digits", "--epochs", "12", "--trace", trace});
  EXPECT_NE(logs.find("mesh validation: 1 KiB all-reduce over 2 rank(s) agrees"), std::string::npos) << logs;
  EXPECT_NE(logs.find("send/receive round trip"), std::string::npos);
  EXPECT_NE(logs.find("2 stage(s) x 1 replica(s)"), std::string::npos);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(logs, m, std::regex("summary: .* test accuracy ([0-9.]+)%"))) << logs;
  EXPECT_GE(std::stod(m[1]), 95.0) << logs;
  EXPECT_NE(logs.find("epoch 12/12"), std::string::npos);
  // fc1 holds 79 % of the FLOPs: it is split into column blocks, and the two
  // stages balance within 5 %.
  EXPECT_NE(logs.find("split fc1 ([32,64] x [64,128], 79% of the FLOPs) into 2 column blocks"), std::string::npos)
      << logs;
  ASSERT_TRUE(std::regex_search(logs, m, std::regex("imbalance flops ([0-9.]+)%"))) << logs;
  EXPECT_LE(std::stod(m[1]), 5.0) << logs;
  // Each rank's trace: its ops as compute spans, the boundary activations
  // (column blocks of h1 computed on stage 0, read by the concat on stage 1)
  // and their gradients as transfers, in Chrome's JSON format.
  for (int rank : {0, 1}) {
    std::ifstream in(trace + ".rank" + std::to_string(rank));
    ASSERT_TRUE(in) << "no trace from rank " << rank;
    const auto json = nlohmann::json::parse(in);
    std::set<std::string> compute, comm;
    for (const auto& e : json["traceEvents"]) {
      if (e["ph"] != "X") continue;
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      (e["cat"] == "compute" ? compute : comm).insert(e["name"].get<std::string>());
    }
    EXPECT_TRUE(comm.count("h1.c0")) << "rank " << rank << " traced no transfer of h1's first block";
    EXPECT_TRUE(compute.count("fc1.c" + std::to_string(rank))) << "rank " << rank << ": not its block of fc1";
    EXPECT_EQ(compute.count("fc2"), rank == 1 ? 1u : 0u) << "rank " << rank;
  }
#if TIERMEM_HAVE_PYTHON
  // tools/trace-top.py sums rank 1's trace up by op: every step (after the
  // three it leaves out) ran fc2's backward once per micro-batch (2; the
  // forward ops run more: an epoch's evaluation counts with its last step).
  const std::string top = m_dir + "/top.json";
  ASSERT_EQ(std::system(("python3 " TIERMEM_SOURCE_ROOT "/tools/trace-top.py --json " + trace + ".rank1 > " + top).c_str()),
            0);
  std::ifstream in(top);
  const auto json = nlohmann::json::parse(in);
  EXPECT_GT(json["steps"].get<int>(), 10);
  EXPECT_GT(json["ms_per_step"].get<double>(), 0.0);
  std::map<std::string, double> calls;
  for (const auto& op : json["ops"]) calls[op["name"].get<std::string>()] = op["calls"].get<double>();
  EXPECT_EQ(calls["fc#.grad_a"], 2.0) << json.dump();
  EXPECT_EQ(calls["loss.grad"], 2.0) << json.dump();
  EXPECT_GE(calls["fc#"], 2.0) << json.dump();
  EXPECT_EQ(calls["optimizer"], 1.0) << json.dump();
#endif
}

TEST_F(TrainerTest, SplitPipelineFollowsTheWholeModel) {
  // Two stages with fc1 in column blocks start from the same parameters as
  // one rank with fc1 whole and follow its losses (close; BLAS may sum
  // narrower blocks in another order, though here the bits agree); kept
  // whole (--no-split), two stages give the very bits of one.
  const std::string one = m_dir + "/one.losses", split = m_dir + "/split.losses", whole = m_dir + "/whole.losses";
  const std::vector<std::string> common{model("mlp_digits"), "--steps", "40", "-q"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  run(1, with({"--job", "s1", "--losses", one}));
  const std::string logs = run(2, with({"--job", "s2", "--losses", split}));
  run(2, with({"--job", "s3", "--losses", whole, "--no-split"}));
  auto losses = [](const std::string& path) {
    std::vector<double> out;
    std::istringstream in(slurp(path));
    for (std::string line; std::getline(in, line);) out.push_back(std::strtod(line.c_str(), nullptr));
    return out;
  };
  const std::vector<double> a = losses(one), b = losses(split);
  ASSERT_EQ(a.size(), 40u);
  ASSERT_EQ(b.size(), a.size()) << logs;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-4 * std::abs(a[i])) << "step " << i + 1;
  EXPECT_EQ(slurp(whole), slurp(one)) << "two stages, ops whole: the same bits as one rank";
}

TEST_F(TrainerTest, FashionMnistMlpReaches85PercentInThreeEpochs) {
  const std::string logs = run(1, {model("mlp_fashion"), "--job", "fashion", "--epochs", "3"});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(logs, m, std::regex("summary: .* test accuracy ([0-9.]+)%"))) << logs;
  EXPECT_GE(std::stod(m[1]), 85.0) << logs;
  EXPECT_NE(logs.find("60000 train / 10000 test rows"), std::string::npos) << logs;
}

// The same bits hold for the same threads per rank: OpenBLAS orders a GEMM's
// sums by its thread count, and ranks sharing a host split its cores
// (TIERMEM_LOCAL_WORLD_SIZE): every run here computes as one of two ranks.
TEST_F(TrainerTest, DeterministicAndTheSameWithOrWithoutAPipeline) {
  ::setenv("TIERMEM_LOCAL_WORLD_SIZE", "2", 1);
  struct Unset {
    ~Unset() { ::unsetenv("TIERMEM_LOCAL_WORLD_SIZE"); }
  } unset;
  const std::string a = m_dir + "/a.losses", b = m_dir + "/b.losses", c = m_dir + "/c.losses", d = m_dir + "/d.losses";
  run(1, {model("ffn_block_digits"), "--job", "d1", "--steps", "30", "--losses", a, "-q"});
  run(1, {model("ffn_block_digits"), "--job", "d2", "--steps", "30", "--losses", b, "-q"});
  run(2, {model("ffn_block_digits"), "--job", "d3", "--steps", "30", "--losses", c, "-q"});
  run(1, {model("ffn_block_digits"), "--job", "d4", "--steps", "30", "--losses", d, "--seed", "2", "-q"});
  // The same pipeline with the nodes as hosts: boundary messages go as
  // batches through the data plane (one request each, sent while the next
  // ops compute).
  const std::string e = m_dir + "/e.losses";
  ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);
  const std::string over_tcp = run(2, {model("ffn_block_digits"), "--job", "d5", "--steps", "30", "--losses", e});
  ::unsetenv("TIERMEM_MAP_SAME_HOST");
  std::smatch calls;
  ASSERT_TRUE(std::regex_search(over_tcp, calls, std::regex("rank 0: tiermem calls: .* ([0-9]+) as checked messages")))
      << over_tcp;
  EXPECT_GT(std::stoll(calls[1]), 0) << "the boundary messages went through the data plane: " << over_tcp;
  EXPECT_EQ(slurp(a), slurp(e)) << "split over two stages, messages through the data plane: the same bits";
  const std::string first = slurp(a);
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(std::count(first.begin(), first.end(), '\n'), 30);
  EXPECT_EQ(slurp(a), slurp(b)) << "two runs with one seed: bit-identical losses";
  EXPECT_EQ(slurp(a), slurp(c)) << "split over two stages on two daemons: the same bits";
  EXPECT_NE(slurp(a), slurp(d)) << "another seed, other losses";
}

TEST_F(TrainerTest, GradientTopologyMismatchIsCaughtAtStart) {
  // Rank 1 loads a model whose hidden layer is smaller.
  std::string text = slurp(model("mlp_digits"));
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"[64, 128]", "[64, 96]"}, {"[128]     role: PARAM init: LINEAR_BIAS init_fan_in: 64", "[96] role: PARAM init: LINEAR_BIAS init_fan_in: 64"}, {"[128, 10]", "[96, 10]"}}) {
    text.replace(text.find(from), from.size(), to);
  }
  const std::string other = m_dir + "/smaller.pbtxt";
  std::ofstream(other) << text;
  // Layers whole (--no-split), so that the boundary tensor is h1 itself.
  Rank r0(0, 2, socket(1), {model("mlp_digits"), "--job", "mm", "--timeout", "10", "--no-split"}, m_dir + "/m0.log");
  Rank r1(1, 2, socket(2), {other, "--job", "mm", "--timeout", "10", "--no-split"}, m_dir + "/m1.log");
  const int rc0 = r0.wait(), rc1 = r1.wait();
  const std::string logs = r0.log() + r1.log();
  EXPECT_NE(rc0 + rc1, 0) << logs;
  EXPECT_NE(logs.find("Gradient topology mismatch"), std::string::npos) << logs;
  EXPECT_NE(logs.find("'h1'"), std::string::npos) << logs;
  EXPECT_NE(logs.find("[32,128]"), std::string::npos) << logs;
  EXPECT_NE(logs.find("[32,96]"), std::string::npos) << logs;
}

TEST_F(TrainerTest, BadModelAndBadEnvironmentAreClearErrors) {
  const std::string bad = m_dir + "/bad.pbtxt";
  std::ofstream(bad) << "name: \"x\" micro_batch: 2 op { name: \"a\" type: TELEPORT }";
  int rc = 0;
  std::string logs = run(1, {bad, "--job", "bad"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("TELEPORT"), std::string::npos) << logs;
  logs = run(3, {model("mlp_digits"), "--job", "three", "--stages", "2"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("cannot be split into 2 pipeline stages"), std::string::npos) << logs;
  logs = run(2, {model("mlp_digits"), "--job", "pipe", "--stages", "2", "--replicas", "1"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("--replicas needs a data-parallel job (--stages 1)"), std::string::npos) << logs;
  logs = run(1, {model("mlp_digits"), "--job", "every", "--replicas", "1", "--snapshot-every", "5"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("--snapshot-every 5 cannot go with it"), std::string::npos) << logs;
  // More copies than the cluster has other nodes: the daemon says so.
  logs = run(1, {model("mlp_digits"), "--job", "many", "--replicas", "3", "--steps", "2"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("the replicated snapshot (--replicas)"), std::string::npos) << logs;
}

TEST_F(TrainerTest, AnUnknownDeviceAndAMissingGpuAreClearErrors) {
  int rc = 0;
  std::string logs = run(1, {model("mlp_digits"), "--job", "tpu", "--device", "tpu", "--steps", "2"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("unknown device 'tpu' (cpu, cuda or cuda:N)"), std::string::npos) << logs;
  logs = run(1, {model("mlp_digits"), "--job", "cudax", "--device", "cuda:x", "--steps", "2"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("unknown device 'cuda:x'"), std::string::npos) << logs;
  logs = run(1, {model("mlp_digits"), "--job", "cpubf16", "--precision", "bf16", "--steps", "2"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("--precision bf16 runs on a GPU"), std::string::npos) << logs;
  EXPECT_EQ(test::run_ctl(socket(1), {"ls"}).out.find("cpubf16."), std::string::npos);
  // NCCL is for GPU ranks: asked for on a CPU rank, refused before
  // anything is allocated; an unknown kind of collectives too.
  logs = run(2, {model("mlp_digits"), "--job", "cpunccl", "--stages", "1", "--collectives", "nccl", "--steps", "2"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("--collectives nccl needs a GPU rank (--device cuda[:N]); cpu reduces through tiermem"),
            std::string::npos) << logs;
  EXPECT_EQ(test::run_ctl(socket(1), {"ls"}).out.find("cpunccl."), std::string::npos);
  logs = run(1, {model("mlp_digits"), "--job", "mpi", "--collectives", "mpi", "--steps", "2"}, &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(logs.find("--collectives"), std::string::npos) << logs;
  logs = run(1, {model("mlp_digits"), "--job", "fp16", "--precision", "fp16", "--steps", "2"}, &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(logs.find("fp16"), std::string::npos) << logs;
  // Without a GPU (CI): the CUDA compute says why it cannot start, and
  // nothing of the job is left behind. With one: tests/gpu covers it.
  if (std::filesystem::exists("/dev/nvidia0")) return;
  logs = run(1, {model("mlp_digits"), "--job", "nogpu", "--device", "cuda", "--steps", "2"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("--device cuda: "), std::string::npos) << logs;
  EXPECT_EQ(test::run_ctl(socket(1), {"ls"}).out.find("nogpu."), std::string::npos);
}

TEST_F(TrainerTest, ASyntheticDatasetTrainsAndABadOneIsRefused) {
  const std::string good = m_dir + "/synthetic.pbtxt";
  std::ofstream(good) << R"(name: "syn" dataset: "synthetic:32:4" micro_batch: 16
tensor { name: "x" shape: [16, 32] role: INPUT }
tensor { name: "y" shape: [16] role: LABEL dtype: I32 }
tensor { name: "w" shape: [32, 4] role: PARAM init: KAIMING_UNIFORM }
op { name: "fc" type: MATMUL input: ["x", "w"] output: "logits" }
op { name: "loss" type: SOFTMAX_CROSS_ENTROPY input: ["logits", "y"] output: "loss" }
loss: "loss"
optimizer { type: ADAM learning_rate: 0.01 beta1: 0.9 beta2: 0.999 epsilon: 1e-8 })";
  std::string logs = run(1, {good, "--job", "syn", "--epochs", "2"});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(logs, m, std::regex("summary: .* test accuracy ([0-9.]+)%"))) << logs;
  EXPECT_GT(std::stod(m[1]), 60.0) << "labels are a linear map of the features: learnable";
  std::string bad = slurp(good);
  bad.replace(bad.find("synthetic:32:4"), 14, "synthetic:32:1");
  std::ofstream(m_dir + "/bad_synthetic.pbtxt") << bad;
  int rc = 0;
  logs = run(1, {m_dir + "/bad_synthetic.pbtxt", "--job", "bad-syn"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("synthetic:COLS:CLASSES with COLS in 1..65536 and CLASSES in 2..1024"), std::string::npos) << logs;
  // Refused without leaving memory behind (the dataset loads while the rank
  // makes its arenas; they go again).
  const std::string ls = test::run_ctl(socket(1), {"ls"}).out;
  EXPECT_EQ(ls.find("bad-syn."), std::string::npos) << ls;
}

// The kernels' OpenMP threads sleep when idle (they spun, and took the
// cores OpenBLAS needs): OMP_WAIT_POLICY is passive unless the environment
// says otherwise, and libgomp acts on it: it spins 0 times before sleeping
// (a policy set too late shows passive but spins 300000 times).
TEST(TiermemExecTest, KernelThreadsWaitPassivelyUnlessTheEnvironmentSaysOtherwise) {
  ::unsetenv("OMP_WAIT_POLICY");
  ::setenv("OMP_DISPLAY_ENV", "VERBOSE", 1);
  auto plain = test::run_command({test::exec_path(), "--version"});
  ::setenv("OMP_WAIT_POLICY", "active", 1);
  auto asked = test::run_command({test::exec_path(), "--version"});
  ::unsetenv("OMP_WAIT_POLICY");
  ::unsetenv("OMP_DISPLAY_ENV");
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.err.find("OMP_WAIT_POLICY = 'PASSIVE'"), std::string::npos) << plain.err;
  EXPECT_NE(plain.err.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << plain.err;
  EXPECT_NE(asked.err.find("OMP_WAIT_POLICY = 'ACTIVE'"), std::string::npos) << asked.err;
  EXPECT_NE(plain.out.find("tiermem-exec "), std::string::npos) << plain.out;
  // Ranks sharing the host share its cores between them, in both pools
  // (OpenMP's shown here), unless told otherwise.
  const unsigned cores = std::thread::hardware_concurrency();
  ::setenv("OMP_DISPLAY_ENV", "TRUE", 1);
  ::setenv("TIERMEM_LOCAL_WORLD_SIZE", "2", 1);
  auto shared = test::run_command({test::exec_path(), "--version"});
  ::setenv("OMP_NUM_THREADS", "3", 1);
  auto told = test::run_command({test::exec_path(), "--version"});
  ::unsetenv("OMP_NUM_THREADS");
  ::unsetenv("TIERMEM_LOCAL_WORLD_SIZE");
  ::unsetenv("OMP_DISPLAY_ENV");
  EXPECT_NE(shared.err.find("OMP_NUM_THREADS = '" + std::to_string(std::max(1u, cores / 2)) + "'"), std::string::npos)
      << shared.err;
  EXPECT_NE(told.err.find("OMP_NUM_THREADS = '3'"), std::string::npos) << told.err;
}

bool torch_available() {
  return test::run_command({"/usr/bin/python3", "-c", "import torch, numpy"}).exit_code == 0;
}

// Every one of `steps` losses (one per line in each text) within 1e-4
// relative of PyTorch's; returns the largest relative difference.
double expect_losses_match(const std::string& ours_text, const std::string& theirs_text, int steps) {
  std::istringstream ours(ours_text), theirs(theirs_text);
  std::string a, b;
  int step = 0;
  double worst = 0;
  while (std::getline(ours, a) && std::getline(theirs, b)) {
    const double x = std::strtod(a.c_str(), nullptr), y = std::strtod(b.c_str(), nullptr);
    worst = std::max(worst, std::abs(x - y) / std::abs(y));
    EXPECT_LE(std::abs(x - y), 1e-4 * std::abs(y)) << "step " << step << ": tiermem " << x << ", PyTorch " << y;
    ++step;
  }
  EXPECT_EQ(step, steps);
  return worst;
}

TEST_F(TrainerTest, LossesMatchPyTorchStepByStep) {
  if (!torch_available()) GTEST_SKIP() << "python3-torch is not installed";
  const std::string dump = m_dir + "/dump", losses = m_dir + "/parity.losses";
  run(1, {model("mlp_digits"), "--job", "parity", "--steps", "50", "--micro-batches", "2", "--dump", dump,
          "--dump-batches", "50", "--losses", losses, "-q"});
  auto torch = test::run_command({"/usr/bin/python3", std::string(TIERMEM_SOURCE_ROOT) + "/tests/executor/torch_reference.py",
                                  dump, "50", "2", "0.05", "0.9"});
  ASSERT_EQ(torch.exit_code, 0) << torch.err;
  const double worst = expect_losses_match(slurp(losses), torch.out, 50);
  std::printf("largest relative difference to PyTorch over 50 steps: %.2e\n", worst);
}

// The GPT of config/models/gpt_tiny.pbtxt (token and position embeddings,
// two blocks of causal self-attention and MLP, bytes as tokens) against the
// same model written in PyTorch (tests/executor/torch_gpt_reference.py),
// from the same initial parameters on the same batches: every loss of 50
// Adam steps within 1e-4 relative. The corpus: tests/data/corpus.txt.
TEST_F(TrainerTest, GptLossesMatchPyTorchStepByStep) {
  if (!torch_available()) GTEST_SKIP() << "python3-torch is not installed";
  const std::string dump = m_dir + "/gpt_dump", losses = m_dir + "/gpt.losses";
  const std::string corpus = std::string(TIERMEM_SOURCE_ROOT) + "/tests/data/corpus.txt";
  run(1, {model("gpt_tiny"), "--job", "gpt", "--data", corpus, "--steps", "50", "--dump", dump, "--dump-batches",
          "50", "--losses", losses, "-q"});
  auto torch = test::run_command({"/usr/bin/python3",
                                  std::string(TIERMEM_SOURCE_ROOT) + "/tests/executor/torch_gpt_reference.py", dump,
                                  "50", "2", "2", "64", "4", "32", "256", "0.003", "0.9", "0.99"});
  ASSERT_EQ(torch.exit_code, 0) << torch.err;
  const double worst = expect_losses_match(slurp(losses), torch.out, 50);
  std::printf("GPT: largest relative difference to PyTorch over 50 steps: %.2e\n", worst);
}

// The GPT learns the corpus: the mean loss of its last 50 of 400 steps is
// far below a uniform guess over 256 bytes (ln 256 = 5.55; 2.2 measured),
// and `tiermem-exec sample` prints text drawn from what it keeps.
// Also: a text dataset that is not there is a clear error, and the rank
// leaves no memory behind.
TEST_F(TrainerTest, GptLearnsTheCorpusAndAMissingCorpusIsAClearError) {
  const std::string corpus = std::string(TIERMEM_SOURCE_ROOT) + "/tests/data/corpus.txt";
  const std::string losses = m_dir + "/learn.losses";
  std::string logs = run(1, {model("gpt_tiny"), "--job", "learn", "--data", corpus, "--steps", "400", "--losses",
                             losses, "--log-every", "100", "--keep"});
  std::istringstream in(slurp(losses));
  std::vector<double> all;
  for (std::string line; std::getline(in, line);) all.push_back(std::strtod(line.c_str(), nullptr));
  ASSERT_EQ(all.size(), 400u);
  double tail = 0;
  for (size_t i = 350; i < 400; ++i) tail += all[i] / 50;
  std::printf("GPT: mean loss of steps 351-400: %.3f (step 1: %.3f)\n", tail, all[0]);
  EXPECT_LT(tail, 2.6) << logs;
  // On the held-out tenth of the corpus, after the first epoch (225 steps):
  // the validation loss, printed with the evaluation (a uniform guess: 5.55).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(logs, m, std::regex("summary: .* test loss ([0-9.]+)"))) << logs;
  std::printf("GPT: test loss after the first epoch: %s\n", m[1].str().c_str());
  EXPECT_LT(std::stod(m[1]), 2.6) << logs;  // 2.31 measured
  // What it learned, as text: the prompt, then 200 bytes drawn from it.
  auto text = test::run_command({test::exec_path(), "sample", model("gpt_tiny"), "--socket", socket(1), "--job", "learn",
                                 "--prompt", "The memory ", "--bytes", "200"});
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out.rfind("The memory ", 0), 0u) << text.out;
  EXPECT_EQ(text.out.size(), std::string("The memory ").size() + 200 + 1) << text.out;
  EXPECT_NE(text.err.find("200 bytes from job learn at step 400"), std::string::npos) << text.err;
  std::printf("GPT sample: %s\n", text.out.c_str());
  auto unknown = test::run_command({test::exec_path(), "sample", model("gpt_tiny"), "--socket", socket(1), "--job", "nope"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("no kept job 'nope'"), std::string::npos) << unknown.err;
  auto not_text = test::run_command({test::exec_path(), "sample", model("mlp_digits"), "--socket", socket(1), "--job", "learn"});
  EXPECT_EQ(not_text.exit_code, 1);
  EXPECT_NE(not_text.err.find("is not a model of text"), std::string::npos) << not_text.err;
  // A model whose token table is smaller than the bytes that index it is
  // refused before it reads past the table.
  std::string small = slurp(model("gpt_tiny"));
  small.replace(small.find("shape: [256, 64] role: PARAM init: XAVIER_UNIFORM"), 16, "shape: [128, 64]");
  std::ofstream(m_dir + "/small_table.pbtxt") << small;
  auto small_table = test::run_command(
      {test::exec_path(), "sample", m_dir + "/small_table.pbtxt", "--socket", socket(1), "--job", "learn"});
  EXPECT_EQ(small_table.exit_code, 1);
  EXPECT_NE(small_table.err.find("fewer than the 256 byte values"), std::string::npos) << small_table.err;
  // The same model with two parameters of one size declared the other way
  // round (the same bytes, other offsets) is refused, not sampled from
  // mixed-up weights.
  std::string swapped = slurp(model("gpt_tiny"));
  const std::string gain = "tensor { name: \"b0.ln1.g\" shape: [64] role: PARAM init: ONES }\n";
  const std::string bias = "tensor { name: \"b0.ln1.b\" shape: [64] role: PARAM }\n";
  ASSERT_NE(swapped.find(gain + bias), std::string::npos);
  swapped.replace(swapped.find(gain + bias), gain.size() + bias.size(), bias + gain);
  std::ofstream(m_dir + "/swapped.pbtxt") << swapped;
  auto mixed = test::run_command(
      {test::exec_path(), "sample", m_dir + "/swapped.pbtxt", "--socket", socket(1), "--job", "learn"});
  EXPECT_EQ(mixed.exit_code, 1) << mixed.out;
  EXPECT_NE(mixed.err.find("job 'learn' keeps its parameters laid out otherwise"), std::string::npos) << mixed.err;
  EXPECT_NE(mixed.err.find("(trained from another model)"), std::string::npos) << mixed.err;
  // A record zeroed (as a tiermem-exec before it left the job) is refused as
  // kept by an older binary. executor/runtime/state/arenas.hpp: k_info_layout.
  auto scribbler = m_cluster->node(1).connect("scribbler");
  ASSERT_NE(scribbler, nullptr);
  auto info = scribbler->lookup("learn.r0.info");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  constexpr uint64_t k_info_layout = (34u << 10) + 24;
  const std::vector<unsigned char> zeros(24, 0);
  ASSERT_TRUE(scribbler->write(info->gva.plus(k_info_layout), zeros.data(), zeros.size()).ok());
  auto older = test::run_command({test::exec_path(), "sample", model("gpt_tiny"), "--socket", socket(1), "--job", "learn"});
  EXPECT_EQ(older.exit_code, 1) << older.out;
  EXPECT_NE(older.err.find("(kept by an older tiermem-exec)"), std::string::npos) << older.err;
  int rc = 0;
  logs = run(1, {model("gpt_tiny"), "--job", "nocorpus", "--data", m_dir + "/no-such-corpus", "--steps", "1"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("no-such-corpus: no such file or directory of files"), std::string::npos) << logs;
  const std::string ls = test::run_ctl(socket(1), {"ls"}).out;
  EXPECT_EQ(ls.find("nocorpus."), std::string::npos) << ls;
}

// Tensor parallelism (X7): the GPT's attention (by heads) and MLP (by
// columns) split over two ranks, their partial sums added through tiermem.
// Not the same bits as one rank: the row matmul's sums over the hidden width
// run in two halves, then added. The first loss is (every part starts as its
// part of the whole), and every later one within 1e-5 (5e-8 measured). A
// pipeline of two tensor-parallel stages does the same arithmetic as one:
// the same bits. Data parallel over two tensor-parallel groups follows data
// parallel over two whole ranks.
TEST_F(TrainerTest, TensorParallelGptFollowsOneRankAndComposesWithPipelineAndDataParallel) {
  const std::string corpus = std::string(TIERMEM_SOURCE_ROOT) + "/tests/data/corpus.txt";
  const std::vector<std::string> common{model("gpt_tiny"), "--data", corpus, "--steps", "30", "-q"};
  auto losses_of = [&](int world, const std::string& job, std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    const std::string file = m_dir + "/" + job + ".losses";
    args.insert(args.end(), {"--job", job, "--losses", file});
    args.insert(args.end(), extra.begin(), extra.end());
    run(world, args);
    return slurp(file);
  };
  auto close = [](const std::string& a_text, const std::string& b_text, const std::string& what) {
    std::istringstream a(a_text), b(b_text);
    std::string x, y;
    int steps = 0;
    while (std::getline(a, x) && std::getline(b, y)) {
      const double u = std::strtod(x.c_str(), nullptr), v = std::strtod(y.c_str(), nullptr);
      if (steps == 0) {
        EXPECT_EQ(x, y) << what << ": the first loss, before any update";
      }
      EXPECT_LE(std::abs(u - v), 1e-5 * std::abs(v)) << what << ", step " << steps << ": " << u << " against " << v;
      ++steps;
    }
    EXPECT_EQ(steps, 30) << what;
  };
  const std::string one = losses_of(1, "tp-one", {});
  const std::string tp = losses_of(2, "tp-two", {"--tensor-parallel", "2"});
  close(tp, one, "two tensor-parallel ranks against one");
  EXPECT_EQ(losses_of(4, "tp-pipe", {"--tensor-parallel", "2", "--stages", "2"}), tp)
      << "two stages of two tensor-parallel ranks: the bits of one stage";
  const std::string dp = losses_of(2, "tp-dp", {"--stages", "1"});
  close(losses_of(4, "tp-dp2", {"--tensor-parallel", "2", "--stages", "1"}), dp,
        "two data-parallel groups of two tensor-parallel ranks against two data-parallel ranks");

  // What it split, said; and what it cannot split, refused with the reason.
  std::string logs = run(2, {model("gpt_tiny"), "--data", corpus, "--steps", "1", "--job", "tp-say", "--tensor-parallel", "2"});
  EXPECT_NE(logs.find("tensor parallel: 'b0.qkv' -> 'b0.proj' split by heads: 2 of 4 per rank"), std::string::npos) << logs;
  EXPECT_NE(logs.find("tensor parallel: 'b1.fc' -> 'b1.out' split by columns: 128 of 256 per rank"), std::string::npos) << logs;
  int rc = 0;
  logs = run(3, {model("gpt_tiny"), "--data", corpus, "--job", "tp-three", "--tensor-parallel", "3"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("op 'b0.attn' has 4 heads, which 3 ranks cannot share"), std::string::npos) << logs;
  logs = run(3, {model("gpt_tiny"), "--data", corpus, "--job", "tp-odd", "--tensor-parallel", "2"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("a world of 3 ranks cannot be split into tensor-parallel groups of 2"), std::string::npos) << logs;
  // GPU ranks sum their parts through NCCL (tests/gpu); through tiermem
  // they cannot (the sums are on the host).
  logs = run(2, {model("gpt_tiny"), "--data", corpus, "--job", "tp-gpu", "--tensor-parallel", "2", "--device", "cuda",
                 "--collectives", "tiermem"}, &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(logs.find("on GPU ranks sums the parts through NCCL: --collectives auto or nccl, not tiermem"),
            std::string::npos) << logs;
}

// A tensor-parallel rank killed mid-run (SIGKILL, each of the two in turn)
// and started again resumes at the committed step; its partner waits for it
// in the middle of a step's exchanges, gets the same parts under the same
// numbers, and every loss is the one an undisturbed run saw, bit for bit.
TEST_F(TrainerTest, AKilledTensorParallelRankResumesAndTheLossesAreUndisturbed) {
  const std::string corpus = std::string(TIERMEM_SOURCE_ROOT) + "/tests/data/corpus.txt";
  auto args = [&](const std::string& job) {
    return std::vector<std::string>{model("gpt_tiny"), "--data", corpus, "--steps", "200", "--tensor-parallel", "2",
                                    "--log-every", "1", "--job", job, "--losses", m_dir + "/" + job + ".losses"};
  };
  run(2, args("tpk-ref"));
  const std::string reference = slurp(m_dir + "/tpk-ref.losses");
  ASSERT_EQ(std::count(reference.begin(), reference.end(), '\n'), 200);
  for (int victim : {1, 0}) {
    const std::string job = "tpk" + std::to_string(victim);
    Rank r0(0, 2, socket(1), args(job), m_dir + "/" + job + "-0.log");
    Rank r1(1, 2, socket(2), args(job), m_dir + "/" + job + "-1.log");
    const std::string at = victim == 1 ? "step 60 " : "step 110 ";
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (r0.log().find(at) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(2ms);
    }
    ASSERT_NE(r0.log().find(at), std::string::npos) << r0.log();
    (victim == 1 ? r1 : r0).kill();
    Rank again(victim, 2, socket(victim + 1), args(job), m_dir + "/" + job + "-again.log");
    EXPECT_EQ(again.wait(), 0) << again.log();
    EXPECT_EQ((victim == 1 ? r0 : r1).wait(), 0);
    std::smatch m;
    const std::string log = again.log();
    ASSERT_TRUE(std::regex_search(log, m, std::regex("resumed at step ([0-9]+)"))) << log;
    EXPECT_GE(std::stoi(m[1]), victim == 1 ? 60 : 110);
    EXPECT_EQ(slurp(m_dir + "/" + job + ".losses"), reference) << "rank " << victim << " killed";
  }
}

// The gradient buckets data-parallel GPU ranks all-reduce through NCCL
// while the backward pass goes on (grad_buckets.hpp, issue 25), run on CPU
// ranks through the memory service (TIERMEM_EXEC_CPU_BUCKETS=1,
// bucket_collective.hpp): every bucket reduced right after the last op that
// writes a gradient in it. A bucket reduced before one of its gradients is
// final would change the losses; reduced where they are, the sums are the
// whole all-reduce's, bit for bit, with many small buckets, three replicas
// and a pipeline of two stages per replica.
TEST_F(TrainerTest, GradientBucketsReducedAfterTheirLastWriteGiveTheBitsOfTheWholeAllReduce) {
  const std::string corpus = std::string(TIERMEM_SOURCE_ROOT) + "/tests/data/corpus.txt";
  auto losses_of = [&](int world, const std::string& job, std::vector<std::string> args, bool buckets,
                       std::string* log = nullptr) {
    const std::string file = m_dir + "/" + job + ".losses";
    args.insert(args.end(), {"--job", job, "--losses", file, "--steps", "30"});
    if (buckets) ::setenv("TIERMEM_EXEC_CPU_BUCKETS", "1", 1);
    const std::string out = run(world, args);
    ::unsetenv("TIERMEM_EXEC_CPU_BUCKETS");
    if (log != nullptr) *log = out;
    return slurp(file);
  };
  struct Case {
    std::string name;
    int world;
    std::vector<std::string> args;
  };
  const std::vector<Case> cases = {
      {"gpt2", 2, {model("gpt_tiny"), "--data", corpus, "--stages", "1", "--bucket-mib", "0.004"}},
      {"mlp3", 3, {model("mlp_digits"), "--stages", "1", "--bucket-mib", "0.001"}},
      {"ffn-pipe", 4, {model("ffn_block_digits"), "--stages", "2", "--bucket-mib", "0.01"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string whole = losses_of(c.world, c.name + "-whole", c.args, false);
    ASSERT_EQ(std::count(whole.begin(), whole.end(), '\n'), 30);
    std::string log;
    const std::string bucketed = losses_of(c.world, c.name + "-buckets", c.args, true, &log);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, std::regex("bucket by bucket \\(group dp\\.s0\\.t0\\): ([0-9]+) gradient bucket")))
        << log;
    EXPECT_GE(std::stoi(m[1]), 3) << "too few buckets to show anything: " << log;
    EXPECT_EQ(bucketed, whole) << "bucket by bucket, each after its gradients' last write: the whole all-reduce's bits";
  }
}

// A replica that dies between its group's all-reduce of a step and its
// commit resumes a step behind the other. Its gradients of that step went
// bucket by bucket (as through NCCL), published nowhere by step, so it
// cannot compute the step again with the other: it takes the other's
// committed state of the step (replicas hold the same bits) and goes on.
// Every loss is the undisturbed run's.
TEST_F(TrainerTest, AReplicaThatDiedBeforeItsCommitCatchesUpWithItsGroup) {
  const std::vector<std::string> common{model("mlp_digits"), "--stages", "1", "--steps", "150", "--bucket-mib",
                                        "0.001", "--log-every", "1"};
  auto args = [&](const std::string& job) {
    std::vector<std::string> a = common;
    a.insert(a.end(), {"--job", job, "--losses", m_dir + "/" + job + ".losses"});
    return a;
  };
  ::setenv("TIERMEM_EXEC_CPU_BUCKETS", "1", 1);
  struct Unset {
    ~Unset() { ::unsetenv("TIERMEM_EXEC_CPU_BUCKETS"); }
  } unset;
  run(2, args("behind-ref"));
  Rank r0(0, 2, socket(1), args("behind"), m_dir + "/behind0.log");
  ::setenv("TIERMEM_EXEC_STOP_BEFORE_COMMIT", "60", 1);
  Rank r1(1, 2, socket(2), args("behind"), m_dir + "/behind1.log");
  ::unsetenv("TIERMEM_EXEC_STOP_BEFORE_COMMIT");
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (r1.log().find("stopping before committing step 60") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_NE(r1.log().find("stopping before committing step 60"), std::string::npos) << r1.log();
  // Rank 0 commits step 60 (the all-reduce was whole) within
  // microseconds and waits at its barrier for rank 1, which did not (its
  // progress line comes after the barrier: nothing to watch for).
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(r0.log().find("step 60 "), std::string::npos) << r0.log();
  r1.kill();
  Rank again(1, 2, socket(2), args("behind"), m_dir + "/behind1b.log");
  EXPECT_EQ(again.wait(), 0) << again.log();
  EXPECT_EQ(r0.wait(), 0) << r0.log();
  EXPECT_NE(again.log().find("a step behind its data-parallel group dp.s0.t0: took the committed state of step 60 "
                             "from rank 0"),
            std::string::npos)
      << again.log();
  const std::string reference = slurp(m_dir + "/behind-ref.losses");
  ASSERT_EQ(std::count(reference.begin(), reference.end(), '\n'), 150);
  EXPECT_EQ(slurp(m_dir + "/behind.losses"), reference);
}

}  // namespace
}  // namespace tiermem
