// The runtime's parts on their own (executor/runtime/): the schedule a plan
// fixes, the feeder's batches and partial gradients, the committer's commit,
// snapshot and barrier, and the stage's sums, each chosen once. Over a daemon
// inside this process (tests/support/in_process_daemon.hpp) and real
// clients: no daemon process, no other rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "executor/compute.hpp"
#include "executor/grad_buckets.hpp"
#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/step/committer.hpp"
#include "executor/runtime/step/feeder.hpp"
#include "executor/runtime/state/job.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/exchange/mailboxes.hpp"
#include "executor/runtime/plan/schedule.hpp"
#include "executor/runtime/exchange/sums.hpp"
#include "executor/runtime/exchange/tp_exchange.hpp"
#include "tests/support/in_process_daemon.hpp"

namespace tiermem::exec {
namespace {

const std::string k_mlp = std::string(TIERMEM_SOURCE_ROOT) + "/config/models/mlp_digits.pbtxt";

TrainOptions options_for(int stages, int micro_batches) {
  TrainOptions o;
  o.model = k_mlp;
  o.stages = stages;
  o.micro_batches = micro_batches;
  o.balance = "flops";
  o.quiet = true;
  o.timeout = std::chrono::seconds(10);
  return o;
}

// A collective that records what the stage asks of it (the NCCL group's
// place, on a CPU): each beside-call's data and size, and each wait.
class RecordingCollective final : public Collective {
 public:
  struct Call {
    float* data;
    int64_t count;
  };
  int size() const override { return 2; }
  int rank() const override { return 0; }
  Result<bool> joined() override { return true; }
  void abort() override {}
  void all_reduce(const float*, float*, int64_t) override { ++sums; }
  uint64_t all_reduce_beside(float* data, int64_t count) override {
    calls.push_back({data, count});
    return calls.size();
  }
  void wait_beside(uint64_t ticket) override { waited.push_back(ticket); }
  Result<std::vector<uint64_t>> sum_words(const std::vector<uint64_t>& mine) override { return mine; }
  void beside_time(uint64_t* bytes, double* seconds) override {
    *bytes = 0;
    *seconds = 0;
  }
  std::string library() const override { return "recording"; }

  std::vector<Call> calls;
  std::vector<uint64_t> waited;
  int sums = 0;
};

// --- the schedule: a pure function of the plan ---------------------------------------

TEST(ScheduleTest, ATwoStagePipelineZeroesEachMicroBatchGradientOnceAndMeetsItsChannels) {
  const TrainOptions o = options_for(2, 3);
  for (int rank = 0; rank < 2; ++rank) {
    auto job = plan_model(o, {.rank = rank, .world = 2});
    ASSERT_TRUE(job.ok()) << job.status().to_string();
    const Schedule s(*job);
    EXPECT_TRUE(s.exchanges());
    ASSERT_EQ(s.positions().size(), job->plan.schedule.size());
    // Every per-micro-batch gradient instance is zeroed once, at its first position.
    size_t zeroed = 0, expected = 0;
    for (size_t w = 0; w < job->plan.work.size(); ++w) {
      const Tensor& t = job->graph.tensors[job->plan.work[w].tensor];
      if (t.role == Role::grad && !t.of_param) ++expected;
    }
    for (size_t pos = 0; pos <= s.positions().size(); ++pos) zeroed += s.zero_at(static_cast<int>(pos)).size();
    EXPECT_EQ(zeroed, expected) << "rank " << rank;
    // What a channel brings here is received, never made here; what this
    // stage sends back is sent once its last writer ran.
    for (const Channel& c : job->channels) {
      if (c.to == rank && c.forward) {
        EXPECT_EQ(s.received_by(c.tensor), c.id);
      }
      if (c.to == rank && !c.forward) {
        ASSERT_NE(s.partials_of(c.tensor), nullptr);
        EXPECT_NE(std::find(s.partials_of(c.tensor)->begin(), s.partials_of(c.tensor)->end(), c.id),
                  s.partials_of(c.tensor)->end());
      }
      if (c.from == rank && !c.forward) {
        EXPECT_GE(s.last_writer(c.tensor), 0) << job->graph.tensors[c.tensor].name;
      }
    }
    // The optimizer ops and what is carried cover this stage's parameters
    // and state, once each.
    std::vector<int> covered = s.carried();
    for (int op : s.update_ops()) {
      const Op& u = job->graph.ops[static_cast<size_t>(op)];
      EXPECT_EQ(u.phase, Phase::update);
      for (int t : u.in) {
        if (job->graph.tensors[t].role != Role::grad) covered.push_back(t);
      }
    }
    std::vector<int> planned;
    for (const auto* list : {&job->plan.params, &job->plan.optimizer}) {
      for (const Placement& p : *list) planned.push_back(p.tensor);
    }
    std::sort(covered.begin(), covered.end());
    std::sort(planned.begin(), planned.end());
    EXPECT_EQ(covered, planned) << "rank " << rank;
    // The loss is on the last stage: its rows there, none on the first.
    EXPECT_EQ(s.loss_rows() > 0, rank == job->loss_stage) << "rank " << rank;
    for (int op : s.forward_ops()) EXPECT_EQ(job->graph.ops[static_cast<size_t>(op)].phase, Phase::forward);
  }
}

TEST(ScheduleTest, OneRankAloneExchangesNothing) {
  auto job = plan_model(options_for(1, 2), {.rank = 0, .world = 1});
  ASSERT_TRUE(job.ok()) << job.status().to_string();
  const Schedule s(*job);
  EXPECT_FALSE(s.exchanges());
  EXPECT_EQ(s.loss_rows(), 2 * job->graph.micro_batch);
  for (const auto& [op, mb] : s.positions()) EXPECT_FALSE(s.is_partial_sum(op));
}

// A GPU with --precision bf16 runs attention without dropout in tiles
// (cuda/flash_attention.cuh): the plan saves the tiles' state, [m * heads,
// dh + 2] (gpt_tiny: 4 heads of 16, context 32: 18 floats a row), not each
// head's softmax, [m * heads, t]; fp32, or the CPU, saves the softmax, and
// the stage's memory shrinks.
TEST(PlanTest, Bf16OnAGpuSavesAttentionsTileStateNotItsSoftmax) {
  auto saved = [](const std::string& precision, const std::string& device, int64_t* stage_bytes) {
    TrainOptions o = options_for(1, 1);
    o.model = std::string(TIERMEM_SOURCE_ROOT) + "/config/models/gpt_tiny.pbtxt";
    o.precision = precision;
    o.device = device;
    auto job = plan_model(o, {.rank = 0, .world = 1});
    EXPECT_TRUE(job.ok()) << job.status().to_string();
    if (!job.ok()) return std::vector<std::vector<int64_t>>{};
    std::vector<std::vector<int64_t>> shapes;
    for (const Op& op : job->graph.ops) {
      if (op.kind == proto::CAUSAL_ATTENTION) shapes.push_back(job->graph.tensors[op.out[1]].shape);
    }
    *stage_bytes = 0;
    for (const ArenaPlan& a : job->plan.arenas) *stage_bytes += a.bytes;
    return shapes;
  };
  int64_t fp32_bytes = 0, bf16_bytes = 0, cpu_bytes = 0;
  const auto fp32 = saved("fp32", "cuda", &fp32_bytes);
  const auto bf16 = saved("bf16", "cuda", &bf16_bytes);
  const auto cpu = saved("bf16", "cpu", &cpu_bytes);  // refused later by the CPU's compute; planned as fp32
  ASSERT_EQ(fp32.size(), 2u);
  ASSERT_EQ(bf16.size(), 2u);
  const int64_t rows = 8 * 32 * 4;  // sequences x context x heads
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(fp32[i], (std::vector<int64_t>{rows, 32}));
    EXPECT_EQ(bf16[i], (std::vector<int64_t>{rows, 18}));
  }
  EXPECT_EQ(cpu, fp32);
  EXPECT_LT(bf16_bytes, fp32_bytes);
  setenv("TIERMEM_FLASH", "0", 1);
  int64_t off_bytes = 0;
  EXPECT_EQ(saved("bf16", "cuda", &off_bytes), fp32) << "the tiles turned off: the softmax is saved";
  unsetenv("TIERMEM_FLASH");
}

// The optimizer's state lies by kind (every first moment, then every
// second) in the parameters' order, so that updates of parameters side by
// side find their state side by side and run as one call: for gpt_tiny
// (Adam, no weight decay) each of parameters, gradients, first and second
// moments follows on from the one before in the update ops' order.
TEST(PlanTest, UpdatesFindTheirParametersAndStateSideBySide) {
  TrainOptions o = options_for(1, 1);
  o.model = std::string(TIERMEM_SOURCE_ROOT) + "/config/models/gpt_tiny.pbtxt";
  auto job = plan_model(o, {.rank = 0, .world = 1});
  ASSERT_TRUE(job.ok()) << job.status().to_string();
  auto offset_in = [](const std::vector<Placement>& list, int tensor) -> int64_t {
    for (const Placement& p : list) {
      if (p.tensor == tensor) return p.offset;
    }
    return -1;
  };
  std::vector<const Op*> updates;
  for (const Op& op : job->graph.ops) {
    if (op.kind == proto::ADAM_UPDATE) updates.push_back(&op);
  }
  ASSERT_GT(updates.size(), 10u);
  for (size_t u = 1; u < updates.size(); ++u) {
    const Op& a = *updates[u - 1];
    const Op& b = *updates[u];
    const int64_t bytes = job->graph.tensors[a.in[0]].bytes();
    EXPECT_EQ(offset_in(job->plan.params, b.in[0]), offset_in(job->plan.params, a.in[0]) + bytes);
    EXPECT_EQ(offset_in(job->plan.grads, b.in[1]), offset_in(job->plan.grads, a.in[1]) + bytes);
    EXPECT_EQ(offset_in(job->plan.optimizer, b.in[2]), offset_in(job->plan.optimizer, a.in[2]) + bytes) << "m";
    EXPECT_EQ(offset_in(job->plan.optimizer, b.in[3]), offset_in(job->plan.optimizer, a.in[3]) + bytes) << "v";
  }
}

// --- the parts that touch memory, over an in-process daemon ----------------------------

class RuntimePartsTest : public ::testing::Test {
 protected:
  // A job of `world` ranks (data parallel: one stage) as rank 0 sees it,
  // its arenas allocated on the in-process daemon, its dataset attached.
  void start(int world, int64_t snapshot_every = 0) {
    ASSERT_TRUE(m_daemon.ok()) << m_daemon.status().to_string();
    m_client = m_daemon.connect("runtime-test");
    ASSERT_NE(m_client, nullptr);
    m_options = options_for(1, 2);
    m_options.stages = 1;
    m_options.job = "runtime-test-" + std::to_string(world);
    m_options.snapshot_every = snapshot_every;
    auto job = plan_model(m_options, {.rank = 0, .world = world});
    ASSERT_TRUE(job.ok()) << job.status().to_string();
    m_job = std::move(job).value();
    auto data = load_dataset(m_job.graph.dataset, "", m_options.seed, sample_rows(m_job.graph));
    ASSERT_TRUE(attach_data(std::move(data), m_options, &m_job).ok());
    m_compute = make_cpu_compute();
    m_dir = std::make_unique<JobDirectory>(*m_client, m_options.job, 0, m_options.timeout);
    ASSERT_TRUE(m_arenas.allocate(*m_dir, m_job, m_options, Mailboxes::bytes(m_job) + TpExchange::bytes(m_job),
                                  *m_compute)
                    .ok());
    ASSERT_TRUE(m_arenas.initialise(m_job, m_options, *m_compute).ok());
    m_schedule = std::make_unique<Schedule>(m_job);
  }
  void TearDown() override {
    if (m_client) {
      for (const Gva g : m_arenas.release()) (void)m_client->free(g);
    }
  }

  test::InProcessDaemon m_daemon;
  std::unique_ptr<Client> m_client;
  TrainOptions m_options;
  JobPlan m_job;
  std::unique_ptr<Compute> m_compute;
  std::unique_ptr<JobDirectory> m_dir;
  Arenas m_arenas;
  std::unique_ptr<Schedule> m_schedule;
  Trace m_trace{false};
};

// The rows of a micro-batch are those of the epoch's shuffled order, at the
// micro-batch's place in the step; each pass loads a batch once.
TEST_F(RuntimePartsTest, TheFeederLoadsTheRowsOfTheEpochsOrderAtTheMicroBatchsPlace) {
  start(1);
  RankPeers peers;
  peers.ctl[0] = m_arenas.ctl_region().gva;
  Mailboxes mail(m_job, m_options, *m_client, *m_dir, m_arenas, peers, m_trace);
  Feeder feeder(m_job, *m_schedule, m_options, m_arenas, mail, *m_compute, false);
  int input = -1;
  for (size_t t = 0; t < m_job.graph.tensors.size(); ++t) {
    if (m_job.graph.tensors[t].role == Role::input) input = static_cast<int>(t);
  }
  ASSERT_GE(input, 0);
  const int first_op = m_schedule->positions()[0].first;
  std::vector<int64_t> order(static_cast<size_t>(m_job.data.train.rows));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(m_options.seed * 1000003));
  const Tensor& x = m_job.graph.tensors[static_cast<size_t>(input)];
  for (const auto& [step, mb] : {std::pair<int64_t, int>{0, 0}, {0, 1}, {3, 1}}) {
    feeder.begin_pass();
    std::vector<void*> pointers(m_job.graph.tensors.size(), nullptr);
    ASSERT_TRUE(feeder.gather_inputs(m_job.graph.ops[static_cast<size_t>(first_op)], {.step = step, .mb = mb}, &pointers).ok());
    std::vector<float> expected(static_cast<size_t>(x.elements()));
    const int64_t start = step * m_job.rows_per_step() + mb * m_job.graph.micro_batch;
    fill_batch(m_job.data.train, order, start, m_job.graph.micro_batch, expected.data(), nullptr);
    const auto* got = static_cast<const float*>(feeder.memory(input, mb, step));
    ASSERT_NE(got, nullptr);
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), got)) << "step " << step << " micro-batch " << mb;
  }
  // Parameters alternate between two copies: the update writes the other.
  int param = m_job.plan.params.front().tensor;
  EXPECT_NE(feeder.memory(param, -1, 4, false), feeder.memory(param, -1, 4, true));
  EXPECT_EQ(feeder.memory(param, -1, 4, true), feeder.memory(param, -1, 5, false));
}

// A step ends committed with its barrier raised; every second one (due)
// also with its snapshot in PMEM, after which the step is committed.
TEST_F(RuntimePartsTest, TheCommitterCommitsEachStepRaisesItsBarrierAndSnapshotsWhenDue) {
  start(1, 2);
  RankPeers peers;
  peers.ctl[0] = m_arenas.ctl_region().gva;
  Committer committer(m_job, m_options, *m_client, *m_dir, m_arenas, peers, m_trace, *m_compute);
  for (int64_t step = 0; step < 4; ++step) {
    ASSERT_TRUE(committer.end_step(step).ok()) << "step " << step;
    EXPECT_EQ(m_arenas.committed(), step + 1);
    EXPECT_EQ(m_arenas.ctl()[k_barrier], static_cast<uint64_t>(step + 1));
  }
  EXPECT_TRUE(committer.settle().ok());  // nothing posted: nothing to wait for
  EXPECT_EQ(m_arenas.snapshot_every(), 2);
}

// Data parallel through a collective: each gradient bucket starts right
// after the position of its last writer, on the bucket's place in the
// gradient arena, and the optimizer waits for the last one.
TEST_F(RuntimePartsTest, GradientBucketsStartAfterTheirLastWriterAndTheOptimizerWaitsForTheLast) {
  start(2);
  RankPeers peers;  // the bucket sum asks nothing of its peers
  TpExchange tp(m_job, m_options, *m_client, *m_dir, m_arenas, peers, m_trace);
  RecordingCollective group;
  const auto buckets = plan_grad_buckets(m_job.graph, m_job.plan, 4096);
  ASSERT_GT(buckets.size(), 1u);
  RankPeers none;
  Mailboxes mail(m_job, m_options, *m_client, *m_dir, m_arenas, none, m_trace);
  const RankParts rank{m_job, m_options, *m_client, *m_dir, m_arenas, mail, peers, m_trace, *m_compute};
  auto sums = make_stage_sums(rank, tp, &group, nullptr, buckets);
  ASSERT_TRUE(sums.ok()) << sums.status().to_string();
  size_t started = 0;
  for (size_t pos = 0; pos < m_schedule->positions().size(); ++pos) {
    sums->gradients->after_position(static_cast<int>(pos));
    for (const GradBucket& b : buckets) {
      if (b.ready != static_cast<int>(pos)) continue;
      ASSERT_LT(started, group.calls.size()) << "the bucket ready after position " << pos << " did not start";
      EXPECT_EQ(group.calls[started].data, reinterpret_cast<float*>(m_arenas.grads().data() + b.offset));
      EXPECT_EQ(group.calls[started].count, b.bytes / 4);
      ++started;
    }
    EXPECT_EQ(group.calls.size(), started) << "a bucket started before its last writer (position " << pos << ")";
  }
  EXPECT_EQ(started, buckets.size());
  ASSERT_TRUE(sums->gradients->all_queued().ok());
  EXPECT_EQ(group.waited, std::vector<uint64_t>{buckets.size()});
  EXPECT_TRUE(sums->gradients->after_sync(0).ok());
  // No tensor parallelism: a partial sum is a bug, said as one.
  float part = 1, out = 0;
  const Status s = sums->parts->sum(0, {}, &part, &out, 1, false);
  EXPECT_EQ(s.code(), ErrorCode::internal) << s.to_string();
  EXPECT_EQ(group.sums, 0);
}

}  // namespace
}  // namespace tiermem::exec
