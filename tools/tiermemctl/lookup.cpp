// tiermemctl lookup NAME: the allocation of that name on the node.
#include <cstdio>

#include <tiermem/units.h>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {

int cmd_lookup(const Context& ctx, const std::string& name) {
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto a = client->lookup(name, ctx.node);
  if (!a.ok()) return fail("lookup '" + name + "'", a.status());
  if (ctx.json) {
    print_json(to_json(*a));
    return k_exit_ok;
  }
  std::printf("%s %s %s tenant %s%s\n", a->gva.to_string().c_str(), format_size(a->size).c_str(),
              std::string(tier_name(a->tier)).c_str(), a->tenant.c_str(),
              a->replicas.empty() ? "" : (" (" + std::to_string(a->replicas.size()) + " copies)").c_str());
  return k_exit_ok;
}

}  // namespace tiermem::ctl
