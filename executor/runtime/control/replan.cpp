#include "executor/runtime/control/replan.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <tiermem/status_macros.h>

namespace tiermem::exec {
namespace {

// The sample: a sequence word (odd while it is written), then the figures.
constexpr int64_t k_sample = 128;
struct SampleWords {
  uint64_t sequence;
  uint64_t steps;
  double compute_seconds, step_p99_seconds, cpu_busy;
};
static_assert(sizeof(SampleWords) <= 128);
// The record: committed, pending, switch step, ops per cut; then for the
// committed generation and for the pending one each stage's rate (FLOP/s,
// up to k_max_stages) and a uint16 stage per forward op, to the end of the
// profile's first page.
constexpr int64_t k_record = 256, k_max_stages = 16, k_max_ops = 880;
constexpr int64_t k_rates[2] = {k_record + 32, k_record + 32 + 8 * k_max_stages};
constexpr int64_t k_cuts[2] = {k_record + 32 + 16 * k_max_stages, k_record + 32 + 16 * k_max_stages + 2 * k_max_ops};
static_assert(k_cuts[1] + 2 * k_max_ops <= 4096);
constexpr int k_window = 64;  // steps in the P99
constexpr int k_settle_steps = 50;  // steps of a cut before its first look (its warm-up is slower)
constexpr double k_dead_band = 1.25;  // a stage's time within 1.25x of its baseline has not changed

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The host's CPU counters (busy, total) from /proc/stat; zeros when unread.
std::pair<uint64_t, uint64_t> cpu_counters() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  uint64_t v[8] = {};
  in >> cpu;
  for (uint64_t& x : v) in >> x;
  if (!in || cpu != "cpu") return {0, 0};
  uint64_t total = 0;
  for (uint64_t x : v) total += x;
  return {total - v[3] - v[4], total};  // less idle and iowait
}

void store(std::byte* at, uint64_t v) {
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(at)).store(v, std::memory_order_release);
}

}  // namespace

void SamplePublisher::step_done(uint64_t steps, double wall, double compute) {
  if (m_walls.size() == k_window) m_walls.erase(m_walls.begin());
  m_walls.push_back(wall);
  m_compute = m_compute < 0 ? compute : 0.7 * m_compute + 0.3 * compute;
  if (const int64_t t = now_ms(); t - m_cpu_at >= 250) {
    const auto [busy, total] = cpu_counters();
    if (m_cpu_at > 0 && total > m_cpu_total) {
      m_cpu = static_cast<double>(busy - m_cpu_busy) / static_cast<double>(total - m_cpu_total);
    }
    m_cpu_busy = busy;
    m_cpu_total = total;
    m_cpu_at = t;
  }
  std::vector<double> sorted = m_walls;
  const size_t k = std::min(sorted.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(sorted.size())));
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k), sorted.end());
  std::byte* at = m_profile.data() + k_sample;
  SampleWords w;
  std::memcpy(&w, at, sizeof w);
  const uint64_t sequence = w.sequence;
  store(at, sequence + 1);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  w = {sequence + 1, steps, m_compute, sorted[k], m_cpu};
  std::memcpy(at + 8, reinterpret_cast<const std::byte*>(&w) + 8, sizeof w - 8);
  store(at, sequence + 2);
}

Result<StepSample> read_sample(JobDirectory& dir, int rank) {
  TIERMEM_ASSIGN_OR_RETURN(const Gva at, dir.peer(rank, "profile"));
  for (int attempt = 0; attempt < 100; ++attempt) {
    SampleWords w;
    uint64_t after = 0;
    TIERMEM_RETURN_IF_ERROR(dir.read(at.plus(k_sample), &w, sizeof w));
    TIERMEM_RETURN_IF_ERROR(dir.read(at.plus(k_sample), &after, 8));
    if (w.sequence % 2 == 0 && after == w.sequence) {
      return StepSample{w.steps, w.compute_seconds, w.step_p99_seconds, w.cpu_busy};
    }
  }
  return Status(ErrorCode::busy, "rank " + std::to_string(rank) + "'s step sample kept changing while read");
}

Result<PlanRecord> read_record(JobDirectory& dir, const OwnRegion* own, bool with_cuts) {
  uint64_t head[4];
  Gva at;
  if (own != nullptr) {
    for (int i = 0; i < 4; ++i) head[i] = load_local(own->as<uint64_t>() + k_record / 8 + i);
  } else {
    TIERMEM_ASSIGN_OR_RETURN(at, dir.peer(0, "profile"));
    TIERMEM_RETURN_IF_ERROR(dir.read(at.plus(k_record), head, sizeof head));
  }
  PlanRecord r;
  r.committed = head[0];
  r.pending = head[1];
  r.switch_step = static_cast<int64_t>(head[2]);
  if (!with_cuts || head[3] == 0) return r;
  if (head[3] > static_cast<uint64_t>(k_max_ops)) {
    return Status(ErrorCode::data_lost, "rank 0's plan record names " + std::to_string(head[3]) + " ops, more than " +
                                            std::to_string(k_max_ops) + " fit");
  }
  for (int which : {0, 1}) {
    std::vector<uint16_t> cut(head[3]);
    std::vector<double> rates(k_max_stages);
    if (own != nullptr) {
      std::memcpy(cut.data(), own->data() + k_cuts[which], cut.size() * 2);
      std::memcpy(rates.data(), own->data() + k_rates[which], rates.size() * 8);
    } else {
      TIERMEM_RETURN_IF_ERROR(dir.read(at.plus(k_cuts[which]), cut.data(), cut.size() * 2));
      TIERMEM_RETURN_IF_ERROR(dir.read(at.plus(k_rates[which]), rates.data(), rates.size() * 8));
    }
    (which == 0 ? r.cut : r.next_cut).assign(cut.begin(), cut.end());
    (which == 0 ? r.rates : r.next_rates) = std::move(rates);
  }
  return r;
}

void write_record(const OwnRegion& own, const PlanRecord& record) {
  auto* words = own.as<uint64_t>() + k_record / 8;
  for (int which : {0, 1}) {
    const std::vector<int>& from = which == 0 ? record.cut : record.next_cut;
    std::vector<uint16_t> cut(from.begin(), from.end());
    std::vector<double> rates = which == 0 ? record.rates : record.next_rates;
    cut.resize(static_cast<size_t>(k_max_ops), 0);
    rates.resize(static_cast<size_t>(k_max_stages), 0);
    std::memcpy(own.data() + k_cuts[which], cut.data(), cut.size() * 2);
    std::memcpy(own.data() + k_rates[which], rates.data(), rates.size() * 8);
  }
  const size_t ops = std::max(record.cut.size(), record.next_cut.size());
  std::atomic_ref<uint64_t>(words[3]).store(ops, std::memory_order_release);
  std::atomic_ref<uint64_t>(words[2]).store(static_cast<uint64_t>(record.switch_step), std::memory_order_release);
  std::atomic_ref<uint64_t>(words[0]).store(record.committed, std::memory_order_release);
  std::atomic_ref<uint64_t>(words[1]).store(record.pending, std::memory_order_release);
}

bool record_fits(const JobPlan& job) {
  return job.topo.stages <= k_max_stages && job.partition.of_forward_op.size() <= static_cast<size_t>(k_max_ops);
}

Result<std::optional<ReplanPolicy::Decision>> ReplanPolicy::look(JobDirectory& dir, int64_t step) {
  // The first look at a cut (its baseline) as soon as its steps settled,
  // then every every_ms.
  const int64_t t = now_ms();
  if (!m_baseline.empty() && t - m_last_look_ms < m_opt.every_ms) return std::optional<Decision>();
  const Topology& topo = m_job.topo;
  std::vector<double> compute(static_cast<size_t>(topo.stages), 0);
  double p99 = 0, cpu = 0;
  for (int r = 0; r < topo.world(); ++r) {
    TIERMEM_ASSIGN_OR_RETURN(const StepSample s, read_sample(dir, r));
    // Too few steps of this cut yet (the first after a move are slower).
    if (s.steps < static_cast<uint64_t>(m_fresh_from + k_settle_steps)) return std::optional<Decision>();
    double& c = compute[static_cast<size_t>(r % topo.stages)];
    c = std::max(c, s.compute_seconds);
    p99 = std::max(p99, s.step_p99_seconds);
    cpu = std::max(cpu, s.cpu_busy);
  }
  // Each stage's speed against what it was when this cut was made: the
  // first look at the cut takes every stage's compute time per step as its
  // baseline (the cost model counts FLOPs, and a stage of many light ops
  // takes longer than its FLOPs say: only a change is the device's). A
  // stage whose time moved by less than k_dead_band is as it was.
  m_last_look_ms = t;
  if (m_baseline.empty()) {
    m_baseline = compute;
    return std::optional<Decision>();
  }
  std::vector<StageCost> costs = m_job.costs;
  std::vector<double> factor(compute.size(), 1.0);
  for (size_t s = 0; s < costs.size(); ++s) {
    if (compute[s] <= 0 || m_baseline[s] <= 0) continue;
    const double f = compute[s] / m_baseline[s];
    if (f > k_dead_band || f < 1 / k_dead_band) factor[s] = f;
    costs[s].flops_per_second /= factor[s];
  }
  const std::vector<double> now = predict_stage_seconds(m_job.graph, m_job.partition, m_job.micro_batches, costs);
  TIERMEM_ASSIGN_OR_RETURN(Partition better, partition_by_time(m_job.graph, m_job.micro_batches, costs));
  const double slowest = *std::max_element(now.begin(), now.end());
  const double then = *std::max_element(better.predicted_seconds.begin(), better.predicted_seconds.end());
  const bool over = p99 * 1e3 >= m_opt.p99_ms && cpu * 100 >= m_opt.cpu_percent &&
                    then <= (1 - m_opt.min_gain) * slowest && better.of_forward_op != m_job.partition.of_forward_op;
  m_over = over ? m_over + 1 : 0;
  if (m_over < m_opt.patience) return std::optional<Decision>();
  m_over = 0;
  const size_t worst = static_cast<size_t>(
      std::max_element(factor.begin(), factor.end(), [](double a, double b) { return std::abs(std::log(a)) < std::abs(std::log(b)); }) -
      factor.begin());
  char text[400];
  std::snprintf(text, sizeof text,
                "step time P99 %.1f ms (threshold %.0f ms) and CPU %.0f%% (threshold %.0f%%) for %d looks %d ms "
                "apart; stage %zu computes %.3g ms per step, %.2fx its %.3g ms when the job was cut; slowest stage "
                "predicted %.2f ms per step now, %.2f ms cut again",
                p99 * 1e3, m_opt.p99_ms, cpu * 100, m_opt.cpu_percent, m_opt.patience, m_opt.every_ms, worst,
                compute[worst] * 1e3, factor[worst], m_baseline[worst] * 1e3, slowest * 1e3, then * 1e3);
  (void)step;
  return std::optional<Decision>(Decision{std::move(better), std::move(costs), text});
}

void ReplanPolicy::moved(int64_t step) {
  m_fresh_from = step;
  m_baseline.clear();
  m_over = 0;
}

}  // namespace tiermem::exec
