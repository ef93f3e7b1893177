// tiermemctl ls: every allocation on the node.
#include <chrono>
#include <cstdio>

#include <tiermem/units.h>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {

int cmd_ls(const Context& ctx) {
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto list = client->list(ctx.node);
  if (!list.ok()) return fail("ls", list.status());
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
               std::to_string(a.pages), std::to_string(a.map_count), std::to_string(a.gva.generation),
               age(now > a.created_unix_ms ? now - a.created_unix_ms : 0), a.tenant,
               name});
  }
  std::fputs(table.render().c_str(), stdout);
  std::printf("%zu allocation(s)\n", list->size());
  return k_exit_ok;
}

}  // namespace tiermem::ctl
