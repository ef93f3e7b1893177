// tiermemctl status: the node, its tiers and their use.
#include <cstdio>

#include <tiermem/units.h>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {

int cmd_status(const Context& ctx) {
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto stat = client->stat(ctx.node);
  if (!stat.ok()) return fail("status", stat.status());
  const NodeStat::Recovery& r = stat->recovery;
  if (ctx.json) {
    nlohmann::json tiers = nlohmann::json::array();
    for (const auto& t : stat->tiers) tiers.push_back(to_json(t));
    print_json({{"node", stat->node},
                {"daemon_version", stat->daemon_version},
                {"socket", stat->socket_path},
                {"fabric", stat->fabric},
                {"page_size", stat->page_size},
                {"uptime_ms", stat->uptime_ms},
                {"sessions", stat->sessions},
                {"allocations", stat->allocations},
                {"locks_broken", stat->locks_broken},
                {"truncations_repaired", stat->truncations_repaired},
                {"files_trimmed", stat->files_trimmed},
                {"trimmed_bytes", stat->trimmed_bytes},
                {"recovery",
                 {{"durable", r.durable},
                  {"pool", r.pool},
                  {"memory_adopted", r.memory_adopted},
                  {"starts", r.starts},
                  {"allocations", r.allocations},
                  {"lost_allocations", r.lost_allocations},
                  {"lost_pages", r.lost_pages},
                  {"lost", r.lost},
                  {"domains_made_anew", r.domains_made_anew},
                  {"dropped", r.dropped},
                  {"lent_frames", r.lent_frames},
                  {"locks_broken", r.locks_broken},
                  {"elapsed_ms", r.elapsed_ms}}},
                {"tiers", tiers}});
    return k_exit_ok;
  }
  std::printf("node %u  tiermemd %s  up %s  %llu session(s)  %llu allocation(s)  page size %s\n",
              stat->node, stat->daemon_version.c_str(), age(stat->uptime_ms).c_str(),
              static_cast<unsigned long long>(stat->sessions),
              static_cast<unsigned long long>(stat->allocations), format_size(stat->page_size).c_str());
  std::printf("socket %s\n", stat->socket_path.c_str());
  std::printf("data plane: %s\n", stat->fabric.c_str());
  if (stat->locks_broken > 0 || stat->truncations_repaired > 0) {
    std::printf("repaired: %llu page lock(s) of dead clients broken, %llu truncated memory file(s) restored\n",
                static_cast<unsigned long long>(stat->locks_broken),
                static_cast<unsigned long long>(stat->truncations_repaired));
  }
  if (stat->files_trimmed > 0) {
    std::printf("trimmed: %llu tenant file(s) grown past their size cut back, %s of storage given back\n",
                static_cast<unsigned long long>(stat->files_trimmed), format_size(stat->trimmed_bytes).c_str());
  }
  if (!r.durable) {
    std::printf("metadata: none (metadata.enabled = false): allocations end with this daemon\n");
  } else if (r.starts <= 1) {
    std::printf("metadata: %s (new at this start)\n", r.pool.c_str());
  } else {
    std::printf("metadata: %s, start %llu: recovered %llu allocation(s) in %.1f ms, shared memory %s\n",
                r.pool.c_str(), static_cast<unsigned long long>(r.starts),
                static_cast<unsigned long long>(r.allocations), r.elapsed_ms,
                r.memory_adopted ? "taken over" : "made anew in part");
  }
  for (const std::string& d : r.domains_made_anew) std::printf("  shared memory made anew: %s\n", d.c_str());
  if (r.lost_allocations > 0 || r.dropped > 0 || r.locks_broken > 0) {
    std::printf("recovery: %llu allocation(s) lost %llu page(s) (reads fail with data_lost), %llu record(s) "
                "dropped, %llu page(s) torn\n",
                static_cast<unsigned long long>(r.lost_allocations), static_cast<unsigned long long>(r.lost_pages),
                static_cast<unsigned long long>(r.dropped), static_cast<unsigned long long>(r.locks_broken));
    for (const std::string& l : r.lost) std::printf("  lost: %s\n", l.c_str());
  }
  std::printf("\n");
  Table table({"TIER", "CAPACITY", "USED", "FREE", "USE", "ALLOCS", "PERSISTENT", "BACKING"});
  for (const auto& t : stat->tiers) {
    table.add({std::string(tier_name(t.tier)), format_size(t.capacity_bytes), format_size(t.used_bytes),
               format_size(t.free_bytes), percent(t.used_bytes, t.capacity_bytes),
               std::to_string(t.allocations), t.persistent ? "yes" : "no", t.backing});
  }
  std::fputs(table.render().c_str(), stdout);
  return k_exit_ok;
}

}  // namespace tiermem::ctl
