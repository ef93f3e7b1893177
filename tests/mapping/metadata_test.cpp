// The durable metadata (H5) on a real libpmemobj pool: what is recorded
// comes back at the next open, a pool of another geometry or a full table is
// refused with a reason, and an AddressSpace rebuilt from records drops the
// ones that do not fit its tiers (and erases them) while keeping the rest,
// bytes included.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "mapping/address_space.hpp"
#include "mapping/metadata_store.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

constexpr uint64_t k_page = 64 << 10;

MetadataGeometry geometry() {
  MetadataGeometry g;
  g.node = 3;
  g.page_size = k_page;
  g.domains = 2;
  g.pages_per_domain = 4096;
  g.tier_frames[static_cast<size_t>(Tier::dram)] = 64;  // 2 domains of a 2 MiB span
  g.tier_frames[static_cast<size_t>(Tier::pmem)] = 64;
  return g;
}

AllocationRecord record(uint64_t first_page, uint64_t frame_offset, const std::string& name) {
  AllocationRecord r;
  r.first_page = first_page;
  r.pages = 2;
  r.size = 2 * k_page - 5;
  r.generation = 77;
  r.tier = Tier::dram;
  r.owner_uid = 1000;
  r.created_unix_ms = 123;
  r.tenant = "team";
  r.name = name;
  r.runs = {{frame_offset, 2, 3, Tier::dram, 0x17, 0}};
  return r;
}

class MetadataTest : public ::testing::Test {
 protected:
  void SetUp() override { m_dir = test::make_temp_dir("tiermem-meta"); }
  void TearDown() override { std::filesystem::remove_all(m_dir); }
  MetadataOptions options(uint64_t max = 16) const { return {.path = m_dir + "/metadata.pool", .max_allocations = max}; }
  std::string m_dir;
};

TEST_F(MetadataTest, WhatIsRecordedComesBackAtTheNextOpen) {
  {
    auto store = open_pmem_metadata(options(), geometry());
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    EXPECT_TRUE((*store)->image().created);
    DomainRecord d{1, "team", {}};
    d.limit_pages[static_cast<size_t>(Tier::dram)] = 32;
    ASSERT_TRUE((*store)->put_domain(d).ok());
    ASSERT_TRUE((*store)->put_allocation(record(4096, 32 * k_page, "kept"), 78).ok());
    ASSERT_TRUE((*store)->put_allocation(record(4100, 34 * k_page, "freed"), 79).ok());
    ASSERT_TRUE((*store)->erase_allocation(4100).ok());
    AllocationRecord moved = record(4096, 32 * k_page, "kept");
    moved.runs = {{32 * k_page, 1, 3, Tier::dram, 0x17, 0}, {5 * k_page, 1, 2, Tier::pmem, 0x07, 99}};
    ASSERT_TRUE((*store)->put_allocation(moved, 80).ok()) << "a record is replaced in place";
    ASSERT_TRUE((*store)->set_lent(Tier::pmem, {40, 41}, 2, 1).ok());
    ASSERT_TRUE((*store)->set_lent(Tier::pmem, {41}, 0, 0).ok());
    EXPECT_EQ((*store)->image().memory_generations, std::vector<uint64_t>(geometry().domains, 0))
        << "a new pool knows no domain's memory yet";
    std::vector<uint64_t> generations(geometry().domains, 0);
    generations[1] = 555;
    ASSERT_TRUE((*store)->set_memory_generations(generations).ok());
    EXPECT_EQ((*store)->set_memory_generations({1, 2, 3, 4, 5, 6, 7}).code(), ErrorCode::internal)
        << "one generation per domain, no more";
  }
  auto store = open_pmem_metadata(options(), geometry());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  const MetadataImage& m = (*store)->image();
  EXPECT_FALSE(m.created);
  EXPECT_EQ(m.starts, 2u);
  EXPECT_EQ(m.next_generation, 80u);
  ASSERT_EQ(m.memory_generations.size(), geometry().domains);
  EXPECT_EQ(m.memory_generations[1], 555u) << "each domain's memory generation is its own";
  EXPECT_EQ(m.memory_generations[0], 0u);
  ASSERT_EQ(m.domains.size(), 1u);
  EXPECT_EQ(m.domains[0].domain, 1u);
  EXPECT_EQ(m.domains[0].tenant, "team");
  EXPECT_EQ(m.domains[0].limit_pages[static_cast<size_t>(Tier::dram)], 32u);
  ASSERT_EQ(m.allocations.size(), 1u) << "the freed one is gone";
  const AllocationRecord& a = m.allocations[0];
  EXPECT_EQ(a.first_page, 4096u);
  EXPECT_EQ(a.size, 2 * k_page - 5);
  EXPECT_EQ(a.generation, 77u);
  EXPECT_EQ(a.name, "kept");
  EXPECT_EQ(a.tenant, "team");
  EXPECT_EQ(a.owner_uid, 1000u);
  ASSERT_EQ(a.runs.size(), 2u);
  EXPECT_EQ(a.runs[1].node, 2u);
  EXPECT_EQ(a.runs[1].tier, Tier::pmem);
  EXPECT_EQ(a.runs[1].memory_generation, 99u);
  ASSERT_EQ(m.lent.size(), 1u);
  EXPECT_EQ(m.lent[0].frame, 40u);
  EXPECT_EQ(m.lent[0].borrower, 2u);
}

TEST_F(MetadataTest, APoolOfAnotherGeometryOrAFullTableIsRefused) {
  {
    auto store = open_pmem_metadata(options(2), geometry());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->put_allocation(record(4096, 32 * k_page, "a"), 1).ok());
    ASSERT_TRUE((*store)->put_allocation(record(4100, 34 * k_page, "b"), 2).ok());
    const Status full = (*store)->put_allocation(record(4104, 36 * k_page, "c"), 3);
    EXPECT_EQ(full.code(), ErrorCode::tier_exhausted) << full.to_string();
    EXPECT_NE(full.message().find("metadata.max_allocations"), std::string::npos) << full.message();
    EXPECT_TRUE((*store)->put_allocation(record(4100, 34 * k_page, "b2"), 3).ok()) << "replacing needs no slot";
  }
  MetadataGeometry other = geometry();
  other.page_size = 2 * k_page;
  auto refused = open_pmem_metadata(options(2), other);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::config_error);
  EXPECT_NE(refused.status().message().find("page size 65536, the configuration says 131072"), std::string::npos)
      << refused.status().message();
  std::ofstream(m_dir + "/garbage.pool") << "not a pool";
  auto garbage = open_pmem_metadata({.path = m_dir + "/garbage.pool"}, geometry());
  EXPECT_EQ(garbage.status().code(), ErrorCode::io_error) << garbage.status().to_string();
}

std::unique_ptr<AddressSpace> durable_space(const std::string& dir) {
  TierSet tiers;
  tiers[static_cast<size_t>(Tier::dram)] = std::move(make_dram_tier({dir, 4 * k_page, 2})).value();
  tiers[static_cast<size_t>(Tier::pmem)] = std::move(make_pmem_tier({dir, 8 * k_page, 2})).value();
  AddressSpaceOptions o{.node = 3, .page_size = k_page, .domains = 2, .pages_per_domain = 4096,
                        .versions_dir = dir, .incarnation = 7};
  o.metadata = MetadataOptions{.path = dir + "/metadata.pool", .max_allocations = 16};
  auto space = AddressSpace::create(o, std::move(tiers));
  EXPECT_TRUE(space.ok()) << space.status().to_string();
  return space.ok() ? std::move(space).value() : nullptr;
}

// Two daemons configured with one metadata.path: PMDK's lock on the pool
// used to come out raw ("flock ...: Resource temporarily unavailable"). A
// second open (here of the same process: flock is per open file) says who
// holds the pool and which key to change.
TEST_F(MetadataTest, APoolInUseSaysByWhomAndWhichKeyToChange) {
  auto first = open_pmem_metadata(options(), geometry());
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  auto second = open_pmem_metadata(options(), geometry());
  ASSERT_FALSE(second.ok()) << "one pool opened twice at once";
  EXPECT_EQ(second.status().code(), ErrorCode::already_exists);
  const std::string m = second.status().message();
  EXPECT_NE(m.find("metadata pool " + options().path + " is in use by another process (pid " +
                   std::to_string(::getpid()) + ", metadata_test)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("two daemons must never share one: give each daemon its own metadata.path"), std::string::npos)
      << m;
  first->reset();
  EXPECT_TRUE(open_pmem_metadata(options(), geometry()).ok()) << "free again once the holder closed it";
}

TEST_F(MetadataTest, ARebuiltSpaceKeepsWhatFitsAndDropsTheRest) {
  const auto bytes = test::pattern(2 * k_page, 4);
  AllocationInfo a, b;
  {
    auto space = durable_space(m_dir);
    ASSERT_NE(space, nullptr);
    auto ra = space->allocate({.size = 2 * k_page, .tier = Tier::dram, .name = "a", .tenant = "team"});
    auto rb = space->allocate({.size = k_page, .tier = Tier::pmem, .name = "b", .tenant = "team"});
    ASSERT_TRUE(ra.ok() && rb.ok());
    a = *ra;
    b = *rb;
    ASSERT_TRUE(space->write(a.gva, bytes.data(), bytes.size()).ok());
  }
  {
    // Records that lie: one overlapping a's pages, one on a frame past its
    // tenant's files, one of a tenant with no domain.
    auto store = open_pmem_metadata({.path = m_dir + "/metadata.pool", .max_allocations = 16}, geometry());
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    const uint64_t first = a.gva.offset / k_page;
    const uint32_t next = b.gva.generation + 1;
    ASSERT_TRUE((*store)->put_allocation(record(first + 1, 0, "overlap"), next).ok());
    ASSERT_TRUE((*store)->put_allocation(record(first + 40, 30 * k_page, "past the files"), next).ok());
    AllocationRecord stranger = record(first + 80, 2 * k_page, "stranger");
    stranger.tenant = "nobody";
    ASSERT_TRUE((*store)->put_allocation(stranger, next).ok());
  }
  {
    auto space = durable_space(m_dir);
    ASSERT_NE(space, nullptr);
    const RecoveryReport& r = space->recovery();
    EXPECT_EQ(r.allocations, 2u);
    EXPECT_EQ(r.dropped, 3u);
    EXPECT_EQ(r.dropped_reasons.size(), 3u);
    EXPECT_TRUE(r.memory_adopted);
    EXPECT_EQ(space->allocation_count(), 2u);
    EXPECT_EQ(space->lookup("overlap").status().code(), ErrorCode::not_found);
    auto found = space->lookup("a");
    ASSERT_TRUE(found.ok());
    EXPECT_EQ(found->gva, a.gva);
    std::vector<unsigned char> back(bytes.size());
    ASSERT_TRUE(space->read(a.gva, back.data(), back.size()).ok());
    EXPECT_EQ(back, bytes);
    auto c = space->allocate({.size = k_page, .tier = Tier::dram, .tenant = "team"});
    ASSERT_TRUE(c.ok());
    EXPECT_NE(c->gva.offset, a.gva.offset + k_page) << "a recovered page was handed out again";
    EXPECT_EQ(c->gva.generation, b.gva.generation + 1) << "generations go on";
  }
  auto again = durable_space(m_dir);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->recovery().dropped, 0u) << "dropped records were erased";
  EXPECT_EQ(again->recovery().allocations, 3u);
}

}  // namespace
}  // namespace tiermem
