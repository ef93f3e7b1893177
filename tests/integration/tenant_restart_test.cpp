// One tenant cannot make a restart lose another tenant's memory (H5, S1,
// O5). A hostile tenant (bob, a real user) does to its own files what the
// descriptors the daemon hands it allow — writing its segment header,
// growing or cutting its version words, locking every word, cutting its DRAM
// or PMEM file — and exits; the daemon is stopped (SIGTERM) or killed
// (SIGKILL) and started again on the same memory. Every other tenant's DRAM
// and PMEM allocations (root's and alice's) come back byte for byte; bob's
// are lost only where bob's damage reached, and are reported by name with
// the reason, to operators and to bob, never to alice.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/tenant_fixture.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;
using test::code;
using test::Outcome;

struct DamageCase {
  const char* what;  // tenant_probe damage WHAT
  bool sigkill;      // else SIGTERM
  // What bob loses: his DRAM, his PMEM; whether his domain's shared memory
  // is made anew (its version words were cut), and his pages torn (he left
  // every word locked).
  bool bob_dram_lost = false;
  bool bob_pmem_lost = false;
  bool made_anew = false;
  bool torn = false;
};

std::string case_name(const ::testing::TestParamInfo<DamageCase>& info) {
  std::string n = info.param.what;
  for (char& ch : n) {
    if (ch == '-') ch = '_';
  }
  return n + (info.param.sigkill ? "_sigkill" : "_sigterm");
}

class TenantDamageTest : public test::TenantTest, public ::testing::WithParamInterface<DamageCase> {
 protected:
  struct Owned {
    std::string owner;  // root, alice, bob
    Tier tier;
    Gva gva;
  };
};

TEST_P(TenantDamageTest, ATenantDamagingItsOwnFilesLosesOnlyItsOwnMemoryAcrossARestart) {
  const DamageCase c = GetParam();
  constexpr size_t k_bytes = 1 << 20;  // whole pages (over sub_page_max): frames of their own
  test::TestDaemon daemon({.extra_toml = tenants_toml(), .control_toml = "socket_mode = \"0666\"\n"});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  open_to_users(daemon);
  const std::string sock = daemon.socket();
  auto root = daemon.connect("root");

  // Each of root, alice and bob has a named allocation in DRAM and in PMEM;
  // root (an operator) fills all six with bytes of their own.
  std::vector<Owned> owned;
  for (const std::string who : {"root", "alice", "bob"}) {
    for (Tier tier : {Tier::dram, Tier::pmem}) {
      const std::string name = who + "-" + std::string(tier_name(tier));
      Gva gva;
      if (who == "root") {
        auto a = root->alloc(k_bytes, {.tier = tier, .strict = true, .name = name});
        ASSERT_TRUE(a.ok()) << a.status().to_string();
        gva = a->gva;
      } else {
        const Outcome made = as(who == "alice" ? &*s_alice : &*s_bob, sock,
                                {"alloc", std::to_string(k_bytes), std::string(tier_name(tier)), name});
        ASSERT_TRUE(made.ok) << who << ": " << made.text;
        auto parsed = Gva::parse(made.text);
        ASSERT_TRUE(parsed.ok()) << made.text;
        gva = *parsed;
      }
      owned.push_back({who, tier, gva});
    }
  }
  for (size_t i = 0; i < owned.size(); ++i) {
    const auto bytes = test::pattern(k_bytes, static_cast<unsigned>(i + 1));
    ASSERT_TRUE(root->write(owned[i].gva, bytes.data(), bytes.size()).ok());
  }

  const Outcome damaged = as(&*s_bob, sock, {"damage", c.what});
  ASSERT_TRUE(damaged.ok) << damaged.text;
  if (std::string(c.what) == "header") {
    EXPECT_EQ(damaged.text, "refused") << "bob wrote his segment header";
  }

  root.reset();
  if (c.sigkill) {
    daemon.kill();
  } else {
    EXPECT_EQ(daemon.stop(), 0) << daemon.log();
  }
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  root = daemon.connect("root-after");

  auto listed = root->list();
  ASSERT_TRUE(listed.ok()) << listed.status().to_string();
  std::map<std::string, AllocationInfo> by_name;
  for (const AllocationInfo& a : *listed) by_name[a.name] = a;
  for (size_t i = 0; i < owned.size(); ++i) {
    const Owned& o = owned[i];
    const std::string name = o.owner + "-" + std::string(tier_name(o.tier));
    const bool bobs = o.owner == "bob";
    const bool lost = bobs && (o.tier == Tier::dram ? c.bob_dram_lost : c.bob_pmem_lost);
    ASSERT_EQ(by_name.count(name), 1u) << name << " did not come back";
    EXPECT_EQ(by_name[name].lost_pages > 0, lost) << name;
    EXPECT_EQ(by_name[name].torn_pages > 0, bobs && c.torn) << name;
    std::vector<unsigned char> back(k_bytes);
    const Status r = root->read(o.gva, back.data(), back.size());
    if (lost) {
      EXPECT_EQ(r.code(), ErrorCode::data_lost) << name << ": " << r.to_string();
      continue;
    }
    ASSERT_TRUE(r.ok()) << name << ": " << r.to_string();
    EXPECT_TRUE(back == test::pattern(k_bytes, static_cast<unsigned>(i + 1))) << name << " changed over the restart";
  }

  // What the restart lost is said, by name and why: to operators all of it,
  // to bob his own, to alice nothing of bob's.
  auto stat = root->stat();
  ASSERT_TRUE(stat.ok());
  std::string report;
  for (const std::string& l : stat->recovery.lost) report += l + "\n";
  for (const std::string& d : stat->recovery.domains_made_anew) report += d + "\n";
  EXPECT_EQ(report.find("'root-"), std::string::npos) << report;
  EXPECT_EQ(report.find("'alice-"), std::string::npos) << report;
  EXPECT_EQ(report.find("'bob-dram'") != std::string::npos, c.bob_dram_lost) << report;
  EXPECT_EQ(report.find("'bob-pmem'") != std::string::npos, c.bob_pmem_lost) << report;
  EXPECT_EQ(report.find("(tenant 'bob'): ") != std::string::npos, c.made_anew) << report;
  if (c.bob_dram_lost || c.bob_pmem_lost) {
    EXPECT_NE(report.find("of tenant 'bob': "), std::string::npos) << "the reason is given: " << report;
  }
  if (std::string(c.what) == "dram-grow" || std::string(c.what) == "pmem-grow") {
    // Cut back to his quota at the start (and said so at its first sweep).
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (root->stat()->files_trimmed == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_GE(root->stat()->files_trimmed, 1u) << daemon.log();
    for (const auto& dir : {daemon.dram_dir(), daemon.pmem_dir()}) {
      for (const auto& e : std::filesystem::directory_iterator(dir)) {
        if (!e.is_regular_file()) continue;
        EXPECT_LT(e.file_size(), uint64_t{1} << 30) << e.path() << " is still grown";
      }
    }
  }
  const Outcome bob_sees = as(&*s_bob, sock, {"recovery"});
  ASSERT_TRUE(bob_sees.ok) << bob_sees.text;
  EXPECT_EQ(bob_sees.text.find("bob-") != std::string::npos, c.bob_dram_lost || c.bob_pmem_lost) << bob_sees.text;
  const Outcome alice_sees = as(&*s_alice, sock, {"recovery"});
  ASSERT_TRUE(alice_sees.ok) << alice_sees.text;
  EXPECT_EQ(alice_sees.text.find("bob"), std::string::npos) << "alice is told of bob's losses: " << alice_sees.text;

  // Everyone works on, bob included.
  for (const auto* user : {&*s_alice, &*s_bob}) {
    const Outcome fresh = as(user, sock, {"alloc", std::to_string(k_bytes), "dram"});
    ASSERT_TRUE(fresh.ok) << fresh.text;
    EXPECT_TRUE(as(user, sock, {"--direct", "write", fresh.text, "after"}).ok);
    const Outcome back = as(user, sock, {"--direct", "read", fresh.text, "5"});
    EXPECT_TRUE(back.ok && back.text == "after") << back.text;
  }
  EXPECT_TRUE(daemon.alive());
}

INSTANTIATE_TEST_SUITE_P(
    Damage, TenantDamageTest,
    ::testing::Values(DamageCase{"header", false}, DamageCase{"header", true},
                      DamageCase{"versions-grow", false}, DamageCase{"versions-grow", true},
                      DamageCase{"versions-cut", false, true, false, true},
                      DamageCase{"versions-cut", true, true, false, true},
                      DamageCase{"versions-odd", false, false, false, false, true},
                      DamageCase{"versions-odd", true, false, false, false, true},
                      DamageCase{"dram-cut", false, true}, DamageCase{"dram-cut", true, true},
                      DamageCase{"pmem-cut", false, false, true}, DamageCase{"pmem-cut", true, false, true},
                      DamageCase{"dram-grow", false}, DamageCase{"dram-grow", true},
                      DamageCase{"pmem-grow", false}, DamageCase{"pmem-grow", true}),
    case_name);

// Frames a node lent to another node's pages belong to a domain of the
// lender (the allocation's tenant's). Bob damages his domain on the lender
// and the lender restarts: pages of bob's on frames it lent are lost, and
// alice's pages on frames it lent from her domain come back intact.
class LenderTest : public test::TenantTest {};

TEST_F(LenderTest, ALenderMakingOneTenantsDomainAnewLosesOnlyThatTenantsLentFrames) {
  test::TestCluster cluster(2, {.extra_toml = tenants_toml(), .control_toml = "socket_mode = \"0666\"\n"});
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  for (int n : {1, 2}) open_to_users(cluster.node(n));
  std::filesystem::permissions(cluster.dir(), std::filesystem::perms(0755));
  const std::string sock1 = cluster.node(1).socket(), sock2 = cluster.node(2).socket();
  auto root = cluster.node(1).connect("root");
  constexpr size_t k_bytes = 1 << 20;
  std::map<std::string, Gva> gva;
  for (const auto* user : {&*s_alice, &*s_bob}) {
    const std::string name = user->name + "-moved";
    const Outcome made = as(user, sock1, {"alloc", std::to_string(k_bytes), "dram", name});
    ASSERT_TRUE(made.ok) << made.text;
    gva[name] = *Gva::parse(made.text);
    const auto bytes = test::pattern(k_bytes, name.size());
    ASSERT_TRUE(root->write(gva[name], bytes.data(), bytes.size()).ok());
    const Outcome moved = as(user, sock1, {"migrate", made.text, "dram", "2"});
    ASSERT_TRUE(moved.ok) << moved.text;  // its pages on frames node 2 lent from the user's domain there
  }
  const Outcome damaged = as(&*s_bob, sock2, {"damage", "versions-cut"});
  ASSERT_TRUE(damaged.ok) << damaged.text;
  cluster.node(2).kill();
  ASSERT_TRUE(cluster.node(2).restart()) << cluster.logs();
  ASSERT_TRUE(cluster.wait_connected()) << cluster.logs();

  std::vector<unsigned char> back(k_bytes);
  Status bobs;
  for (int i = 0; i < 100; ++i) {  // node 1 learns node 2's domains at its next handshake
    bobs = root->read(gva["tiermem-bob-moved"], back.data(), back.size());
    if (bobs.code() == ErrorCode::data_lost) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(bobs.code(), ErrorCode::data_lost) << bobs.to_string();
  const Status alices = root->read(gva["tiermem-alice-moved"], back.data(), back.size());
  ASSERT_TRUE(alices.ok()) << alices.to_string();
  EXPECT_TRUE(back == test::pattern(k_bytes, std::string("tiermem-alice-moved").size()))
      << "alice's pages on frames node 2 lent changed";
  EXPECT_NE(cluster.node(1).log().find("on frames it lent are lost"), std::string::npos) << cluster.logs();
  EXPECT_TRUE(cluster.node(1).alive() && cluster.node(2).alive());
}

}  // namespace
}  // namespace tiermem
