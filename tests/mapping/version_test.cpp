// The version word helpers the daemon uses on its own array (mapping/
// version.hpp): translation changes (alloc, free, migration) and the
// exclusive lock that new writers hold off for. The seqlocked copies that
// clients and the daemon run are tested in seqlock_copy_test.
#include "pages/version.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace tiermem {
namespace {

TEST(VersionTest, TranslationChangeMovesToTheNextEpoch) {
  uint64_t word = 6;
  uint64_t locked = 0;
  ASSERT_TRUE(version::lock_exclusive_for(word, std::chrono::milliseconds(100), &locked));
  EXPECT_EQ(locked & ~version::k_exclusive_pending, 7u);
  EXPECT_TRUE(version::is_locked(word));
  EXPECT_FALSE(version::writable(word));
  version::unlock_new_epoch(word, locked);
  EXPECT_EQ(version::epoch_of(word), 1);
  EXPECT_EQ(version::sequence_of(word), 0u);
  EXPECT_TRUE(version::writable(word));
  // The 16-bit epoch wraps rather than spilling into the sequence.
  uint64_t last = uint64_t{0xffff} << version::k_epoch_shift;
  version::advance_epoch(last);
  EXPECT_EQ(last, 0u);
}

TEST(VersionTest, AdvanceEpochTakesOverAWordWhateverWasWrittenIntoIt) {
  // A free page's word scribbled on (locked, pending): allocation does not
  // wait for it, it moves it to the next epoch.
  uint64_t word = (uint64_t{3} << version::k_epoch_shift) | version::k_exclusive_pending | 41;
  version::advance_epoch(word);
  EXPECT_EQ(word, uint64_t{4} << version::k_epoch_shift);
}

TEST(VersionTest, ExclusivePendingStopsWritersAndIsWithdrawnOnTimeout) {
  uint64_t word = 4;
  version::WordRef(word).fetch_add(1);  // a writer holds the page
  uint64_t locked = 0;
  EXPECT_FALSE(version::lock_exclusive_for(word, std::chrono::milliseconds(20), &locked));
  EXPECT_EQ(word, 5u) << "the announcement is withdrawn when the wait gives up";

  // With the writer gone while the daemon waits, the daemon gets the page and
  // no new writer could take it in between.
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(version::writable(version::load(word))) << "pending: writers hold off";
    version::WordRef(word).fetch_add(1);  // the writer releases
  });
  EXPECT_TRUE(version::lock_exclusive_for(word, std::chrono::seconds(5), &locked));
  writer.join();
  EXPECT_TRUE(version::is_locked(word));
  version::unlock_exclusive(word, locked);
  EXPECT_EQ(word, 8u) << "released without the pending bit, same epoch";
}

TEST(VersionTest, SpinWaitGivesUpAfterItsTimeout) {
  version::SpinWait wait(std::chrono::milliseconds(30));
  const auto start = std::chrono::steady_clock::now();
  while (wait.again()) {
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(30));
  EXPECT_LT(took, std::chrono::seconds(2));
}

}  // namespace
}  // namespace tiermem
