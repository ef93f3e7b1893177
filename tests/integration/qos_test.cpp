// QoS classes (H3) with a real fault: three daemons over TCP (where a
// one-sided operation needs the peer's own progress, so a stopped peer makes
// it wait), the home of two allocations SIGSTOPped. strict fails within its
// deadline, naming the node's state; best_effort tries three times within
// its deadline and then fails; graceful_degrade returns a copy's bytes; an
// allocation's default class applies to calls that name none.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Room for a loaded CI machine on top of a deadline: still far below the
// seconds a call waits without a class.
constexpr auto k_margin = 150ms;
constexpr size_t k_size = 64 << 10;

class QosTest : public ::testing::Test {
 protected:
  // The clients' data plane, like the daemons': the nodes stand for hosts
  // of their own, so memory of another node is not mapped from its daemon
  // here (a stopped daemon of this host would not stop that).
  void SetUp() override {
    ::setenv("UCX_TLS", "tcp", 1);
    ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);
  }
  void TearDown() override {
    ::unsetenv("UCX_TLS");
    ::unsetenv("TIERMEM_MAP_SAME_HOST");
  }
};

test::DaemonOptions tcp_cluster() {
  test::DaemonOptions o;
  o.page_size = "64KiB";
  o.tls = "tcp";
  o.cluster_timing = "reconnect_interval_ms = 10\nheartbeat_interval_ms = 10\npeer_timeout_ms = 2000\n";
  o.extra_toml = "[health]\nunreachable_after_ms = 300\n";
  return o;
}

std::chrono::milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

bool wait_healthy(Client& c, std::initializer_list<NodeId> nodes) {
  const auto until = Clock::now() + 10s;
  while (Clock::now() < until) {
    bool all = true;
    for (NodeId n : nodes) all = all && test::health_of(c, n) == NodeHealth::healthy;
    if (all) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

bool strict_read_succeeds(Client& c, Gva gva) {
  std::vector<unsigned char> got(k_size);
  for (int i = 0; i < 3; ++i) {
    Status s = c.read(gva, got.data(), k_size, QosClass::strict);
    if (s.ok()) return true;
    EXPECT_EQ(s.code(), ErrorCode::deadline_exceeded) << s.to_string();
  }
  return false;
}

TEST_F(QosTest, WithTheHomeStoppedStrictFailsFastBestEffortRetriesAndGracefulReadsACopy) {
  test::TestCluster cluster(3, tcp_cluster());
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  auto owner = cluster.node(2).connect("owner");
  ASSERT_TRUE(wait_healthy(*owner, {1, 3}));
  auto replicated = owner->alloc(k_size, {.tier = Tier::dram, .replicas = 1});
  ASSERT_TRUE(replicated.ok()) << replicated.status().to_string();
  auto strict = owner->alloc(k_size, {.tier = Tier::dram, .qos = QosClass::strict});
  ASSERT_TRUE(strict.ok()) << strict.status().to_string();
  EXPECT_EQ(strict->qos, QosClass::strict);
  const auto data = test::pattern(k_size, 5);
  ASSERT_TRUE(owner->write(replicated->gva, data.data(), k_size).ok());
  ASSERT_TRUE(owner->write(strict->gva, data.data(), k_size).ok());

  // A reader on node 1 has read both before (its translations are cached:
  // what follows is the data path).
  auto reader = cluster.node(1).connect("reader");
  std::vector<unsigned char> got(k_size);
  ASSERT_TRUE(reader->read(replicated->gva, got.data(), k_size).ok());
  ASSERT_TRUE(reader->read(strict->gva, got.data(), k_size, QosClass::standard).ok());
  ASSERT_EQ(got, data);
  // A strict read of a home that answers succeeds (on a loaded machine one
  // may miss 50 ms now and then: three tries).
  EXPECT_TRUE(strict_read_succeeds(*reader, replicated->gva));

  // Operators set and see the class (tiermemctl).
  auto made = test::run_ctl(cluster.node(2).socket(), {"--json", "alloc", "64KiB", "--qos", "best_effort"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  EXPECT_NE(made.out.find("\"qos\": \"best_effort\""), std::string::npos) << made.out;
  auto bad = test::run_ctl(cluster.node(2).socket(), {"alloc", "64KiB", "--qos", "urgent"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("no QoS class"), std::string::npos) << bad.err;

  ASSERT_TRUE(test::stop_process(cluster.node(2).pid()));

  auto start = Clock::now();
  Status s = reader->read(replicated->gva, got.data(), k_size, QosClass::strict);
  auto took = since(start);
  EXPECT_EQ(s.code(), ErrorCode::deadline_exceeded) << s.to_string();
  EXPECT_LE(took, 50ms + k_margin) << s.to_string();
  EXPECT_NE(s.message().find("strict read of"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("within 50 ms"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("node 2 is "), std::string::npos) << s.to_string();

  // The allocation's default class, for a call that names none.
  start = Clock::now();
  s = reader->read(strict->gva, got.data(), k_size);
  took = since(start);
  EXPECT_EQ(s.code(), ErrorCode::deadline_exceeded) << s.to_string();
  EXPECT_LE(took, 50ms + k_margin) << s.to_string();

  // A write of a replicated allocation goes through the home daemon: the
  // daemons' waits end by the deadline too.
  start = Clock::now();
  s = reader->write(replicated->gva, data.data(), k_size, QosClass::strict);
  took = since(start);
  EXPECT_EQ(s.code(), ErrorCode::deadline_exceeded) << s.to_string();
  EXPECT_LE(took, 50ms + k_margin) << s.to_string();

  start = Clock::now();
  s = reader->read(replicated->gva, got.data(), k_size, QosClass::best_effort);
  took = since(start);
  EXPECT_EQ(s.code(), ErrorCode::deadline_exceeded) << s.to_string();
  EXPECT_GE(took, 190ms) << "best_effort gave up before its budget: " << s.to_string();
  EXPECT_LE(took, 200ms + k_margin) << s.to_string();
  EXPECT_NE(s.message().find("attempt 3 of 3"), std::string::npos) << s.to_string();

  start = Clock::now();
  std::fill(got.begin(), got.end(), 0);
  s = reader->read(replicated->gva, got.data(), k_size, QosClass::graceful_degrade);
  took = since(start);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(got, data) << "graceful_degrade returned other bytes than the copy's";
  EXPECT_LE(took, 800ms + k_margin);

  // Without a copy there is nothing to degrade to: it fails, in time.
  start = Clock::now();
  s = reader->read(strict->gva, got.data(), k_size, QosClass::graceful_degrade);
  took = since(start);
  EXPECT_EQ(s.code(), ErrorCode::deadline_exceeded) << s.to_string();
  EXPECT_LE(took, 800ms + k_margin);
  EXPECT_NE(s.message().find("a copy:"), std::string::npos) << s.to_string();

  ::kill(cluster.node(2).pid(), SIGCONT);
  ASSERT_TRUE(wait_healthy(*reader, {2}));
  ASSERT_TRUE(reader->read(replicated->gva, got.data(), k_size).ok());
  EXPECT_TRUE(strict_read_succeeds(*reader, replicated->gva)) << "the home answers again";
}

}  // namespace
}  // namespace tiermem
