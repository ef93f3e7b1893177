// RequestHandler::metrics(): the daemon's Prometheus exposition. Counters
// from Metrics; gauges read at the scrape: tiers, each tenant's memory,
// peers' health, clients' check-ins, durable metadata and recovery.
#include <map>
#include <tuple>

#include "daemon/data_plane.hpp"
#include "daemon/peer_manager.hpp"
#include "daemon/request_handler.hpp"
#include "tiers/truncation_guard.hpp"
#include "tiermem_config.h"

namespace tiermem {
namespace {

std::string health_text(int health) {
  return std::string(node_health_name(static_cast<NodeHealth>(health)));
}

constexpr NodeHealth k_health_states[] = {NodeHealth::healthy, NodeHealth::degraded, NodeHealth::unreachable,
                                          NodeHealth::unknown};

}  // namespace

std::string RequestHandler::metrics() {
  const std::string node = std::to_string(m_space.node());
  Exposition out;
  out.family("tiermem_build_info", "gauge",
             "The daemon's version, its data plane's fabric and the libfabric it was built with (value 1).");
  // libfabric: the library loaded now ("" when built without it).
  out.sample("tiermem_build_info",
             {{"node", node},
              {"version", TIERMEM_VERSION},
              {"fabric", fabric_name(m_data_plane)},
              {"libfabric", libfabric_version()}},
             uint64_t{1});
  out.family("tiermem_uptime_seconds", "gauge", "Seconds since the daemon started serving.");
  out.sample("tiermem_uptime_seconds", {{"node", node}},
             std::chrono::duration<double>(std::chrono::steady_clock::now() - m_started).count());
  out.family("tiermem_sessions", "gauge", "Open control sessions (clients and peers).");
  out.sample("tiermem_sessions", {{"node", node}}, m_sessions.open());

  const std::vector<TierStat> tiers = m_space.tier_stats();
  struct TierFamily {
    const char* name;
    const char* help;
    uint64_t TierStat::*field;
  };
  constexpr TierFamily k_tier_families[] = {
      {"tiermem_tier_capacity_bytes", "Bytes the tier may hold.", &TierStat::capacity_bytes},
      {"tiermem_tier_used_bytes", "Bytes of the tier's frames in use.", &TierStat::used_bytes},
      {"tiermem_tier_free_bytes", "Bytes of the tier free for allocations.", &TierStat::free_bytes},
      {"tiermem_tier_allocations", "Allocations with pages on the tier.", &TierStat::allocations},
  };
  for (const TierFamily& f : k_tier_families) {
    out.family(f.name, "gauge", f.help);
    for (const TierStat& t : tiers) {
      out.sample(f.name, {{"node", node}, {"tier", std::string(tier_name(t.tier))}}, t.*f.field);
    }
  }

  const DemotionCounters demoted = m_demoter.counters();
  out.family("tiermem_demoted_pages_total", "counter",
             "Cold pages of demotable allocations moved down the tiers under capacity pressure (M7).");
  constexpr size_t k_tiers = std::size(k_tiers_fastest_first);
  for (size_t i = 0; i < k_tiers; ++i) {
    for (size_t j = i + 1; j < k_tiers; ++j) {  // down only
      const Tier from = k_tiers_fastest_first[i], to = k_tiers_fastest_first[j];
      if (m_space.backend(from) == nullptr || m_space.backend(to) == nullptr) continue;
      const uint64_t n = demoted.pages[static_cast<size_t>(from)][static_cast<size_t>(to)];
      out.sample("tiermem_demoted_pages_total",
                 {{"node", node}, {"from", std::string(tier_name(from))}, {"to", std::string(tier_name(to))}}, n);
    }
  }
  out.family("tiermem_demotion_rounds_total", "counter",
             "Demotion rounds that found a tier above its high-water mark.");
  out.sample("tiermem_demotion_rounds_total", {{"node", node}}, demoted.rounds);
  out.family("tiermem_demotion_idle_rounds_total", "counter",
             "Demotion rounds above a high-water mark with no demotable page unwritten for a round to move.");
  out.sample("tiermem_demotion_idle_rounds_total", {{"node", node}}, demoted.nothing_to_move);
  out.family("tiermem_demotion_failures_total", "counter",
             "Allocations whose demotion failed in a round (the log says why).");
  out.sample("tiermem_demotion_failures_total", {{"node", node}}, demoted.failures);

  // Each tenant's allocations and bytes by tier (copies of other nodes'
  // replicated allocations included: they hold memory here).
  std::map<std::pair<std::string, Tier>, std::pair<uint64_t, uint64_t>> by_tenant;  // count, bytes
  for (const AllocationInfo& a : m_space.list()) {
    auto& [count, bytes] = by_tenant[{a.tenant, a.tier}];
    ++count;
    bytes += a.slot_bytes != 0 ? a.slot_bytes : a.pages * m_space.page_size();  // a sub-page one: its slot
  }
  out.family("tiermem_tenant_allocations", "gauge", "Allocations of a tenant on this node, by tier.");
  for (const auto& [key, v] : by_tenant) {
    out.sample("tiermem_tenant_allocations",
               {{"node", node}, {"tenant", key.first}, {"tier", std::string(tier_name(key.second))}}, v.first);
  }
  out.family("tiermem_tenant_bytes", "gauge", "Bytes (whole pages) of a tenant's allocations on this node, by tier.");
  for (const auto& [key, v] : by_tenant) {
    out.sample("tiermem_tenant_bytes",
               {{"node", node}, {"tenant", key.first}, {"tier", std::string(tier_name(key.second))}}, v.second);
  }

  m_metrics.render(out, node);

  const Replicator::CopyWrites copy_writes = m_replicas.copy_writes();
  out.family("tiermem_copy_writes_total", "counter",
             "Writes of replicated allocations homed here into their copies (H2), by path: one-sided through the "
             "data plane, or as requests to the copies' daemons (where the data plane could not reach a copy).");
  out.sample("tiermem_copy_writes_total", {{"node", node}, {"path", "data_plane"}}, copy_writes.data_plane);
  out.sample("tiermem_copy_writes_total", {{"node", node}, {"path", "daemon"}}, copy_writes.through_daemon);

  if (m_peers != nullptr) {
    const std::vector<proto::NodeInfo> peers = m_peers->nodes();
    out.family("tiermem_peer_health", "gauge",
               "The edge from this daemon to a peer (H1): 1 for the state it is in, 0 for the others.");
    for (const proto::NodeInfo& p : peers) {
      for (NodeHealth h : k_health_states) {
        out.sample("tiermem_peer_health",
                   {{"node", node}, {"peer", std::to_string(p.node_id())}, {"state", std::string(node_health_name(h))}},
                   uint64_t{static_cast<int>(h) == static_cast<int>(p.health())});
      }
    }
    out.family("tiermem_peer_missed_heartbeats", "gauge", "Heartbeats to a peer unanswered in a row.");
    for (const proto::NodeInfo& p : peers) {
      out.sample("tiermem_peer_missed_heartbeats", {{"node", node}, {"peer", std::to_string(p.node_id())}},
                 uint64_t{p.missed_heartbeats()});
    }
    out.family("tiermem_peer_heartbeat_rtt_seconds", "gauge", "Round trip of the last answered heartbeat.");
    for (const proto::NodeInfo& p : peers) {
      out.sample("tiermem_peer_heartbeat_rtt_seconds", {{"node", node}, {"peer", std::to_string(p.node_id())}},
                 static_cast<double>(p.heartbeat_rtt_us()) / 1e6);
    }
  }

  // Clients' check-in edges, counted by tenant and state.
  std::map<std::pair<std::string, std::string>, uint64_t> clients;
  for (const proto::ClientEdge& e : m_sessions.check_ins().edges()) ++clients[{e.tenant(), health_text(e.health())}];
  out.family("tiermem_clients", "gauge", "Client sessions by tenant and check-in state (H1).");
  for (const auto& [key, n] : clients) {
    out.sample("tiermem_clients", {{"node", node}, {"tenant", key.first}, {"state", key.second}}, n);
  }

  const RecoveryReport& r = m_space.recovery();
  out.family("tiermem_metadata_durable", "gauge", "1 when allocations are recorded in durable metadata (H5).");
  out.sample("tiermem_metadata_durable", {{"node", node}}, uint64_t{m_space.durable()});
  out.family("tiermem_metadata_starts", "gauge", "Daemon starts recorded on the metadata pool.");
  out.sample("tiermem_metadata_starts", {{"node", node}}, r.starts);
  out.family("tiermem_recovery_allocations", "gauge",
             "What this start recovered from the metadata: allocations (lost ones included), by outcome.");
  out.sample("tiermem_recovery_allocations", {{"node", node}, {"outcome", "recovered"}}, r.allocations - r.lost_allocations);
  out.sample("tiermem_recovery_allocations", {{"node", node}, {"outcome", "lost"}}, r.lost_allocations);
  out.sample("tiermem_recovery_allocations", {{"node", node}, {"outcome", "dropped"}}, r.dropped);
  out.family("tiermem_recovery_lost_pages", "gauge", "Pages this start found lost (their memory went).");
  out.sample("tiermem_recovery_lost_pages", {{"node", node}}, r.lost_pages);
  out.family("tiermem_recovery_seconds", "gauge", "How long this start's recovery took.");
  out.sample("tiermem_recovery_seconds", {{"node", node}}, r.elapsed_ms / 1000.0);
  out.family("tiermem_memory_adopted", "gauge", "1 when this start found the node's shared memory of before.");
  out.sample("tiermem_memory_adopted", {{"node", node}}, uint64_t{r.memory_adopted});
  out.family("tiermem_locks_broken_total", "counter", "Page locks of dead clients broken (their pages flagged torn).");
  out.sample("tiermem_locks_broken_total", {{"node", node}}, m_sessions.locks_broken() + r.locks_broken);
  out.family("tiermem_truncations_repaired_total", "counter", "Memory files a client truncated, extended again.");
  out.sample("tiermem_truncations_repaired_total", {{"node", node}}, TruncationGuard::repairs());
  out.family("tiermem_files_trimmed_total", "counter", "Tenants' memory files grown past their size, cut back.");
  out.sample("tiermem_files_trimmed_total", {{"node", node}}, m_files_trimmed.load());
  out.family("tiermem_trimmed_bytes_total", "counter", "Storage given back by cutting tenants' grown files.");
  out.sample("tiermem_trimmed_bytes_total", {{"node", node}}, m_trimmed_bytes.load());
  return out.take();
}

}  // namespace tiermem
