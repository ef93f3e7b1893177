// The Demoter's choices (daemon/demoter.hpp) over an in-process address
// space, round by round: cold pages of demotable allocations move down,
// a page written since the last look stays, a page whose version word a
// writer holds locked stays and does not stall the round, allocations not
// asked demotable never move, and an allocation whose move fails is left
// alone for a while instead of failing every round (here: no room below
// for its run).
#include "daemon/demoter.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <vector>

#include "pages/version.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t k_page = 64 << 10;

class DemoterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_dir = test::make_temp_dir("tiermem-demoter");
    TierSet tiers;
    tiers[static_cast<size_t>(Tier::dram)] = std::move(make_dram_tier({m_dir, 16 * k_page, 1})).value();
    tiers[static_cast<size_t>(Tier::pmem)] = std::move(make_pmem_tier({m_dir, 32 * k_page, 1})).value();
    auto space = AddressSpace::create({.node = 1, .page_size = k_page, .domains = 1, .versions_dir = m_dir},
                                      std::move(tiers));
    ASSERT_TRUE(space.ok()) << space.status().to_string();
    m_space = std::move(space).value();
  }
  void TearDown() override {
    m_space.reset();
    std::filesystem::remove_all(m_dir);
  }
  AllocationInfo alloc(uint64_t bytes, bool demotable) {
    auto a = m_space->allocate({.size = bytes, .tier = Tier::dram, .strict = true, .policy = {.demotable = demotable}});
    EXPECT_TRUE(a.ok()) << a.status().to_string();
    return a.ok() ? *a : AllocationInfo{};
  }
  uint64_t first_page(const AllocationInfo& a) { return m_space->layout(a.gva)->first_page; }
  Tier tier_of(uint64_t page) { return m_space->page_entry(page)->tier; }
  DemotionOptions options() const {
    return {.high_water_percent = 75, .low_water_percent = 25, .lock_timeout = 2s};
  }

  std::string m_dir;
  std::unique_ptr<AddressSpace> m_space;
};

TEST_F(DemoterTest, ColdPagesGoWrittenAndLockedOnesStayAndNothingWaitsForAWriter) {
  const AllocationInfo cold = alloc(8 * k_page, true), held = alloc(4 * k_page, true), kept = alloc(2 * k_page, false);
  const AllocationInfo small = alloc(100, true);
  EXPECT_EQ(small.slot_bytes, 0u) << "a demotable allocation takes a page of its own";
  EXPECT_TRUE(small.demotable);
  const uint64_t c0 = first_page(cold), h0 = first_page(held), k0 = first_page(kept), s0 = first_page(small);
  // DRAM: 15 of 16 frames. A writer holds the first page of `held`.
  uint64_t locked = 0;
  ASSERT_TRUE(version::lock_exclusive_for(m_space->versions().word(h0), 1s, &locked));

  Demoter demoter(*m_space, [](const std::string&) { return TenantLimits{}; }, options());
  demoter.round();  // every page seen a first time: none idle yet
  EXPECT_EQ(demoter.counters().rounds, 1u);
  EXPECT_EQ(demoter.counters().nothing_to_move, 1u);
  const char data[8] = "written";
  ASSERT_TRUE(m_space->write(cold.gva, data, sizeof data).ok());  // page c0 written between the looks
  const auto started = std::chrono::steady_clock::now();
  demoter.round();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1s) << "the round waited for the held page";

  // Excess: 15 - 4 = 11 pages; the candidates are exactly 11.
  EXPECT_EQ(tier_of(c0), Tier::dram) << "written since the last look";
  for (uint64_t p = c0 + 1; p < c0 + 8; ++p) EXPECT_EQ(tier_of(p), Tier::pmem) << "cold page " << p;
  EXPECT_EQ(tier_of(h0), Tier::dram) << "its writer holds it";
  for (uint64_t p = h0 + 1; p < h0 + 4; ++p) EXPECT_EQ(tier_of(p), Tier::pmem) << "cold page " << p;
  EXPECT_EQ(tier_of(s0), Tier::pmem);
  EXPECT_EQ(tier_of(k0), Tier::dram);
  EXPECT_EQ(tier_of(k0 + 1), Tier::dram);
  const DemotionCounters c = demoter.counters();
  EXPECT_EQ(c.pages[static_cast<size_t>(Tier::dram)][static_cast<size_t>(Tier::pmem)], 11u);
  EXPECT_EQ(c.failures, 0u);
  char back[8] = {};
  ASSERT_TRUE(m_space->read(cold.gva, back, sizeof back).ok());
  EXPECT_STREQ(back, "written");
  version::unlock_exclusive(m_space->versions().word(h0), locked);
}

TEST_F(DemoterTest, AnAllocationWhoseMoveFailsIsLeftAloneForAWhile) {
  const AllocationInfo a = alloc(14 * k_page, true);
  // PMEM has 4 free frames for the 10 pages to move: the run is refused.
  ASSERT_TRUE(m_space->allocate({.size = 28 * k_page, .tier = Tier::pmem, .strict = true}).ok());
  Demoter demoter(*m_space, [](const std::string&) { return TenantLimits{}; }, options());
  demoter.round();
  demoter.round();
  EXPECT_EQ(demoter.counters().failures, 1u);
  for (int i = 0; i < 5; ++i) demoter.round();
  EXPECT_EQ(demoter.counters().failures, 1u) << "tried again every round";
  EXPECT_EQ(demoter.counters().pages[static_cast<size_t>(Tier::dram)][static_cast<size_t>(Tier::pmem)], 0u);
  EXPECT_EQ(tier_of(first_page(a)), Tier::dram);
}

}  // namespace
}  // namespace tiermem
