#include "mapping/address_space.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "mapping/version.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

constexpr uint64_t k_page = 64 << 10;

class AddressSpaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_dir = test::make_temp_dir("tiermem-as");
    TierSet tiers;
    tiers[static_cast<size_t>(Tier::dram)] = std::move(make_dram_tier(4 * k_page, "test-dram")).value();
    tiers[static_cast<size_t>(Tier::pmem)] =
        std::move(make_pmem_tier({m_dir + "/pool", 8 * k_page})).value();
    auto space = AddressSpace::create({.node = 3, .page_size = k_page}, std::move(tiers));
    ASSERT_TRUE(space.ok()) << space.status().to_string();
    m_space = std::move(space).value();
  }
  void TearDown() override {
    m_space.reset();
    std::filesystem::remove_all(m_dir);
  }

  AllocationInfo alloc(uint64_t size, Tier tier, bool strict = false, std::string name = "") {
    auto r = m_space->allocate({.size = size, .tier = tier, .strict = strict, .name = std::move(name)});
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : AllocationInfo{};
  }

  std::string m_dir;
  std::unique_ptr<AddressSpace> m_space;
};

TEST_F(AddressSpaceTest, AllocationRoundsUpToPagesAndGetsAFreshGeneration) {
  const AllocationInfo a = alloc(100, Tier::dram);
  const AllocationInfo b = alloc(k_page + 1, Tier::dram);
  EXPECT_EQ(a.gva.node, 3);
  EXPECT_EQ(a.pages, 1u);
  EXPECT_EQ(b.pages, 2u);
  EXPECT_EQ(a.gva.offset % k_page, 0u);
  EXPECT_NE(a.gva.offset, 0u) << "offset 0 is the null GVA";
  EXPECT_NE(a.gva.generation, b.gva.generation);
  EXPECT_EQ(a.tier, Tier::dram);
}

TEST_F(AddressSpaceTest, FallsBackDownTheChainWhenATierIsFull) {
  alloc(3 * k_page, Tier::dram);
  const AllocationInfo spill = alloc(2 * k_page, Tier::dram);
  EXPECT_EQ(spill.tier, Tier::pmem) << "DRAM has one page left; the request falls back to PMEM";
  const AllocationInfo automatic = alloc(k_page, Tier::automatic);
  EXPECT_EQ(automatic.tier, Tier::dram) << "AUTO takes the fastest tier with room (no VRAM here)";
}

TEST_F(AddressSpaceTest, StrictRequestFailsInsteadOfFallingBack) {
  alloc(4 * k_page, Tier::dram);
  auto r = m_space->allocate({.size = k_page, .tier = Tier::dram, .strict = true});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::tier_exhausted);
  EXPECT_NE(r.status().message().find("dram has 0 of 4 pages free"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("strict"), std::string::npos);
}

TEST_F(AddressSpaceTest, ExhaustionOfEveryTierSaysWhatEachHas) {
  alloc(4 * k_page, Tier::dram);
  alloc(7 * k_page, Tier::pmem);
  auto r = m_space->allocate({.size = 2 * k_page, .tier = Tier::automatic});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::tier_exhausted);
  EXPECT_NE(r.status().message().find("vram not configured"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("dram has 0 of 4"), std::string::npos);
  EXPECT_NE(r.status().message().find("pmem has 1 of 8"), std::string::npos);
  // Freeing makes room again.
  ASSERT_TRUE(m_space->free(m_space->list().front().gva).ok());
  EXPECT_TRUE(m_space->allocate({.size = 2 * k_page}).ok());
}

TEST_F(AddressSpaceTest, StrictRequestForAMissingTierIsUnavailable) {
  auto r = m_space->allocate({.size = 1, .tier = Tier::vram, .strict = true});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::tier_unavailable);
  auto fallback = m_space->allocate({.size = 1, .tier = Tier::vram});
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(fallback->tier, Tier::dram);
}

TEST_F(AddressSpaceTest, FragmentedTierStillServesFromScatteredFrames) {
  std::vector<AllocationInfo> one_page;
  for (int i = 0; i < 4; ++i) one_page.push_back(alloc(k_page, Tier::dram, true));
  ASSERT_TRUE(m_space->free(one_page[0].gva).ok());
  ASSERT_TRUE(m_space->free(one_page[2].gva).ok());
  const AllocationInfo two = alloc(2 * k_page, Tier::dram, true);
  auto t = m_space->translate(two.gva);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->extents.size(), 2u) << "two non-adjacent frames";
  std::vector<unsigned char> out(2 * k_page), in(2 * k_page);
  std::iota(out.begin(), out.end(), 1);
  ASSERT_TRUE(m_space->write(two.gva, out.data(), out.size()).ok());
  ASSERT_TRUE(m_space->read(two.gva, in.data(), in.size()).ok());
  EXPECT_EQ(out, in);
}

TEST_F(AddressSpaceTest, NewAllocationsReadAsZeros) {
  const AllocationInfo a = alloc(k_page, Tier::dram, true);
  std::vector<unsigned char> ones(k_page, 0xff);
  ASSERT_TRUE(m_space->write(a.gva, ones.data(), ones.size()).ok());
  ASSERT_TRUE(m_space->free(a.gva).ok());
  for (int i = 0; i < 4; ++i) {
    const AllocationInfo b = alloc(k_page, Tier::dram, true);
    std::vector<unsigned char> in(k_page, 0x55);
    ASSERT_TRUE(m_space->read(b.gva, in.data(), in.size()).ok());
    EXPECT_EQ(in, std::vector<unsigned char>(k_page, 0));
  }
}

TEST_F(AddressSpaceTest, FreeErrorsNameTheProblem) {
  const AllocationInfo a = alloc(2 * k_page, Tier::dram);
  auto inside = m_space->free(a.gva.plus(16));
  EXPECT_EQ(inside.code(), ErrorCode::invalid_argument);
  EXPECT_NE(inside.message().find("16 bytes into allocation"), std::string::npos) << inside.message();
  ASSERT_TRUE(m_space->free(a.gva).ok());
  auto twice = m_space->free(a.gva);
  EXPECT_EQ(twice.code(), ErrorCode::not_allocated);
  EXPECT_NE(twice.message().find("freed at generation " + std::to_string(a.gva.generation)), std::string::npos)
      << twice.message();
  Gva never = a.gva;
  never.offset = 1000 * k_page;
  EXPECT_NE(m_space->free(never).message().find("never allocated"), std::string::npos);
  Gva other = a.gva;
  other.node = 9;
  EXPECT_EQ(m_space->free(other).code(), ErrorCode::bad_gva);
}

TEST_F(AddressSpaceTest, StaleGenerationIsDetectedWhenAnAddressIsReused) {
  // A tiny virtual range forces reuse of the same addresses.
  TierSet tiers;
  tiers[static_cast<size_t>(Tier::dram)] = std::move(make_dram_tier(2 * k_page, "small")).value();
  auto space = std::move(AddressSpace::create({.node = 1, .page_size = k_page, .virtual_pages = 2},
                                              std::move(tiers)))
                   .value();
  auto first = space->allocate({.size = 1});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(space->free(first->gva).ok());
  auto second = space->allocate({.size = 1});
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->gva.offset, first->gva.offset) << "only one virtual page exists";
  char byte = 0;
  Status s = space->read(first->gva, &byte, 1);
  EXPECT_EQ(s.code(), ErrorCode::stale_generation) << s.to_string();
  Gva unchecked = first->gva;
  unchecked.generation = 0;
  EXPECT_TRUE(space->read(unchecked, &byte, 1).ok()) << "generation 0 is not checked";
}

TEST_F(AddressSpaceTest, OutOfRangeAccessIsRefused) {
  const AllocationInfo a = alloc(1000, Tier::pmem);
  std::vector<char> buf(100);
  EXPECT_TRUE(m_space->write(a.gva.plus(900), buf.data(), 100).ok());
  Status s = m_space->read(a.gva.plus(950), buf.data(), 100);
  EXPECT_EQ(s.code(), ErrorCode::out_of_range);
  EXPECT_NE(s.message().find("runs past the end"), std::string::npos);
  EXPECT_EQ(m_space->write(a.gva.plus(1001), buf.data(), 0).code(), ErrorCode::out_of_range);
}

TEST_F(AddressSpaceTest, NamesAreUniqueAndFoundAgain) {
  const AllocationInfo a = alloc(1, Tier::dram, false, "weights");
  auto dup = m_space->allocate({.size = 1, .name = "weights"});
  EXPECT_EQ(dup.status().code(), ErrorCode::already_exists);
  auto found = m_space->lookup("weights");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->gva, a.gva);
  ASSERT_TRUE(m_space->free(a.gva).ok());
  EXPECT_EQ(m_space->lookup("weights").status().code(), ErrorCode::not_found);
}

TEST_F(AddressSpaceTest, PinnedAllocationCannotBeFreed) {
  const AllocationInfo a = alloc(1, Tier::dram);
  ASSERT_TRUE(m_space->pin(a.gva).ok());
  auto t = m_space->translate(a.gva);
  EXPECT_TRUE(t->page.flags & k_page_pinned);
  EXPECT_EQ(m_space->free(a.gva).code(), ErrorCode::failed_precondition);
  ASSERT_TRUE(m_space->unpin(a.gva).ok());
  EXPECT_EQ(m_space->unpin(a.gva).code(), ErrorCode::failed_precondition);
  EXPECT_TRUE(m_space->free(a.gva).ok());
}

TEST_F(AddressSpaceTest, EveryTranslationChangeMovesThePageEpoch) {
  const AllocationInfo a = alloc(1, Tier::dram);
  auto layout = m_space->layout(a.gva);
  ASSERT_TRUE(layout.ok());
  const uint64_t page = layout->first_page;
  const uint64_t v1 = version::load(m_space->versions().word(page));
  EXPECT_FALSE(version::is_locked(v1));
  char c = 1;
  ASSERT_TRUE(m_space->write(a.gva, &c, 1).ok());
  const uint64_t v2 = version::load(m_space->versions().word(page));
  EXPECT_EQ(version::epoch_of(v2), version::epoch_of(v1)) << "a data write keeps the epoch";
  EXPECT_EQ(version::sequence_of(v2), version::sequence_of(v1) + 2);
  ASSERT_TRUE(m_space->free(a.gva).ok());
  EXPECT_NE(version::epoch_of(version::load(m_space->versions().word(page))), version::epoch_of(v1));
}

TEST_F(AddressSpaceTest, DumpListsEveryPage) {
  alloc(3 * k_page, Tier::dram, false, "a");
  alloc(1, Tier::pmem, false, "b");
  const MappingDump d = m_space->dump();
  EXPECT_EQ(d.allocations.size(), 2u);
  EXPECT_EQ(d.pages.size(), 4u);
  EXPECT_EQ(d.pages.back().tier, Tier::pmem);
  EXPECT_TRUE(d.pages.back().flags & k_page_durable);
  const auto stats = m_space->tier_stats();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].used_bytes, 3 * k_page);
  EXPECT_EQ(stats[1].used_bytes, k_page);
}

}  // namespace
}  // namespace tiermem
