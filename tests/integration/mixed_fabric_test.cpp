// A cluster uses one fabric (issue 24): a node whose data plane runs over
// another fabric (or another libfabric provider) is refused at the peer
// hello, by the side that answers the hello and by the side that opened the
// link, and stays DOWN with the reason as its last error.
//
// MixedFabricTest plays the other node itself, over the real peer protocol
// with the cluster's secret: once as the node that says hello, once as the
// node that answers one. MixedClusterTest runs two real daemons on two
// fabrics (it needs the libfabric transport: a build without it fails at
// the start of node 2, saying so).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/frame.hpp"
#include "control.pb.h"
#include "daemon/peer_auth.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

constexpr const char* k_other_fabric = "libfabric/tcp;ofi_rxm";

std::string refusal(NodeId node, const std::string& theirs, const std::string& ours) {
  return "node " + std::to_string(node) + " runs its data plane over " + theirs + " and this node over " + ours +
         ": a cluster uses one fabric ([transport] fabric and provider alike on every node)";
}

sockaddr_in loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

int tcp_connect(int port) {
  sockaddr_in addr = loopback(port);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

template <typename Out>
bool exchange(int fd, const google::protobuf::Message& message, Out* out) {
  if (!wire::send_frame(fd, message.SerializeAsString()).ok()) return false;
  std::string payload;
  if (!wire::recv_frame(fd, 1 << 24, &payload, nullptr).ok()) return false;
  return out->ParseFromString(payload);
}

// Node 1 (a real daemon, UCX) in a cluster file of two; node 2 is the test.
class MixedFabricTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_dir = test::make_temp_dir("tiermem-fabric");
    m_secret_path = test::write_secret(m_dir);
    m_port1 = test::free_port();
    m_port2 = test::free_port();
    std::ofstream(m_dir + "/cluster.toml") << "[[node]]\nid = 1\ncontrol = \"127.0.0.1:" << m_port1
                                           << "\"\n[[node]]\nid = 2\ncontrol = \"127.0.0.1:" << m_port2 << "\"\n";
    auto secret = ClusterSecret::load(m_secret_path, "test");
    ASSERT_TRUE(secret.ok()) << secret.status().to_string();
    m_secret = std::move(secret).value();
  }
  void TearDown() override {
    m_daemon.reset();
    std::filesystem::remove_all(m_dir);
  }
  void start_node1() {
    m_daemon = std::make_unique<test::TestDaemon>(test::DaemonOptions{
        .node_id = 1, .cluster_file = m_dir + "/cluster.toml", .secret_file = m_secret_path, .dir = m_dir + "/node1"});
    ASSERT_TRUE(m_daemon->ready()) << m_daemon->log();
  }
  // Node 1's view of node 2, once its last error is `error` (up to 5 s).
  NodeInfo node2_once(const std::string& error) {
    auto client = m_daemon->connect();
    NodeInfo seen;
    for (auto until = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < until;) {
      auto nodes = client->nodes();
      if (nodes.ok() && nodes->size() == 2) seen = (*nodes)[1];
      if (seen.last_error == error) break;
      std::this_thread::sleep_for(50ms);
    }
    return seen;
  }

  std::string m_dir, m_secret_path;
  int m_port1 = 0, m_port2 = 0;
  ClusterSecret m_secret;
  std::unique_ptr<test::TestDaemon> m_daemon;
};

// The test says hello to node 1 as node 2 on another fabric: refused in the
// words of node 2, which reads the answer; a hello with no fabric (a node
// from before libfabric: UCX) is taken.
TEST_F(MixedFabricTest, AHelloFromAnotherFabricIsRefused) {
  start_node1();
  const auto hello = [&](const std::string& fabric, proto::Response* r) {
    const int fd = tcp_connect(m_port1);
    ASSERT_GE(fd, 0);
    const std::string nonce(k_nonce_bytes, 'a');
    proto::Request challenge;
    challenge.mutable_peer_challenge()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    challenge.mutable_peer_challenge()->set_node_id(2);
    challenge.mutable_peer_challenge()->set_nonce(nonce);
    proto::Response c;
    ASSERT_TRUE(exchange(fd, challenge, &c));
    ASSERT_EQ(c.status().code(), 0u) << c.status().message();
    proto::Request h;
    h.mutable_peer_hello()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
    h.mutable_peer_hello()->mutable_self()->set_node_id(2);
    h.mutable_peer_hello()->mutable_self()->set_fabric(fabric);
    h.mutable_peer_hello()->set_proof(m_secret.proof("client", 2, 1, nonce, c.peer_challenge().nonce()));
    ASSERT_TRUE(exchange(fd, h, r));
    if (r->status().code() != 0) {
      char byte;
      EXPECT_EQ(::recv(fd, &byte, 1, 0), 0) << "a refused hello closes the connection";
    }
    ::close(fd);
  };
  proto::Response refused;
  hello(k_other_fabric, &refused);
  EXPECT_EQ(refused.status().code(), static_cast<uint32_t>(ErrorCode::config_error));
  EXPECT_EQ(refused.status().message(), refusal(1, "ucx", k_other_fabric));
  proto::Response older;
  hello("", &older);
  EXPECT_EQ(older.status().code(), 0u) << older.status().message();
  EXPECT_EQ(older.peer_hello().self().fabric(), "ucx") << "node 1 says which fabric it runs";
}

// Node 1 opens its link to the test, which answers as node 2 on another
// fabric: node 1 refuses it and shows it DOWN with the reason.
TEST_F(MixedFabricTest, AnAnswerFromAnotherFabricIsRefused) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr = loopback(m_port2);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(listener, 8), 0);
  std::atomic<bool> stop{false};
  std::atomic<int> hellos{0};
  std::thread node2([&] {
    while (!stop) {
      pollfd p{listener, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::string payload;
      proto::Request challenge, hello;
      if (wire::recv_frame(fd, 1 << 24, &payload, nullptr).ok() && challenge.ParseFromString(payload) &&
          challenge.has_peer_challenge()) {
        const std::string nonce(k_nonce_bytes, 'b');
        proto::Response r;
        r.set_id(challenge.id());
        r.mutable_peer_challenge()->set_node_id(2);
        r.mutable_peer_challenge()->set_nonce(nonce);
        r.mutable_peer_challenge()->set_proof(m_secret.proof("server", 1, 2, challenge.peer_challenge().nonce(), nonce));
        proto::Response answer;
        answer.set_id(0);
        if (exchange(fd, r, &hello) && hello.has_peer_hello()) {
          answer.set_id(hello.id());
          answer.mutable_peer_hello()->mutable_self()->set_node_id(2);
          answer.mutable_peer_hello()->mutable_self()->set_incarnation(7);
          answer.mutable_peer_hello()->mutable_self()->set_fabric("libfabric/shm");
          (void)wire::send_frame(fd, answer.SerializeAsString());
          ++hellos;
        }
      }
      ::close(fd);
    }
  });
  start_node1();
  const std::string why = refusal(2, "libfabric/shm", "ucx");
  const NodeInfo seen = node2_once(why);
  // While the test still answers as node 2 (once it is gone, the next try
  // is refused by the kernel instead).
  auto ctl = test::run_ctl(m_daemon->socket(), {"nodes"});
  stop = true;
  node2.join();
  ::close(listener);
  EXPECT_GT(hellos.load(), 0) << "node 1 never said hello:\n" << m_daemon->log();
  EXPECT_EQ(seen.state, NodeState::down) << node_state_name(seen.state);
  EXPECT_EQ(seen.last_error, why);
  EXPECT_EQ(seen.incarnation, 0u) << "never taken for a peer";
  EXPECT_NE(ctl.out.find(why), std::string::npos) << ctl.out << ctl.err;
}

// Two real daemons, node 1 on UCX and node 2 on libfabric over TCP: they
// never connect, and each shows the other DOWN with the reason, in its
// nodes view, in tiermemctl nodes and in what a request to the other gets.
TEST(MixedClusterTest, NodesOnTwoFabricsNeverConnectAndSayWhy) {
  test::TestCluster cluster(2, test::DaemonOptions{}, [](int) { return "127.0.0.1:" + std::to_string(test::free_port()); },
                            [](int id, test::DaemonOptions& o) {
                              if (id != 2) return;
                              o.fabric = "libfabric";
                              o.provider = "tcp;ofi_rxm";
                            });
  ASSERT_TRUE(cluster.ready()) << "both nodes start (the refusal comes at the hello)\n" << cluster.logs();
  const std::string from1 = refusal(2, k_other_fabric, "ucx");
  const std::string from2 = refusal(1, "ucx", k_other_fabric);
  // Several reconnect intervals (200 ms): every attempt is refused.
  std::string seen1, seen2;
  for (auto until = std::chrono::steady_clock::now() + 3s; std::chrono::steady_clock::now() < until;) {
    for (int id : {1, 2}) {
      auto client = cluster.node(id).connect();
      ASSERT_NE(client, nullptr);
      auto nodes = client->nodes();
      ASSERT_TRUE(nodes.ok()) << nodes.status().to_string();
      ASSERT_EQ(nodes->size(), 2u);
      const NodeInfo& other = (*nodes)[1];  // this node first, then its peer
      ASSERT_NE(other.state, NodeState::connected) << "node " << id << " took a peer on another fabric";
      (id == 1 ? seen1 : seen2) = other.last_error;
    }
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_EQ(seen1, from1) << cluster.logs();
  EXPECT_EQ(seen2, from2) << cluster.logs();
  auto client = cluster.node(1).connect();
  auto nodes = client->nodes();
  ASSERT_TRUE(nodes.ok());
  EXPECT_EQ((*nodes)[1].state, NodeState::down);
  auto ctl = test::run_ctl(cluster.node(1).socket(), {"nodes"});
  EXPECT_NE(ctl.out.find(from1), std::string::npos) << ctl.out << ctl.err;
  auto status = test::run_ctl(cluster.node(2).socket(), {"status"});
  EXPECT_NE(status.out.find("data plane: libfabric/tcp;ofi_rxm"), std::string::npos) << status.out << status.err;
  auto there = client->alloc(4096, {.node = 2});
  ASSERT_FALSE(there.ok()) << "an allocation on a node that is not a peer";
  EXPECT_NE(there.status().message().find("a cluster uses one fabric"), std::string::npos) << there.status().to_string();
}

}  // namespace
}  // namespace tiermem
