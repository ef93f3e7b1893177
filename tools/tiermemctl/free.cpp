// tiermemctl free GVA | --name-prefix P | --tenant T [--tier X] [--dry-run]
#include <cstdio>

#include <tiermem/units.h>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {

int cmd_free(const Context& ctx, const std::string& gva_text) {
  auto gva = Gva::parse(gva_text);
  if (!gva.ok()) return fail("free", gva.status());
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  Status s = client->free(*gva);
  if (!s.ok()) return fail("free " + gva_text, s);
  if (ctx.json) {
    print_json({{"freed", gva->to_string()}});
  } else {
    std::printf("freed %s\n", gva->to_string().c_str());
  }
  return k_exit_ok;
}

// Every allocation the filter takes, freed one by one: a mapped one (or one
// another call frees first) fails alone and the rest go on.
int cmd_free_matching(const Context& ctx, Filter filter, bool dry_run) {
  if (Status s = filter.normalise(); !s.ok()) return fail("free", s);
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto all = client->list(ctx.node);
  if (!all.ok()) return fail("free", all.status());
  nlohmann::json freed = nlohmann::json::array(), failed = nlohmann::json::array();
  uint64_t bytes = 0;
  for (const AllocationInfo& a : *all) {
    if (!filter.matches(a) || a.replica_of.node != 0) continue;  // copies go with their home
    const Status s = dry_run ? Status() : client->free(a.gva);
    if (s.ok()) {
      freed.push_back({{"gva", a.gva.to_string()}, {"name", a.name}, {"tenant", a.tenant}, {"size", a.size}});
      bytes += a.size;
      if (!ctx.json) std::printf("%s %s %s%s\n", dry_run ? "would free" : "freed", a.gva.to_string().c_str(),
                                 format_size(a.size).c_str(), a.name.empty() ? "" : (" '" + a.name + "'").c_str());
    } else {
      failed.push_back({{"gva", a.gva.to_string()}, {"name", a.name}, {"code", std::string(error_code_name(s.code()))},
                        {"message", s.message()}});
      if (!ctx.json) std::fprintf(stderr, "tiermemctl: free %s: %s\n", a.gva.to_string().c_str(), s.to_string().c_str());
    }
  }
  if (ctx.json) {
    print_json({{dry_run ? "would_free" : "freed", freed}, {"failed", failed}, {"bytes", bytes}});
  } else {
    std::printf("%s %zu allocation(s), %s%s\n", dry_run ? "would free" : "freed", freed.size(),
                format_size(bytes).c_str(),
                failed.empty() ? "" : ("; " + std::to_string(failed.size()) + " could not be freed").c_str());
  }
  return failed.empty() ? k_exit_ok : k_exit_failed;
}

}  // namespace tiermem::ctl
