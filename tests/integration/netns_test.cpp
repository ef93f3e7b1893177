// Daemons in separate network namespaces joined by veth pairs to a bridge:
// one address space across a real (virtual) network, and a network partition
// made and healed with `ip link`. Needs root and iproute2; exits 77
// (skipped) saying why otherwise.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <thread>

#include "tests/support/exec_rank.hpp"
#include "tests/support/netns.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

using test::Network;

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_net = std::make_unique<Network>(3);
    ASSERT_TRUE(m_net->ok()) << "could not build the namespaces";
    m_dir = test::make_temp_dir("tiermem-netns");
  }
  // Three daemons, one per namespace; `fast`: heartbeats every 20 ms and
  // UNREACHABLE after 300 ms (replication's drop after 600 ms).
  void start(bool fast) {
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
      o.page_size = "64KiB";
      o.dram = "16MiB";
      o.pmem = "8MiB";
      if (fast) {
        o.cluster_timing = "reconnect_interval_ms = 20\nheartbeat_interval_ms = 20\npeer_timeout_ms = 200\n";
        o.extra_toml = "[health]\nunreachable_after_ms = 300\n[replication]\nrepair_interval_ms = 50\n"
                       "orphan_min_age_ms = 500\n";
      }
      m_net->place(i, o);
      m_daemons.push_back(std::make_unique<test::TestDaemon>(o));
      ASSERT_TRUE(m_daemons.back()->ready()) << m_daemons.back()->log();
    }
    // This process reaches the namespaces through the bridge.
    m_net->use_bridge();
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

  // Replicated allocations of k_size bytes, every word one number.
  static constexpr size_t k_size = 64 << 10;
  static std::vector<uint64_t> filled(uint64_t seq) { return std::vector<uint64_t>(k_size / 8, seq); }
  static bool wait_for(const std::function<bool()>& done, std::chrono::milliseconds limit) {
    for (auto end = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < end;) {
      if (done()) return true;
      std::this_thread::sleep_for(20ms);
    }
    return done();
  }
  // A client on node 1 once it sees nodes 2 and 3 healthy, and in *a an
  // allocation of k_size homed there with one copy (null on failure).
  std::unique_ptr<Client> home_with_one_copy(std::optional<AllocationInfo>* a) {
    auto home = m_daemons[0]->connect("home");
    if (home == nullptr || !wait_for([&] {
          return test::health_of(*home, 2) == NodeHealth::healthy && test::health_of(*home, 3) == NodeHealth::healthy;
        }, 20s)) {
      ADD_FAILURE() << "node 1 never saw nodes 2 and 3 healthy";
      return nullptr;
    }
    auto made = home->alloc(k_size, {.tier = Tier::dram, .replicas = 1});
    if (!made.ok()) {
      ADD_FAILURE() << made.status().to_string();
      return nullptr;
    }
    *a = *made;
    return home;
  }
  // Whether `gva` (homed where `home` asks) has exactly one copy in sync and
  // it holds `seq` in every word; *torn counts words that differ from the
  // copy's first.
  bool one_copy_holds(Client& home, Gva gva, uint64_t seq, int* torn = nullptr) {
    auto t = home.translate(gva);
    if (!t.ok()) return false;
    size_t in_sync = 0;
    for (const ReplicaInfo& r : t->allocation.replicas) {
      if (r.state != ReplicaState::in_sync) continue;
      ++in_sync;
      auto near = m_daemons[r.node - 1]->connect("copy");
      std::vector<uint64_t> copy(k_size / 8);
      if (!near || !near->read(r.gva, copy.data(), k_size).ok()) return false;
      if (torn != nullptr) {
        for (uint64_t w : copy) *torn += w != copy[0] ? 1 : 0;
      }
      if (copy != filled(seq)) return false;
    }
    return in_sync == 1;
  }

  std::unique_ptr<Network> m_net;
  std::string m_dir;
  std::vector<std::unique_ptr<test::TestDaemon>> m_daemons;
};

TEST_F(NetnsTest, OneAddressSpaceAcrossNamespacesAndAPartitionHeals) {
  start(false);
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

// A client waiting on a node that is cut off is told once its daemon sees
// the node UNREACHABLE, not when TCP or the operation's own timeout (10 s)
// gives up; after the heal it reaches the node again.
TEST_F(NetnsTest, AWaitOnACutOffNodeEndsWhenItsDaemonSeesItUnreachable) {
  start(true);  // UNREACHABLE 300 ms after the last answered heartbeat
  auto client = m_daemons[0]->connect("waiter");
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(wait_state(*client, 3, NodeState::connected, 20s));
  auto a = client->alloc(64 << 10, {.node = 3});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  std::vector<char> out(64 << 10, 'w'), back(64 << 10);
  ASSERT_TRUE(client->write(a->gva, out.data(), out.size()).ok());
  ASSERT_TRUE(client->read(a->gva, back.data(), back.size()).ok());
  // Over TCP: checked messages to node 3, not the daemon.
  EXPECT_EQ(client->access_counters().message, 2u) << "the write and read go to node 3 through the data plane";
  EXPECT_EQ(client->access_counters().through_daemon, 0u);

  ASSERT_TRUE(m_net->link(3, false));
  const auto cut = std::chrono::steady_clock::now();
  Status s = client->read(a->gva, back.data(), back.size());
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  EXPECT_FALSE(s.ok()) << "read memory of a node that is cut off";
  EXPECT_LT(waited, 3.0) << "the wait lasted as long as the operation's timeout: " << s.to_string();
  EXPECT_NE(s.message().find("node 3"), std::string::npos) << s.to_string();
  std::printf("read of a cut-off node's memory failed after %.0f ms: %s\n", waited * 1e3, s.to_string().c_str());

  ASSERT_TRUE(m_net->link(3, true));
  bool back_again = false;
  for (auto end = std::chrono::steady_clock::now() + 30s; !back_again && std::chrono::steady_clock::now() < end;) {
    back_again = client->read(a->gva, back.data(), back.size()).ok();
    if (!back_again) std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(back_again) << "node 3's memory is out of reach after the heal";
  EXPECT_EQ(back, out);
}

// Replicated memory across a real partition (docs/ARCHITECTURE.md,
// "Replicated memory"). The node holding the copy is cut off: the home's
// side (a majority) writes on once the copy is dropped and makes a new one,
// the cut-off node serves nothing. After the heal its dropped copy is freed
// and every copy equals the home. Then the home is cut off alone: it writes
// nothing, while the majority reads the last acknowledged write from the
// copy; after the heal the home writes again and the copy follows.
TEST_F(NetnsTest, OnlyTheSideWithTheHomeAndAMajorityWritesAndTheCopiesConverge) {
  start(true);
  // A client that reaches memory only through `node`'s daemon: it is on that
  // side of the partition (this process itself reaches every namespace).
  auto through = [&](int node) {
    auto c = Client::connect({.socket_path = m_daemons[static_cast<size_t>(node - 1)]->socket(),
                              .client_name = "side", .direct_access = false});
    return c.ok() ? std::move(c).value() : nullptr;
  };
  std::optional<AllocationInfo> a;
  auto home = home_with_one_copy(&a);
  ASSERT_TRUE(home != nullptr && a.has_value());
  const int holder = static_cast<int>(a->replicas.at(0).node), other = 5 - holder;
  uint64_t acked = 1;
  ASSERT_TRUE(home->write(a->gva, filled(acked).data(), k_size).ok());

  // --- the copy's node cut off ---
  ASSERT_TRUE(m_net->link(holder, false));
  ASSERT_TRUE(wait_for([&] { return test::health_of(*home, static_cast<NodeId>(holder)) == NodeHealth::unreachable; },
                       10s));
  int refused = 0;
  ASSERT_TRUE(wait_for([&] {
    Status w = home->write(a->gva, filled(acked + 1).data(), k_size);
    if (w.ok()) return ++acked, true;
    EXPECT_EQ(w.code(), ErrorCode::unavailable) << w.to_string();
    ++refused;
    return false;
  }, 10s)) << "the home's side never wrote on";
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(home->write(a->gva, filled(++acked).data(), k_size).ok());
  std::printf("copy cut off: %d write(s) refused before it was dropped\n", refused);
  auto cut = through(holder);
  ASSERT_NE(cut, nullptr);
  std::vector<uint64_t> got(k_size / 8);
  EXPECT_FALSE(cut->read(a->gva, got.data(), k_size).ok()) << "the cut-off node served a read";
  EXPECT_FALSE(cut->write(a->gva, filled(999).data(), k_size).ok()) << "the cut-off node took a write";
  // A new copy on the node that is left.
  ASSERT_TRUE(wait_for([&] {
    auto t = home->translate(a->gva);
    if (!t.ok()) return false;
    for (const ReplicaInfo& r : t->allocation.replicas) {
      if (static_cast<int>(r.node) == other && r.state == ReplicaState::in_sync) return true;
    }
    return false;
  }, 10s)) << "no new copy on node " << other;

  // --- heal ---
  ASSERT_TRUE(m_net->link(holder, true));
  ASSERT_TRUE(wait_for([&] { return test::health_of(*home, static_cast<NodeId>(holder)) == NodeHealth::healthy; }, 30s));
  auto copies_there = [&](int node) {
    auto list = home->list(static_cast<NodeId>(node));
    size_t n = 0;
    if (list.ok()) {
      for (const AllocationInfo& i : *list) n += i.replica_of == a->gva ? 1 : 0;
    }
    return n;
  };
  EXPECT_TRUE(wait_for([&] { return copies_there(holder) == 0; }, 10s)) << "the dropped copy was never freed";
  ASSERT_TRUE(cut->read(a->gva, got.data(), k_size).ok());
  EXPECT_EQ(got, filled(acked)) << "after the heal the cut-off node reads the last acknowledged write";
  // Every copy in sync holds the last acknowledged write (a dropped one is
  // listed as dropped until the repair loop forgets it).
  auto converged = [&] { return one_copy_holds(*home, a->gva, acked); };
  EXPECT_TRUE(converged()) << "a copy differs from its home";

  // --- the home cut off alone ---
  auto majority = through(other);
  ASSERT_NE(majority, nullptr);
  ASSERT_TRUE(m_net->link(1, false));
  ASSERT_TRUE(wait_for([&] { return test::health_of(*majority, 1) == NodeHealth::unreachable; }, 10s));
  int written = 0;
  for (auto end = std::chrono::steady_clock::now() + 1500ms; std::chrono::steady_clock::now() < end;) {
    written += home->write(a->gva, filled(acked + 1).data(), k_size).ok() ? 1 : 0;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(written, 0) << "a home without a majority acknowledged writes (past the drop time)";
  ASSERT_TRUE(wait_for([&] { return majority->read(a->gva, got.data(), k_size).ok(); }, 5s))
      << "the majority could not read the copy";
  EXPECT_EQ(got, filled(acked)) << "the copy did not serve the last acknowledged write";
  ASSERT_TRUE(m_net->link(1, true));
  ASSERT_TRUE(wait_for([&] {
    if (!home->write(a->gva, filled(acked + 1).data(), k_size).ok()) return false;
    ++acked;
    return true;
  }, 30s)) << "the home never wrote again after the heal";
  EXPECT_TRUE(wait_for(converged, 10s)) << "the copies did not converge after the heal";
}

// A link that flaps: the copy's node's veth goes down and up every 50-300
// ms (random) for TIERMEM_FLAP_SECONDS (15 s by default; the run is
// a minute) while the home takes writes of increasing numbers. Every write
// is acknowledged or refused, never lost: after the heal every copy in sync
// equals the home, which holds the last acknowledged number, and with the
// home then cut off alone the majority reads exactly that number from the
// copy.
TEST_F(NetnsTest, ALinkThatFlapsLosesNoAcknowledgedWrite) {
  start(true);
  std::optional<AllocationInfo> a;
  auto home = home_with_one_copy(&a);
  ASSERT_TRUE(home != nullptr && a.has_value());
  const int holder = static_cast<int>(a->replicas.at(0).node), other = 5 - holder;
  uint64_t next = 1, acked = 0;
  int refused = 0, torn = 0;
  const auto write = [&] {
    const uint64_t seq = next++;
    Status w = home->write(a->gva, filled(seq).data(), k_size);
    if (w.ok()) {
      acked = seq;
      return true;
    }
    if (w.code() != ErrorCode::unavailable && w.code() != ErrorCode::timeout &&
        w.code() != ErrorCode::transport_error && w.code() != ErrorCode::connection_failed) {
      ADD_FAILURE() << "a write failed unlike a refusal: " << w.to_string();
    }
    ++refused;
    return false;
  };
  ASSERT_TRUE(write());

  const char* env = std::getenv("TIERMEM_FLAP_SECONDS");
  const int seconds = env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 15;
  std::atomic<bool> flapping{true};
  int flaps = 0;
  std::thread flapper([&] {
    std::mt19937 rng(12345);
    std::uniform_int_distribution<int> wait_ms(50, 300);
    bool up = true;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms(rng)));
      up = !up;
      if (!m_net->link(holder, up)) ADD_FAILURE() << "ip link failed";
      ++flaps;
    }
    if (!up) (void)m_net->link(holder, true);
    flapping = false;
  });
  while (flapping) {
    (void)write();
    std::this_thread::sleep_for(2ms);
  }
  flapper.join();
  std::printf("%d flaps of node %d's link in %d s: %llu write(s) acknowledged, %d refused\n", flaps, holder, seconds,
              static_cast<unsigned long long>(acked), refused);

  // Healed: the home writes again, and its copies converge on it.
  ASSERT_TRUE(wait_for([&] {
    return test::health_of(*home, static_cast<NodeId>(holder)) == NodeHealth::healthy &&
           test::health_of(*home, static_cast<NodeId>(other)) == NodeHealth::healthy;
  }, 30s));
  ASSERT_TRUE(wait_for(write, 30s)) << "the home never wrote again after the flapping";
  std::vector<uint64_t> got(k_size / 8);
  ASSERT_TRUE(home->read(a->gva, got.data(), k_size).ok());
  EXPECT_EQ(got, filled(acked)) << "the home does not hold the last acknowledged write";
  auto converged = [&] { return one_copy_holds(*home, a->gva, acked, &torn); };
  EXPECT_TRUE(wait_for(converged, 20s)) << "the copies did not converge on the home";
  EXPECT_EQ(torn, 0) << "a copy held a torn write";

  // The home cut off alone: the majority reads the last acknowledged write.
  auto t = home->translate(a->gva);
  ASSERT_TRUE(t.ok());
  int copy_node = 0;
  for (const ReplicaInfo& r : t->allocation.replicas) {
    if (r.state == ReplicaState::in_sync) copy_node = static_cast<int>(r.node);
  }
  ASSERT_NE(copy_node, 0);
  auto majority = Client::connect({.socket_path = m_daemons[static_cast<size_t>(copy_node - 1)]->socket(),
                                   .client_name = "majority", .direct_access = false});
  ASSERT_TRUE(majority.ok()) << majority.status().to_string();
  ASSERT_TRUE(m_net->link(1, false));
  ASSERT_TRUE(wait_for([&] { return test::health_of(**majority, 1) == NodeHealth::unreachable; }, 10s));
  ASSERT_TRUE(wait_for([&] { return (*majority)->read(a->gva, got.data(), k_size).ok(); }, 5s))
      << "the majority could not read the copy";
  EXPECT_EQ(got, filled(acked)) << "an acknowledged write was lost: the copy holds " << got[0] << ", the last "
                                << "acknowledged was " << acked;
  ASSERT_TRUE(m_net->link(1, true));
}

// A training job under a flapping link: one rank on node 1 with --replicas 1
// (the snapshot of every step also on another node, committed once it is
// whole there) while the copy's node's link goes down and up every 50-300 ms
// (random) until the job ends. It finishes, and every loss is the
// undisturbed run's.
TEST_F(NetnsTest, ATrainingJobUnderAFlappingLinkFinishesWithTheUndisturbedLosses) {
  start(true);
  auto watch = m_daemons[0]->connect("watch");
  ASSERT_NE(watch, nullptr);
  ASSERT_TRUE(wait_for([&] {
    return test::health_of(*watch, 2) == NodeHealth::healthy && test::health_of(*watch, 3) == NodeHealth::healthy;
  }, 20s));
  const auto args = [&](const std::string& job) {
    return std::vector<std::string>{TIERMEM_SOURCE_ROOT "/config/models/mlp_digits.pbtxt", "--steps", "1500",
                                    "--replicas", "1", "--log-every", "100", "--timeout", "60", "--job", job,
                                    "--losses", m_dir + "/" + job + ".losses", "--keep"};
  };
  const auto ref_started = std::chrono::steady_clock::now();
  test::ExecRank ref(0, 1, m_daemons[0]->socket(), args("ref"), m_dir + "/ref.log", m_net->exec_in(1));
  ASSERT_EQ(ref.wait(), 0) << ref.log();
  const double ref_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ref_started).count();

  test::ExecRank flapped(0, 1, m_daemons[0]->socket(), args("flap"), m_dir + "/flap.log", m_net->exec_in(1));
  int holder = 0;
  ASSERT_TRUE(wait_for([&] {
    auto snapshot = watch->lookup("flap.r0.snapshot");
    if (!snapshot.ok() || snapshot->replicas.empty()) return false;
    holder = static_cast<int>(snapshot->replicas[0].node);
    return true;
  }, 30s)) << flapped.log();
  std::mt19937 rng(4242);
  std::uniform_int_distribution<int> wait_ms(50, 300);
  bool up = true;
  int flaps = 0;
  const auto end = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < end && ::kill(flapped.pid(), 0) == 0 &&
         flapped.log().find("summary:") == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms(rng)));
    up = !up;
    ASSERT_TRUE(m_net->link(holder, up)) << "ip link failed";
    ++flaps;
  }
  if (!up) ASSERT_TRUE(m_net->link(holder, true));
  const int rc = flapped.wait();
  std::printf("%d flaps of node %d's link (the snapshot's copy) while the job trained: undisturbed %.1f s\n", flaps,
              holder, ref_s);
  ASSERT_EQ(rc, 0) << flapped.log();
  EXPECT_GE(flaps, 4) << "the job ended before the link flapped";
  const std::string ref_losses = test::read_file(m_dir + "/ref.losses"), flap_losses = test::read_file(m_dir + "/flap.losses");
  EXPECT_FALSE(ref_losses.empty());
  EXPECT_EQ(flap_losses, ref_losses) << "the flapped job's losses are not the undisturbed run's";
  // Kept (--keep): once healed, the snapshot's copy in sync holds the home's
  // bytes (the last committed step's image, nothing acknowledged lost).
  auto snapshot = watch->lookup("flap.r0.snapshot");
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().to_string();
  std::vector<char> home_bytes(snapshot->size);
  ASSERT_TRUE(watch->read(snapshot->gva, home_bytes.data(), home_bytes.size()).ok());
  EXPECT_TRUE(wait_for([&] {
    auto t = watch->translate(snapshot->gva);
    if (!t.ok()) return false;
    for (const ReplicaInfo& r : t->allocation.replicas) {
      if (r.state != ReplicaState::in_sync) continue;
      auto near = m_daemons[r.node - 1]->connect("copy");
      std::vector<char> copy(home_bytes.size());
      if (near != nullptr && near->read(r.gva, copy.data(), copy.size()).ok() && copy == home_bytes) return true;
    }
    return false;
  }, 20s)) << "no copy in sync holds the home's snapshot";
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) {
  if (const std::string why = tiermem::test::netns_unavailable(); !why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
