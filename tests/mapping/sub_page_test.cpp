// Sub-page allocations (M10) on a real AddressSpace (DRAM memfd files, a
// PMEM pool file, a libpmemobj metadata pool): small allocations share pages
// without ever overlapping, each keeps its own generation and bounds, pages
// are never shared between tenants, freed slots come back zeroed and their
// old addresses are refused, the last free gives the page back, and all of
// it survives a restart from the durable metadata.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "mapping/address_space.hpp"
#include "pages/version.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

constexpr uint64_t k_page = 64 << 10;
constexpr uint64_t k_sub_max = k_page / 8;

std::unique_ptr<AddressSpace> make_space(const std::string& dir, bool durable, uint64_t sub_page_max = k_sub_max) {
  TierSet tiers;
  tiers[static_cast<size_t>(Tier::dram)] = std::move(make_dram_tier({dir, 8 * k_page, 2})).value();
  tiers[static_cast<size_t>(Tier::pmem)] = std::move(make_pmem_tier({dir, 8 * k_page, 2})).value();
  AddressSpaceOptions o{.node = 3, .page_size = k_page, .domains = 2, .pages_per_domain = 4096,
                        .sub_page_max = sub_page_max, .versions_dir = dir, .incarnation = 7};
  if (durable) o.metadata = MetadataOptions{.path = dir + "/metadata.pool", .max_allocations = 4096};
  auto space = AddressSpace::create(o, std::move(tiers));
  EXPECT_TRUE(space.ok()) << space.status().to_string();
  return space.ok() ? std::move(space).value() : nullptr;
}

uint64_t used_pages(const AddressSpace& space, Tier tier) {
  for (const TierStat& t : space.tier_stats()) {
    if (t.tier == tier) return t.used_bytes / k_page;
  }
  return ~uint64_t{0};
}

class SubPageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_dir = test::make_temp_dir("tiermem-subpage");
    m_space = make_space(m_dir, false);
    ASSERT_NE(m_space, nullptr);
  }
  void TearDown() override {
    m_space.reset();
    std::filesystem::remove_all(m_dir);
  }
  AllocationInfo alloc(uint64_t size, const std::string& tenant = "", const std::string& name = "",
                       bool coherent = false) {
    auto r = m_space->allocate(
        {.size = size, .tier = Tier::dram, .name = name, .coherent = coherent, .tenant = tenant});
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : AllocationInfo{};
  }

  std::string m_dir;
  std::unique_ptr<AddressSpace> m_space;
};

TEST_F(SubPageTest, SmallAllocationsSharePagesAndNeverOverlap) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint64_t> size(1, k_sub_max);
  std::vector<AllocationInfo> all;
  uint64_t slot_bytes = 0;
  for (int i = 0; i < 100; ++i) {
    const AllocationInfo a = alloc(i % 10 == 0 ? 8 : size(rng));
    ASSERT_NE(a.gva.offset, 0u);
    EXPECT_EQ(a.slot_bytes, std::max<uint64_t>(64, std::bit_ceil(a.size))) << "size " << a.size;
    EXPECT_EQ(a.gva.offset % a.slot_bytes, 0u) << "a slot is aligned to its size class";
    EXPECT_EQ(a.gva.offset / k_page, (a.gva.offset + a.slot_bytes - 1) / k_page) << "a slot never crosses a page";
    EXPECT_EQ(a.pages, 1u);
    slot_bytes += a.slot_bytes;
    all.push_back(a);
  }
  // No two slots overlap, and every generation is an allocation's own.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::set<uint32_t> generations;
  for (const AllocationInfo& a : all) {
    ranges.push_back({a.gva.offset, a.gva.offset + a.slot_bytes});
    generations.insert(a.gva.generation);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "slots overlap";
  EXPECT_EQ(generations.size(), all.size());
  // Far fewer pages than allocations: each size class fills its pages.
  const AddressSpace::SlabStats slabs = m_space->slab_stats();
  EXPECT_EQ(slabs.allocations, all.size());
  EXPECT_LE(slabs.slabs * k_page, slot_bytes + 8 * k_page) << slabs.slabs << " pages for " << all.size();
  EXPECT_EQ(used_pages(*m_space, Tier::dram) + used_pages(*m_space, Tier::pmem), slabs.slabs) << "DRAM filled, PMEM took the rest";

  // Every allocation filled to its last byte, then all read back intact:
  // nobody's bytes landed in a neighbour's.
  for (size_t i = 0; i < all.size(); ++i) {
    const auto bytes = test::pattern(all[i].size, static_cast<unsigned>(i + 1));
    ASSERT_TRUE(m_space->write(all[i].gva, bytes.data(), bytes.size()).ok());
  }
  for (size_t i = 0; i < all.size(); ++i) {
    std::vector<unsigned char> back(all[i].size);
    ASSERT_TRUE(m_space->read(all[i].gva, back.data(), back.size()).ok());
    EXPECT_EQ(back, test::pattern(all[i].size, static_cast<unsigned>(i + 1))) << "allocation " << i;
  }
}

TEST_F(SubPageTest, BoundsAreTheAllocationsNotItsSlotOrPage) {
  const AllocationInfo a = alloc(100);
  const AllocationInfo b = alloc(100);
  ASSERT_EQ(a.slot_bytes, 128u);
  ASSERT_EQ(b.gva.offset, a.gva.offset + 128) << "the next slot of the same page";
  std::vector<unsigned char> buf(200, 0xab);
  const Status past = m_space->write(a.gva, buf.data(), 101);
  EXPECT_EQ(past.code(), ErrorCode::out_of_range) << past.to_string();
  EXPECT_NE(past.message().find("100 bytes"), std::string::npos) << past.message();
  EXPECT_EQ(m_space->read(a.gva.plus(64), buf.data(), 64).code(), ErrorCode::out_of_range);
  // The rest of a's slot is past a's end; a slot nobody has is no
  // allocation's.
  const Status tail = m_space->read(a.gva.plus(110), buf.data(), 1);
  EXPECT_EQ(tail.code(), ErrorCode::out_of_range) << tail.to_string();
  const Status gap = m_space->read(a.gva.plus(256), buf.data(), 1);
  EXPECT_EQ(gap.code(), ErrorCode::not_allocated) << gap.to_string();
  EXPECT_NE(gap.message().find("free slot"), std::string::npos) << gap.message();
  // A GVA inside b is b's, and b's generation is not a's.
  auto t = m_space->translate(b.gva.plus(5));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->allocation.gva, b.gva);
  EXPECT_EQ(t->offset_in_allocation, 5u);
  Gva wrong = b.gva;
  wrong.generation = a.gva.generation;
  EXPECT_EQ(m_space->translate(wrong).status().code(), ErrorCode::stale_generation);
  // Free takes the first byte; atomics need alignment inside the allocation.
  EXPECT_EQ(m_space->free(a.gva.plus(8)).code(), ErrorCode::invalid_argument);
  EXPECT_EQ(m_space->atomic(a.gva.plus(96), WordOp::fetch_add, 1, 0).status().code(), ErrorCode::out_of_range);
  auto old = m_space->atomic(a.gva.plus(88), WordOp::fetch_add, 5, 0);
  ASSERT_TRUE(old.ok()) << old.status().to_string();
  EXPECT_EQ(*old, 0u);
}

TEST_F(SubPageTest, TenantsNeverShareAPage) {
  const AllocationInfo a = alloc(64, "alice");
  const AllocationInfo b = alloc(64, "bob");
  const AllocationInfo a2 = alloc(64, "alice");
  EXPECT_EQ(a.gva.offset / k_page, a2.gva.offset / k_page) << "alice's small allocations share her page";
  EXPECT_NE(a.gva.offset / k_page, b.gva.offset / k_page);
  const auto da = m_space->find_domain("alice"), db = m_space->find_domain("bob");
  ASSERT_TRUE(da && db);
  EXPECT_EQ(m_space->versions().domain_of(a.gva.offset / k_page), *da);
  EXPECT_EQ(m_space->versions().domain_of(b.gva.offset / k_page), *db);
  // Each page's frame is in its tenant's files: a client of bob's is never
  // given the memory of alice's page.
  auto la = m_space->layout(a.gva), lb = m_space->layout(b.gva);
  ASSERT_TRUE(la.ok() && lb.ok());
  const DomainFiles fa = m_space->domain_files(*da), fb = m_space->domain_files(*db);
  const auto in_files = [](const DomainFiles& f, uint64_t frame_offset) {
    for (const auto& t : f.tiers) {
      if (t.tier == Tier::dram && frame_offset >= t.frame_offset && frame_offset < t.frame_offset + t.bytes) return true;
    }
    return false;
  };
  EXPECT_TRUE(in_files(fa, la->extents.at(0).frame_offset));
  EXPECT_FALSE(in_files(fb, la->extents.at(0).frame_offset));
  EXPECT_TRUE(in_files(fb, lb->extents.at(0).frame_offset));
  // Bob's quota counts his page, not alice's.
  EXPECT_EQ(m_space->usage("alice", Tier::dram), k_page);
  EXPECT_EQ(m_space->usage("bob", Tier::dram), k_page);
}

TEST_F(SubPageTest, AFreedSlotIsRefusedThenComesBackZeroedAndTheLastFreeGivesThePageBack) {
  const AllocationInfo a = alloc(64, "", "a");
  const AllocationInfo b = alloc(64);
  const std::vector<unsigned char> secret(64, 0x5a);
  ASSERT_TRUE(m_space->write(a.gva, secret.data(), secret.size()).ok());
  ASSERT_TRUE(m_space->write(b.gva, secret.data(), secret.size()).ok());
  const uint64_t page = a.gva.offset / k_page;
  const uint64_t epoch = version::epoch_of(version::load(m_space->versions().word(page)));
  ASSERT_TRUE(m_space->free(a.gva).ok());
  EXPECT_NE(version::epoch_of(version::load(m_space->versions().word(page))), epoch)
      << "a free moves the page's epoch: every cached translation of the page is stale";
  std::vector<unsigned char> back(64);
  EXPECT_EQ(m_space->read(a.gva, back.data(), back.size()).code(), ErrorCode::not_allocated);
  EXPECT_EQ(m_space->lookup("a").status().code(), ErrorCode::not_found);
  EXPECT_EQ(m_space->free(a.gva).code(), ErrorCode::not_allocated) << "freed twice";
  // The slot is taken again: by a new allocation that reads zeros, and the
  // old address (its generation) is stale, not the new one's.
  const AllocationInfo c = alloc(64);
  ASSERT_EQ(c.gva.offset, a.gva.offset) << "the first free slot";
  ASSERT_TRUE(m_space->read(c.gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, std::vector<unsigned char>(64, 0)) << "nothing of the freed allocation shows through";
  EXPECT_EQ(m_space->read(a.gva, back.data(), back.size()).code(), ErrorCode::stale_generation);
  ASSERT_TRUE(m_space->read(b.gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, secret) << "the neighbour kept its bytes";

  EXPECT_EQ(used_pages(*m_space, Tier::dram), 1u);
  ASSERT_TRUE(m_space->free(b.gva).ok());
  ASSERT_TRUE(m_space->free(c.gva).ok());
  EXPECT_EQ(m_space->slab_stats().slabs, 0u);
  EXPECT_EQ(used_pages(*m_space, Tier::dram), 0u) << "the last free gives the page back";
  EXPECT_EQ(m_space->allocation_count(), 0u);
  EXPECT_EQ(m_space->translate(b.gva).status().code(), ErrorCode::not_allocated);
}

TEST_F(SubPageTest, KindsSizesAndCopiesKeepTheirOwnPages) {
  const AllocationInfo plain = alloc(8);
  const AllocationInfo counter = alloc(8, "", "", /*coherent=*/true);
  EXPECT_NE(plain.gva.offset / k_page, counter.gva.offset / k_page)
      << "coherent words take no page lock: they never share a page with locked ones";
  const AllocationInfo big = alloc(k_sub_max + 1);
  EXPECT_EQ(big.slot_bytes, 0u);
  EXPECT_EQ(big.gva.offset % k_page, 0u);
  auto copied = m_space->allocate({.size = 8, .tier = Tier::dram, .policy = {.replicas_wanted = 1}});
  ASSERT_TRUE(copied.ok());
  EXPECT_EQ(copied->slot_bytes, 0u) << "a replicated allocation takes whole pages";
  // Shared pages are not migrated; the refusal says why and what to do.
  auto moved = m_space->begin_migration(plain.gva);
  ASSERT_FALSE(moved.ok());
  EXPECT_EQ(moved.status().code(), ErrorCode::failed_precondition);
  EXPECT_NE(moved.status().message().find("shares page"), std::string::npos) << moved.status().message();
  // Pinning one pins the page, for as long as any of its allocations is mapped.
  const AllocationInfo neighbour = alloc(8);
  auto pinned = m_space->pin(plain.gva);
  ASSERT_TRUE(pinned.ok());
  ASSERT_EQ(pinned->extents.size(), 1u);
  EXPECT_EQ(pinned->extents[0].length, 64u);
  EXPECT_EQ(pinned->extents[0].frame_offset % k_page, plain.gva.offset % k_page);
  ASSERT_TRUE(m_space->pin(neighbour.gva).ok());
  EXPECT_EQ(m_space->free(plain.gva).code(), ErrorCode::failed_precondition) << "mapped";
  ASSERT_TRUE(m_space->unpin(plain.gva).ok());
  const auto flags = [&] {
    const MappingDump d = m_space->dump();
    for (const PageInfo& p : d.pages) {
      if (p.page_index == plain.gva.offset / k_page) return p.flags;
    }
    return 0u;
  };
  EXPECT_NE(flags() & k_page_pinned, 0u) << "the neighbour is still mapped";
  ASSERT_TRUE(m_space->unpin(neighbour.gva).ok());
  EXPECT_EQ(flags() & k_page_pinned, 0u);
  EXPECT_TRUE(m_space->free(plain.gva).ok());
}

TEST_F(SubPageTest, ASmallAllocationCountsOnePageAgainstAQuota) {
  TenantLimits limits;
  limits.bytes[static_cast<size_t>(Tier::dram)] = k_page;
  std::vector<AllocationInfo> in_page;
  for (uint64_t i = 0; i < k_page / 1024; ++i) {
    auto r = m_space->allocate({.size = 1000, .tier = Tier::dram, .strict = true, .tenant = "small", .limits = limits});
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().to_string();
  }
  auto over = m_space->allocate({.size = 1000, .tier = Tier::dram, .strict = true, .tenant = "small", .limits = limits});
  ASSERT_FALSE(over.ok()) << "the page is full and the quota is one page";
  EXPECT_EQ(over.status().code(), ErrorCode::quota_exceeded) << over.status().to_string();
}

TEST(SubPageOptionsTest, ASharedPageMustHoldTwo) {
  const std::string dir = test::make_temp_dir("tiermem-subpage-opt");
  TierSet tiers;
  tiers[static_cast<size_t>(Tier::dram)] = std::move(make_dram_tier({dir, 4 * k_page, 1})).value();
  auto space = AddressSpace::create({.node = 1, .page_size = k_page, .sub_page_max = k_page / 2 + 1, .versions_dir = dir},
                                    std::move(tiers));
  ASSERT_FALSE(space.ok());
  EXPECT_EQ(space.status().code(), ErrorCode::invalid_argument);
  EXPECT_NE(space.status().message().find("half a page"), std::string::npos) << space.status().message();
  std::filesystem::remove_all(dir);
}

TEST(SubPageDurableTest, SmallAllocationsComeBackAfterARestartAndSessionOnesDoNot) {
  const std::string dir = test::make_temp_dir("tiermem-subpage-durable");
  std::vector<AllocationInfo> kept;
  AllocationInfo session, freed;
  {
    auto space = make_space(dir, true);
    ASSERT_NE(space, nullptr);
    for (int i = 0; i < 40; ++i) {
      auto r = space->allocate({.size = static_cast<uint64_t>(8 + 37 * i), .tier = i % 2 ? Tier::dram : Tier::pmem,
                                .name = "small-" + std::to_string(i), .tenant = "team"});
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      const auto bytes = test::pattern(r->size, static_cast<unsigned>(i + 1));
      ASSERT_TRUE(space->write(r->gva, bytes.data(), bytes.size()).ok());
      kept.push_back(*r);
    }
    auto s = space->allocate({.size = 64, .tier = Tier::dram, .session = true, .tenant = "team"});
    auto f = space->allocate({.size = 64, .tier = Tier::dram, .tenant = "team"});
    ASSERT_TRUE(s.ok() && f.ok());
    session = *s;
    freed = *f;
    const std::vector<unsigned char> old(64, 0xee);
    ASSERT_TRUE(space->write(freed.gva, old.data(), old.size()).ok());
    ASSERT_TRUE(space->free(freed.gva).ok());
  }
  {
    auto space = make_space(dir, true);
    ASSERT_NE(space, nullptr);
    const RecoveryReport& r = space->recovery();
    EXPECT_TRUE(r.memory_adopted);
    EXPECT_EQ(r.dropped, 0u) << (r.dropped_reasons.empty() ? "" : r.dropped_reasons[0]);
    EXPECT_EQ(r.allocations, kept.size()) << "the session allocation is not recovered";
    EXPECT_EQ(space->allocation_count(), kept.size());
    for (size_t i = 0; i < kept.size(); ++i) {
      auto found = space->lookup("small-" + std::to_string(i));
      ASSERT_TRUE(found.ok()) << found.status().to_string();
      EXPECT_EQ(found->gva, kept[i].gva) << "same address and generation";
      EXPECT_EQ(found->slot_bytes, kept[i].slot_bytes);
      EXPECT_EQ(found->tier, kept[i].tier);
      std::vector<unsigned char> back(kept[i].size);
      ASSERT_TRUE(space->read(kept[i].gva, back.data(), back.size()).ok());
      EXPECT_EQ(back, test::pattern(kept[i].size, static_cast<unsigned>(i + 1))) << i;
    }
    std::vector<unsigned char> back(64);
    EXPECT_FALSE(space->read(session.gva, back.data(), back.size()).ok());
    // The slots of the freed and the session allocation are free again, and
    // read as zeros whoever takes them.
    std::set<uint64_t> seen;
    for (int i = 0; i < 4; ++i) {
      auto again = space->allocate({.size = 64, .tier = Tier::dram, .tenant = "team"});
      ASSERT_TRUE(again.ok());
      seen.insert(again->gva.offset);
      ASSERT_TRUE(space->read(again->gva, back.data(), back.size()).ok());
      EXPECT_EQ(back, std::vector<unsigned char>(64, 0)) << "slot " << again->gva.to_string();
    }
    EXPECT_TRUE(seen.count(freed.gva.offset) != 0) << "the freed slot was handed out again";
    EXPECT_EQ(space->allocation_count(), kept.size() + 4);
    for (const AllocationInfo& a : space->list()) ASSERT_TRUE(space->free(a.gva).ok()) << a.gva.to_string();
    EXPECT_EQ(space->slab_stats().slabs, 0u);
    EXPECT_EQ(used_pages(*space, Tier::dram) + used_pages(*space, Tier::pmem), 0u);
  }
  {
    auto space = make_space(dir, true);
    ASSERT_NE(space, nullptr);
    EXPECT_EQ(space->recovery().allocations, 0u);
    EXPECT_EQ(space->slab_stats().slabs, 0u) << "no shared page outlives its allocations";
    EXPECT_EQ(used_pages(*space, Tier::dram) + used_pages(*space, Tier::pmem), 0u);
  }
  // A session allocation alone in its page: the page is given back at the
  // next start.
  {
    auto space = make_space(dir, true);
    ASSERT_TRUE(space->allocate({.size = 64, .tier = Tier::dram, .session = true, .tenant = "team"}).ok());
  }
  {
    auto space = make_space(dir, true);
    ASSERT_NE(space, nullptr);
    EXPECT_EQ(space->slab_stats().slabs, 0u);
    EXPECT_EQ(used_pages(*space, Tier::dram), 0u);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tiermem
