#include "daemon/demoter.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include <spdlog/spdlog.h>

#include "daemon/migrator.hpp"
#include "pages/version.hpp"

namespace tiermem {

Demoter::Demoter(AddressSpace& space, std::function<TenantLimits(const std::string&)> limits,
                 DemotionOptions options)
    : m_space(space), m_limits(std::move(limits)), m_options(options) {}

Demoter::~Demoter() {
  {
    std::lock_guard lock(m_mutex);
    m_stop = true;
  }
  m_wake.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

void Demoter::start() {
  if (!m_options.enabled || m_thread.joinable()) return;
  m_thread = std::thread([this] { run(); });
}

void Demoter::run() {
  std::unique_lock lock(m_mutex);
  while (!m_stop) {
    m_wake.wait_for(lock, m_options.interval, [this] { return m_stop; });
    if (m_stop) break;
    lock.unlock();
    round();
    lock.lock();
  }
}

DemotionCounters Demoter::counters() const {
  std::lock_guard lock(m_mutex);
  return m_counters;
}

void Demoter::round() {
  ++m_round;
  // Fastest first: what VRAM sheds lands in DRAM, which this round's look
  // at DRAM then sees.
  for (Tier t : k_tiers_fastest_first) {
    if (m_space.backend(t) != nullptr) round_of(t);
  }
  // Pages no round saw this time (freed, moved down, mapped) start cold
  // again should they come back; back-offs that ended are forgotten.
  std::erase_if(m_heat, [this](const auto& kv) { return kv.second.seen != m_round; });
  std::erase_if(m_backoff, [this](const auto& kv) { return kv.second <= m_round; });
}

Tier Demoter::destination(Tier tier, uint64_t pages) const {
  Tier any = Tier::automatic;
  bool below = false;
  for (const TierStat& s : m_space.tier_stats()) {
    if (s.tier == tier) {
      below = true;
      continue;
    }
    if (!below || s.free_bytes < m_space.page_size()) continue;
    if (s.free_bytes / m_space.page_size() >= pages) return s.tier;
    if (any == Tier::automatic) any = s.tier;
  }
  return any;
}

void Demoter::round_of(Tier tier) {
  const std::vector<AddressSpace::DemotableAllocation> allocations = m_space.demotable_allocations(tier);
  struct Candidate {
    uint32_t idle;
    uint64_t page;
    size_t allocation;  // index into `allocations`
  };
  std::vector<Candidate> candidates;
  for (size_t i = 0; i < allocations.size(); ++i) {
    const AddressSpace::DemotableAllocation& a = allocations[i];
    const auto backoff = m_backoff.find({a.base.generation, a.base.offset});
    const bool resting = backoff != m_backoff.end() && backoff->second > m_round;
    for (const auto& [page, version] : a.pages) {
      auto [it, fresh] = m_heat.try_emplace(page, Heat{version, 0, m_round});
      Heat& h = it->second;
      // A locked word is a write under way (or a writer holding the page):
      // never idle, so no move waits on it.
      if (!fresh) h.idle_rounds = h.version == version && !version::is_locked(version) ? h.idle_rounds + 1 : 0;
      h.version = version;
      h.seen = m_round;
      // Only pages seen unwritten for a whole interval at least: one written
      // since the last look (or seen for the first time) stays; moving it
      // would only slow its writer, and nothing brings it back up.
      if (h.idle_rounds > 0 && !resting) candidates.push_back({h.idle_rounds, page, i});
    }
  }
  const uint64_t page = m_space.page_size();
  uint64_t used = 0, frames = 0;
  for (const TierStat& s : m_space.tier_stats()) {
    if (s.tier != tier) continue;
    used = s.used_bytes / page;
    frames = s.capacity_bytes / page;
  }
  if (frames == 0 || used * 100 <= frames * m_options.high_water_percent) return;
  const uint64_t excess = used - std::min(used, frames * m_options.low_water_percent / 100);
  {
    std::lock_guard lock(m_mutex);
    ++m_counters.rounds;
    if (candidates.empty()) ++m_counters.nothing_to_move;
  }
  if (candidates.empty() || excess == 0) return;
  // Coldest first: most rounds without a write, then lowest address.
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& x, const Candidate& y) {
    return x.idle != y.idle ? x.idle > y.idle : x.page < y.page;
  });
  candidates.resize(std::min<uint64_t>(candidates.size(), excess));
  const Tier to = destination(tier, candidates.size());
  if (to == Tier::automatic) {
    spdlog::warn("demotion: {} is above {}% ({} of {} frames used) but no tier below it has a free frame",
                 tier_name(tier), m_options.high_water_percent, used, frames);
    return;
  }
  // Per allocation, the allocations of the coldest pages first.
  std::vector<size_t> order;
  std::vector<std::vector<uint64_t>> pages(allocations.size());
  for (const Candidate& c : candidates) {
    if (pages[c.allocation].empty()) order.push_back(c.allocation);
    pages[c.allocation].push_back(c.page);
  }
  uint64_t moved_in_all = 0;
  for (size_t i : order) {
    const AddressSpace::DemotableAllocation& a = allocations[i];
    Migrator migrator(m_space, nullptr, nullptr, m_options.lock_timeout, m_limits(a.tenant));
    auto moved = migrator.move_pages(a.base, pages[i], to);
    std::lock_guard lock(m_mutex);
    if (!moved.ok()) {
      // Freed, mapped, locked past the timeout or out of quota below: left
      // alone for a while, so one allocation cannot hold every round up.
      ++m_counters.failures;
      m_backoff[{a.base.generation, a.base.offset}] = m_round + k_backoff_rounds;
      spdlog::warn("demotion: {} (left alone for {} rounds)", moved.status().message(), k_backoff_rounds);
      continue;
    }
    m_counters.pages[static_cast<size_t>(tier)][static_cast<size_t>(to)] += *moved;
    moved_in_all += *moved;
  }
  if (moved_in_all > 0) {
    spdlog::info("demotion: {} was at {} of {} frames (high water {}%): moved {} cold page(s) of {} allocation(s) to {}",
                 tier_name(tier), used, frames, m_options.high_water_percent, moved_in_all, order.size(),
                 tier_name(to));
  }
}

}  // namespace tiermem
