#include "executor/runtime/control/profile.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include <tiermem/status_macros.h>

#include "executor/runtime/step/slowdown.hpp"

namespace tiermem::exec {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t k_profile_magic = 0x3130464f'52504d54;  // "TMPROF01"
constexpr size_t k_phase = 0, k_magic = 1;
constexpr size_t k_figures = 16, k_plan_inputs = 40, k_device = 64, k_device_bytes = 64;
constexpr int64_t k_probe = 4096;
constexpr int k_latency_reads = 21, k_bandwidth_reads = 9;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

uint64_t load_word(const OwnRegion& r, size_t word) { return load_local(r.as<uint64_t>() + word); }
void store_word(const OwnRegion& r, size_t word, uint64_t v) {
  std::atomic_ref<uint64_t>(r.as<uint64_t>()[word]).store(v, std::memory_order_release);
}

RankProfile parse(const std::byte* bytes) {
  RankProfile p;
  double figures[3];
  std::memcpy(figures, bytes + k_figures, sizeof figures);
  p.flops_per_second = figures[0];
  p.link_bytes_per_second = figures[1];
  p.link_latency_seconds = figures[2];
  uint64_t words[2];
  std::memcpy(words, bytes + k_plan_inputs, sizeof words);
  p.budget = static_cast<int64_t>(words[0]);
  p.device_memory = (words[1] & 1) != 0;
  const auto* name = reinterpret_cast<const char*>(bytes + k_device);
  p.device.assign(name, strnlen(name, k_device_bytes - 1));
  return p;
}

void write_figures(const OwnRegion& r, const RankProfile& p) {
  const double figures[3] = {p.flops_per_second, p.link_bytes_per_second, p.link_latency_seconds};
  std::memcpy(r.data() + k_figures, figures, sizeof figures);
  const uint64_t words[2] = {static_cast<uint64_t>(p.budget), p.device_memory ? 1u : 0u};
  std::memcpy(r.data() + k_plan_inputs, words, sizeof words);
  std::memset(r.data() + k_device, 0, k_device_bytes);
  std::memcpy(r.data() + k_device, p.device.data(), std::min(p.device.size(), k_device_bytes - 1));
}

// Reads rank `rank`'s profile once its phase is at least `phase`.
Result<RankProfile> read_profile(JobDirectory& dir, int rank, uint64_t phase) {
  TIERMEM_ASSIGN_OR_RETURN(const Gva at, dir.peer(rank, "profile"));
  const auto deadline = Clock::now() + dir.timeout();
  auto pause = std::chrono::microseconds(50);
  std::byte head[k_device + k_device_bytes];
  for (;;) {
    TIERMEM_RETURN_IF_ERROR(dir.read(at, head, sizeof head));
    uint64_t words[2];
    std::memcpy(words, head, sizeof words);
    if (words[k_magic] == k_profile_magic && words[k_phase] >= phase) return parse(head);
    if (Clock::now() > deadline) {
      return Status(ErrorCode::timeout, "rank " + std::to_string(rank) + " did not publish its device profile within " +
                                            std::to_string(dir.timeout().count() / 1000) + " s");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
}

// Latency (a word) and bandwidth (60 KiB) of reads of `rank`'s profile.
Status measure_link(JobDirectory& dir, int rank, RankProfile* out) {
  TIERMEM_ASSIGN_OR_RETURN(const Gva at, dir.peer(rank, "profile"));
  std::vector<std::byte> buffer(static_cast<size_t>(k_profile_bytes - k_probe));
  std::vector<double> word, block;
  for (int i = 0; i < k_latency_reads; ++i) {
    const auto t = Clock::now();
    TIERMEM_RETURN_IF_ERROR(dir.read(at, buffer.data(), 8));
    word.push_back(seconds_since(t));
  }
  for (int i = 0; i < k_bandwidth_reads; ++i) {
    const auto t = Clock::now();
    TIERMEM_RETURN_IF_ERROR(dir.read(at.plus(k_probe), buffer.data(), buffer.size()));
    block.push_back(seconds_since(t));
  }
  out->link_latency_seconds = median(word);
  const double transfer = std::max(median(block) - out->link_latency_seconds, 1e-9);
  out->link_bytes_per_second = static_cast<double>(buffer.size()) / transfer;
  return Status();
}

}  // namespace

Result<double> measure_gemm_rate(Compute& compute, GemmShape shape, double slowdown) {
  const int64_t m = std::clamp<int64_t>(shape.m, 1, 8192), k = std::clamp<int64_t>(shape.k, 1, 8192),
                n = std::clamp<int64_t>(shape.n, 1, 8192);
  auto* a = static_cast<float*>(compute.device_buffer(static_cast<size_t>(m * k * 4)));
  auto* b = static_cast<float*>(compute.device_buffer(static_cast<size_t>(k * n * 4)));
  auto* c = static_cast<float*>(compute.device_buffer(static_cast<size_t>(m * n * 4)));
  if (a == nullptr || b == nullptr || c == nullptr) {
    return Status(ErrorCode::tier_exhausted, "no room on " + compute.name() + " to calibrate its GEMM rate");
  }
  compute.zero(a, static_cast<size_t>(m * k * 4));
  compute.zero(b, static_cast<size_t>(k * n * 4));
  // Warm-up (threads, kernels, clocks), and how many make a run of 5 ms.
  auto timed = [&](int reps) -> Result<double> {
    const auto t = Clock::now();
    for (int i = 0; i < reps; ++i) compute.matmul(a, b, c, m, k, n, false);
    TIERMEM_RETURN_IF_ERROR(compute.sync());
    return seconds_since(t) / reps;
  };
  TIERMEM_RETURN_IF_ERROR(timed(1).status());
  TIERMEM_ASSIGN_OR_RETURN(const double once, timed(1));
  const int reps = static_cast<int>(std::clamp(5e-3 / std::max(once, 1e-9), 1.0, 1000.0));
  Slowdown slow(slowdown);
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    const auto t = Clock::now();
    {
      Slowdown::Scope stretched(slow);
      TIERMEM_RETURN_IF_ERROR(timed(reps).status());
    }
    runs.push_back(seconds_since(t) / reps);
  }
  return 2.0 * static_cast<double>(m * k * n) / median(runs);
}

Status Profiles::exchange(JobDirectory& dir, const Topology& topo, Compute& compute, GemmShape gemm,
                          double slowdown, int64_t budget, bool quiet) {
  TIERMEM_ASSIGN_OR_RETURN(m_region, dir.own("profile", k_profile_bytes, {.tier = Tier::dram}));
  RankProfile mine;
  if (m_region.existed && load_word(m_region, k_magic) == k_profile_magic && load_word(m_region, k_phase) >= 2) {
    mine = parse(m_region.data());  // a restart: the figures the plan was made from
  } else {
    m_measured_now = true;
    mine.device = compute.name();
    mine.budget = budget;
    mine.device_memory = compute.memory_is_device();
    if (slowdown > 1) {
      char text[32];
      std::snprintf(text, sizeof text, ", slowed %gx", slowdown);
      mine.device += text;
    }
    TIERMEM_ASSIGN_OR_RETURN(mine.flops_per_second, measure_gemm_rate(compute, gemm, slowdown));
    write_figures(m_region, mine);
    store_word(m_region, k_magic, k_profile_magic);
    store_word(m_region, k_phase, 1);
    if (topo.stage() + 1 < topo.stages) {
      TIERMEM_RETURN_IF_ERROR(measure_link(dir, topo.rank_of(topo.stage() + 1, topo.replica()), &mine));
      write_figures(m_region, mine);
    }
    store_word(m_region, k_phase, 2);
    if (!quiet) {
      std::fprintf(stderr, "rank %d: %s computes GEMMs at %.3g GFLOP/s", topo.rank, mine.device.c_str(),
                   mine.flops_per_second / 1e9);
      if (mine.link_bytes_per_second > 0) {
        std::fprintf(stderr, "; to the next stage %.3g GB/s, %.1f us", mine.link_bytes_per_second / 1e9,
                     mine.link_latency_seconds * 1e6);
      }
      std::fprintf(stderr, "\n");
    }
  }
  m_ranks.assign(static_cast<size_t>(topo.world()), RankProfile{});
  for (int r = 0; r < topo.world(); ++r) {
    if (r == topo.rank) {
      m_ranks[r] = mine;
    } else {
      TIERMEM_ASSIGN_OR_RETURN(m_ranks[r], read_profile(dir, r, 2));
    }
  }
  return Status();
}

std::vector<StageCost> Profiles::stage_costs(const Topology& topo) const {
  std::map<std::string, std::vector<double>> by_device;
  for (const RankProfile& p : m_ranks) by_device[p.device].push_back(p.flops_per_second);
  std::map<std::string, double> rate;
  for (auto& [device, rates] : by_device) rate[device] = median(rates);
  std::vector<StageCost> out(static_cast<size_t>(topo.stages));
  for (size_t r = 0; r < m_ranks.size(); ++r) {
    const RankProfile& p = m_ranks[r];
    StageCost& s = out[r % static_cast<size_t>(topo.stages)];
    const double device_rate = rate[p.device];
    if (s.flops_per_second == 0 || device_rate < s.flops_per_second) {
      s.flops_per_second = device_rate;
      s.device = p.device;
    }
    if (p.link_bytes_per_second > 0 &&
        (s.link_bytes_per_second == 0 || p.link_bytes_per_second < s.link_bytes_per_second)) {
      s.link_bytes_per_second = p.link_bytes_per_second;
    }
    s.link_latency_seconds = std::max(s.link_latency_seconds, p.link_latency_seconds);
  }
  return out;
}

}  // namespace tiermem::exec
