// A peer's slots alone: requests over the limit wait in order (sessions'
// without a thread, others blocking), until their deadline; a peer that
// goes down fails its waiters at once; threads that block are bounded.
#include "daemon/peer_slots.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace tiermem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

PeerSlots::Deadline in(std::chrono::milliseconds ms) {
  return {Clock::now() + ms, "the test's deadline of " + std::to_string(ms.count()) + " ms"};
}

TEST(PeerSlotsTest, OverTheLimitASessionWaitsWithoutAThreadAndIsHandedTheNextSlot) {
  PeerSlots slots(2, 1);
  auto a = slots.acquire(3, in(1s));
  auto b = slots.acquire(3, in(1s));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(slots.outstanding(3), 2u);
  std::atomic<int> woken{0};
  PeerSlots::Wait first = slots.wait(3, in(1s), [&] { ++woken; });
  PeerSlots::Wait second = slots.wait(3, in(1s), [&] { woken += 10; });
  EXPECT_FALSE(first.ready());
  EXPECT_EQ(slots.waiting(3), 2u);
  // Another peer is not held up by this one.
  EXPECT_TRUE(slots.acquire(2, in(1s)).ok());

  *a = PeerSlots::Slot();  // a request to node 3 is answered
  EXPECT_EQ(woken, 1) << "the first in line is woken, once";
  ASSERT_TRUE(first.ready());
  EXPECT_FALSE(second.ready());
  auto taken = first.take();
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(taken->node(), 3);
  EXPECT_EQ(slots.outstanding(3), 2u) << "handed over, not given back";
  {
    PeerSlots::Use use(*taken);
    ASSERT_NE(PeerSlots::Use::of(3), nullptr);
    EXPECT_EQ(PeerSlots::Use::of(3)->slot(), &*taken);
    EXPECT_EQ(PeerSlots::Use::of(2), nullptr);
  }
  EXPECT_EQ(PeerSlots::Use::of(3), nullptr);
}

TEST(PeerSlotsTest, AWaitPastItsDeadlineSaysWhoHowManyAndHowLong) {
  PeerSlots slots(1, 4);
  auto held = slots.acquire(3, in(1s));
  ASSERT_TRUE(held.ok());
  const auto start = Clock::now();
  auto late = slots.acquire(3, in(150ms));
  const auto took = Clock::now() - start;
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), ErrorCode::unavailable);
  EXPECT_GE(took, 140ms);
  EXPECT_LT(took, 1s);
  const std::string m = late.status().message();
  EXPECT_NE(m.find("node 3 has 1 requests outstanding"), std::string::npos) << m;
  EXPECT_NE(m.find("waited 1"), std::string::npos) << m;
  EXPECT_NE(m.find("the test's deadline of 150 ms"), std::string::npos) << m;
  EXPECT_EQ(slots.waiting(3), 0u) << "it left the line";

  // The same for a session's wait that its deadline ended.
  PeerSlots::Wait wait = slots.wait(3, in(50ms), [] {});
  std::this_thread::sleep_for(60ms);
  auto taken = wait.take();
  ASSERT_FALSE(taken.ok());
  EXPECT_NE(taken.status().message().find("waited"), std::string::npos) << taken.status().message();
  EXPECT_EQ(slots.waiting(3), 0u);
}

TEST(PeerSlotsTest, APeerThatGoesDownFailsItsWaitersAtOnce) {
  PeerSlots slots(1, 4);
  auto held = slots.acquire(3, in(10s));
  ASSERT_TRUE(held.ok());
  std::atomic<int> woken{0};
  PeerSlots::Wait session = slots.wait(3, in(10s), [&] { ++woken; });
  Result<PeerSlots::Slot> blocked = Status();
  double blocked_s = 0;
  std::thread t([&] {
    const auto start = Clock::now();
    blocked = slots.acquire(3, in(10s));
    blocked_s = std::chrono::duration<double>(Clock::now() - start).count();
  });
  while (slots.waiting(3) < 2) std::this_thread::sleep_for(1ms);
  const Status down(ErrorCode::connection_failed, "node 3 (127.0.0.1:1) is down: gone");
  slots.set_down(3, down);
  t.join();
  EXPECT_EQ(woken, 1);
  ASSERT_FALSE(blocked.ok());
  EXPECT_EQ(blocked.status().code(), ErrorCode::connection_failed);
  EXPECT_LT(blocked_s, 2.0) << "waited for its deadline on a node that is down";
  auto s = session.take();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), down.message());
  // Until it is up again, waits fail at once.
  EXPECT_EQ(slots.acquire(3, in(10s)).status().code(), ErrorCode::connection_failed);
  EXPECT_TRUE(slots.wait(3, in(10s), [] {}).ready());
  slots.set_up(3);
  *held = PeerSlots::Slot();
  EXPECT_TRUE(slots.acquire(3, in(10s)).ok());
}

TEST(PeerSlotsTest, ThreadsThatBlockOnOnePeerAreBoundedAndServedInOrder) {
  PeerSlots slots(1, 2);
  auto held = slots.acquire(3, in(10s));
  ASSERT_TRUE(held.ok());
  std::vector<int> order;
  std::mutex order_mutex;
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&, i] {
      auto s = slots.acquire(3, in(10s));
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      std::lock_guard lock(order_mutex);
      order.push_back(i);
    });
    while (slots.waiting(3) < static_cast<size_t>(i + 1)) std::this_thread::sleep_for(1ms);
  }
  // A third would hold one more thread: refused at once, saying why.
  const auto start = Clock::now();
  auto third = slots.acquire(3, in(10s));
  EXPECT_LT(Clock::now() - start, 1s);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), ErrorCode::unavailable);
  EXPECT_NE(third.status().message().find("2 more waiting"), std::string::npos) << third.status().message();
  // A session's wait costs no thread: it joins the line.
  PeerSlots::Wait session = slots.wait(3, in(10s), [] {});
  EXPECT_EQ(slots.waiting(3), 3u);
  *held = PeerSlots::Slot();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1})) << "first come, first served";
  EXPECT_TRUE(session.ready());
}

TEST(PeerSlotsTest, AWaitGoneBeforeTakingItsSlotPassesItOn) {
  PeerSlots slots(1, 1);
  auto held = slots.acquire(3, in(10s));
  ASSERT_TRUE(held.ok());
  std::atomic<int> next{0};
  PeerSlots::Wait second;
  {
    PeerSlots::Wait first = slots.wait(3, in(10s), [] {});
    second = slots.wait(3, in(10s), [&] { ++next; });
    *held = PeerSlots::Slot();
    EXPECT_TRUE(first.ready());
    EXPECT_EQ(next, 0);
  }  // handed a slot, and gone before it took it (its session closed)
  EXPECT_EQ(next, 1);
  EXPECT_TRUE(second.ready());
  EXPECT_EQ(slots.outstanding(3), 1u) << "the slot went on to the next in line";
  EXPECT_EQ(slots.waiting(3), 0u);
  EXPECT_TRUE(second.take().ok());
}

TEST(PeerSlotsTest, AUseCarriesTheRefusalOfASessionsWait) {
  PeerSlots::Use use(4, Status(ErrorCode::unavailable, "node 4 has 8 requests outstanding"));
  ASSERT_NE(PeerSlots::Use::of(4), nullptr);
  EXPECT_EQ(PeerSlots::Use::of(4)->slot(), nullptr);
  EXPECT_EQ(PeerSlots::Use::of(4)->refused().code(), ErrorCode::unavailable);
}

}  // namespace
}  // namespace tiermem
