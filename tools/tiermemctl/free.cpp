// tiermemctl free GVA
#include <cstdio>

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

}  // namespace tiermem::ctl
