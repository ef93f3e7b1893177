#include <gtest/gtest.h>

#include <tiermem/units.h>

namespace tiermem {
namespace {

TEST(UnitsTest, ParsesBinaryAndDecimalSuffixes) {
  EXPECT_EQ(*parse_size("4096"), 4096u);
  EXPECT_EQ(*parse_size("64KiB"), 64u << 10);
  EXPECT_EQ(*parse_size("2MiB"), 2u << 20);
  EXPECT_EQ(*parse_size("1GiB"), uint64_t{1} << 30);
  EXPECT_EQ(*parse_size("1gib"), uint64_t{1} << 30);
  EXPECT_EQ(*parse_size("3 M"), 3u << 20);
  EXPECT_EQ(*parse_size("2TiB"), uint64_t{2} << 40);
  EXPECT_EQ(*parse_size("5KB"), 5000u);
  EXPECT_EQ(*parse_size("7MB"), 7000000u);
  EXPECT_EQ(*parse_size("12B"), 12u);
}

TEST(UnitsTest, RejectsBadSizes) {
  for (const char* bad : {"", "MiB", "-1", "1.5GiB", "12 parsecs", "99999999999999999999", "20000000TiB"}) {
    auto r = parse_size(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::invalid_argument);
    EXPECT_NE(r.status().message().find("invalid size"), std::string::npos);
  }
}

TEST(UnitsTest, FormatsForPeople) {
  EXPECT_EQ(format_size(512), "512 B");
  EXPECT_EQ(format_size(64 << 10), "64 KiB");
  EXPECT_EQ(format_size(3 << 19), "1.5 MiB");
  EXPECT_EQ(format_size(uint64_t{1} << 30), "1 GiB");
}

}  // namespace
}  // namespace tiermem
