// The health graph (H1) with real faults: three daemons heartbeating every
// 10 ms; one is stopped (SIGSTOP), continued, and killed, and the others'
// view of it moves through degraded to unreachable and back to healthy, each
// change logged once, within the bounds docs/ARCHITECTURE.md gives.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int k_interval_ms = 10, k_timeout_ms = 30, k_unreachable_ms = 300;

test::DaemonOptions fast_heartbeats() {
  test::DaemonOptions o;
  o.page_size = "64KiB";
  o.cluster_timing = "reconnect_interval_ms = " + std::to_string(k_interval_ms) +
                     "\nheartbeat_interval_ms = " + std::to_string(k_interval_ms) +
                     "\npeer_timeout_ms = " + std::to_string(k_timeout_ms) + "\n";
  o.extra_toml = "[health]\ndegraded_after_missed = 2\nunreachable_after_ms = " + std::to_string(k_unreachable_ms) + "\n";
  return o;
}

// How long until `c`'s daemon sees `node` as `want` (at most `limit`).
std::chrono::milliseconds until(Client& c, NodeId node, NodeHealth want, std::chrono::milliseconds limit) {
  const auto start = Clock::now();
  while (Clock::now() - start < limit) {
    if (test::health_of(c, node) == want) {
      return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    }
    std::this_thread::sleep_for(1ms);
  }
  return limit + 1ms;
}

TEST(HealthTest, AStoppedPeerGoesUnreachableAndComesBackHealthyAndAKilledOneIsSeenAtOnce) {
  test::TestCluster cluster(3, fast_heartbeats());
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  auto c = cluster.node(1).connect("watcher");
  ASSERT_NE(c, nullptr);
  ASSERT_LT(until(*c, 3, NodeHealth::healthy, 2s), 2s);

  auto graph = c->health();
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  ASSERT_EQ(graph->nodes.size(), 3u);
  EXPECT_EQ(graph->edges.size(), 6u) << "each of three daemons reports its two peers";
  for (const HealthEdge& e : graph->edges) {
    EXPECT_EQ(e.to.health, NodeHealth::healthy) << e.from << " -> " << e.to.node;
    EXPECT_GT(e.to.last_heartbeat_ms, 0u);
    EXPECT_EQ(e.to.missed_heartbeats, 0u);
  }
  EXPECT_TRUE(graph->unasked.empty());

  // SIGSTOP: nothing tells the others; heartbeats go unanswered. Bound (see
  // ARCHITECTURE.md, health): unreachable_after + one check (a timeout and
  // an interval), here with room for a loaded machine.
  ASSERT_TRUE(test::stop_process(cluster.node(3).pid()));
  const auto stopped = until(*c, 3, NodeHealth::unreachable, 3s);
  const auto bound = std::chrono::milliseconds(k_unreachable_ms + 3 * k_interval_ms + 2 * k_timeout_ms);
  EXPECT_LE(stopped, bound + 300ms) << "a stopped peer took " << stopped.count() << " ms to be unreachable";
  auto during = c->health();
  ASSERT_TRUE(during.ok());
  bool seen_from_2 = false;
  for (const HealthEdge& e : during->edges) {
    if (e.from == 2 && e.to.node == 3) {
      seen_from_2 = true;
      EXPECT_NE(e.to.health, NodeHealth::healthy) << "node 2 still sees the stopped node 3 as healthy";
      EXPECT_GT(e.to.missed_heartbeats, 0u);
    }
  }
  EXPECT_TRUE(seen_from_2);
  EXPECT_FALSE(during->unasked.empty()) << "the stopped daemon could not be asked for its edges";
  // Health is judged by the clock when asked; the transition is logged by
  // the sweeper on its next round: read the log once it has it (or after a
  // second, to say what is missing).
  std::string log = cluster.node(1).log();
  for (const auto end = Clock::now() + 1s;
       log.find("node 3 health: degraded -> unreachable") == std::string::npos && Clock::now() < end;) {
    std::this_thread::sleep_for(10ms);
    log = cluster.node(1).log();
  }
  const size_t degraded = log.find("node 3 health: healthy -> degraded");
  const size_t unreachable = log.find("node 3 health: degraded -> unreachable");
  EXPECT_NE(degraded, std::string::npos) << log;
  EXPECT_NE(unreachable, std::string::npos) << log;
  EXPECT_LT(degraded, unreachable);
  EXPECT_EQ(log.find("node 3 health: degraded -> unreachable", unreachable + 1), std::string::npos)
      << "a transition is logged once";

  ::kill(cluster.node(3).pid(), SIGCONT);
  EXPECT_LT(until(*c, 3, NodeHealth::healthy, 5s), 5s) << cluster.node(1).log();

  // SIGKILL: the kernel refuses the next connection, which says the process
  // is gone: unreachable without waiting out unreachable_after.
  cluster.node(3).kill();
  const auto killed = until(*c, 3, NodeHealth::unreachable, 3s);
  EXPECT_LT(killed, std::chrono::milliseconds(k_unreachable_ms)) << "took " << killed.count() << " ms";

  auto ctl = test::run_ctl(cluster.node(1).socket(), {"--json", "health"});
  ASSERT_EQ(ctl.exit_code, 0) << ctl.err;
  const auto j = nlohmann::json::parse(ctl.out);
  ASSERT_EQ(j["nodes"].size(), 3u);
  EXPECT_EQ(j["nodes"][2]["health"], "unreachable");
  EXPECT_EQ(j["edges"].size(), 4u) << "nodes 1 and 2 report their edges; 3 cannot be asked";
  auto human = test::run_ctl(cluster.node(1).socket(), {"health"});
  EXPECT_EQ(human.exit_code, 0);
  EXPECT_NE(human.out.find("unreachable"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("not asked: node 3"), std::string::npos) << human.out;
}

// Pings that hang (a stopped peer answers nothing, and a ping waits up to
// the peer timeout, 3 s here) neither delay that peer's verdict past
// unreachable_after nor hold up any other peer's heartbeat: each peer has a
// heartbeat of its own, and health goes by the clock. Node 2 is stopped and
// must be unreachable long before its ping times out; node 3 is killed while
// node 2's pings still hang and must be seen at once.
TEST(HealthTest, APeerWhosePingsHangHoldsUpNoOtherAndIsUnreachableOnTime) {
  test::DaemonOptions o = fast_heartbeats();
  constexpr int k_long_timeout_ms = 3000;
  o.cluster_timing = "reconnect_interval_ms = 10\nheartbeat_interval_ms = 10\npeer_timeout_ms = " +
                     std::to_string(k_long_timeout_ms) + "\n";
  test::TestCluster cluster(3, o);
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  auto c = cluster.node(1).connect("watcher");
  ASSERT_NE(c, nullptr);
  ASSERT_LT(until(*c, 2, NodeHealth::healthy, 2s), 2s);
  ASSERT_LT(until(*c, 3, NodeHealth::healthy, 2s), 2s);

  ASSERT_TRUE(test::stop_process(cluster.node(2).pid()));
  const auto stopped = until(*c, 2, NodeHealth::unreachable, 6s);
  // unreachable_after and one interval, with room for a loaded machine; the
  // single heartbeat thread of old waited out the whole ping (3 s).
  EXPECT_LT(stopped, std::chrono::milliseconds(k_unreachable_ms + 700))
      << "a stopped peer took " << stopped.count() << " ms to be unreachable (peer timeout " << k_long_timeout_ms
      << " ms)\n" << cluster.node(1).log();
  EXPECT_EQ(test::health_of(*c, 3), NodeHealth::healthy) << "node 3 was not touched";

  // Node 2's ping is still waiting (it waits 3 s): node 3 dies now.
  cluster.node(3).kill();
  const auto killed = until(*c, 3, NodeHealth::unreachable, 6s);
  EXPECT_LT(killed, std::chrono::milliseconds(k_unreachable_ms + 700))
      << "a killed peer took " << killed.count() << " ms while another's pings hung\n" << cluster.node(1).log();

  ::kill(cluster.node(2).pid(), SIGCONT);
  EXPECT_LT(until(*c, 2, NodeHealth::healthy, 10s), 10s) << cluster.node(1).log();
  // Logged once, from healthy (no ping had failed yet: they hang) or degraded.
  const std::string log = cluster.node(1).log();
  size_t logged = 0;
  for (const char* from : {"healthy", "degraded"}) {
    const std::string line = std::string("node 2 health: ") + from + " -> unreachable";
    for (size_t at = log.find(line); at != std::string::npos; at = log.find(line, at + 1)) ++logged;
  }
  EXPECT_EQ(logged, 1u) << log;
}

// With heartbeats 10 s apart, a SIGKILLed peer is still known at once: its
// UCX endpoint fails (the TCP connection is reset), or libfabric shm's
// watch of the peer process sees it exit, and the data plane tells the
// health graph (H2), which does not wait for the next heartbeat. Not over
// tcp;ofi_rxm: it reports nothing when a peer's connection breaks (sends
// to it are refused with EAGAIN), so only an asker's ping or a heartbeat
// finds the peer gone (ofi_transport's dead-peer cases).
class DataPlaneReportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DataPlaneReportTest, AKilledPeerIsReportedBeforeAnyHeartbeat) {
  test::DaemonOptions o;
  o.page_size = "64KiB";
  o.cluster_timing = "reconnect_interval_ms = 10\nheartbeat_interval_ms = 10000\npeer_timeout_ms = 3000\n";
  test::TestCluster cluster(2, o.over(GetParam()));
  ASSERT_TRUE(cluster.ready()) << cluster.logs();
  ASSERT_TRUE(cluster.wait_connected()) << cluster.logs();
  auto c = cluster.node(1).connect();
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(test::health_of(*c, 2), NodeHealth::healthy) << cluster.logs();
  const std::string before = cluster.node(1).log();
  const bool ucx = GetParam() == "ucx";
  if (ucx && before.find("data plane: tcp") == std::string::npos) {
    GTEST_SKIP() << "the peers' data plane is not UCX over TCP here (no peer-failure reports):\n" << before;
  }
  const auto killed = Clock::now();
  cluster.node(2).kill();
  const auto took = until(*c, 2, NodeHealth::unreachable, 5000ms);
  EXPECT_LT(took.count(), 2000) << "not before a heartbeat would have seen it\n" << cluster.node(1).log();
  const std::string log = cluster.node(1).log();
  const std::string said = ucx ? "the data plane reports node 2 failed (UCX reports the peer failed"
                               : "the data plane reports node 2 failed (libfabric reports the peer failed: the peer "
                                 "process exited";
  EXPECT_NE(log.find(said), std::string::npos) << log;
  std::printf("SIGKILLed peer unreachable after %lld ms (heartbeats every 10 s)\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed).count()));
}

INSTANTIATE_TEST_SUITE_P(Fabrics, DataPlaneReportTest, ::testing::Values("ucx", "ofi-shm"),
                         [](const auto& info) { return test::fabric_name(info.param); });

// The check-in edge of `pid`'s session on `c`'s daemon (health unknown: no
// such edge).
CheckInEdge check_in_of(Client& c, pid_t pid) {
  auto g = c.health();
  if (g.ok()) {
    for (const CheckInEdge& e : g->check_ins) {
      if (e.pid == static_cast<uint32_t>(pid)) return e;
    }
  }
  return CheckInEdge{};
}

// A client (tenant_probe hold) checking in every 20 ms: healthy while it
// does; SIGSTOP: degraded after two missed check-ins and unreachable after
// health.unreachable_after_ms, each logged once; SIGCONT: healthy again;
// SIGKILL: its edge ends with its connection.
TEST(HealthTest, AStoppedClientGoesDegradedThenUnreachableAndAKilledOneIsGone) {
  constexpr int k_checkin_ms = 20;
  test::TestDaemon daemon(fast_heartbeats());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  const char* probe = std::getenv("TIERMEM_PROBE");
  ASSERT_NE(probe, nullptr) << "TIERMEM_PROBE is not set";
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::dup2(out[1], 1);
    ::setenv("TIERMEM_CHECKIN_INTERVAL_MS", std::to_string(k_checkin_ms).c_str(), 1);
    ::execl(probe, probe, daemon.socket().c_str(), "hold", "60000", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out[1]);
  char said[8] = {};
  ASSERT_GT(::read(out[0], said, 2), 0) << "the probe did not connect";
  ::close(out[0]);
  auto observer = daemon.connect("observer");
  ASSERT_NE(observer, nullptr);

  // Healthy as long as it checks in: never degraded over 15 intervals
  // (without check-ins it would be after 2).
  CheckInEdge e = check_in_of(*observer, child);
  ASSERT_EQ(e.health, NodeHealth::healthy) << daemon.log();
  EXPECT_EQ(e.client_name, "probe");
  EXPECT_EQ(e.interval_ms, static_cast<uint32_t>(k_checkin_ms));
  for (auto end = Clock::now() + 15 * std::chrono::milliseconds(k_checkin_ms); Clock::now() < end;) {
    e = check_in_of(*observer, child);
    ASSERT_EQ(e.health, NodeHealth::healthy) << e.missed << " check-ins missed while running\n" << daemon.log();
    std::this_thread::sleep_for(5ms);
  }

  auto wait_for = [&](NodeHealth want, std::chrono::milliseconds limit) {
    const auto start = Clock::now();
    while (Clock::now() - start < limit) {
      if (check_in_of(*observer, child).health == want) break;
      std::this_thread::sleep_for(1ms);
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  };
  const auto stopped = Clock::now();
  ASSERT_TRUE(test::stop_process(child));
  // Two intervals after its last check-in (at most one before the stop),
  // plus a sweep (half an interval) and a margin for a loaded machine.
  const auto degraded = wait_for(NodeHealth::degraded, 250ms);
  EXPECT_LE(degraded.count(), 250) << daemon.log();
  const auto unreachable = wait_for(NodeHealth::unreachable, 1000ms);
  const auto since_stop = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stopped);
  EXPECT_LE(since_stop.count(), k_unreachable_ms + 300) << daemon.log();
  EXPECT_GE(since_stop.count(), k_unreachable_ms - 2 * k_checkin_ms) << "unreachable before its bound";
  std::printf("stopped client: degraded after %lld ms, unreachable after %lld ms (check-in every %d ms, "
              "unreachable after %d ms)\n",
              static_cast<long long>(degraded.count()), static_cast<long long>(since_stop.count()), k_checkin_ms,
              k_unreachable_ms);
  (void)unreachable;
  ::kill(child, SIGCONT);
  EXPECT_LE(wait_for(NodeHealth::healthy, 500ms).count(), 200) << daemon.log();

  // Logged once each.
  const std::string log = daemon.log();
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("check-ins: healthy -> degraded"), 1u) << log;
  EXPECT_EQ(count("check-ins: degraded -> unreachable"), 1u) << log;
  EXPECT_EQ(count("check-ins: unreachable -> healthy (checked in again)"), 1u) << log;

  // tiermemctl shows the edges (the observer's too).
  auto ctl = test::run_ctl(daemon.socket(), {"--json", "health"});
  ASSERT_EQ(ctl.exit_code, 0) << ctl.err;
  bool listed = false;
  const auto graph = nlohmann::json::parse(ctl.out);
  for (const auto& c : graph["check_ins"]) {
    listed |= c["pid"] == child && c["client"] == "probe" && c["checkin_interval_ms"] == k_checkin_ms;
  }
  EXPECT_TRUE(listed) << ctl.out;
  EXPECT_NE(test::run_ctl(daemon.socket(), {"health"}).out.find("check-ins (clients to their daemon)"),
            std::string::npos);

  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_LE(wait_for(NodeHealth::unknown, 1000ms).count(), 500) << "the killed client's edge stays\n" << daemon.log();
}

}  // namespace
}  // namespace tiermem
