// tiermemctl nodes: the cluster as the local daemon sees it.
#include <chrono>
#include <cstdio>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {

int cmd_nodes(const Context& ctx) {
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto nodes = client->nodes();
  if (!nodes.ok()) return fail("nodes", nodes.status());
  if (ctx.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& n : *nodes) {
      out.push_back({{"node", n.node},
                     {"control", n.control_address},
                     {"state", node_state_name(n.state)},
                     {"incarnation", hex(n.incarnation)},
                     {"transports", n.transports},
                     {"last_error", n.last_error},
                     {"state_since_ms", n.state_since_ms}});
    }
    print_json(out);
    return k_exit_ok;
  }
  const auto now = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
  Table table({"NODE", "STATE", "SINCE", "CONTROL", "INCARNATION", "DATA PLANE", "LAST ERROR"});
  for (const auto& n : *nodes) {
    table.add({std::to_string(n.node), std::string(node_state_name(n.state)),
               n.state_since_ms == 0 ? "-" : age(now > n.state_since_ms ? now - n.state_since_ms : 0),
               n.control_address.empty() ? "-" : n.control_address, hex(n.incarnation),
               n.state == NodeState::self ? "(local: shared memory)" : (n.transports.empty() ? "-" : n.transports),
               n.last_error.empty() ? "-" : n.last_error});
  }
  std::fputs(table.render().c_str(), stdout);
  return k_exit_ok;
}

}  // namespace tiermem::ctl
