// The frame budget alone: buffers grow with what arrived, claims are
// granted in order, a uid at its own limit holds up only itself, and a
// claim that times out says which budget was full and lets the next pass.
#include "daemon/frame_budget.hpp"

#include <gtest/gtest.h>

#include <atomic>

namespace tiermem {
namespace {

constexpr uint64_t k_mib = 1 << 20;

TEST(FrameCapacityTest, AnAnnouncedSizeCommitsNothing) {
  // A 16 MiB frame of which one byte arrived: the smallest buffer.
  EXPECT_EQ(next_frame_capacity(0, 1, 16 * k_mib), k_min_frame_buffer);
  // What is in the socket is taken in one step, never past the frame.
  EXPECT_EQ(next_frame_capacity(0, 200 << 10, 16 * k_mib), 200u << 10);
  EXPECT_EQ(next_frame_capacity(0, 200 << 10, 100), 100u);
  // Else twice what it holds: a 16 MiB frame is copied about twice, not
  // once per arrival.
  EXPECT_EQ(next_frame_capacity(4 << 10, 0, 16 * k_mib), 8u << 10);
  EXPECT_EQ(next_frame_capacity(12 * k_mib, 0, 16 * k_mib), 16 * k_mib);
  // Never more than the frame, nor more than twice what arrived plus the
  // smallest buffer.
  for (uint64_t have = 0; have < 16 * k_mib; have = have * 2 + 1) {
    const uint64_t next = next_frame_capacity(have, 0, 16 * k_mib);
    EXPECT_LE(next, 16 * k_mib);
    EXPECT_LE(next, 2 * have + k_min_frame_buffer);
    EXPECT_GT(next, have);
  }
}

struct Woken {
  std::atomic<int> times{0};
  std::function<void()> callback() {
    return [this] { ++times; };
  }
};

TEST(FrameBudgetTest, ClaimsThatFitAreGrantedAtOnceAndTheRestInTurn) {
  FrameBudget budget(32 * k_mib, 32 * k_mib);
  Woken a, b, c;
  auto first = budget.claim(1000, "uid 1000", 16 * k_mib, a.callback());
  auto second = budget.claim(1000, "uid 1000", 16 * k_mib, b.callback());
  auto third = budget.claim(1000, "uid 1000", 8 * k_mib, c.callback());
  EXPECT_TRUE(first->granted());
  EXPECT_TRUE(second->granted());
  EXPECT_FALSE(third->granted());
  EXPECT_EQ(budget.held(), 32 * k_mib);
  EXPECT_EQ(budget.waiting(), 1u);
  EXPECT_EQ(a.times + b.times, 0) << "granted at once: nobody to wake";
  budget.release(1000, 16 * k_mib);
  EXPECT_TRUE(third->granted());
  EXPECT_EQ(c.times, 1);
  EXPECT_TRUE(budget.settle(third).ok());
  EXPECT_EQ(budget.held(), 24 * k_mib);
  budget.release(1000, 16 * k_mib);
  budget.release(1000, 8 * k_mib);
  EXPECT_EQ(budget.held(), 0u);
  EXPECT_EQ(budget.held_by(1000), 0u);
}

TEST(FrameBudgetTest, NobodyPassesTheFirstInLineForTheTotal) {
  FrameBudget budget(32 * k_mib, 32 * k_mib);
  Woken big, small;
  auto holder = budget.claim(1, "uid 1", 24 * k_mib, {});
  auto large = budget.claim(2, "uid 2", 16 * k_mib, big.callback());
  // 8 MiB are free, but the 16 MiB claim came first: a stream of small
  // claims must not starve it.
  auto later = budget.claim(3, "uid 3", 4 * k_mib, small.callback());
  EXPECT_FALSE(large->granted());
  EXPECT_FALSE(later->granted());
  budget.release(1, 24 * k_mib);
  EXPECT_TRUE(large->granted());
  EXPECT_TRUE(later->granted());
  EXPECT_EQ(big.times, 1);
  EXPECT_EQ(small.times, 1);
}

TEST(FrameBudgetTest, AUidAtItsOwnLimitHoldsUpOnlyItself) {
  FrameBudget budget(64 * k_mib, 16 * k_mib);
  auto greedy = budget.claim(1, "uid 1", 16 * k_mib, {});
  Woken more;
  auto greedier = budget.claim(1, "uid 1", 8 * k_mib, more.callback());
  EXPECT_FALSE(greedier->granted()) << "uid 1 holds its whole share";
  auto other = budget.claim(2, "uid 2", 16 * k_mib, {});
  EXPECT_TRUE(other->granted()) << "uid 2 waited behind uid 1's own limit";
  budget.release(1, 16 * k_mib);
  EXPECT_TRUE(greedier->granted());
  EXPECT_EQ(more.times, 1);
}

TEST(FrameBudgetTest, AClaimThatTimesOutSaysWhichBudgetAndLetsTheNextPass) {
  FrameBudget budget(32 * k_mib, 16 * k_mib);
  auto held = budget.claim(1, "uid 1", 16 * k_mib, {});
  auto over_uid = budget.claim(1, "uid 1", 8 * k_mib, {});
  Status s = budget.settle(over_uid);
  EXPECT_EQ(s.code(), ErrorCode::busy);
  EXPECT_NE(s.message().find("uid 1 holds 16 MiB of its 16 MiB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("control.frame_budget_per_uid_bytes"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("a frame of 8 MiB waited"), std::string::npos) << s.message();

  auto second = budget.claim(2, "uid 2", 16 * k_mib, {});
  ASSERT_TRUE(second->granted());
  auto blocked = budget.claim(3, "uid 3", 16 * k_mib, {});  // first in line for the total
  Woken w;
  auto behind = budget.claim(4, "uid 4", 1 * k_mib, w.callback());
  EXPECT_FALSE(behind->granted());
  s = budget.settle(blocked);
  EXPECT_EQ(s.code(), ErrorCode::busy);
  EXPECT_NE(s.message().find("hold 32 MiB of 32 MiB (control.frame_budget_bytes"), std::string::npos)
      << s.message();
  EXPECT_EQ(budget.waiting(), 1u);
  EXPECT_FALSE(behind->granted()) << "32 of 32 MiB are held: nothing fits";
  budget.release(2, 16 * k_mib);
  EXPECT_TRUE(behind->granted());
  EXPECT_EQ(w.times, 1);
}

TEST(FrameBudgetTest, AClosedBudgetGrantsAndWakesNothing) {
  FrameBudget budget(16 * k_mib, 16 * k_mib);
  auto held = budget.claim(1, "uid 1", 16 * k_mib, {});
  Woken w;
  auto waiting = budget.claim(1, "uid 1", 1 * k_mib, w.callback());
  budget.close();
  budget.release(1, 16 * k_mib);
  EXPECT_FALSE(waiting->granted());
  EXPECT_EQ(w.times, 0);
}

}  // namespace
}  // namespace tiermem
