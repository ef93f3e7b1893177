// tiermemctl dump: the mapping table, allocation by allocation, page by page.
#include <cstdio>

#include <tiermem/units.h>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {

int cmd_dump(const Context& ctx) {
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto d = client->dump(ctx.node);
  if (!d.ok()) return fail("dump", d.status());
  if (ctx.json) {
    nlohmann::json allocations = nlohmann::json::array();
    for (const auto& a : d->allocations) allocations.push_back(to_json(a));
    nlohmann::json pages = nlohmann::json::array();
    for (const auto& p : d->pages) pages.push_back(to_json(p, d->page_size, d->node));
    print_json({{"node", d->node},
                {"page_size", d->page_size},
                {"l2_pages", d->l2_pages},
                {"allocations", allocations},
                {"pages", pages}});
    return k_exit_ok;
  }
  std::printf("mapping table of node %u: page size %s, %llu pages per L2 domain, %zu allocation(s), %zu page(s)\n\n",
              d->node, format_size(d->page_size).c_str(), static_cast<unsigned long long>(d->l2_pages),
              d->allocations.size(), d->pages.size());
  Table table({"PAGE", "GVA", "TIER", "NODE", "FRAME", "FLAGS", "VERSION", "VALID", "DIRTY", "ALLOCATION"});
  size_t next = 0;
  for (const auto& a : d->allocations) {
    for (uint64_t i = 0; i < a.pages && next < d->pages.size(); ++i, ++next) {
      const PageInfo& p = d->pages[next];
      Gva g;
      g.node = d->node;
      g.offset = p.page_index * d->page_size;
      table.add({std::to_string(p.page_index), g.to_string(), std::string(tier_name(p.tier)),
                 std::to_string(p.node), "0x" + hex(p.frame_offset), page_flags_text(p.flags),
                 version_text(p), hex(p.valid_mask), hex(p.dirty_mask),
                 i == 0 ? (a.name.empty() ? a.gva.to_string() : a.name) : ""});
    }
  }
  std::fputs(table.render().c_str(), stdout);
  return k_exit_ok;
}

}  // namespace tiermem::ctl
