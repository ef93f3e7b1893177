// Daemons in separate network namespaces joined by veth pairs to a bridge:
// one address space across a real (virtual) network, and a network partition
// made and healed with `ip link`. Needs root and iproute2; exits 77
// (skipped) saying why otherwise.
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

// Runs a command, true when it exits 0.
bool sh(const std::vector<std::string>& argv) { return test::run_command(argv).exit_code == 0; }

std::string g_why_skipped;

class Network {
 public:
  explicit Network(int nodes) : m_nodes(nodes) {
    const int tag = ::getpid() % 200 + 20;
    m_subnet = "10.213." + std::to_string(tag) + ".";
    m_bridge = "tmbr" + std::to_string(tag);
    m_ok = sh({"/usr/sbin/ip", "link", "add", m_bridge, "type", "bridge"}) &&
           sh({"/usr/sbin/ip", "addr", "add", m_subnet + "254/24", "dev", m_bridge}) &&
           sh({"/usr/sbin/ip", "link", "set", m_bridge, "up"});
    for (int i = 1; i <= nodes && m_ok; ++i) {
      const std::string ns = this->ns(i), host = this->host(i);
      m_ok = sh({"/usr/sbin/ip", "netns", "add", ns}) &&
             sh({"/usr/sbin/ip", "link", "add", host, "type", "veth", "peer", "name", "tmeth0", "netns", ns}) &&
             sh({"/usr/sbin/ip", "-n", ns, "addr", "add", address(i) + "/24", "dev", "tmeth0"}) &&
             sh({"/usr/sbin/ip", "-n", ns, "link", "set", "tmeth0", "up"}) &&
             sh({"/usr/sbin/ip", "-n", ns, "link", "set", "lo", "up"}) &&
             sh({"/usr/sbin/ip", "link", "set", host, "master", m_bridge}) &&
             sh({"/usr/sbin/ip", "link", "set", host, "up"});
    }
  }
  ~Network() {
    for (int i = 1; i <= m_nodes; ++i) {
      sh({"/usr/sbin/ip", "link", "del", host(i)});  // takes its peer in the namespace along
      sh({"/usr/sbin/ip", "netns", "del", ns(i)});
    }
    sh({"/usr/sbin/ip", "link", "del", m_bridge});
  }
  bool ok() const { return m_ok; }
  std::string ns(int i) const { return "tmns" + std::to_string(::getpid()) + "n" + std::to_string(i); }
  std::string address(int i) const { return m_subnet + std::to_string(i); }
  std::string host(int i) const { return "tmh" + std::to_string(::getpid() % 200 + 20) + "n" + std::to_string(i); }
  const std::string& bridge() const { return m_bridge; }
  bool link(int i, bool up) {
    return sh({"/usr/sbin/ip", "-n", ns(i), "link", "set", "tmeth0", up ? "up" : "down"});
  }

 private:
  int m_nodes;
  bool m_ok = false;
  std::string m_subnet, m_bridge;
};

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_net = std::make_unique<Network>(3);
    ASSERT_TRUE(m_net->ok()) << "could not build the namespaces";
    m_dir = test::make_temp_dir("tiermem-netns");
    const std::string file = m_dir + "/cluster.toml";
    {
      std::ofstream out(file);
      for (int i = 1; i <= 3; ++i) out << "[[node]]\nid = " << i << "\ncontrol = \"" << m_net->address(i) << ":7100\"\n";
    }
    const std::string secret = test::write_secret(m_dir);
    for (int i = 1; i <= 3; ++i) {
      test::DaemonOptions o;
      o.node_id = i;
      o.cluster_file = file;
      o.secret_file = secret;
      o.dir = m_dir + "/node" + std::to_string(i);
      o.tls = "tcp";
      o.page_size = "64KiB";
      o.dram = "16MiB";
      o.pmem = "8MiB";
      o.extra_toml = "devices = \"tmeth0\"\n";  // [transport] is the last table written
      o.wrapper = {"/usr/sbin/ip", "netns", "exec", m_net->ns(i)};
      m_daemons.push_back(std::make_unique<test::TestDaemon>(o));
      ASSERT_TRUE(m_daemons.back()->ready()) << m_daemons.back()->log();
    }
    // This process reaches the namespaces through the bridge.
    ::setenv("UCX_TLS", "tcp", 1);
    ::setenv("UCX_NET_DEVICES", m_net->bridge().c_str(), 1);
  }
  void TearDown() override {
    if (HasFailure()) {
      for (auto& d : m_daemons) std::fprintf(stderr, "--- daemon\n%s\n", d->log().c_str());
    }
    m_daemons.clear();
    m_net.reset();
    std::error_code ec;
    std::filesystem::remove_all(m_dir, ec);
    ::unsetenv("UCX_TLS");
    ::unsetenv("UCX_NET_DEVICES");
  }

  // The state node 1 reports for `node`.
  NodeState state_of(Client& c, NodeId node) {
    auto nodes = c.nodes();
    if (!nodes.ok()) return NodeState::down;
    for (const auto& n : *nodes) {
      if (n.node == node) return n.state;
    }
    return NodeState::down;
  }
  bool wait_state(Client& c, NodeId node, NodeState want, std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (state_of(c, node) == want) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  std::unique_ptr<Network> m_net;
  std::string m_dir;
  std::vector<std::unique_ptr<test::TestDaemon>> m_daemons;
};

TEST_F(NetnsTest, OneAddressSpaceAcrossNamespacesAndAPartitionHeals) {
  auto client = m_daemons[0]->connect("netns");
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(wait_state(*client, 2, NodeState::connected, 20s));
  ASSERT_TRUE(wait_state(*client, 3, NodeState::connected, 20s));
  auto nodes = client->nodes();
  EXPECT_NE((*nodes)[1].transports.find("tcp/tmeth0"), std::string::npos)
      << "daemons talk over the veth: " << (*nodes)[1].transports;

  auto a = client->alloc(200 << 10, {.node = 3});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  std::vector<char> out(200 << 10, 'n'), back(200 << 10);
  ASSERT_TRUE(client->write(a->gva, out.data(), out.size()).ok());
  ASSERT_TRUE(client->read(a->gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, out);
  auto counter = client->alloc(4096, {.node = 2, .coherent = true});
  ASSERT_TRUE(counter.ok());
  EXPECT_EQ(*client->fetch_add(counter->gva, 2), 0u);
  EXPECT_EQ(*client->fetch_add(counter->gva, 2), 2u);
  ASSERT_TRUE(client->migrate(a->gva, Tier::pmem, 2).ok());
  ASSERT_TRUE(client->read(a->gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, out);

  // Partition node 3 off the network.
  ASSERT_TRUE(m_net->link(3, false));
  ASSERT_TRUE(wait_state(*client, 3, NodeState::down, 20s)) << "node 1 never saw node 3 go";
  auto refused = client->alloc(4096, {.node = 3});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("node 3"), std::string::npos) << refused.status().to_string();
  // Nodes 1 and 2 go on; memory homed on node 3 is out of reach, and says so.
  uint64_t word = 0;
  ASSERT_TRUE(client->read(counter->gva, &word, 8).ok());
  EXPECT_EQ(word, 4u);
  Status cut = client->read(a->gva, back.data(), 4096);
  EXPECT_FALSE(cut.ok()) << "the page is on node 2 but its version words are on node 3";

  // Heal it: node 3 rejoins (same incarnation: it never stopped).
  ASSERT_TRUE(m_net->link(3, true));
  ASSERT_TRUE(wait_state(*client, 3, NodeState::connected, 30s)) << "node 3 never came back";
  auto again = client->alloc(4096, {.node = 3});
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  ASSERT_TRUE(client->write(again->gva, "healed", 6).ok());
  char text[6];
  ASSERT_TRUE(client->read(again->gva, text, 6).ok());
  EXPECT_EQ(std::string(text, 6), "healed");
  Status healed = client->read(a->gva, back.data(), back.size());
  ASSERT_TRUE(healed.ok()) << "reachable again after the heal: " << healed.to_string();
  EXPECT_EQ(back, out);
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) {
  using tiermem::sh;
  if (::geteuid() != 0) {
    std::printf("skipped: network namespaces need root\n");
    return 77;
  }
  if (!sh({"/usr/sbin/ip", "netns", "add", "tmprobe"}) || !sh({"/usr/sbin/ip", "netns", "del", "tmprobe"})) {
    std::printf("skipped: `ip netns add` does not work here (no CAP_SYS_ADMIN, or no iproute2)\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
