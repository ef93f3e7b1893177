#include "mapping/address_space.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "pages/version.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

constexpr uint64_t k_page = 64 << 10;

// A space with `domains` tenants' room, DRAM of `dram` pages, PMEM of 8 pages.
std::unique_ptr<AddressSpace> make_space(const std::string& dir, NodeId node, uint64_t dram, uint32_t domains = 2,
                                         uint64_t pages_per_domain = 0) {
  TierSet tiers;
  tiers[static_cast<size_t>(Tier::dram)] = std::move(make_dram_tier({dir, dram * k_page, domains})).value();
  tiers[static_cast<size_t>(Tier::pmem)] = std::move(make_pmem_tier({dir, 8 * k_page, domains})).value();
  auto space = AddressSpace::create({.node = node, .page_size = k_page, .domains = domains,
                                     .pages_per_domain = pages_per_domain, .versions_dir = dir, .incarnation = 7},
                                    std::move(tiers));
  EXPECT_TRUE(space.ok()) << space.status().to_string();
  return space.ok() ? std::move(space).value() : nullptr;
}

class AddressSpaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_dir = test::make_temp_dir("tiermem-as");
    m_space = make_space(m_dir, 3, 4);
    ASSERT_NE(m_space, nullptr);
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
  // Allocate and free until next-fit has gone round the domain's virtual
  // range and hands out the first address again.
  auto first = m_space->allocate({.size = 1});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(m_space->free(first->gva).ok());
  Result<AllocationInfo> again = Status(ErrorCode::internal, "not yet");
  for (int i = 0; i < 5000; ++i) {
    again = m_space->allocate({.size = 1});
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    if (again->gva.offset == first->gva.offset) break;
    ASSERT_TRUE(m_space->free(again->gva).ok());
  }
  ASSERT_EQ(again->gva.offset, first->gva.offset) << "the range wrapped";
  char byte = 0;
  Status s = m_space->read(first->gva, &byte, 1);
  EXPECT_EQ(s.code(), ErrorCode::stale_generation) << s.to_string();
  Gva unchecked = first->gva;
  unchecked.generation = 0;
  EXPECT_TRUE(m_space->read(unchecked, &byte, 1).ok()) << "generation 0 is not checked";
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

TEST_F(AddressSpaceTest, TenantsGetDomainsOfTheirOwnWithFilesOfTheirOwn) {
  auto a = m_space->allocate({.size = 1, .tier = Tier::dram, .tenant = "alice"});
  auto b = m_space->allocate({.size = 1, .tier = Tier::dram, .tenant = "bob"});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tenant, "alice");
  const auto da = m_space->find_domain("alice"), db = m_space->find_domain("bob");
  ASSERT_TRUE(da && db);
  EXPECT_NE(*da, *db);
  EXPECT_EQ(m_space->versions().domain_of(a->gva.offset / k_page), *da) << "a's pages are in a's range";
  EXPECT_EQ(m_space->versions().domain_of(b->gva.offset / k_page), *db);
  const DomainFiles fa = m_space->domain_files(*da), fb = m_space->domain_files(*db);
  ASSERT_FALSE(fa.tiers.empty());
  EXPECT_NE(fa.versions_fd, fb.versions_fd);
  EXPECT_NE(fa.tiers[0].fd, fb.tiers[0].fd);
  auto t = m_space->translate(a->gva);
  ASSERT_TRUE(t.ok());
  EXPECT_GE(t->extents[0].frame_offset, fa.tiers[0].frame_offset);
  EXPECT_LT(t->extents[0].frame_offset, fa.tiers[0].frame_offset + fa.tiers[0].bytes) << "in alice's file";
  EXPECT_EQ(m_space->tenant_of_domain(*da), "alice");
  EXPECT_STREQ(m_space->versions().header(*da).tenant, "alice");
  // Both domains are taken: a third tenant has no room on this node.
  auto c = m_space->allocate({.size = 1, .tenant = "carol"});
  EXPECT_EQ(c.status().code(), ErrorCode::tier_exhausted);
  EXPECT_NE(c.status().message().find("tenants.max_per_node"), std::string::npos) << c.status().message();
}

TEST_F(AddressSpaceTest, QuotaIsEnforcedPerTenantAndTier) {
  TenantLimits limits;
  limits.bytes[static_cast<size_t>(Tier::dram)] = 2 * k_page;
  ASSERT_TRUE(m_space->allocate({.size = 2 * k_page, .tier = Tier::dram, .strict = true, .tenant = "q", .limits = limits}).ok());
  auto over = m_space->allocate({.size = 1, .tier = Tier::dram, .strict = true, .tenant = "q", .limits = limits});
  EXPECT_EQ(over.status().code(), ErrorCode::quota_exceeded) << over.status().to_string();
  EXPECT_NE(over.status().message().find("quota of tenant 'q' 128 KiB, 128 KiB used"), std::string::npos)
      << over.status().message();
  // Not strict: it falls back to PMEM, where the tenant has no limit.
  auto spill = m_space->allocate({.size = 1, .tier = Tier::dram, .tenant = "q", .limits = limits});
  ASSERT_TRUE(spill.ok());
  EXPECT_EQ(spill->tier, Tier::pmem);
  EXPECT_EQ(m_space->usage("q", Tier::dram), 2 * k_page);
  // Another tenant still has the rest of the tier.
  EXPECT_TRUE(m_space->allocate({.size = 2 * k_page, .tier = Tier::dram, .strict = true, .tenant = "r"}).ok());
}

TEST_F(AddressSpaceTest, LentFramesComeBackOnlyFromTheirBorrowerAndOnlyOnce) {
  auto lent = m_space->reserve_frames(Tier::dram, 1, "t", {}, /*borrower=*/5);
  ASSERT_TRUE(lent.ok()) << lent.status().to_string();
  EXPECT_EQ(m_space->lent_to(5), 1u);
  EXPECT_EQ(m_space->release_frames(*lent, 6).code(), ErrorCode::invalid_argument) << "not lent to node 6";
  // A frame of a live allocation, or a free one, is never released.
  const AllocationInfo a = alloc(1, Tier::dram);
  auto t = m_space->translate(a.gva);
  std::vector<Extent> live = {{Tier::dram, 3, t->extents[0].frame_offset, 0, k_page}};
  EXPECT_EQ(m_space->release_frames(live, 5).code(), ErrorCode::invalid_argument);
  // The same frame twice in one request (a migrator handing back what a
  // lender sent twice): refused whole, nothing released, the daemon lives.
  std::vector<Extent> twice = {lent->front(), lent->front()};
  EXPECT_EQ(m_space->release_frames(twice, 5).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(m_space->lent_to(5), 1u);
  ASSERT_TRUE(m_space->release_frames(*lent, 5).ok());
  EXPECT_EQ(m_space->release_frames(*lent, 5).code(), ErrorCode::invalid_argument) << "given back twice";
  EXPECT_EQ(m_space->lent_to(5), 0u);
  EXPECT_EQ(m_space->reserve_frames(Tier::dram, uint64_t{1} << 40, "t", {}, 5).status().code(),
            ErrorCode::invalid_argument);
  EXPECT_EQ(m_space->reserve_frames(Tier::automatic, 1, "t", {}, 5).status().code(), ErrorCode::tier_unavailable);
  char c = 0;
  EXPECT_TRUE(m_space->read(a.gva, &c, 1).ok()) << "the live allocation is untouched";
}

TEST_F(AddressSpaceTest, PagesOnFramesOfADomainMadeAnewOnTheirNodeAreLost) {
  const AllocationInfo a = alloc(2 * k_page, Tier::dram);
  auto move = m_space->begin_migration(a.gva);
  ASSERT_TRUE(move.ok());
  auto pm = m_space->begin_move(move->front());
  ASSERT_TRUE(pm.ok());
  m_space->note_lender(9, a.tenant, 111);
  PageEntry to;
  to.node = 9;
  to.tier = Tier::dram;
  to.frame_offset = 0;
  std::vector<Extent> remote;
  ASSERT_TRUE(m_space->commit_moves({&*pm, 1}, {&to, 1}, &remote).ok());
  m_space->end_migration(a.gva);
  auto layout = m_space->layout(a.gva);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->extents[0].node, 9);
  EXPECT_EQ(layout->extents[0].memory_generation, 111u) << "extents carry the lender's memory generation";
  EXPECT_EQ(m_space->lose_frames_of(9, {{a.tenant, 111}}), 0u) << "same memory: nothing lost";
  EXPECT_EQ(m_space->lose_frames_of(9, {{a.tenant, 111}, {"someone else", 5}}), 0u)
      << "another tenant's domain on node 9 changed, not the one that lent the frames";
  EXPECT_EQ(m_space->lose_frames_of(8, {{a.tenant, 222}}), 0u) << "another node";
  EXPECT_EQ(m_space->lose_frames_of(9, {{a.tenant, 222}}), 1u);
  EXPECT_EQ(m_space->layout(a.gva).status().code(), ErrorCode::data_lost);
  char c = 0;
  EXPECT_EQ(m_space->read(a.gva, &c, 1).code(), ErrorCode::data_lost);
  auto t = m_space->translate(a.gva);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->page.flags & k_page_lost);
  std::vector<Extent> give_back;
  EXPECT_TRUE(m_space->free(a.gva, &give_back).ok()) << "a lost allocation can be freed";
  EXPECT_TRUE(give_back.empty()) << "lost frames are not given back to a node that forgot them";
}

}  // namespace
}  // namespace tiermem

namespace tiermem {
namespace {

// One tenant per node (tenants.max_per_node = 1): the DRAM and PMEM tiers
// have one domain's files, which are still opened for it (they were taken
// for a shared region like VRAM's, and the first allocation failed with
// EBADF).
TEST(AddressSpaceSingleDomainTest, OneTenantPerNodeAllocatesInDramAndPmem) {
  const std::string dir = test::make_temp_dir("tiermem-as1");
  {
    auto space = make_space(dir, 1, 4, /*domains=*/1);
    ASSERT_NE(space, nullptr);
    for (Tier tier : {Tier::dram, Tier::pmem}) {
      auto a = space->allocate({.size = 2 * k_page, .tier = tier, .strict = true});
      ASSERT_TRUE(a.ok()) << tier_name(tier) << ": " << a.status().to_string();
      const auto bytes = test::pattern(2 * k_page, 9);
      ASSERT_TRUE(space->write(a->gva, bytes.data(), bytes.size()).ok());
      std::vector<unsigned char> back(bytes.size());
      ASSERT_TRUE(space->read(a->gva, back.data(), back.size()).ok());
      EXPECT_EQ(back, bytes);
    }
    EXPECT_FALSE(space->domain_files(0).tiers.empty()) << "a client of the tenant is handed its files";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tiermem
