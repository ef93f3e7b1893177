// Daemons of one host (C3, issue 29): a client reaches memory homed on
// another daemon of its host by mapping the files that daemon hands it, as it
// does its own node's — every byte directly, none through a daemon; a writer
// killed inside a write leaves no lock behind on the other daemon's pages;
// the other daemon's restart is followed. (Tenants against each other on this
// path: security_test's ATenantTouchesOnlyItsOwnMemoryAcrossDaemons, which
// runs on it now.)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include <tiermem/client.h>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

test::DaemonOptions small_pages() {
  test::DaemonOptions o;
  o.page_size = "64KiB";
  o.extra_toml = "[recovery]\nstale_writer_grace_ms = 200\n";
  return o;
}

TEST(SameHostTest, AnotherDaemonsMemoryIsMappedAndCopiedDirectly) {
  test::TestCluster cluster(2, small_pages());
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  auto c = cluster.node(1).connect("mapper");
  std::vector<Gva> on2;
  for (Tier tier : {Tier::dram, Tier::pmem}) {
    auto a = c->alloc(1 << 20, {.tier = tier, .strict = true, .node = 2});
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    on2.push_back(a->gva);
  }
  auto counter = c->alloc(64, {.tier = Tier::dram, .node = 2, .coherent = true});
  ASSERT_TRUE(counter.ok());
  const AccessCounters before = c->access_counters();
  for (size_t i = 0; i < on2.size(); ++i) {
    const auto data = test::pattern(1 << 20, static_cast<unsigned>(i + 1));
    ASSERT_TRUE(c->write(on2[i], data.data(), data.size()).ok());
    std::vector<unsigned char> back(data.size());
    ASSERT_TRUE(c->read(on2[i], back.data(), back.size()).ok());
    EXPECT_EQ(back, data);
    // Node 2's own client sees the same bytes.
    std::vector<unsigned char> there(data.size());
    ASSERT_TRUE(cluster.node(2).connect("home")->read(on2[i], there.data(), there.size()).ok());
    EXPECT_EQ(there, data);
  }
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(c->fetch_add(counter->gva, 1).ok());
  auto sum = c->fetch_add(counter->gva, 0);
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(*sum, 100u);
  const AccessCounters after = c->access_counters();
  EXPECT_EQ(after.through_daemon, before.through_daemon) << "a byte went through a daemon";
  EXPECT_EQ(after.direct_remote - before.direct_remote, 2u * 2 + 101) << "every call reached node 2 mapped";
  EXPECT_EQ(after.message, before.message) << "a call went to node 2 through the data plane";
  // Node 2 was asked by this process itself (its own session there), and
  // made no data-plane endpoint to it.
  EXPECT_NE(cluster.node(2).log().find("opened by pid " + std::to_string(::getpid())), std::string::npos)
      << cluster.node(2).log();
  // Off, the same calls take the data plane (and still work).
  auto fabric = Client::connect({.socket_path = cluster.node(1).socket(), .map_same_host = false});
  ASSERT_TRUE(fabric.ok());
  std::vector<unsigned char> back(1 << 20);
  ASSERT_TRUE((*fabric)->read(on2[0], back.data(), back.size()).ok());
  EXPECT_EQ(back, test::pattern(1 << 20, 1));
}

// A writer of node 1 killed inside 1 MiB writes to node 2's memory: node 2
// breaks the locks it held (they are in the lock log of its session there),
// so the next writer waits for nothing, and the pages are flagged torn.
TEST(SameHostTest, AWriterKilledMidWriteLeavesNoLockOnTheOtherDaemonsPages) {
  test::TestCluster cluster(2, small_pages());
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  auto owner = Client::connect({.socket_path = cluster.node(2).socket(), .lock_timeout = 5000ms});
  ASSERT_TRUE(owner.ok());
  auto a = (*owner)->alloc(1 << 20, {.tier = Tier::dram, .name = "victim"});
  ASSERT_TRUE(a.ok());
  const auto data = test::pattern(1 << 20, 3);
  std::mt19937 rng(7);
  double slowest = 0;
  for (int round = 0; round < 10; ++round) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      auto c = cluster.node(1).connect("doomed");
      if (!c) ::_exit(2);
      std::vector<unsigned char> buf(1 << 20, static_cast<unsigned char>(round));
      for (;;) {
        if (!c->write(a->gva, buf.data(), buf.size()).ok()) ::_exit(3);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(80 + rng() % 60));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer stopped on its own: " << status << "\n" << cluster.logs();
    const auto start = Clock::now();
    const Status s = (*owner)->write(a->gva, data.data(), data.size());
    ASSERT_TRUE(s.ok()) << "round " << round << ": " << s.to_string() << "\n" << cluster.logs();
    slowest = std::max(slowest, std::chrono::duration<double>(Clock::now() - start).count());
  }
  EXPECT_LT(slowest, 2.0) << "a write waited " << slowest << " s for a dead writer's lock";
  std::vector<unsigned char> back(data.size());
  ASSERT_TRUE((*owner)->read(a->gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, data);
  auto info = (*owner)->lookup("victim");
  ASSERT_TRUE(info.ok());
  EXPECT_GT(info->torn_pages, 0u) << "no kill landed inside a write in 10 rounds of 1 MiB writes";
  EXPECT_TRUE(cluster.node(1).alive() && cluster.node(2).alive());
}

// A coherent word (issue 52's short path: one CPU atomic once the page's
// version word and the daemon's liveness agree with the translation), on
// this client's node and mapped from the other daemon: four threads' adds
// each counted once, compare-and-swap as asked, nothing through a daemon;
// freed by another client of the tenant and its page given to new coherent
// words, the old address is refused and the new words keep their bytes.
TEST(SameHostTest, CoherentWordsTakeTheShortPathAndAFreedOneIsRefused) {
  test::TestCluster cluster(2, small_pages());
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  auto c = cluster.node(1).connect("adder");
  auto other = cluster.node(1).connect("freer");
  for (NodeId node : {NodeId{1}, NodeId{2}}) {
    SCOPED_TRACE("memory of node " + std::to_string(node));
    auto counter = c->alloc(64, {.tier = Tier::dram, .node = node, .coherent = true});
    ASSERT_TRUE(counter.ok()) << counter.status().to_string();
    const AccessCounters before = c->access_counters();
    constexpr int k_threads = 4, k_adds = 5000;
    std::vector<std::thread> adders;
    std::atomic<int> failed{0};
    for (int t = 0; t < k_threads; ++t) {
      adders.emplace_back([&] {
        for (int i = 0; i < k_adds; ++i) {
          if (!c->fetch_add(counter->gva, 1).ok()) failed.fetch_add(1);
        }
      });
    }
    for (auto& t : adders) t.join();
    EXPECT_EQ(failed.load(), 0);
    auto sum = c->fetch_add(counter->gva, 0);
    ASSERT_TRUE(sum.ok());
    EXPECT_EQ(*sum, uint64_t{k_threads} * k_adds);
    auto swapped = c->compare_swap(counter->gva, *sum, 7);
    ASSERT_TRUE(swapped.ok());
    EXPECT_EQ(*swapped, *sum);
    auto kept = c->compare_swap(counter->gva, 1, 9);  // not 1: left as it is
    ASSERT_TRUE(kept.ok());
    EXPECT_EQ(*kept, 7u);
    uint64_t seen = 0;
    ASSERT_TRUE(other->read(counter->gva, &seen, 8).ok());
    EXPECT_EQ(seen, 7u);
    EXPECT_EQ(c->access_counters().through_daemon, before.through_daemon) << "an atomic went through a daemon";

    ASSERT_TRUE(other->free(counter->gva).ok());
    std::vector<Gva> fresh;
    for (int i = 0; i < 32; ++i) {
      auto f = other->alloc(64, {.tier = Tier::dram, .node = node, .coherent = true});
      ASSERT_TRUE(f.ok()) << f.status().to_string();
      fresh.push_back(f->gva);
    }
    auto late = c->fetch_add(counter->gva, 1000);
    EXPECT_FALSE(late.ok()) << "an add to a freed word was acknowledged (it held " << (late.ok() ? *late : 0) << ")";
    if (!late.ok()) EXPECT_EQ(late.status().code(), ErrorCode::not_allocated) << late.status().to_string();
    for (const Gva& g : fresh) {
      uint64_t v = 1;
      ASSERT_TRUE(other->read(g, &v, 8).ok());
      EXPECT_EQ(v, 0u) << "the freed word's add landed in " << g.to_string();
    }
  }
}

// Node 2 restarts (SIGKILL): a client of node 1 that mapped its memory
// follows it — the old mapping is refused, the new daemon's is mapped — and
// reads the same bytes (node 2 took its memory over).
TEST(SameHostTest, TheOtherDaemonsRestartIsFollowed) {
  test::TestCluster cluster(2, small_pages());
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  auto c = cluster.node(1).connect("follower");
  auto a = c->alloc(1 << 20, {.tier = Tier::dram, .node = 2});
  auto counter = c->alloc(64, {.tier = Tier::dram, .node = 2, .coherent = true});
  ASSERT_TRUE(a.ok() && counter.ok());
  const auto data = test::pattern(1 << 20, 9);
  ASSERT_TRUE(c->write(a->gva, data.data(), data.size()).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c->fetch_add(counter->gva, 1).ok());  // the short path learnt
  cluster.node(2).kill();
  ASSERT_TRUE(cluster.node(2).restart()) << cluster.logs();
  ASSERT_TRUE(cluster.wait_connected()) << cluster.logs();
  std::vector<unsigned char> back(data.size());
  Status r;
  for (int i = 0; i < 50 && !(r = c->read(a->gva, back.data(), back.size())).ok(); ++i) {
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(r.ok()) << r.to_string() << "\n" << cluster.logs();
  EXPECT_EQ(back, data);
  const auto more = test::pattern(1 << 20, 10);
  const AccessCounters before = c->access_counters();
  ASSERT_TRUE(c->write(a->gva, more.data(), more.size()).ok());
  EXPECT_EQ(c->access_counters().through_daemon, before.through_daemon) << "mapped again, not through a daemon";
  ASSERT_TRUE(cluster.node(2).connect("home")->read(a->gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, more);
  // The coherent word: its adds before the restart kept, the next ones on
  // the new daemon's memory.
  auto added = c->fetch_add(counter->gva, 1);
  ASSERT_TRUE(added.ok()) << added.status().to_string();
  EXPECT_EQ(*added, 5u);
  uint64_t word = 0;
  ASSERT_TRUE(cluster.node(2).connect("home")->read(counter->gva, &word, 8).ok());
  EXPECT_EQ(word, 6u);
}

}  // namespace
}  // namespace tiermem
