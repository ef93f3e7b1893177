// The seqlock copy protocol (pages/seqlock_copy), "never a torn read, never
// a lost acknowledged write", tested on the production reader and writer.
//
// The version words and frames are real memory behind the real local
// accessors (LocalVersionWords, MappedFrameData), wrapped by scripted ones in
// the manner of LevelDB's ErrorEnv: every call is logged, a hook can run
// another writer, a migration or a free at a chosen point of the protocol,
// and any call can be made to fail.
#include <tiermem/status_macros.h>

#include "pages/seqlock_copy.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "pages/sub_blocks.hpp"
#include "pages/version.hpp"

namespace tiermem {
namespace {

constexpr uint64_t k_page = 4096;
constexpr uint64_t k_pages = 4;
constexpr auto k_timeout = std::chrono::milliseconds(2000);

enum class Call { load, compare_swap, release, snapshot, read, write, atomic };

// What the scripted accessors do before each call: log it, run the hook
// (which may act as another process would at that moment), fail on demand.
class Script {
 public:
  struct Event {
    Call call;
    uint64_t where;  // first page (words) or frame offset (frames)
  };
  using Hook = std::function<void(Call call, uint64_t where, int nth)>;

  Status step(Call call, uint64_t where) {
    const int nth = m_count[call]++;
    m_log.push_back({call, where});
    if (m_hook && !m_in_hook) {
      m_in_hook = true;
      m_hook(call, where, nth);
      m_in_hook = false;
    }
    auto it = m_failures.find({call, nth});
    if (it != m_failures.end()) return it->second;
    return Status();
  }
  void on(Hook hook) { m_hook = std::move(hook); }
  // The nth (0-based) call of `call` returns `status` instead of running.
  void fail(Call call, int nth, Status status) { m_failures[{call, nth}] = std::move(status); }
  int count(Call call) const {
    auto it = m_count.find(call);
    return it == m_count.end() ? 0 : it->second;
  }
  const std::vector<Event>& log() const { return m_log; }

 private:
  Hook m_hook;
  bool m_in_hook = false;
  std::map<Call, int> m_count;
  std::map<std::pair<Call, int>, Status> m_failures;
  std::vector<Event> m_log;
};

class ScriptedWords final : public VersionWords {
 public:
  ScriptedWords(Script& script, uint64_t* words, size_t count, uint64_t* l3)
      : m_script(script), m_real(words, count, l3, k_page) {}
  Status load(uint64_t first, size_t count, uint64_t* out) override {
    TIERMEM_RETURN_IF_ERROR(m_script.step(Call::load, first));
    return m_real.load(first, count, out);
  }
  Status compare_swap(uint64_t page, uint64_t expected, uint64_t desired, uint64_t* old) override {
    TIERMEM_RETURN_IF_ERROR(m_script.step(Call::compare_swap, page));
    return m_real.compare_swap(page, expected, desired, old);
  }
  Status release(std::span<const uint64_t> pages) override {
    TIERMEM_RETURN_IF_ERROR(m_script.step(Call::release, pages.empty() ? 0 : pages[0]));
    return m_real.release(pages);
  }
  void mark_written(uint64_t page, uint64_t offset, uint64_t length, bool dirty) override {
    m_real.mark_written(page, offset, length, dirty);
  }
  // Off unless asked for: then words, data, words in one call, as a remote
  // node's batch does it.
  Status snapshot(uint64_t first, size_t count, std::span<const CopySegment> segments, uint64_t* before,
                  uint64_t* after) override {
    if (!m_snapshots) return Status(ErrorCode::not_supported, "no snapshot");
    TIERMEM_RETURN_IF_ERROR(m_script.step(Call::snapshot, first));
    TIERMEM_RETURN_IF_ERROR(m_real.load(first, count, before));
    for (const CopySegment& seg : segments) {
      TIERMEM_RETURN_IF_ERROR(seg.frames->read(seg.frame_offset, seg.buffer, seg.length));
    }
    return m_real.load(first, count, after);
  }
  bool m_snapshots = false;

 private:
  Script& m_script;
  LocalVersionWords m_real;
};

class ScriptedFrames final : public FrameData {
 public:
  ScriptedFrames(Script& script, std::byte* base, size_t length) : m_script(script), m_real(base, length, false) {}
  Status read(uint64_t frame_offset, void* dst, size_t length) override {
    TIERMEM_RETURN_IF_ERROR(m_script.step(Call::read, frame_offset));
    return m_real.read(frame_offset, dst, length);
  }
  Status write(uint64_t frame_offset, const void* src, size_t length) override {
    TIERMEM_RETURN_IF_ERROR(m_script.step(Call::write, frame_offset));
    return m_real.write(frame_offset, src, length);
  }
  Status atomic(uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare, uint64_t* old) override {
    TIERMEM_RETURN_IF_ERROR(m_script.step(Call::atomic, frame_offset));
    return m_real.atomic(frame_offset, op, operand, compare, old);
  }
  bool persistent() const override { return false; }

 private:
  Script& m_script;
  MappedFrameData m_real;
};

// One home node's words and two frame arenas ("tiers"): an allocation of
// k_pages pages, pages 0-1 in arena A at frame 0, pages 2-3 in arena B at
// frame 2 (so a range across the middle has two segments).
class SeqlockCopyTest : public ::testing::Test {
 protected:
  SeqlockCopyTest()
      : m_words(k_pages, 0),
        m_l3(k_pages * k_l3_words_per_page, 0),
        m_a(4 * k_page),
        m_b(4 * k_page),
        m_scripted_words(m_script, m_words.data(), m_words.size(), m_l3.data()),
        m_frames_a(m_script, m_a.data(), m_a.size()),
        m_frames_b(m_script, m_b.data(), m_b.size()),
        m_other_words(m_words.data(), m_words.size(), m_l3.data(), k_page),
        m_other_a(m_a.data(), m_a.size(), false),
        m_other_b(m_b.data(), m_b.size(), false) {
    for (uint64_t& w : m_words) w = version::next_epoch(0) + 6;  // epoch 1, stable
  }

  // Segments of [offset, offset+length) of the allocation into `buffer`.
  std::vector<CopySegment> segments(uint64_t offset, size_t length, std::byte* buffer, FrameData& a, FrameData& b) {
    std::vector<CopySegment> out;
    for (uint64_t at = offset; at < offset + length;) {
      const bool in_a = at < 2 * k_page;
      const uint64_t end = std::min<uint64_t>(offset + length, in_a ? 2 * k_page : 4 * k_page);
      out.push_back({in_a ? &a : &b, in_a ? at : at - 2 * k_page + 2 * k_page, at - offset, buffer + (at - offset),
                     static_cast<size_t>(end - at)});
      at = end;
    }
    return out;
  }
  // The range as a client that translated it when the words were `cached`.
  PageRange range(uint64_t offset, size_t length, const std::vector<uint64_t>& cached) {
    PageRange r;
    r.first_page = offset / k_page;
    r.count = (offset + length - 1) / k_page - r.first_page + 1;
    r.cached = cached.data() + r.first_page;
    r.page_size = k_page;
    r.offset = offset % k_page;
    return r;
  }

  Status write(uint64_t offset, std::vector<std::byte>& data, const std::vector<uint64_t>& cached) {
    auto segs = segments(offset, data.size(), data.data(), m_frames_a, m_frames_b);
    return seqlocked_write(m_scripted_words, range(offset, data.size(), cached), segs, k_timeout);
  }
  Status read(uint64_t offset, std::vector<std::byte>& out, const std::vector<uint64_t>& cached,
              std::chrono::milliseconds timeout = k_timeout) {
    auto segs = segments(offset, out.size(), out.data(), m_frames_a, m_frames_b);
    return seqlocked_read(m_scripted_words, range(offset, out.size(), cached), segs, timeout);
  }
  // Another writer (another client), unscripted, on the same memory.
  Status other_write(uint64_t offset, std::vector<std::byte> data) {
    auto segs = segments(offset, data.size(), data.data(), m_other_a, m_other_b);
    return seqlocked_write(m_other_words, range(offset, data.size(), m_words), segs, k_timeout);
  }
  // What the daemon does to a page on migration or free: lock it, release it
  // into the next epoch.
  void change_translation(uint64_t page) {
    uint64_t locked = 0;
    ASSERT_TRUE(version::lock_exclusive_for(m_words[page], k_timeout, &locked));
    version::unlock_new_epoch(m_words[page], locked);
  }
  // The frames of the allocation (arena A frames 0-1, arena B frames 2-3)
  // all hold `value`.
  bool frames_hold(unsigned char value) const {
    auto same = [&](const std::byte* p) {
      return std::all_of(p, p + 2 * k_page, [&](std::byte b) { return b == std::byte{value}; });
    };
    return same(m_a.data()) && same(m_b.data() + 2 * k_page);
  }
  bool all_stable() const {
    return std::all_of(m_words.begin(), m_words.end(), [](uint64_t w) { return w % 2 == 0; });
  }

  Script m_script;
  std::vector<uint64_t> m_words, m_l3;
  std::vector<std::byte> m_a, m_b;
  ScriptedWords m_scripted_words;
  ScriptedFrames m_frames_a, m_frames_b;
  LocalVersionWords m_other_words;
  MappedFrameData m_other_a, m_other_b;
};

std::vector<std::byte> filled(size_t n, unsigned char value) { return std::vector<std::byte>(n, std::byte{value}); }

bool uniform(const std::vector<std::byte>& v, unsigned char value) {
  return std::all_of(v.begin(), v.end(), [&](std::byte b) { return b == std::byte{value}; });
}

TEST_F(SeqlockCopyTest, WriteThenReadAcrossTwoSegmentsAndThreePages) {
  const std::vector<uint64_t> cached = m_words;
  auto data = filled(2 * k_page - 14, 0x5a);
  const uint64_t offset = k_page - 50;  // to 3 pages - 64 bytes: pages 0..2, arenas A and B
  ASSERT_TRUE(write(offset, data, cached).ok());
  // Each page of the range went through one lock and one unlock (+2); the
  // page outside it did not move; every epoch is the one it was.
  EXPECT_EQ(m_words[0], cached[0] + 2);
  EXPECT_EQ(m_words[1], cached[1] + 2);
  EXPECT_EQ(m_words[2], cached[2] + 2);
  EXPECT_EQ(m_words[3], cached[3]);
  EXPECT_EQ(m_script.count(Call::write), 2) << "one frame write per segment";
  // The L3 valid and dirty bits of the written sub-blocks (64 bytes each).
  EXPECT_EQ(m_l3[0 * 2] >> 63, 1u) << "last sub-block of page 0";
  EXPECT_EQ(m_l3[1 * 2], ~uint64_t{0}) << "all of page 1";
  EXPECT_EQ(m_l3[1 * 2 + 1], ~uint64_t{0}) << "dirty on a volatile tier";
  EXPECT_EQ(m_l3[2 * 2], (uint64_t{1} << 63) - 1) << "all but the last sub-block of page 2";
  EXPECT_EQ(m_l3[3 * 2], 0u);

  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(read(offset, back, cached).ok());
  EXPECT_TRUE(uniform(back, 0x5a));
  EXPECT_EQ(m_words[1], cached[1] + 2) << "an optimistic read changes no word";
  EXPECT_EQ(m_script.count(Call::compare_swap), 3) << "only the write locked";
}

TEST_F(SeqlockCopyTest, WriterLocksPagesInAscendingOrderAndReleasesThemTogether) {
  const std::vector<uint64_t> cached = m_words;
  auto data = filled(4 * k_page, 1);
  ASSERT_TRUE(write(0, data, cached).ok());
  std::vector<uint64_t> cas;
  size_t first_write = 0, first_release = 0;
  for (size_t i = 0; i < m_script.log().size(); ++i) {
    const auto& e = m_script.log()[i];
    if (e.call == Call::compare_swap) cas.push_back(e.where);
    if (e.call == Call::write && first_write == 0) first_write = i;
    if (e.call == Call::release) first_release = i;
  }
  EXPECT_EQ(cas, (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_GT(first_write, 3u) << "every page is locked before any byte is written";
  EXPECT_GT(first_release, first_write) << "released after the data";
  EXPECT_EQ(m_script.count(Call::release), 1) << "one release of the whole range";
}

TEST_F(SeqlockCopyTest, ReadThatAWriterTearsIsRetriedNotAccepted) {
  auto old_bytes = filled(4 * k_page, 0x11);
  ASSERT_TRUE(other_write(0, old_bytes).ok());
  const std::vector<uint64_t> cached = m_words;
  // Between the reader's copy of arena A and of arena B, another client writes
  // the whole range: A was copied old, B would be new. The words moved, so
  // the reader must throw the copy away and read again.
  m_script.on([&](Call call, uint64_t where, int nth) {
    if (call == Call::read && where >= 2 * k_page && nth == 1) {
      ASSERT_TRUE(other_write(0, filled(4 * k_page, 0x22)).ok());
    }
  });
  std::vector<std::byte> out(4 * k_page);
  ASSERT_TRUE(read(0, out, cached).ok());
  EXPECT_TRUE(uniform(out, 0x22)) << "the copy is one write's bytes, never a mix";
  EXPECT_EQ(m_script.count(Call::read), 4) << "two segments, read twice";
}

TEST_F(SeqlockCopyTest, SnapshotReadsAreValidatedTheSameWay) {
  m_scripted_words.m_snapshots = true;
  ASSERT_TRUE(other_write(0, filled(4 * k_page, 0x11)).ok());
  const std::vector<uint64_t> cached = m_words;
  m_script.on([&](Call call, uint64_t where, int nth) {
    if (call == Call::read && where >= 2 * k_page && nth == 1) {
      ASSERT_TRUE(other_write(0, filled(4 * k_page, 0x33)).ok());
    }
  });
  std::vector<std::byte> out(4 * k_page);
  ASSERT_TRUE(read(0, out, cached).ok());
  EXPECT_TRUE(uniform(out, 0x33));
  EXPECT_EQ(m_script.count(Call::snapshot), 2);
  EXPECT_EQ(m_script.count(Call::load), 0) << "snapshots replace the separate word loads";
}

TEST_F(SeqlockCopyTest, MigrationDuringAReadMakesItStale) {
  const std::vector<uint64_t> cached = m_words;
  // The page moves (new epoch) after the reader loaded the words.
  m_script.on([&](Call call, uint64_t, int nth) {
    if (call == Call::read && nth == 0) change_translation(1);
  });
  std::vector<std::byte> out(4 * k_page);
  Status s = read(0, out, cached);
  EXPECT_TRUE(is_stale(s)) << s.to_string();
}

TEST_F(SeqlockCopyTest, ReadOfAFreedPageIsStaleBeforeAnyByteIsCopied) {
  const std::vector<uint64_t> cached = m_words;
  change_translation(2);  // freed (or migrated) since the client translated
  std::vector<std::byte> out(4 * k_page);
  EXPECT_TRUE(is_stale(read(0, out, cached)));
  EXPECT_EQ(m_script.count(Call::read), 0);
}

TEST_F(SeqlockCopyTest, WriteToAPageFreedUnderneathIsRefusedAndLeavesNoLock) {
  const std::vector<uint64_t> cached = m_words;
  // Page 2 is freed once the writer holds pages 0 and 1.
  m_script.on([&](Call call, uint64_t where, int) {
    if (call == Call::compare_swap && where == 2) change_translation(2);
  });
  auto data = filled(4 * k_page, 7);
  Status s = write(0, data, cached);
  EXPECT_TRUE(is_stale(s)) << s.to_string();
  EXPECT_EQ(m_script.count(Call::write), 0) << "no byte written into a frame that may be someone else's";
  EXPECT_TRUE(all_stable()) << "the locks of pages 0 and 1 were released";
  EXPECT_TRUE(frames_hold(0));
}

TEST_F(SeqlockCopyTest, WriterWaitsHoldingNothingWhilePageIsTaken) {
  const std::vector<uint64_t> cached = m_words;
  // Another writer holds page 2 (odd word) until the writer has looked at it
  // a few times. Meanwhile pages 0 and 1 must not be held: a migration or a
  // reader of them must not wait behind a writer that waits.
  uint64_t taken = 0;
  ASSERT_TRUE(version::lock_exclusive_for(m_words[2], k_timeout, &taken));
  version::WordRef(m_words[2]).fetch_and(~version::k_exclusive_pending);  // an ordinary writer's lock
  taken &= ~version::k_exclusive_pending;
  int looks = 0;
  bool held_while_waiting = false;
  m_script.on([&](Call call, uint64_t where, int) {
    if (call != Call::load || where != 2) return;
    held_while_waiting = held_while_waiting || m_words[0] % 2 != 0 || m_words[1] % 2 != 0;
    if (++looks == 3) version::WordRef(m_words[2]).store(taken + 1);  // the other writer is done
  });
  auto data = filled(4 * k_page, 9);
  ASSERT_TRUE(write(0, data, cached).ok());
  EXPECT_FALSE(held_while_waiting);
  EXPECT_GE(looks, 3);
  EXPECT_TRUE(frames_hold(9));
  EXPECT_TRUE(all_stable());
}

TEST_F(SeqlockCopyTest, PageLockedForeverIsBusyNamingThePageAndNothingStaysHeld) {
  const std::vector<uint64_t> cached = m_words;
  version::WordRef(m_words[3]).fetch_add(1);  // a writer that never finishes
  auto data = filled(4 * k_page, 4);
  const auto start = std::chrono::steady_clock::now();
  Status s = seqlocked_write(m_scripted_words, range(0, data.size(), cached),
                             segments(0, data.size(), data.data(), m_frames_a, m_frames_b), std::chrono::milliseconds(50));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), ErrorCode::busy) << s.to_string();
  EXPECT_NE(s.message().find("page 3"), std::string::npos) << s.message();
  EXPECT_LT(took, std::chrono::seconds(2)) << "the wait is bounded by the timeout";
  for (int p = 0; p < 3; ++p) EXPECT_EQ(m_words[p] % 2, 0u) << "page " << p;
  std::vector<std::byte> out(k_page);
  EXPECT_EQ(read(3 * k_page, out, cached, std::chrono::milliseconds(50)).code(), ErrorCode::busy);
}

TEST_F(SeqlockCopyTest, ExclusivePendingHoldsNewWritersOffUntilTheMigrationIsDone) {
  const std::vector<uint64_t> cached = m_words;
  // The daemon announced it wants page 1 (migration). A writer must not take
  // it; when the migration releases it into a new epoch, the writer finds its
  // translation stale and writes nothing.
  version::WordRef(m_words[1]).fetch_or(version::k_exclusive_pending);
  int looks = 0;
  m_script.on([&](Call call, uint64_t where, int) {
    if (call == Call::load && where == 1 && ++looks == 2) {
      uint64_t locked = 0;
      ASSERT_TRUE(version::lock_exclusive_for(m_words[1], k_timeout, &locked));
      version::unlock_new_epoch(m_words[1], locked);
    }
  });
  auto data = filled(2 * k_page, 5);
  EXPECT_TRUE(is_stale(write(0, data, cached)));
  EXPECT_EQ(m_script.count(Call::write), 0);
  EXPECT_TRUE(all_stable());
}

TEST_F(SeqlockCopyTest, FrameWriteFailureIsReturnedAndEveryLockReleased) {
  const std::vector<uint64_t> cached = m_words;
  m_script.fail(Call::write, 1, Status(ErrorCode::io_error, "disk on fire"));
  auto data = filled(4 * k_page, 3);
  Status s = write(0, data, cached);
  EXPECT_EQ(s.code(), ErrorCode::io_error);
  EXPECT_TRUE(all_stable()) << "no page is left locked after a failed write";
  // The sequence moved on, so a reader that overlapped the failed write does
  // not accept what it copied meanwhile.
  for (int p = 0; p < 4; ++p) EXPECT_EQ(m_words[p], cached[p] + 2);
}

TEST_F(SeqlockCopyTest, LockFailureMidRangeReleasesWhatWasTaken) {
  const std::vector<uint64_t> cached = m_words;
  m_script.fail(Call::compare_swap, 2, Status(ErrorCode::transport_error, "peer went away"));
  auto data = filled(4 * k_page, 3);
  EXPECT_EQ(write(0, data, cached).code(), ErrorCode::transport_error);
  EXPECT_EQ(m_script.count(Call::write), 0);
  EXPECT_TRUE(all_stable());
}

TEST_F(SeqlockCopyTest, ReleaseFailureIsReported) {
  const std::vector<uint64_t> cached = m_words;
  m_script.fail(Call::release, 0, Status(ErrorCode::transport_error, "peer went away"));
  auto data = filled(k_page, 3);
  EXPECT_EQ(write(0, data, cached).code(), ErrorCode::transport_error)
      << "a write whose unlock failed is not acknowledged";
}

TEST_F(SeqlockCopyTest, ReadFailureIsReturned) {
  const std::vector<uint64_t> cached = m_words;
  m_script.fail(Call::read, 0, Status(ErrorCode::io_error, "bad frame"));
  std::vector<std::byte> out(k_page);
  EXPECT_EQ(read(0, out, cached).code(), ErrorCode::io_error);
}

TEST_F(SeqlockCopyTest, ReaderThatWritersKeepSpoilingLocksTheRange) {
  const std::vector<uint64_t> cached = m_words;
  // Every optimistic attempt is spoiled by a write during the copy; after a
  // bounded number of attempts the reader locks the pages like a writer.
  // (Not while the reader holds the page: the writer would wait for it.)
  m_script.on([&](Call call, uint64_t, int) {
    if (call == Call::read && m_words[0] % 2 == 0) {
      ASSERT_TRUE(other_write(0, filled(k_page, 0x44)).ok());
    }
  });
  std::vector<std::byte> out(k_page);
  ASSERT_TRUE(read(0, out, cached).ok());
  EXPECT_TRUE(uniform(out, 0x44));
  // The reader's words were old, so its first CAS may miss; it locked the
  // page (CAS) and let go of it once (release).
  EXPECT_GE(m_script.count(Call::compare_swap), 1);
  EXPECT_EQ(m_script.count(Call::release), 1);
  EXPECT_GT(m_script.count(Call::read), 2);
  EXPECT_TRUE(all_stable());
}

TEST_F(SeqlockCopyTest, AtomicOnAPageLocksAroundItUnlessCoherent) {
  const std::vector<uint64_t> cached = m_words;
  uint64_t old = 0;
  ASSERT_TRUE(seqlocked_atomic(m_scripted_words, m_frames_a, 1, cached[1], false, k_page + 8, WordOp::fetch_add, 5, 0,
                               &old, k_timeout)
                  .ok());
  EXPECT_EQ(old, 0u);
  EXPECT_EQ(m_words[1], cached[1] + 2) << "locked and released around the atomic";
  ASSERT_TRUE(seqlocked_atomic(m_scripted_words, m_frames_a, 1, cached[1], true, k_page + 8, WordOp::compare_swap, 9, 5,
                               &old, k_timeout)
                  .ok());
  EXPECT_EQ(old, 5u);
  EXPECT_EQ(m_words[1], cached[1] + 2) << "a coherent word is one operation, no lock";
  uint64_t value = 0;
  std::memcpy(&value, m_a.data() + k_page + 8, 8);
  EXPECT_EQ(value, 9u);
  change_translation(1);
  EXPECT_TRUE(is_stale(seqlocked_atomic(m_scripted_words, m_frames_a, 1, cached[1], false, k_page + 8,
                                        WordOp::fetch_add, 1, 0, &old, k_timeout)));
}

// Copies through a layout: the segments follow the extents, a range past the
// end is out_of_range, and extents that do not cover the range mean a stale
// translation.
class TwoArenaAccess final : public MemoryAccess {
 public:
  TwoArenaAccess(VersionWords& words, FrameData& a, FrameData& b) : m_words(words), m_a(a), m_b(b) {}
  Result<VersionWords*> versions(NodeId, uint64_t) override { return &m_words; }
  Result<FrameData*> frames(NodeId, Tier tier) override { return tier == Tier::dram ? &m_a : &m_b; }

 private:
  VersionWords& m_words;
  FrameData& m_a;
  FrameData& m_b;
};

TEST_F(SeqlockCopyTest, CopyThroughLayoutFollowsTheExtents) {
  const std::vector<uint64_t> cached = m_words;
  const std::vector<Extent> extents = {{Tier::dram, 1, 0, 0, 2 * k_page}, {Tier::pmem, 1, 2 * k_page, 2 * k_page, 2 * k_page}};
  const LayoutView layout{1, 0, k_page, 4 * k_page - 10, extents, cached};
  TwoArenaAccess access(m_scripted_words, m_frames_a, m_frames_b);
  auto data = filled(3 * k_page - 10, 6);
  ASSERT_TRUE(copy_through_layout(layout, access, k_page, data.data(), data.size(), true, k_timeout).ok());
  EXPECT_EQ(m_script.count(Call::write), 2);
  EXPECT_EQ(m_a[k_page], std::byte{6});
  EXPECT_EQ(m_a[k_page - 1], std::byte{0});
  EXPECT_EQ(m_b[4 * k_page - 11], std::byte{6});
  EXPECT_EQ(m_b[4 * k_page - 10], std::byte{0});
  std::vector<std::byte> out(20);
  EXPECT_EQ(copy_through_layout(layout, access, 4 * k_page - 20, out.data(), out.size(), false, k_timeout).code(),
            ErrorCode::out_of_range);
  const std::vector<Extent> holey = {{Tier::dram, 1, 0, 0, k_page}};
  const LayoutView partial{1, 0, k_page, 4 * k_page, holey, cached};
  EXPECT_TRUE(is_stale(copy_through_layout(partial, access, 0, data.data(), 2 * k_page, false, k_timeout)));
}

// Real threads on real memory through the production accessors: two writers
// fill a range across both arenas with one byte value at a time, two readers
// copy it; no accepted copy is ever a mix of two writes.
TEST(SeqlockCopyConcurrencyTest, NoTornReadUnderConcurrentWriters) {
  std::vector<uint64_t> words(k_pages, 0);
  std::vector<std::byte> a(4 * k_page), b(4 * k_page);
  LocalVersionWords local(words.data(), words.size());
  MappedFrameData fa(a.data(), a.size(), false), fb(b.data(), b.size(), false);
  const std::vector<uint64_t> cached = words;
  PageRange range{0, k_pages, cached.data(), k_page, 0};
  auto segs = [&](std::byte* buffer) {
    return std::vector<CopySegment>{{&fa, 0, 0, buffer, 2 * k_page}, {&fb, 2 * k_page, 2 * k_page, buffer + 2 * k_page, 2 * k_page}};
  };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> accepted{0}, torn{0}, writes{0}, failures{0};
  auto writer = [&](unsigned char seed) {
    std::vector<std::byte> data(4 * k_page);
    for (unsigned char v = seed; !stop.load(std::memory_order_relaxed); v = static_cast<unsigned char>(v + 2)) {
      std::fill(data.begin(), data.end(), std::byte{v});
      const auto s = segs(data.data());
      if (!seqlocked_write(local, range, s, k_timeout).ok()) failures.fetch_add(1);
      writes.fetch_add(1, std::memory_order_relaxed);
      std::this_thread::yield();
    }
  };
  auto reader = [&] {
    std::vector<std::byte> out(4 * k_page);
    while (!stop.load(std::memory_order_relaxed)) {
      const auto s = segs(out.data());
      if (!seqlocked_read(local, range, s, k_timeout).ok()) {
        failures.fetch_add(1);
        continue;
      }
      accepted.fetch_add(1, std::memory_order_relaxed);
      if (!uniform(out, static_cast<unsigned char>(out[0]))) torn.fetch_add(1);
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(writer, 0);
  threads.emplace_back(writer, 1);
  threads.emplace_back(reader);
  threads.emplace_back(reader);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(torn.load(), 0u) << "a torn copy was accepted";
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_GT(accepted.load(), 100u);
  EXPECT_GT(writes.load(), 100u);
  for (uint64_t w : words) EXPECT_EQ(w % 2, 0u);
}

}  // namespace
}  // namespace tiermem
