// The DRAM and PMEM backends: a file per domain, mapped side by side.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "common/shared_memory.hpp"
#include "tiers/tier_backend.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

constexpr uint64_t k_capacity = 8 << 20;

TEST(PmemTierTest, ContentsOfADomainSurviveClosingAndReopeningThePool) {
  const std::string dir = test::make_temp_dir("tiermem-pmem");
  std::vector<unsigned char> pattern(1 << 20);
  std::iota(pattern.begin(), pattern.end(), 7);
  uint64_t span = 0;
  {
    auto tier = make_pmem_tier({dir, k_capacity, 2});
    ASSERT_TRUE(tier.ok()) << tier.status().to_string();
    EXPECT_TRUE((*tier)->persistent());
    EXPECT_EQ((*tier)->capacity(), k_capacity);
    span = (*tier)->domain_span();
    ASSERT_TRUE((*tier)->open_domain(1, k_capacity).ok());
    EXPECT_TRUE((*tier)->contains(span + (3 << 20), pattern.size()));
    EXPECT_FALSE((*tier)->contains(3 << 20, 1)) << "domain 0 is not open";
    EXPECT_FALSE((*tier)->contains(0, 0)) << "not even an empty range of a domain not open";
    EXPECT_TRUE((*tier)->contains(span, 0));
    ASSERT_TRUE((*tier)->write(span + (3 << 20), pattern.data(), pattern.size()).ok());
  }  // unmapped and closed here
  ASSERT_TRUE(std::filesystem::exists(dir + "/pmem.1"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/pmem.0"));
  EXPECT_EQ(std::filesystem::file_size(dir + "/pmem.1"), k_capacity);
  {
    auto tier = make_pmem_tier({dir, k_capacity, 2});
    ASSERT_TRUE(tier.ok());
    ASSERT_TRUE((*tier)->open_domain(1, k_capacity).ok());
    std::vector<unsigned char> back(pattern.size());
    ASSERT_TRUE((*tier)->read(span + (3 << 20), back.data(), back.size()).ok());
    EXPECT_EQ(back, pattern);
    // Discard zeroes the range on the file itself.
    ASSERT_TRUE((*tier)->discard(span + (3 << 20), 1 << 20).ok());
  }
  {
    auto tier = make_pmem_tier({dir, k_capacity, 2});
    ASSERT_TRUE((*tier)->open_domain(1, k_capacity).ok());
    std::vector<unsigned char> back(pattern.size(), 1);
    ASSERT_TRUE((*tier)->read(span + (3 << 20), back.data(), back.size()).ok());
    EXPECT_EQ(back, std::vector<unsigned char>(pattern.size(), 0));
  }
  std::filesystem::remove_all(dir);
}

TEST(PmemTierTest, UnwritableDirectoryIsAClearError) {
  auto tier = make_pmem_tier({"/nonexistent-dir/x", 1 << 20, 1});
  ASSERT_TRUE(tier.ok()) << "nothing is opened until a domain is";
  Status s = (*tier)->open_domain(0, 1 << 20);
  EXPECT_EQ(s.code(), ErrorCode::io_error);
  EXPECT_NE(s.message().find("/nonexistent-dir/x/pmem.0"), std::string::npos) << s.message();
}

TEST(DramTierTest, EachDomainIsAFileOfItsOwnSharedThroughItsDescriptor) {
  const std::string dir = test::make_temp_dir("tiermem-dram");
  auto tier = make_dram_tier({dir, 1 << 20, 3});
  ASSERT_TRUE(tier.ok());
  EXPECT_EQ((*tier)->share_fd(0), -1) << "not open yet";
  ASSERT_TRUE((*tier)->open_domain(0, 1 << 20).ok());
  ASSERT_TRUE((*tier)->open_domain(2, 1 << 20).ok());
  EXPECT_EQ((*tier)->open_domain(2, 4096).code(), ErrorCode::invalid_argument) << "never resized";
  EXPECT_EQ((*tier)->open_domain(3, 4096).code(), ErrorCode::invalid_argument) << "no such domain";
  const uint64_t span = (*tier)->domain_span();
  const char zero[] = "domain zero", two[] = "domain two";
  ASSERT_TRUE((*tier)->write(4096, zero, sizeof zero).ok());
  ASSERT_TRUE((*tier)->write(2 * span + 4096, two, sizeof two).ok());
  auto view0 = MappedRegion::map((*tier)->share_fd(0), 1 << 20);
  auto view2 = MappedRegion::map((*tier)->share_fd(2), 1 << 20);
  ASSERT_TRUE(view0.ok() && view2.ok());
  EXPECT_STREQ(reinterpret_cast<const char*>(view0->data() + 4096), "domain zero");
  EXPECT_STREQ(reinterpret_cast<const char*>(view2->data() + 4096), "domain two")
      << "the descriptor of domain 2 holds its frames only";
  EXPECT_EQ((*tier)->domain_of(2 * span + 4096), 2u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tiermem
