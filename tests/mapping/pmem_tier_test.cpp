#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "common/shared_memory.hpp"
#include "mapping/tier_backend.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

TEST(PmemTierTest, ContentsSurviveClosingAndReopeningThePool) {
  const std::string dir = test::make_temp_dir("tiermem-pmem");
  const std::string path = dir + "/pool";
  constexpr uint64_t k_capacity = 8 << 20;
  std::vector<unsigned char> pattern(1 << 20);
  std::iota(pattern.begin(), pattern.end(), 7);
  {
    auto tier = make_pmem_tier({path, k_capacity});
    ASSERT_TRUE(tier.ok()) << tier.status().to_string();
    EXPECT_TRUE((*tier)->persistent());
    EXPECT_EQ((*tier)->capacity(), k_capacity);
    ASSERT_TRUE((*tier)->write(3 << 20, pattern.data(), pattern.size()).ok());
  }  // unmapped and closed here
  ASSERT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(std::filesystem::file_size(path), k_capacity);
  {
    auto tier = make_pmem_tier({path, k_capacity});
    ASSERT_TRUE(tier.ok());
    std::vector<unsigned char> back(pattern.size());
    ASSERT_TRUE((*tier)->read(3 << 20, back.data(), back.size()).ok());
    EXPECT_EQ(back, pattern);
    // Discard zeroes the range on the file itself.
    ASSERT_TRUE((*tier)->discard(3 << 20, 1 << 20).ok());
  }
  {
    auto tier = make_pmem_tier({path, k_capacity});
    std::vector<unsigned char> back(pattern.size(), 1);
    ASSERT_TRUE((*tier)->read(3 << 20, back.data(), back.size()).ok());
    EXPECT_EQ(back, std::vector<unsigned char>(pattern.size(), 0));
  }
  std::filesystem::remove_all(dir);
}

TEST(PmemTierTest, UnwritablePathIsAClearError) {
  auto tier = make_pmem_tier({"/nonexistent-dir/x/pool", 1 << 20});
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.status().code(), ErrorCode::io_error);
  EXPECT_NE(tier.status().message().find("/nonexistent-dir/x/pool"), std::string::npos);
}

TEST(DramTierTest, IsSharedThroughItsDescriptor) {
  auto tier = make_dram_tier(1 << 20, "dram-test");
  ASSERT_TRUE(tier.ok());
  ASSERT_GE((*tier)->share_fd(), 0);
  const char msg[] = "shared";
  ASSERT_TRUE((*tier)->write(4096, msg, sizeof msg).ok());
  auto view = MappedRegion::map((*tier)->share_fd(), 1 << 20);
  ASSERT_TRUE(view.ok());
  EXPECT_STREQ(reinterpret_cast<const char*>(view->data() + 4096), "shared");
}

}  // namespace
}  // namespace tiermem
