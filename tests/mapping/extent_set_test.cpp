#include "mapping/extent_set.hpp"

#include <gtest/gtest.h>

namespace tiermem {
namespace {

TEST(ExtentSetTest, BestFitPrefersTheSmallestHole) {
  ExtentSet s(0, 100);
  UnitRange a, b, c;
  ASSERT_TRUE(s.take_best_fit(10, &a));
  ASSERT_TRUE(s.take_best_fit(5, &b));
  ASSERT_TRUE(s.take_best_fit(20, &c));
  EXPECT_TRUE(s.release(b));  // a 5-unit hole at 10..15
  UnitRange d;
  ASSERT_TRUE(s.take_best_fit(4, &d));
  EXPECT_EQ(d.start, 10u);
  EXPECT_EQ(s.free_units(), 100u - 10 - 20 - 4);
}

TEST(ExtentSetTest, ReleaseMergesNeighbours) {
  ExtentSet s(0, 30);
  UnitRange a, b, c;
  ASSERT_TRUE(s.take_best_fit(10, &a));
  ASSERT_TRUE(s.take_best_fit(10, &b));
  ASSERT_TRUE(s.take_best_fit(10, &c));
  EXPECT_EQ(s.free_units(), 0u);
  EXPECT_TRUE(s.release(a));
  EXPECT_TRUE(s.release(c));
  EXPECT_EQ(s.fragments(), 2u);
  EXPECT_TRUE(s.release(b));
  EXPECT_EQ(s.fragments(), 1u);
  EXPECT_EQ(s.largest(), 30u);
}

TEST(ExtentSetTest, ScatteredTakesPiecesWhenNoRunIsLongEnough) {
  ExtentSet s(0, 10);
  UnitRange r[5];
  for (auto& x : r) ASSERT_TRUE(s.take_best_fit(2, &x));
  EXPECT_TRUE(s.release(r[0]));
  EXPECT_TRUE(s.release(r[2]));
  EXPECT_TRUE(s.release(r[4]));
  std::vector<UnitRange> pieces;
  EXPECT_FALSE(s.take_best_fit(5, &r[0]));
  ASSERT_TRUE(s.take_scattered(5, &pieces));
  uint64_t total = 0;
  for (const auto& p : pieces) total += p.count;
  EXPECT_EQ(total, 5u);
  EXPECT_EQ(pieces.size(), 3u);
  EXPECT_EQ(s.free_units(), 1u);
  std::vector<UnitRange> none;
  EXPECT_FALSE(s.take_scattered(2, &none));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(s.free_units(), 1u) << "a failed take leaves the set unchanged";
}

TEST(ExtentSetTest, NextFitDoesNotReuseFreedRangesUntilWrapping) {
  ExtentSet s(1, 9);  // units 1..9
  UnitRange a, b;
  ASSERT_TRUE(s.take_next_fit(3, 1, &a));
  EXPECT_EQ(a.start, 1u);
  EXPECT_TRUE(s.release(a));
  ASSERT_TRUE(s.take_next_fit(3, a.start + a.count, &b));
  EXPECT_EQ(b.start, 4u) << "the freed range 1..3 must not be reused yet";
  UnitRange c;
  ASSERT_TRUE(s.take_next_fit(3, b.start + b.count, &c));
  EXPECT_EQ(c.start, 7u);
  UnitRange d;
  ASSERT_TRUE(s.take_next_fit(3, c.start + c.count, &d));
  EXPECT_EQ(d.start, 1u) << "wrapped around";
  UnitRange e;
  EXPECT_FALSE(s.take_next_fit(1, 1, &e));
}

TEST(ExtentSetTest, ReserveRemovesASpecificFreeRange) {
  ExtentSet s(0, 10);
  EXPECT_TRUE(s.reserve({3, 4}));
  EXPECT_EQ(s.free_units(), 6u);
  EXPECT_FALSE(s.reserve({2, 2})) << "3 is no longer free";
}

TEST(ExtentSetTest, GivingBackWhatIsFreeIsRefusedAndChangesNothing) {
  ExtentSet s(0, 10);
  UnitRange a;
  ASSERT_TRUE(s.take_best_fit(4, &a));
  EXPECT_TRUE(s.release(a));
  EXPECT_FALSE(s.release(a)) << "released twice";
  EXPECT_FALSE(s.release({8, 4})) << "overlaps the free tail";
  EXPECT_FALSE(s.release({~uint64_t{0} - 1, 4})) << "wraps around";
  EXPECT_EQ(s.free_units(), 10u);
  EXPECT_EQ(s.fragments(), 1u);
}

}  // namespace
}  // namespace tiermem
