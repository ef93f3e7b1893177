// Lock logs (pages/lock_intents): every lock the seqlock protocol takes
// through RecordedVersionWords is in the log while it is held and gone once
// released; break_lock breaks only a word that still has the recorded value.
#include "pages/lock_intents.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "pages/version.hpp"

namespace tiermem {
namespace {

constexpr uint64_t k_page = 4096;
constexpr uint64_t k_pages = 8;
constexpr auto k_timeout = std::chrono::milliseconds(2000);
constexpr NodeId k_home = 3;

struct Fixture {
  std::vector<std::byte> log_memory = std::vector<std::byte>(k_intent_log_bytes);
  std::vector<uint64_t> words = std::vector<uint64_t>(k_pages, 0);
  std::vector<uint64_t> l3 = std::vector<uint64_t>(2 * k_pages, 0);
  std::vector<std::byte> frames = std::vector<std::byte>(k_pages * k_page);
  LocalVersionWords local{words.data(), k_pages, l3.data(), k_page};
  MappedFrameData data{frames.data(), frames.size(), false};
  IntentLog log{log_memory.data()};
};

// Frames that run a hook in the middle of a write (while its locks are held).
class HookedFrames final : public FrameData {
 public:
  HookedFrames(FrameData& inner, std::function<void()> hook) : m_inner(inner), m_hook(std::move(hook)) {}
  Status atomic(uint64_t o, WordOp op, uint64_t a, uint64_t c, uint64_t* old) override {
    return m_inner.atomic(o, op, a, c, old);
  }
  Status read(uint64_t o, void* dst, size_t n) override { return m_inner.read(o, dst, n); }
  Status write(uint64_t o, const void* src, size_t n) override {
    m_hook();
    return m_inner.write(o, src, n);
  }
  bool persistent() const override { return false; }

 private:
  FrameData& m_inner;
  std::function<void()> m_hook;
};

TEST(LockIntentsTest, AWriteRecordsItsLocksWhileHeldAndForgetsThemAfter) {
  Fixture f;
  RecordedVersionWords words(f.local, f.log, k_home);
  std::vector<LockIntent> during;
  HookedFrames frames(f.data, [&] { during = f.log.entries(); });
  std::vector<std::byte> buffer(3 * k_page, std::byte{7});
  const uint64_t cached[3] = {0, 0, 0};
  const PageRange range{2, 3, cached, k_page, 0};
  const CopySegment segment{&frames, 2 * k_page, 0, buffer.data(), buffer.size()};
  ASSERT_TRUE(seqlocked_write(words, range, {&segment, 1}, k_timeout).ok());
  ASSERT_EQ(during.size(), 3u) << "every page of the range is recorded while the write holds it";
  for (const LockIntent& e : during) {
    EXPECT_EQ(e.node, k_home);
    EXPECT_GE(e.page, 2u);
    EXPECT_LE(e.page, 4u);
    EXPECT_EQ(e.locked, 1u) << "the value the word has while locked";
  }
  EXPECT_TRUE(f.log.entries().empty()) << "released locks stay in the log";
  EXPECT_EQ(f.words[2], 2u);
}

TEST(LockIntentsTest, ALockThatWasNotTakenIsNotLeftInTheLog) {
  Fixture f;
  f.words[1] = 5;  // somebody else holds it: the CAS from the cached 4 fails
  RecordedVersionWords words(f.local, f.log, k_home);
  uint64_t old = 0;
  ASSERT_TRUE(words.compare_swap(1, 4, 5, &old).ok());
  EXPECT_EQ(old, 5u);
  EXPECT_TRUE(f.log.entries().empty());
}

TEST(LockIntentsTest, BreakLockBreaksOnlyTheRecordedValue) {
  uint64_t word = 7;  // locked, sequence 7
  EXPECT_FALSE(break_lock(word, 5)) << "a stale record (the word moved on) breaks nothing";
  EXPECT_EQ(word, 7u);
  EXPECT_FALSE(break_lock(word, 6)) << "an even (unlocked) value is never a lock";
  EXPECT_TRUE(break_lock(word, 7));
  EXPECT_EQ(word, 8u);
  EXPECT_FALSE(break_lock(word, 7)) << "broken once only";
  // The daemon waits for the page exclusively: its pending bit is kept.
  uint64_t pending = 9 | version::k_exclusive_pending;
  EXPECT_TRUE(break_lock(pending, 9));
  EXPECT_EQ(pending, 10 | version::k_exclusive_pending);
  // Another epoch: the same sequence is not the same lock.
  uint64_t other_epoch = (uint64_t{1} << version::k_epoch_shift) | 7;
  EXPECT_FALSE(break_lock(other_epoch, 7));
}

TEST(LockIntentsTest, AFullLogRefusesTheLockInsteadOfTakingItUnrecorded) {
  Fixture f;
  for (size_t i = 0; i < k_intents; ++i) ASSERT_TRUE(f.log.add(k_home, 1000 + i, 1).ok());
  RecordedVersionWords words(f.local, f.log, k_home);
  uint64_t old = 0;
  const Status s = words.compare_swap(1, 0, 1, &old);
  EXPECT_EQ(s.code(), ErrorCode::busy) << s.to_string();
  EXPECT_EQ(f.words[1], 0u) << "the word was locked without a record";
}

TEST(LockIntentsTest, ConcurrentWritersKeepTheLogExact) {
  Fixture f;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&f, t] {
      RecordedVersionWords words(f.local, f.log, k_home);
      std::vector<std::byte> buffer(k_page, static_cast<std::byte>(t));
      for (int i = 0; i < 2000; ++i) {
        const uint64_t page = static_cast<uint64_t>((t + i) % k_pages);
        uint64_t cached[1] = {0};
        const CopySegment segment{&f.data, page * k_page, 0, buffer.data(), buffer.size()};
        const PageRange range{page, 1, cached, k_page, 0};
        ASSERT_TRUE(seqlocked_write(words, range, {&segment, 1}, k_timeout).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(f.log.entries().empty());
  uint64_t sequence = 0;
  for (uint64_t w : f.words) sequence += version::sequence_of(w);
  EXPECT_EQ(sequence, 2u * 4 * 2000) << "every write locked and unlocked once";
}

}  // namespace
}  // namespace tiermem
