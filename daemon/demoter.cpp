#include "daemon/demoter.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include <spdlog/spdlog.h>

#include "daemon/migrator.hpp"

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
  // again should they come back.
  std::erase_if(m_heat, [this](const auto& kv) { return kv.second.seen != m_round; });
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
  std::vector<AddressSpace::DemotablePage> pages = m_space.demotable_pages(tier);
  for (const auto& p : pages) {
    auto [it, fresh] = m_heat.try_emplace(p.page, Heat{p.version, 0, m_round});
    Heat& h = it->second;
    if (!fresh) {
      h.idle_rounds = h.version == p.version ? h.idle_rounds + 1 : 0;
      h.version = p.version;
    }
    h.seen = m_round;
  }
  const uint64_t page = m_space.page_size();
  uint64_t used = 0, frames = 0;
  for (const TierStat& s : m_space.tier_stats()) {
    if (s.tier != tier) continue;
    used = s.used_bytes / page;
    frames = s.capacity_bytes / page;
  }
  if (frames == 0 || used * 100 <= frames * m_options.high_water_percent) return;
  const uint64_t target = frames * m_options.low_water_percent / 100;
  const uint64_t excess = used - std::min(used, target);
  {
    std::lock_guard lock(m_mutex);
    ++m_counters.rounds;
  }
  // Only pages seen unwritten for a whole interval at least: one written
  // since the last look (or seen for the first time) stays; moving it would
  // only slow its writer, and nothing brings it back up.
  std::erase_if(pages, [this](const auto& p) { return m_heat[p.page].idle_rounds == 0; });
  if (pages.empty() || excess == 0) {
    if (pages.empty()) {
      std::lock_guard lock(m_mutex);
      ++m_counters.nothing_to_move;
    }
    return;
  }
  // Coldest first: most rounds without a write, then lowest address.
  std::sort(pages.begin(), pages.end(), [this](const auto& x, const auto& y) {
    const uint32_t ix = m_heat[x.page].idle_rounds, iy = m_heat[y.page].idle_rounds;
    return ix != iy ? ix > iy : x.page < y.page;
  });
  pages.resize(std::min<uint64_t>(pages.size(), excess));
  const Tier to = destination(tier, pages.size());
  if (to == Tier::automatic) {
    spdlog::warn("demotion: {} is above {}% ({} of {} frames used) but no tier below it has a free frame",
                 tier_name(tier), m_options.high_water_percent, used, frames);
    return;
  }
  // Per allocation, in page order; the allocations of the coldest pages first.
  std::vector<Gva> order;
  std::map<std::pair<uint32_t, uint64_t>, std::pair<std::string, std::vector<uint64_t>>> by_allocation;
  for (const auto& p : pages) {
    auto& [tenant, list] = by_allocation[{p.allocation.generation, p.allocation.offset}];
    if (list.empty()) order.push_back(p.allocation);
    tenant = p.tenant;
    list.push_back(p.page);
  }
  uint64_t moved_in_all = 0;
  for (const Gva& base : order) {
    auto& [tenant, list] = by_allocation[{base.generation, base.offset}];
    Migrator migrator(m_space, nullptr, nullptr, m_options.lock_timeout, m_limits(tenant));
    auto moved = migrator.move_pages(base, list, to);
    std::lock_guard lock(m_mutex);
    if (!moved.ok()) {
      ++m_counters.failures;
      spdlog::warn("demotion: {}", moved.status().message());
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
