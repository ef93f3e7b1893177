// Three real daemons on this machine form one address space. Run with UCX over
// TCP and over shared memory: cross-node alloc, one-sided reads and writes,
// atomics, exact sums of concurrent fetch-adds from several processes, and a
// peer that is killed and restarted.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

test::DaemonOptions options(const std::string& tls) {
  test::DaemonOptions o;
  o.tls = tls;
  o.page_size = "64KiB";
  o.dram = "32MiB";
  o.pmem = "16MiB";
  return o;
}

class ClusterTest : public ::testing::TestWithParam<std::string> {
 protected:
  // "tcp": the nodes stand for hosts of their own, and clients reach other
  // nodes' memory through the data plane (UCX over TCP). "sm": daemons of one
  // host (UCX's shared memory between them), whose clients map the memory of
  // every daemon of the host from the files each hands them.
  void SetUp() override {
    ::setenv("UCX_TLS", GetParam().c_str(), 1);
    if (GetParam() == "tcp") ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);
    m_cluster = std::make_unique<test::TestCluster>(3, options(GetParam()));
    ASSERT_TRUE(m_cluster->ready()) << m_cluster->logs();
    ASSERT_TRUE(m_cluster->wait_connected()) << m_cluster->logs();
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "%s\n", m_cluster->logs().c_str());
    m_cluster.reset();
    ::unsetenv("UCX_TLS");
    ::unsetenv("TIERMEM_MAP_SAME_HOST");
  }
  std::unique_ptr<test::TestCluster> m_cluster;
};

TEST_P(ClusterTest, CrossNodeAllocWriteReadAndAtomics) {
  auto client = m_cluster->node(1).connect("cross-node");
  ASSERT_NE(client, nullptr);
  for (NodeId home : {NodeId{2}, NodeId{3}}) {
    auto a = client->alloc(300 << 10, {.tier = Tier::dram, .node = home});
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(a->gva.node, home);
    const auto data = test::pattern(300 << 10, home);
    ASSERT_TRUE(client->write(a->gva, data.data(), data.size()).ok());
    std::vector<unsigned char> back(data.size());
    Status rs = client->read(a->gva, back.data(), back.size());
    ASSERT_TRUE(rs.ok()) << rs.to_string();
    EXPECT_EQ(back, data);
    // A client of the home node sees the same bytes through its own path.
    auto local = m_cluster->node(home).connect("home");
    std::vector<unsigned char> there(data.size());
    ASSERT_TRUE(local->read(a->gva, there.data(), there.size()).ok());
    EXPECT_EQ(there, data);
    auto t = client->translate(a->gva.plus(70 << 10));
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->page.node, home);
    EXPECT_EQ(t->page.tier, Tier::dram);
  }
  // Both nodes' memory was written and read directly, never through a
  // daemon: over TCP as checked messages to the home, between daemons of
  // one host mapped.
  const auto direct = [&](const AccessCounters& c) { return GetParam() == "tcp" ? c.message : c.direct_remote; };
  const auto other = [&](const AccessCounters& c) { return GetParam() == "tcp" ? c.direct_remote : c.message; };
  EXPECT_EQ(direct(client->access_counters()), 4u);
  EXPECT_EQ(other(client->access_counters()), 0u);
  EXPECT_EQ(client->access_counters().through_daemon, 0u);
  for (bool coherent : {true, false}) {
    auto counter = client->alloc(4096, {.tier = Tier::dram, .node = 2, .coherent = coherent});
    ASSERT_TRUE(counter.ok());
    auto old = client->fetch_add(counter->gva.plus(8), 5);
    ASSERT_TRUE(old.ok()) << old.status().to_string();
    EXPECT_EQ(*old, 0u);
    EXPECT_EQ(*client->fetch_add(counter->gva.plus(8), 7), 5u);
    auto swapped = client->compare_swap(counter->gva.plus(8), 12, 100);
    ASSERT_TRUE(swapped.ok());
    EXPECT_EQ(*swapped, 12u);
    auto refused = client->compare_swap(counter->gva.plus(8), 12, 200);
    EXPECT_EQ(*refused, 100u) << "the word is 100 now: no swap";
    uint64_t word = 0;
    ASSERT_TRUE(client->read(counter->gva.plus(8), &word, 8).ok());
    EXPECT_EQ(word, 100u);
    EXPECT_EQ(client->fetch_add(counter->gva.plus(4), 1).status().code(), ErrorCode::invalid_argument);
  }
  // Eight atomics and two reads more, all on the same path.
  EXPECT_EQ(direct(client->access_counters()), 4u + 10u);
  EXPECT_EQ(other(client->access_counters()), 0u);
  EXPECT_EQ(client->access_counters().through_daemon, 0u);
  auto nodes = client->nodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 3u);
  EXPECT_EQ((*nodes)[0].state, NodeState::self);
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ((*nodes)[i].state, NodeState::connected);
    EXPECT_FALSE((*nodes)[i].transports.empty());
  }
}

TEST_P(ClusterTest, CliWorksAcrossNodes) {
  const std::string sock = m_cluster->node(3).socket();
  auto alloc = test::run_ctl(sock, {"--node", "1", "alloc", "100KiB", "--tier", "pmem"});
  ASSERT_EQ(alloc.exit_code, 0) << alloc.err;
  std::string gva = alloc.out.substr(0, alloc.out.find('\n'));
  EXPECT_EQ(gva.substr(0, 5), "0001:");
  ASSERT_EQ(test::run_ctl(sock, {"write", gva, "-"}, "over the wire").exit_code, 0);
  auto read = test::run_ctl(m_cluster->node(2).socket(), {"read", gva, "13"});
  EXPECT_EQ(read.out, "over the wire") << read.err;
  auto nodes = nlohmann::json::parse(test::run_ctl(sock, {"--json", "nodes"}).out);
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[0]["node"], 3);
  EXPECT_EQ(nodes[0]["state"], "self");
  EXPECT_EQ(nodes[1]["state"], "connected");
  auto migrate = test::run_ctl(sock, {"migrate", gva, "--tier", "dram", "--to-node", "2"});
  ASSERT_EQ(migrate.exit_code, 0) << migrate.err;
  auto t = nlohmann::json::parse(test::run_ctl(sock, {"--json", "translate", gva}).out);
  EXPECT_EQ(t["page"]["node"], 2);
  EXPECT_EQ(t["page"]["tier"], "dram");
  EXPECT_EQ(test::run_ctl(sock, {"read", gva, "13"}).out, "over the wire");
  auto ls = nlohmann::json::parse(test::run_ctl(sock, {"--json", "--node", "1", "ls"}).out);
  ASSERT_EQ(ls.size(), 1u);
  auto bad = test::run_ctl(sock, {"--node", "9", "status"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("node 9 is not in the cluster"), std::string::npos) << bad.err;
}

// Several processes, on several nodes, add to the same words at once.
TEST_P(ClusterTest, ConcurrentFetchAddsFromSeveralProcessesSumExactly) {
  auto owner = m_cluster->node(2).connect("owner");
  auto coherent = owner->alloc(4096, {.tier = Tier::dram, .coherent = true});
  auto locked = owner->alloc(4096, {.tier = Tier::dram});
  ASSERT_TRUE(coherent.ok() && locked.ok());
  constexpr int k_processes = 4;
  constexpr int k_adds = 300;
  std::vector<pid_t> children;
  for (int p = 0; p < k_processes; ++p) {
    const int node = 1 + p % 3;  // clients on every node, the home one included
    const pid_t pid = ::fork();
    if (pid == 0) {
      auto c = m_cluster->node(node).connect("adder");
      if (!c) ::_exit(2);
      for (int i = 0; i < k_adds; ++i) {
        if (!c->fetch_add(coherent->gva, 1).ok()) ::_exit(3);
        if (!c->fetch_add(locked->gva.plus(64), 3).ok()) ::_exit(4);
      }
      ::_exit(0);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "adder exited with " << status;
  }
  uint64_t a = 0, b = 0;
  ASSERT_TRUE(owner->read(coherent->gva, &a, 8).ok());
  ASSERT_TRUE(owner->read(locked->gva.plus(64), &b, 8).ok());
  EXPECT_EQ(a, uint64_t{k_processes} * k_adds);
  EXPECT_EQ(b, uint64_t{k_processes} * k_adds * 3);
}

// Clients on another node are killed in the middle of remote reads and
// atomics, over and over: the home daemon answers the next request as if
// nothing happened and its memory is intact. (Over TCP, UCX 1.13's own
// emulation of one-sided operations aborts the answering daemon here; run
// with TIERMEM_RMA_EMULATION=ucx to see it.)
TEST_P(ClusterTest, ClientsKilledMidOperationLeaveTheHomeDaemonServing) {
  // Over "sm" the clients map the home's memory (no UCX between a client and
  // a daemon, so no receive FIFO of the daemon's for a killed sender to
  // wedge); page locks a killed client held are the home's to break.
  auto owner = m_cluster->node(2).connect("owner");
  auto block = owner->alloc(2 << 20, {.tier = Tier::dram});
  auto counter = owner->alloc(4096, {.tier = Tier::dram, .coherent = true});
  ASSERT_TRUE(block.ok() && counter.ok());
  const auto data = test::pattern(2 << 20, 7);
  ASSERT_TRUE(owner->write(block->gva, data.data(), data.size()).ok());
  std::mt19937 rng(11);
  for (int round = 0; round < 16; ++round) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      auto c = m_cluster->node(round % 2 == 0 ? 1 : 3).connect("doomed");
      if (!c) ::_exit(2);
      std::vector<unsigned char> back(data.size());
      for (;;) {
        // Many small reads keep requests in flight all the time.
        for (size_t off = 0; off < back.size(); off += 64 << 10) {
          const Status s = c->read(block->gva.plus(off), back.data() + off, 64 << 10);
          if (!s.ok()) {
            std::fprintf(stderr, "doomed client: read: %s\n", s.to_string().c_str());
            ::_exit(3);
          }
        }
        const auto added = c->fetch_add(counter->gva, 1);
        if (!added.ok()) {
          std::fprintf(stderr, "doomed client: fetch_add: %s\n", added.status().to_string().c_str());
          ::_exit(4);
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(40 + rng() % 60));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the client stopped on its own: " << status;
    for (NodeId n : {NodeId{1}, NodeId{2}, NodeId{3}}) {
      ASSERT_TRUE(m_cluster->node(n).alive()) << "round " << round << ": " << m_cluster->logs();
    }
  }
  // Another remote client still gets every byte.
  auto other = m_cluster->node(3).connect("survivor");
  std::vector<unsigned char> back(data.size());
  const Status got = other->read(block->gva, back.data(), back.size());
  ASSERT_TRUE(got.ok()) << got.to_string();
  EXPECT_EQ(back, data);
  auto added = other->fetch_add(counter->gva, 1);
  ASSERT_TRUE(added.ok()) << added.status().to_string();
  EXPECT_GT(*added, 0u) << "the killed clients did add";
  for (NodeId n : {NodeId{1}, NodeId{2}, NodeId{3}}) EXPECT_TRUE(m_cluster->node(n).alive()) << m_cluster->logs();
}

// A remote write is one message that its home runs only once all of it has
// arrived (large ones by rendezvous into a staging buffer): a writer killed
// while its bytes are on the way leaves the page as it was, never half
// written, and never locked.
TEST_P(ClusterTest, WritersKilledMidSendLeaveEveryRemoteWriteWholeOrAbsent) {
  if (GetParam() == "sm") GTEST_SKIP() << "a client killed mid-send wedges UCX mm's receive FIFO (see above)";
  auto owner = m_cluster->node(2).connect("owner");
  auto block = owner->alloc(2 << 20, {.tier = Tier::dram});
  ASSERT_TRUE(block.ok());
  std::vector<uint64_t> words(block->size / 8, 0);
  ASSERT_TRUE(owner->write(block->gva, words.data(), block->size).ok());
  std::mt19937 rng(29);
  for (int round = 0; round < 12; ++round) {
    // The writer says when its first write is done: it is killed while it
    // sends, not during UCX's wire-up (a client killed there can abort its
    // home daemon in UCX 1.13, a known bug the test above is exposed to).
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(ready[0]);
      auto c = m_cluster->node(round % 2 == 0 ? 1 : 3).connect("doomed");
      if (!c) ::_exit(2);
      std::vector<uint64_t> mine(words.size());
      for (uint64_t n = 1;; ++n) {
        std::fill(mine.begin(), mine.end(), (uint64_t(round + 1) << 32) | n);
        const Status s = c->write(block->gva, mine.data(), block->size);
        if (!s.ok()) {
          std::fprintf(stderr, "doomed writer: %s\n", s.to_string().c_str());
          ::_exit(3);
        }
        if (n == 1) (void)!::write(ready[1], "w", 1);
      }
    }
    ::close(ready[1]);
    char w = 0;
    pollfd p{ready[0], POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 10000), 1) << "round " << round << ": the writer never wrote";
    ASSERT_EQ(::read(ready[0], &w, 1), 1);
    ::close(ready[0]);
    std::this_thread::sleep_for(std::chrono::milliseconds(1 + rng() % 40));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer stopped on its own: " << status;
    const Status got = owner->read(block->gva, words.data(), block->size);
    ASSERT_TRUE(got.ok()) << "round " << round << ": " << got.to_string();
    for (size_t i = 1; i < words.size(); ++i) {
      ASSERT_EQ(words[i], words[0]) << "round " << round << ": the block is torn at word " << i;
    }
    EXPECT_TRUE(words[0] == 0 || (words[0] >> 32) <= uint64_t(round + 1)) << std::hex << words[0];
    EXPECT_EQ(words[0] >> 32, uint64_t(round + 1)) << "round " << round << ": its acknowledged first write is gone";
    for (NodeId n : {NodeId{1}, NodeId{2}, NodeId{3}}) {
      ASSERT_TRUE(m_cluster->node(n).alive()) << "round " << round << ": " << m_cluster->logs();
    }
  }
  // A remote client still writes and reads there.
  auto other = m_cluster->node(3).connect("survivor");
  std::fill(words.begin(), words.end(), 0x5eed);
  ASSERT_TRUE(other->write(block->gva, words.data(), block->size).ok());
  std::vector<uint64_t> back(words.size());
  ASSERT_TRUE(other->read(block->gva, back.data(), block->size).ok());
  EXPECT_EQ(back, words);
}

TEST_P(ClusterTest, KilledPeerIsSeenDownAndRejoinsAfterRestart) {
  auto client = m_cluster->node(1).connect("watcher");
  auto old = client->alloc(4096, {.node = 3});
  ASSERT_TRUE(old.ok());
  ASSERT_TRUE(client->write(old->gva, "early", 5).ok());
  const uint64_t before = (*client->nodes())[2].incarnation;
  m_cluster->node(3).kill();
  bool down = false;
  for (int i = 0; i < 100 && !down; ++i) {
    down = (*client->nodes())[2].state != NodeState::connected;
    if (!down) std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(down) << "node 1 never noticed that node 3 died";
  auto failed = client->alloc(4096, {.node = 3});
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), ErrorCode::connection_failed);
  EXPECT_NE(failed.status().message().find("node 3"), std::string::npos) << failed.status().message();
  // The others keep serving each other meanwhile.
  auto on2 = client->alloc(4096, {.node = 2});
  ASSERT_TRUE(on2.ok()) << on2.status().to_string();
  ASSERT_TRUE(client->write(on2->gva, "still here", 10).ok());

  ASSERT_TRUE(m_cluster->node(3).restart()) << m_cluster->node(3).log();
  ASSERT_TRUE(m_cluster->wait_connected()) << m_cluster->logs();
  auto nodes = client->nodes();
  EXPECT_NE((*nodes)[2].incarnation, before) << "a restart is a new incarnation";
  auto again = client->alloc(4096, {.node = 3});
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  Status wrote = client->write(again->gva, "back", 4);
  ASSERT_TRUE(wrote.ok()) << wrote.to_string();
  char back[4];
  ASSERT_TRUE(client->read(again->gva, back, 4).ok());
  EXPECT_EQ(std::string(back, 4), "back");
  // The allocation made before the crash is served again by the new
  // incarnation (durable metadata, shared memory taken over), bytes and all.
  char was[5];
  Status s = client->read(old->gva, was, 5);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(std::string(was, 5), "early");
}

INSTANTIATE_TEST_SUITE_P(Transports, ClusterTest, ::testing::Values("tcp", "sm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tiermem
