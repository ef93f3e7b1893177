// tiermemctl health: the health graph (H1) — every node, and each reachable
// daemon's edges to the others (heartbeat state, since when, the last
// answered heartbeat, how many in a row went unanswered, its round trip),
// and the check-in edges of every asked daemon's clients.
#include <chrono>
#include <cstdio>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {
namespace {

uint64_t now_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

std::string ago(uint64_t now, uint64_t then) { return then == 0 ? "never" : age(now > then ? now - then : 0); }

nlohmann::json edge_json(NodeId from, const NodeInfo& to) {
  return {{"from", from},
          {"to", to.node},
          {"health", node_health_name(to.health)},
          {"health_since_ms", to.health_since_ms},
          {"state", node_state_name(to.state)},
          {"last_heartbeat_ms", to.last_heartbeat_ms},
          {"missed_heartbeats", to.missed_heartbeats},
          {"heartbeat_rtt_us", to.heartbeat_rtt_us},
          {"last_error", to.last_error}};
}

nlohmann::json check_in_json(const CheckInEdge& c) {
  return {{"node", c.node},
          {"session", c.session},
          {"client", c.client_name},
          {"pid", c.pid},
          {"uid", c.uid},
          {"tenant", c.tenant},
          {"health", node_health_name(c.health)},
          {"health_since_ms", c.health_since_ms},
          {"last_checkin_ms", c.last_checkin_ms},
          {"missed_checkins", c.missed},
          {"checkin_interval_ms", c.interval_ms}};
}

}  // namespace

int cmd_health(const Context& ctx) {
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto graph = client->health();
  if (!graph.ok()) return fail("health", graph.status());
  if (ctx.json) {
    nlohmann::json nodes = nlohmann::json::array(), edges = nlohmann::json::array();
    const NodeId self = graph->nodes.empty() ? 0 : graph->nodes[0].node;
    for (const auto& n : graph->nodes) {
      nodes.push_back(n.node == self ? nlohmann::json{{"node", n.node}, {"health", "healthy"}, {"self", true}}
                                     : edge_json(self, n));
    }
    for (const auto& e : graph->edges) edges.push_back(edge_json(e.from, e.to));
    nlohmann::json check_ins = nlohmann::json::array();
    for (const auto& c : graph->check_ins) check_ins.push_back(check_in_json(c));
    print_json({{"nodes", nodes}, {"edges", edges}, {"check_ins", check_ins}, {"unasked", graph->unasked}});
    return k_exit_ok;
  }
  const uint64_t now = now_ms();
  Table nodes({"NODE", "HEALTH", "SINCE", "LAST HEARTBEAT", "MISSED", "RTT", "STATE"});
  for (const auto& n : graph->nodes) {
    const bool self = n.state == NodeState::self;
    nodes.add({std::to_string(n.node), std::string(node_health_name(n.health)), ago(now, n.health_since_ms),
               self ? "-" : ago(now, n.last_heartbeat_ms), self ? "-" : std::to_string(n.missed_heartbeats),
               self || n.last_heartbeat_ms == 0 ? "-" : std::to_string(n.heartbeat_rtt_us) + " us",
               std::string(node_state_name(n.state))});
  }
  std::printf("nodes, as this node's daemon sees them:\n");
  std::fputs(nodes.render().c_str(), stdout);
  Table edges({"FROM", "TO", "HEALTH", "SINCE", "LAST HEARTBEAT", "MISSED", "RTT"});
  for (const auto& e : graph->edges) {
    edges.add({std::to_string(e.from), std::to_string(e.to.node), std::string(node_health_name(e.to.health)),
               ago(now, e.to.health_since_ms), ago(now, e.to.last_heartbeat_ms),
               std::to_string(e.to.missed_heartbeats),
               e.to.last_heartbeat_ms == 0 ? "-" : std::to_string(e.to.heartbeat_rtt_us) + " us"});
  }
  std::printf("\nedges (heartbeats between daemons):\n");
  std::fputs(edges.render().c_str(), stdout);
  Table check_ins({"NODE", "SESSION", "CLIENT", "PID", "HEALTH", "SINCE", "LAST CHECK-IN", "MISSED", "EVERY"});
  for (const auto& c : graph->check_ins) {
    check_ins.add({std::to_string(c.node), std::to_string(c.session), c.client_name, std::to_string(c.pid),
                   std::string(node_health_name(c.health)), ago(now, c.health_since_ms), ago(now, c.last_checkin_ms),
                   std::to_string(c.missed), c.interval_ms == 0 ? "-" : std::to_string(c.interval_ms) + " ms"});
  }
  std::printf("\ncheck-ins (clients to their daemon):\n");
  std::fputs(check_ins.render().c_str(), stdout);
  for (const std::string& u : graph->unasked) std::printf("not asked: %s\n", u.c_str());
  return k_exit_ok;
}

}  // namespace tiermem::ctl
