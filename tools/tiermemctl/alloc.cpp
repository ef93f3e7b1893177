// tiermemctl alloc SIZE [--tier T] [--name N] [--strict] [--coherent] [--demotable] [--replicas N] [--qos Q]:
// prints the new GVA.
#include <cstdio>

#include <tiermem/units.h>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {

int cmd_alloc(const Context& ctx, const std::string& size_text, const std::string& tier_text,
              const std::string& name, AllocFlags flags, uint32_t replicas, const std::string& qos_text) {
  auto size = parse_size(size_text);
  if (!size.ok()) return fail("alloc", size.status());
  auto tier = parse_tier(tier_text);
  if (!tier.ok()) return fail("alloc", tier.status());
  auto qos = parse_qos_class(qos_text);
  if (!qos.ok()) return fail("alloc", qos.status());
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto info = client->alloc(*size, {.tier = *tier, .strict = flags.strict, .name = name, .node = ctx.node,
                                  .coherent = flags.coherent, .replicas = replicas, .qos = *qos,
                                  .demotable = flags.demotable});
  if (!info.ok()) return fail("alloc " + size_text, info.status());
  if (ctx.json) {
    print_json(to_json(*info));
  } else {
    std::printf("%s\n", info->gva.to_string().c_str());
    for (const ReplicaInfo& r : info->replicas) {
      std::printf("  copy on node %u: %s\n", r.node, r.gva.to_string().c_str());
    }
  }
  return k_exit_ok;
}

}  // namespace tiermem::ctl
