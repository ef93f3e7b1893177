// libtiermem against a real tiermemd: every tier, direct and daemon paths,
// mapping, and a second process seeing bytes written through a mapping.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <random>
#include <vector>

#include <tiermem/client.h>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

class ClientTest : public ::testing::TestWithParam<Tier> {
 protected:
  test::TestDaemon m_daemon;
};

TEST_P(ClientTest, AllocWriteReadFreeRoundTrip) {
  ASSERT_TRUE(m_daemon.ready()) << m_daemon.log();
  auto client = m_daemon.connect();
  ASSERT_NE(client, nullptr);
  const size_t size = 5 * (1 << 20) + 123;  // spans three 2 MiB pages, not page aligned
  auto a = client->alloc(size, {.tier = GetParam(), .strict = true});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->tier, GetParam());
  EXPECT_EQ(a->pages, 3u);
  const auto data = test::pattern(size, 1);
  ASSERT_TRUE(client->write(a->gva, data.data(), data.size()).ok());
  std::vector<unsigned char> back(size);
  ASSERT_TRUE(client->read(a->gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, data);
  // A partial read in the middle, across a page boundary.
  std::vector<unsigned char> middle(4096);
  ASSERT_TRUE(client->read(a->gva.plus((2 << 20) - 100), middle.data(), middle.size()).ok());
  EXPECT_TRUE(std::equal(middle.begin(), middle.end(), data.begin() + (2 << 20) - 100));
  // DRAM and PMEM of this node are mapped into the client: all three copies
  // went straight to the tier, none through the daemon.
  const AccessCounters c = client->access_counters();
  EXPECT_EQ(c.direct_local, 3u);
  EXPECT_EQ(c.direct_remote, 0u);
  EXPECT_EQ(c.message, 0u);
  EXPECT_EQ(c.through_daemon, 0u);
  ASSERT_TRUE(client->free(a->gva).ok());
  EXPECT_EQ(client->read(a->gva, back.data(), 1).code(), ErrorCode::not_allocated);
}

TEST_P(ClientTest, DaemonPathAndDirectPathSeeTheSameBytes) {
  ASSERT_TRUE(m_daemon.ready()) << m_daemon.log();
  auto direct = m_daemon.connect("direct");
  auto via_daemon = Client::connect({.socket_path = m_daemon.socket(), .client_name = "rpc", .direct_access = false});
  ASSERT_TRUE(via_daemon.ok());
  auto a = direct->alloc(3 << 20, {.tier = GetParam(), .strict = true});
  ASSERT_TRUE(a.ok());
  const auto one = test::pattern(3 << 20, 2);
  ASSERT_TRUE(direct->write(a->gva, one.data(), one.size()).ok());
  std::vector<unsigned char> back(one.size());
  ASSERT_TRUE((*via_daemon)->read(a->gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, one);
  const auto two = test::pattern(3 << 20, 3);
  ASSERT_TRUE((*via_daemon)->write(a->gva, two.data(), two.size()).ok());
  ASSERT_TRUE(direct->read(a->gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, two);
  EXPECT_EQ(direct->access_counters().direct_local, 2u);
  EXPECT_EQ(direct->access_counters().through_daemon, 0u);
  EXPECT_EQ((*via_daemon)->access_counters().through_daemon, 2u);
  EXPECT_EQ((*via_daemon)->access_counters().direct_local, 0u);
}

INSTANTIATE_TEST_SUITE_P(Tiers, ClientTest, ::testing::Values(Tier::dram, Tier::pmem),
                         [](const auto& info) { return std::string(tier_name(info.param)); });

TEST(ClientMapTest, SecondProcessSeesBytesWrittenThroughAMapping) {
  test::TestDaemon daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto client = daemon.connect();
  for (Tier tier : {Tier::dram, Tier::pmem}) {
    auto a = client->alloc(3 << 20, {.tier = tier, .strict = true});
    ASSERT_TRUE(a.ok());
    auto m = client->map(a->gva);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    ASSERT_EQ(m->size(), 3u << 20);
    const std::string msg = "written through a mapping of " + std::string(tier_name(tier));
    // Across the page boundary, to cover two extents of the mapping.
    std::memcpy(m->data() + (2 << 20) - 8, msg.data(), msg.size());
    ASSERT_TRUE(m->persist((2 << 20) - 8, msg.size()).ok());
    // Another process, the real CLI, reads it through its own connection.
    const auto r = test::run_ctl(daemon.socket(), {"read", a->gva.plus((2 << 20) - 8).to_string(),
                                                   std::to_string(msg.size())});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, msg);
    // While mapped, the allocation is pinned and cannot be freed.
    EXPECT_EQ(client->free(a->gva).code(), ErrorCode::failed_precondition);
    *m = Mapping();  // unmap
    EXPECT_TRUE(client->free(a->gva).ok());
  }
}

TEST(ClientMapTest, MappingOfAClientThatDiedIsReleased) {
  test::TestDaemon daemon;
  ASSERT_TRUE(daemon.ready());
  auto owner = daemon.connect("owner");
  auto a = owner->alloc(1 << 20);
  ASSERT_TRUE(a.ok());
  const pid_t child = ::fork();
  if (child == 0) {
    auto mapper = daemon.connect("mapper");
    auto m = mapper->map(a->gva);
    // Die holding the mapping: no destructor, no unmap request.
    ::_exit(m.ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child could not map";
  // The daemon notices the closed connection and drops its pin.
  uint32_t maps = 1;
  for (int i = 0; i < 200 && maps != 0; ++i) {
    maps = owner->translate(a->gva)->allocation.map_count;
    if (maps != 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(maps, 0u);
  EXPECT_TRUE(owner->free(a->gva).ok());
}

TEST(ClientTest2, LookupStatListDump) {
  test::TestDaemon daemon;
  ASSERT_TRUE(daemon.ready());
  auto client = daemon.connect();
  auto a = client->alloc(4096, {.tier = Tier::pmem, .name = "optimizer-state"});
  ASSERT_TRUE(a.ok());
  auto found = client->lookup("optimizer-state");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->gva, a->gva);
  EXPECT_EQ(client->lookup("nope").status().code(), ErrorCode::not_found);
  auto stat = client->stat();
  ASSERT_TRUE(stat.ok());
  EXPECT_EQ(stat->node, 1);
  ASSERT_EQ(stat->tiers.size(), 2u);
  EXPECT_EQ(stat->tiers[1].tier, Tier::pmem);
  EXPECT_EQ(stat->tiers[1].used_bytes, 2u << 20);
  EXPECT_EQ(stat->allocations, 1u);
  auto list = client->list();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "optimizer-state");
  auto dump = client->dump();
  ASSERT_EQ(dump->pages.size(), 1u);
  EXPECT_EQ(dump->pages[0].tier, Tier::pmem);
  const char c = 'x';
  ASSERT_TRUE(client->write(a->gva.plus(100), &c, 1).ok());
  auto t = client->translate(a->gva.plus(100));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->offset_in_allocation, 100u);
  EXPECT_EQ(t->page.valid_mask, 1u) << "L3 bit of sub-block 0 set by the direct write";
  EXPECT_EQ(t->page.dirty_mask, 0u) << "PMEM writes are durable when acknowledged: nothing dirty";
}

TEST(ClientTest2, ConnectingWithoutADaemonSaysSo) {
  auto c = Client::connect({.socket_path = "/tmp/no-such-tiermem.sock"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::connection_failed);
  EXPECT_NE(c.status().message().find("/tmp/no-such-tiermem.sock"), std::string::npos);
}

}  // namespace
}  // namespace tiermem
