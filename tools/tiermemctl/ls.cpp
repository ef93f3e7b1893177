// tiermemctl ls: every allocation on the node.
#include <chrono>
#include <cstdio>

#include <tiermem/units.h>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {

bool Filter::matches(const AllocationInfo& a) const {
  if (!name_prefix.empty() && a.name.rfind(name_prefix, 0) != 0) return false;
  if (!tenant.empty() && a.tenant != tenant) return false;
  if (!tier.empty() && tier_name(a.tier) != tier) return false;
  return true;
}

Status Filter::normalise() {
  if (tier.empty()) return Status();
  auto parsed = parse_tier(tier);
  if (!parsed.ok()) return parsed.status();
  if (*parsed == Tier::automatic) {
    return Status(ErrorCode::invalid_argument,
                  "--tier auto: an allocation is on vram, dram or pmem, never on auto; name one of them");
  }
  tier = std::string(tier_name(*parsed));
  return Status();
}

int cmd_ls(const Context& ctx, Filter filter) {
  if (Status s = filter.normalise(); !s.ok()) return fail("ls", s);
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto all = client->list(ctx.node);
  if (!all.ok()) return fail("ls", all.status());
  std::vector<AllocationInfo> kept;
  for (AllocationInfo& a : *all) {
    if (filter.matches(a)) kept.push_back(std::move(a));
  }
  const std::vector<AllocationInfo>* list = &kept;
  if (ctx.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& a : *list) out.push_back(to_json(a));
    print_json(out);
    return k_exit_ok;
  }
  const auto now = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
  Table table({"GVA", "SIZE", "TIER", "PAGES", "MAPPED", "GEN", "AGE", "TENANT", "NAME"});
  for (const auto& a : *list) {
    // A copy carries its home's name; say whose copy it is.
    std::string name = a.name.empty() ? "-" : a.name;
    if (a.replica_of.node != 0) name += " (copy of " + a.replica_of.to_string() + ")";
    table.add({a.gva.to_string(), format_size(a.size), std::string(tier_name(a.tier)),
               // A sub-page allocation: its slot of a shared page.
               a.slot_bytes != 0 ? "slot " + format_size(a.slot_bytes) : std::to_string(a.pages),
               std::to_string(a.map_count), std::to_string(a.gva.generation),
               age(now > a.created_unix_ms ? now - a.created_unix_ms : 0), a.tenant,
               name});
  }
  std::fputs(table.render().c_str(), stdout);
  std::printf("%zu allocation(s)\n", list->size());
  return k_exit_ok;
}

}  // namespace tiermem::ctl
