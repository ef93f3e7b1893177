// tiermemctl translate GVA: allocation, page entry and physical layout.
#include <cstdio>

#include <tiermem/units.h>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {

int cmd_translate(const Context& ctx, const std::string& gva_text) {
  auto gva = Gva::parse(gva_text);
  if (!gva.ok()) return fail("translate", gva.status());
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto t = client->translate(*gva);
  if (!t.ok()) return fail("translate " + gva_text, t.status());
  const AllocationInfo& a = t->allocation;
  if (ctx.json) {
    nlohmann::json extents = nlohmann::json::array();
    for (const auto& x : t->extents) extents.push_back(to_json(x));
    print_json({{"gva", gva->to_string()},
                {"allocation", to_json(a)},
                {"offset_in_allocation", t->offset_in_allocation},
                {"page", to_json(t->page, client->page_size(), a.gva.node)},
                {"extents", extents}});
    return k_exit_ok;
  }
  const uint64_t in_page = gva->offset % client->page_size();
  std::printf("%s\n", gva->to_string().c_str());
  std::printf("  allocation  %s  %s  %s  generation %u%s%s\n", a.gva.to_string().c_str(),
              format_size(a.size).c_str(), std::string(tier_name(a.tier)).c_str(), a.gva.generation,
              a.name.empty() ? "" : "  name ", a.name.c_str());
  for (const ReplicaInfo& r : a.replicas) {
    std::printf("  copy        node %u  %s  %s\n", r.node, r.gva.to_string().c_str(),
                std::string(replica_state_name(r.state)).c_str());
  }
  if (a.replica_of.node != 0) {
    std::printf("  copy of     %s%s\n", a.replica_of.to_string().c_str(), a.replica_ready ? "" : "  (being filled)");
  }
  std::printf("  offset      %llu bytes into the allocation\n",
              static_cast<unsigned long long>(t->offset_in_allocation));
  std::printf("  page        %llu  (L1 domain %llu, L2 slot %llu)\n",
              static_cast<unsigned long long>(t->page.page_index),
              static_cast<unsigned long long>(t->page.page_index >> 9),
              static_cast<unsigned long long>(t->page.page_index & 511));
  std::printf("  physical    node %u  tier %s  frame 0x%s  + 0x%llx\n", t->page.node,
              std::string(tier_name(t->page.tier)).c_str(), hex(t->page.frame_offset).c_str(),
              static_cast<unsigned long long>(in_page));
  std::printf("  flags       %s   version %s\n", page_flags_text(t->page.flags).c_str(),
              version_text(t->page).c_str());
  std::printf("  L3 valid    %s  dirty %s\n", hex(t->page.valid_mask).c_str(), hex(t->page.dirty_mask).c_str());
  std::printf("  extents     %zu\n", t->extents.size());
  for (const auto& x : t->extents) {
    std::printf("    +0x%-10llx %-9s -> node %u %s frame 0x%s\n",
                static_cast<unsigned long long>(x.gva_offset), format_size(x.length).c_str(), x.node,
                std::string(tier_name(x.tier)).c_str(), hex(x.frame_offset).c_str());
  }
  return k_exit_ok;
}

}  // namespace tiermem::ctl
