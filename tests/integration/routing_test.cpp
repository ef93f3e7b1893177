// Which route a client's call takes to another node's memory, and that the
// counters say so (C3): real daemons on this machine standing for hosts of
// their own (UCX over TCP, same-host mapping off, as the "tcp" variant of the
// cluster test). A route is decided once per translation: a call neither
// translates again nor asks its daemon about the node on each call, and keys
// of a domain the tenant got since are added on the endpoint it has.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

test::DaemonOptions options() {
  test::DaemonOptions o;
  o.tls = "tcp";
  o.page_size = "64KiB";
  o.dram = "32MiB";
  o.pmem = "16MiB";
  // Node 1 learns of node 2's new regions only when asked (its heartbeat,
  // which would refresh them, comes after the test is over).
  o.cluster_timing = "reconnect_interval_ms = 200\nheartbeat_interval_ms = 60000\npeer_timeout_ms = 120000\n";
  return o;
}

// Requests of `type` that `c`'s daemon (node 1) answered, every tenant and
// result (tiermem_requests_total).
uint64_t requests(Client& c, const std::string& type) {
  auto text = c.metrics(1);
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  if (!text.ok()) return 0;
  const std::regex sample("\ntiermem_requests_total\\{node=\"1\",type=\"" + type + "\",[^}]*\\} ([0-9]+)");
  uint64_t sum = 0;
  for (std::sregex_iterator it(text->begin(), text->end(), sample), end; it != end; ++it) {
    sum += std::stoull((*it)[1].str());
  }
  return sum;
}

class RoutingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("UCX_TLS", "tcp", 1);
    ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);
    m_cluster = std::make_unique<test::TestCluster>(2, options());
    ASSERT_TRUE(m_cluster->ready()) << m_cluster->logs();
    ASSERT_TRUE(m_cluster->wait_connected()) << m_cluster->logs();
    m_admin = m_cluster->node(1).connect("metrics");
    ASSERT_NE(m_admin, nullptr);
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "%s\n", m_cluster->logs().c_str());
    m_admin.reset();
    m_cluster.reset();
    ::unsetenv("UCX_TLS");
    ::unsetenv("TIERMEM_MAP_SAME_HOST");
  }
  std::unique_ptr<test::TestCluster> m_cluster;
  std::unique_ptr<Client> m_admin;  // reads node 1's request counters
};

// The tenant's first allocation on node 2 makes its domain there after node
// 1's daemon last described node 2: the client's first endpoint to node 2
// comes with no key for it. One refresh (node 1 asks node 2) adds the keys
// on that endpoint, the translation is kept, and every call after goes to
// node 2 over TCP as checked messages: counted as `message`, never as
// `direct_remote`, with no request to node 1 per call.
TEST_F(RoutingTest, ANewDomainIsReachedAfterOneRefreshAndCountedAsMessages) {
  auto client = m_cluster->node(1).connect("routing");
  ASSERT_NE(client, nullptr);
  auto a = client->alloc(256 << 10, {.tier = Tier::dram, .node = 2});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  const uint64_t translates = requests(*m_admin, "translate");
  const uint64_t nodes = requests(*m_admin, "nodes");
  const auto data = test::pattern(256 << 10, 7);
  Status w = client->write(a->gva, data.data(), data.size());
  ASSERT_TRUE(w.ok()) << w.to_string();
  AccessCounters c = client->access_counters();
  EXPECT_EQ(c.message, 1u) << "the first write went to node 2 through the data plane";
  EXPECT_EQ(c.through_daemon, 0u);
  EXPECT_EQ(c.direct_remote, 0u) << "a checked message is not one-sided";
  EXPECT_EQ(requests(*m_admin, "translate") - translates, 1u) << "the translation was kept across the refresh";
  // Its description (no key), the local daemon's view (no newer), node 2's
  // (newer): three; a wait longer than 100 ms asks about the node once more.
  const uint64_t first_nodes = requests(*m_admin, "nodes") - nodes;
  EXPECT_GE(first_nodes, 3u);
  EXPECT_LE(first_nodes, 5u);

  constexpr int k_calls = 40;
  std::vector<unsigned char> back(data.size());
  for (int i = 0; i < k_calls; ++i) {
    ASSERT_TRUE(client->read(a->gva, back.data(), back.size()).ok());
    ASSERT_TRUE(client->fetch_add(a->gva.plus(8 * i), 1).ok());
  }
  EXPECT_TRUE(std::equal(back.begin() + 8 * k_calls, back.end(), data.begin() + 8 * k_calls));
  c = client->access_counters();
  EXPECT_EQ(c.message, 1u + 2 * k_calls);
  EXPECT_EQ(c.through_daemon, 0u);
  EXPECT_EQ(c.direct_remote, 0u);
  EXPECT_EQ(requests(*m_admin, "translate") - translates, 1u) << "calls translated again";
  EXPECT_LE(requests(*m_admin, "nodes") - nodes, first_nodes + 3) << "calls asked the daemon about node 2";
}

// A client whose process has no data plane (UCX cannot start with the
// transports it is given) reaches node 2 through its daemon: decided once
// for the translation, so calls neither translate again nor ask about node 2.
TEST_F(RoutingTest, NoDataPlaneHereGoesThroughTheDaemonWithoutAskingAgain) {
  ::setenv("UCX_TLS", "rc_verbs", 1);  // no InfiniBand device here: the client's UCX finds no transport
  auto client = m_cluster->node(1).connect("no-fabric");
  ASSERT_NE(client, nullptr);
  auto a = client->alloc(64 << 10, {.tier = Tier::dram, .node = 2});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  const auto data = test::pattern(64 << 10, 3);
  ASSERT_TRUE(client->write(a->gva, data.data(), data.size()).ok());
  const uint64_t translates = requests(*m_admin, "translate");
  const uint64_t nodes = requests(*m_admin, "nodes");
  constexpr int k_calls = 30;
  std::vector<unsigned char> back(data.size());
  for (int i = 0; i < k_calls; ++i) {
    ASSERT_TRUE(client->write(a->gva, data.data(), data.size()).ok());
    ASSERT_TRUE(client->read(a->gva, back.data(), back.size()).ok());
  }
  EXPECT_EQ(back, data);
  const AccessCounters c = client->access_counters();
  EXPECT_EQ(c.through_daemon, 1u + 2 * k_calls);
  EXPECT_EQ(c.message + c.direct_remote, 0u);
  EXPECT_EQ(requests(*m_admin, "translate"), translates) << "calls translated again";
  EXPECT_EQ(requests(*m_admin, "nodes"), nodes) << "calls asked the daemon about node 2";
}

// Same-host mapping on: node 2's memory is mapped from the files its daemon
// hands over, and counted as `direct_remote` (not `message`).
TEST_F(RoutingTest, AMappedCopyOnTheSameHostIsDirectRemote) {
  ::unsetenv("TIERMEM_MAP_SAME_HOST");
  auto client = m_cluster->node(1).connect("mapped");
  ASSERT_NE(client, nullptr);
  auto a = client->alloc(128 << 10, {.tier = Tier::dram, .node = 2});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  const auto data = test::pattern(128 << 10, 5);
  ASSERT_TRUE(client->write(a->gva, data.data(), data.size()).ok());
  std::vector<unsigned char> back(data.size());
  ASSERT_TRUE(client->read(a->gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, data);
  ASSERT_TRUE(client->fetch_add(a->gva, 1).ok());
  const AccessCounters c = client->access_counters();
  EXPECT_EQ(c.direct_remote, 3u);
  EXPECT_EQ(c.message, 0u);
  EXPECT_EQ(c.through_daemon, 0u);
}

}  // namespace
}  // namespace tiermem
