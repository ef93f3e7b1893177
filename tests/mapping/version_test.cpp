// The seqlock discipline: under concurrent writers, a reader never accepts a
// copy that mixes two writes.
#include "mapping/version.hpp"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

namespace tiermem {
namespace {

TEST(VersionTest, LockUnlockAndEpochs) {
  uint64_t word = 0;
  const uint64_t locked = version::lock(word);
  EXPECT_TRUE(version::is_locked(word));
  uint64_t seen = word;
  EXPECT_FALSE(version::try_lock(word, &seen)) << "cannot lock twice";
  version::unlock(word, locked);
  EXPECT_EQ(word, 2u);
  EXPECT_EQ(version::epoch_of(word), 0);
  const uint64_t again = version::lock(word);
  version::unlock_new_epoch(word, again);
  EXPECT_EQ(version::epoch_of(word), 1);
  EXPECT_EQ(version::sequence_of(word), 0u);
  EXPECT_FALSE(version::is_locked(word));
}

TEST(VersionTest, BoundedWaitsGiveUpOnAStuckLock) {
  uint64_t word = 0;
  (void)version::lock(word);  // a writer that never finishes
  uint64_t v = 0;
  EXPECT_FALSE(version::read_begin_for(word, std::chrono::milliseconds(20), &v));
  EXPECT_FALSE(version::lock_for(word, std::chrono::milliseconds(20), &v));
}

TEST(VersionTest, NoTornReadIsEverAccepted) {
  // A 4 KiB "page" that writers fill with one byte value at a time, so a
  // consistent copy is uniform and a torn one is not.
  constexpr size_t k_bytes = 4096;
  alignas(64) static std::array<unsigned char, k_bytes> page{};
  alignas(64) static uint64_t word = 0;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> accepted{0}, retried{0}, torn{0}, writes{0};

  auto writer = [&](unsigned char seed) {
    unsigned char value = seed;
    while (!stop.load(std::memory_order_relaxed)) {
      const uint64_t locked = version::lock(word);
      // Byte by byte through a volatile pointer so the copy really is slow
      // and interleaves with readers.
      volatile unsigned char* p = page.data();
      for (size_t i = 0; i < k_bytes; ++i) p[i] = value;
      version::unlock(word, locked);
      value = static_cast<unsigned char>(value + 2);
      writes.fetch_add(1, std::memory_order_relaxed);
      // Real writers pause between writes; without a gap two writers on a
      // many-core machine starve readers completely (a seqlock's known
      // trade-off), and the test would check nothing.
      for (int i = 0; i < 4000; ++i) version::cpu_relax();
    }
  };
  auto reader = [&] {
    std::array<unsigned char, k_bytes> copy;
    while (!stop.load(std::memory_order_relaxed)) {
      const uint64_t start = version::read_begin(word);
      volatile const unsigned char* p = page.data();
      for (size_t i = 0; i < k_bytes; ++i) copy[i] = p[i];
      if (!version::read_validate(word, start)) {
        retried.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      accepted.fetch_add(1, std::memory_order_relaxed);
      for (size_t i = 1; i < k_bytes; ++i) {
        if (copy[i] != copy[0]) {
          torn.fetch_add(1, std::memory_order_relaxed);
          break;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(writer, 0);
  threads.emplace_back(writer, 1);
  threads.emplace_back(reader);
  threads.emplace_back(reader);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(torn.load(), 0u) << "accepted a torn read";
  EXPECT_GT(accepted.load(), 100u);
  EXPECT_GT(writes.load(), 100u);
  // On two cores readers and writers really overlap; the retries prove the
  // validation did work (otherwise the test would not be testing anything).
  EXPECT_GT(retried.load(), 0u) << "no reader ever overlapped a writer";
  EXPECT_EQ(word % 2, 0u);
}

}  // namespace
}  // namespace tiermem
