// tiermemctl migrate GVA --tier T [--to-node N]
#include <cstdio>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {

int cmd_migrate(const Context& ctx, const std::string& gva_text, const std::string& tier_text) {
  auto gva = Gva::parse(gva_text);
  if (!gva.ok()) return fail("migrate", gva.status());
  auto tier = parse_tier(tier_text);
  if (!tier.ok()) return fail("migrate", tier.status());
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto info = client->migrate(*gva, *tier, ctx.node);
  if (!info.ok()) return fail("migrate " + gva_text, info.status());
  auto t = client->translate(info->gva);
  if (ctx.json) {
    nlohmann::json out = to_json(*info);
    if (t.ok()) {
      nlohmann::json extents = nlohmann::json::array();
      for (const auto& x : t->extents) extents.push_back(to_json(x));
      out["extents"] = extents;
    }
    print_json(out);
    return k_exit_ok;
  }
  std::printf("migrated %s to %s on node %u\n", info->gva.to_string().c_str(), std::string(tier_name(*tier)).c_str(),
              ctx.node == 0 ? info->gva.node : ctx.node);
  if (t.ok()) {
    for (const auto& x : t->extents) {
      std::printf("  +0x%llx  %llu bytes -> node %u %s frame 0x%s\n", static_cast<unsigned long long>(x.gva_offset),
                  static_cast<unsigned long long>(x.length), x.node, std::string(tier_name(x.tier)).c_str(),
                  hex(x.frame_offset).c_str());
    }
  }
  return k_exit_ok;
}

}  // namespace tiermem::ctl
