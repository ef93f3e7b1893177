// The page protocol over the data plane (access/remote_memory with
// pages/seqlock_copy) on an in-process fake transport that runs messages
// with the real target code and drops, holds back or kills on demand
// (tests/support/fake_transport.hpp): one message per seqlocked write or read
// of a range, a lock that cannot be taken leaves nothing locked and nothing
// written, a peer killed mid-message or a lost message is never an
// acknowledged write, and no read is torn with local writers and migrations
// beside. The real-process tests (cluster, migration, fault) run the same
// protocol over UCX.
#include "access/remote_memory.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "pages/version.hpp"
#include "tests/support/fake_transport.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;
using test::FakeTransport;

constexpr uint64_t k_page = 4096;
constexpr uint64_t k_pages = 8;
constexpr auto k_timeout = 2000ms;
constexpr uint64_t k_stable = (uint64_t{3} << version::k_epoch_shift) + 10;  // epoch 3, stable

// A home node (its version words and DRAM frames, registered with its
// transport) and a client reaching it through another transport.
class RemoteMemoryTest : public ::testing::TestWithParam<bool> {
 protected:
  RemoteMemoryTest()
      : m_words(k_pages, k_stable),
        m_frames(k_pages * k_page),
        m_home("home-" + std::to_string(reinterpret_cast<uintptr_t>(this))),
        m_client("client-" + std::to_string(reinterpret_cast<uintptr_t>(this)), GetParam()) {}

  void SetUp() override {
    auto words = m_home.register_region(m_words.data(), m_words.size() * 8, MemoryKind::host);
    auto frames = m_home.register_region(m_frames.data(), m_frames.size(), MemoryKind::host);
    ASSERT_TRUE(words.ok() && frames.ok());
    NodeAdvert advert;
    advert.node = 2;
    advert.incarnation = 1;
    advert.pages_per_domain = k_pages;
    advert.transport_address = m_home.address();
    advert.regions.push_back({true, Tier::automatic, 0, 0, (*words)->base(), (*words)->length(),
                              (*words)->packed_key(), false, 1});
    advert.regions.push_back({false, Tier::dram, 0, 0, (*frames)->base(), (*frames)->length(),
                              (*frames)->packed_key(), false, 1});
    m_regions.push_back(std::move(*words));
    m_regions.push_back(std::move(*frames));
    auto node = connect_remote_node(m_client, advert);
    ASSERT_TRUE(node.ok()) << node.status().to_string();
    m_node = *node;
    m_remote_words = std::make_unique<RemoteVersionWords>(m_client, m_node, k_timeout);
    m_remote_frames = std::make_unique<RemoteFrameData>(m_client, m_node, Tier::dram, k_timeout, nullptr);
  }

  bool one_sided() const { return GetParam(); }

  // [offset, offset + length) of the frames (page p at frame p * k_page),
  // translated when the words were `cached`.
  PageRange range(uint64_t offset, size_t length, const std::vector<uint64_t>& cached) const {
    PageRange r;
    r.first_page = offset / k_page;
    r.count = (offset + length - 1) / k_page - r.first_page + 1;
    r.cached = cached.data() + r.first_page;
    r.page_size = k_page;
    r.offset = offset % k_page;
    return r;
  }
  Status write(uint64_t offset, std::vector<std::byte>& data, const std::vector<uint64_t>& cached) {
    CopySegment seg{m_remote_frames.get(), offset, 0, data.data(), data.size()};
    return seqlocked_write(*m_remote_words, range(offset, data.size(), cached), {&seg, 1}, k_timeout);
  }
  Status read(uint64_t offset, std::vector<std::byte>& out, const std::vector<uint64_t>& cached) {
    CopySegment seg{m_remote_frames.get(), offset, 0, out.data(), out.size()};
    return seqlocked_read(*m_remote_words, range(offset, out.size(), cached), {&seg, 1}, k_timeout);
  }
  // Another writer on the home node itself, through its own mapping.
  Status local_write(uint64_t offset, std::vector<std::byte> data) {
    LocalVersionWords words(m_words.data(), m_words.size());
    MappedFrameData frames(m_frames.data(), m_frames.size(), false);
    CopySegment seg{&frames, offset, 0, data.data(), data.size()};
    std::vector<uint64_t> cached(k_pages);
    for (uint64_t p = 0; p < k_pages; ++p) cached[p] = version::load(m_words[p]);
    return seqlocked_write(words, range(offset, data.size(), cached), {&seg, 1}, k_timeout);
  }
  bool frames_hold(uint64_t offset, size_t length, unsigned char value) const {
    return std::all_of(m_frames.begin() + offset, m_frames.begin() + offset + length,
                       [&](std::byte b) { return b == std::byte{value}; });
  }
  bool none_locked() const {
    return std::none_of(m_words.begin(), m_words.end(), [](uint64_t w) { return version::is_locked(w); });
  }

  std::vector<uint64_t> m_words;
  std::vector<std::byte> m_frames;
  FakeTransport m_home;
  FakeTransport m_client;
  std::vector<std::unique_ptr<RegisteredRegion>> m_regions;
  std::shared_ptr<RemoteNode> m_node;
  std::unique_ptr<RemoteVersionWords> m_remote_words;
  std::unique_ptr<RemoteFrameData> m_remote_frames;
};

std::vector<std::byte> filled(size_t n, unsigned char value) { return std::vector<std::byte>(n, std::byte{value}); }

TEST_P(RemoteMemoryTest, SeqlockedWriteAndReadOfARangeAreOneMessageEachOnTheMessagePath) {
  const std::vector<uint64_t> cached = m_words;
  // Three pages: from inside page 1 to inside page 3.
  auto data = filled(2 * k_page, 0xab);
  ASSERT_TRUE(write(k_page + 100, data, cached).ok());
  EXPECT_TRUE(frames_hold(k_page + 100, 2 * k_page, 0xab));
  EXPECT_TRUE(frames_hold(0, k_page + 100, 0)) << "nothing written before the range";
  EXPECT_TRUE(frames_hold(3 * k_page + 100, k_page - 100, 0)) << "nor after it";
  for (uint64_t p = 0; p < k_pages; ++p) {
    EXPECT_EQ(m_words[p], p >= 1 && p <= 3 ? k_stable + 2 : k_stable) << "page " << p << ": locked and released once";
  }
  EXPECT_TRUE(none_locked());
  if (!one_sided()) {
    EXPECT_EQ(m_client.messages(), 1u) << "lock, copy and release of three pages in one request";
    EXPECT_EQ(m_client.operations(), 3u + 1u + 3u + 1u) << "takes, the put, releases, the group's end";
  }
  const size_t before = m_client.messages();
  auto back = filled(2 * k_page, 0);
  ASSERT_TRUE(read(k_page + 100, back, cached).ok());
  EXPECT_EQ(back, data);
  EXPECT_EQ(m_client.messages() - before, 1u) << "words, bytes and words again in one request";
}

TEST_P(RemoteMemoryTest, APageThatCannotBeTakenLeavesNothingLockedAndNothingWritten) {
  if (one_sided()) GTEST_SKIP() << "the home runs whole copies on the message path only";
  const std::vector<uint64_t> cached = m_words;
  m_words[2] += 1;  // another writer holds page 2
  const uint64_t held = m_words[2];
  auto data = filled(4 * k_page, 0xcd);
  CopySegment seg{m_remote_frames.get(), 0, 0, data.data(), data.size()};
  uint64_t blocked = 99, seen = 0;
  Status s = m_remote_words->locked_copy(range(0, data.size(), cached), {&seg, 1}, true, &blocked, &seen);
  EXPECT_EQ(s.code(), ErrorCode::failed_precondition) << s.to_string();
  EXPECT_EQ(blocked, 2u);
  EXPECT_EQ(seen, held);
  EXPECT_TRUE(frames_hold(0, 4 * k_page, 0)) << "nothing written";
  EXPECT_EQ(m_words[0], k_stable + 2) << "taken, then let go";
  EXPECT_EQ(m_words[1], k_stable + 2);
  EXPECT_EQ(m_words[2], held) << "the other writer's lock is untouched";
  EXPECT_EQ(m_words[3], k_stable) << "never reached";
  EXPECT_EQ(m_client.messages(), 1u);
}

TEST_P(RemoteMemoryTest, WriterWaitsForATakenPageHoldingNothingAndThenWrites) {
  const std::vector<uint64_t> cached = m_words;
  m_words[2] += 1;  // another writer holds page 2 for a while
  std::vector<std::vector<uint64_t>> seen_by_messages;
  m_client.before_running([&](size_t nth) {
    seen_by_messages.push_back(m_words);
    if (nth == 3) m_words[2] += 1;  // the other writer is done
  });
  auto data = filled(4 * k_page, 0x11);
  ASSERT_TRUE(write(0, data, cached).ok());
  EXPECT_TRUE(frames_hold(0, 4 * k_page, 0x11));
  EXPECT_TRUE(none_locked());
  // While it waited for page 2 (messages 2 and 3 load its word on either
  // path), this writer held no other page.
  ASSERT_GE(seen_by_messages.size(), 4u);
  for (size_t n = 2; n <= 3; ++n) {
    for (uint64_t p : {0, 1, 3}) {
      EXPECT_FALSE(version::is_locked(seen_by_messages[n][p])) << "message " << n << " page " << p;
    }
  }
}

// A translation taken while a writer held a page caches the locked word: the
// lock must be waited for, never "taken" by a CAS from that value (which would
// unlock the other writer's page under it).
TEST_P(RemoteMemoryTest, ALockedWordInTheTranslationIsWaitedForNotCASedOpen) {
  m_words[1] += 1;
  const std::vector<uint64_t> cached = m_words;  // page 1 cached locked
  m_client.before_running([&](size_t nth) {
    EXPECT_TRUE(version::is_locked(m_words[1]) || nth >= 2) << "message " << nth << " found page 1 unlocked";
    if (nth == 1) m_words[1] += 1;  // its writer is done
  });
  auto data = filled(2 * k_page, 0x22);
  ASSERT_TRUE(write(0, data, cached).ok());
  EXPECT_TRUE(frames_hold(0, 2 * k_page, 0x22));
  EXPECT_TRUE(none_locked());
}

TEST_P(RemoteMemoryTest, AMigrationDuringTheWriteMakesItStaleWithNothingWritten) {
  const std::vector<uint64_t> cached = m_words;
  // The daemon takes page 1 exclusively just before the write's first message
  // runs, and releases it into the next epoch (the page moved) after.
  uint64_t locked = 0;
  m_client.before_running([&](size_t nth) {
    if (nth == 0) {
      ASSERT_TRUE(version::lock_exclusive_for(m_words[1], k_timeout, &locked));
    } else if (nth == 1) {
      version::unlock_new_epoch(m_words[1], locked);
    }
  });
  auto data = filled(2 * k_page, 0x33);
  Status s = write(0, data, cached);
  EXPECT_TRUE(is_stale(s)) << s.to_string();
  EXPECT_TRUE(frames_hold(0, 2 * k_page, 0)) << "nothing written into a page that moved";
  EXPECT_TRUE(none_locked());
}

TEST_P(RemoteMemoryTest, APeerKilledMidMessageFailsTheWriteAndLaterCallsFailFast) {
  const std::vector<uint64_t> cached = m_words;
  // The home dies after running two operations of the first message (the
  // two page locks of the compound write; on the one-sided path the first
  // two CASes).
  m_client.fail(0, FakeTransport::Fault::kill_peer, 2);
  auto data = filled(2 * k_page, 0x44);
  Status s = write(0, data, cached);
  EXPECT_EQ(s.code(), ErrorCode::transport_error) << s.to_string();
  EXPECT_TRUE(frames_hold(0, 2 * k_page, 0)) << "no byte of an unacknowledged write reached the frames";
  const auto start = std::chrono::steady_clock::now();
  auto back = filled(k_page, 0);
  EXPECT_EQ(read(0, back, cached).code(), ErrorCode::transport_error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms) << "a dead peer fails at once, not at the timeout";
}

TEST_P(RemoteMemoryTest, AMessageLostOnTheWayChangesNothing) {
  const std::vector<uint64_t> cached = m_words;
  m_client.fail(0, FakeTransport::Fault::drop_request);
  auto data = filled(2 * k_page, 0x55);
  Status s = write(0, data, cached);
  EXPECT_EQ(s.code(), ErrorCode::timeout) << s.to_string();
  EXPECT_TRUE(frames_hold(0, 2 * k_page, 0));
  EXPECT_EQ(m_words, cached) << "no page was locked";
}

TEST_P(RemoteMemoryTest, AWriteWhoseAnswerIsLostIsNotAcknowledgedAndLeavesNoPageLocked) {
  if (one_sided()) GTEST_SKIP() << "one-sided writes take several messages; a lost one is the case above";
  const std::vector<uint64_t> cached = m_words;
  m_client.fail(0, FakeTransport::Fault::drop_answer);
  auto data = filled(2 * k_page, 0x66);
  Status s = write(0, data, cached);
  EXPECT_EQ(s.code(), ErrorCode::timeout) << "not acknowledged: " << s.to_string();
  // It ran whole at the home (allowed: it was never acknowledged), and let
  // go of its pages there.
  EXPECT_TRUE(frames_hold(0, 2 * k_page, 0x66));
  EXPECT_TRUE(none_locked());
}

TEST_P(RemoteMemoryTest, AReadThatALocalWriterTearsIsRetriedNotReturned) {
  const std::vector<uint64_t> cached = m_words;
  // A writer on the home holds page 0 and has written half of it when the
  // read's first message runs; it finishes before the next one.
  m_client.before_running([&](size_t nth) {
    if (nth == 0) {
      m_words[0] += 1;
      std::memset(m_frames.data(), 0x77, k_page / 2);
    }
    if (nth == 1) {
      std::memset(m_frames.data() + k_page / 2, 0x77, k_page / 2);
      m_words[0] += 1;
    }
  });
  auto out = filled(k_page, 0xff);
  ASSERT_TRUE(read(0, out, cached).ok());
  EXPECT_EQ(out, filled(k_page, 0x77)) << "the whole of the write, never half";
  EXPECT_GE(m_client.messages(), 2u);
}

TEST_P(RemoteMemoryTest, AReaderThatKeepsFindingThePageTakenLocksTheRangeLikeAWriter) {
  const std::vector<uint64_t> cached = m_words;
  std::memset(m_frames.data(), 0x88, 2 * k_page);
  // A writer holds page 1 through the reader's first eight optimistic reads
  // and lets go just before the ninth message.
  m_words[1] += 1;
  m_client.before_running([&](size_t nth) {
    if (nth == 8) m_words[1] += 1;
  });
  auto out = filled(2 * k_page, 0xff);
  ASSERT_TRUE(read(0, out, cached).ok());
  EXPECT_EQ(out, filled(2 * k_page, 0x88));
  EXPECT_TRUE(none_locked());
  if (!one_sided()) {
    EXPECT_EQ(m_client.messages(), 9u) << "eight snapshots, then lock, read and release in one message";
    EXPECT_EQ(m_words[0], k_stable + 2) << "the reader took and let go of page 0";
  }
}

TEST_P(RemoteMemoryTest, AnAtomicOnAPageThatMayMoveLocksItAroundTheAtomicInOneMessage) {
  const std::vector<uint64_t> cached = m_words;
  uint64_t value = 40;
  std::memcpy(m_frames.data() + 2 * k_page + 8, &value, 8);
  m_words[2] += 1;  // another writer holds page 2 for the first two messages
  m_client.before_running([&](size_t nth) {
    if (nth == 1) m_words[2] += 1;
  });
  uint64_t old = 0;
  Status s = seqlocked_atomic(*m_remote_words, *m_remote_frames, 2, cached[2], false, 2 * k_page + 8,
                              WordOp::fetch_add, 2, 0, &old, k_timeout);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(old, 40u);
  std::memcpy(&value, m_frames.data() + 2 * k_page + 8, 8);
  EXPECT_EQ(value, 42u);
  EXPECT_TRUE(none_locked());
  if (!one_sided()) {
    // Refused once (page taken), a load that finds it free, then take, add
    // and release in one message.
    EXPECT_EQ(m_client.messages(), 3u);
    EXPECT_EQ(m_words[2], k_stable + 2 + 2);
  }
}

// Writers through the data plane and on the home itself, and readers through
// the data plane, on the same four pages: every read is one writer's whole
// write, and the last acknowledged write is what stays.
TEST_P(RemoteMemoryTest, ConcurrentRemoteAndLocalWritersNeverTearAReadNorLoseAWrite) {
  constexpr size_t k_range = 4 * k_page;
  constexpr uint64_t k_offset = 2 * k_page;
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0}, errors{0}, reads{0};
  std::atomic<unsigned> last[4] = {};  // per writer: the value of its last acknowledged write
  auto cached = [&] {
    std::vector<uint64_t> words(k_pages);
    for (uint64_t p = 0; p < k_pages; ++p) words[p] = version::load(m_words[p]);
    return words;
  };
  std::vector<std::thread> threads;
  auto writer = [&](unsigned char id, bool local) {
    for (unsigned n = 0; !stop.load() && n < 400; ++n) {
      const auto value = static_cast<unsigned char>(id * 16 + n % 16);
      auto data = filled(k_range, value);
      Status s = local ? local_write(k_offset, data) : write(k_offset, data, cached());
      if (!s.ok()) {
        ++errors;
        return;
      }
      last[id].store(value);
    }
  };
  threads.emplace_back(writer, 1, false);
  threads.emplace_back(writer, 2, true);
  threads.emplace_back(writer, 3, false);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&] {
      auto out = filled(k_range, 0);
      while (!stop.load()) {
        if (!read(k_offset, out, cached()).ok()) {
          ++errors;
          return;
        }
        ++reads;
        if (!std::all_of(out.begin(), out.end(), [&](std::byte b) { return b == out[0]; })) ++torn;
      }
    });
  }
  std::this_thread::sleep_for(1s);
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(torn.load(), 0);
  EXPECT_GT(reads.load(), 0);
  // The frames hold one writer's last acknowledged write, whole.
  const auto final_value = static_cast<unsigned char>(m_frames[k_offset]);
  EXPECT_TRUE(frames_hold(k_offset, k_range, final_value));
  EXPECT_TRUE(final_value == last[1].load() || final_value == last[2].load() || final_value == last[3].load())
      << "the frames hold " << int(final_value) << ", which is no writer's last acknowledged write";
  EXPECT_TRUE(frames_hold(0, k_offset, 0)) << "nothing written before the range";
  EXPECT_TRUE(frames_hold(k_offset + k_range, m_frames.size() - k_offset - k_range, 0)) << "nor after it";
  EXPECT_TRUE(none_locked());
}

// What a client decides its route from: per piece, a key of the transport's
// kind (one-sided or message), none that a newer description may bring
// (stale), or none ever (VRAM, registered for no tenant). Keys of a domain
// added later go on the same endpoint and make the piece reachable.
TEST_P(RemoteMemoryTest, ReachSaysPerPieceWhetherOneSidedMessageStaleOrNever) {
  const Reach keyed = one_sided() ? Reach::one_sided : Reach::message;
  EXPECT_EQ(m_node->reach_words(m_client, 0, k_pages), keyed);
  EXPECT_EQ(m_node->reach_frames(m_client, Tier::dram, 0, k_pages * k_page), keyed);
  EXPECT_EQ(m_node->reach_words(m_client, k_pages, 1), Reach::stale) << "domain 1's words: no key yet";
  EXPECT_EQ(m_node->reach_frames(m_client, Tier::dram, k_pages * k_page, k_page), Reach::stale);
  EXPECT_EQ(m_node->reach_frames(m_client, Tier::pmem, 0, k_page), Reach::stale);
  EXPECT_EQ(m_node->reach_frames(m_client, Tier::vram, 0, k_page), Reach::none);

  // Domain 1 given to the tenant since: its keys, added on the same endpoint.
  std::vector<uint64_t> words1(k_pages, k_stable);
  std::vector<std::byte> frames1(k_pages * k_page);
  auto w = m_home.register_region(words1.data(), words1.size() * 8, MemoryKind::host);
  auto f = m_home.register_region(frames1.data(), frames1.size(), MemoryKind::host);
  ASSERT_TRUE(w.ok() && f.ok());
  const std::vector<RegionAdvert> added = {
      {true, Tier::automatic, 1, k_pages, (*w)->base(), (*w)->length(), (*w)->packed_key(), false, 1},
      {false, Tier::dram, 1, k_pages * k_page, (*f)->base(), (*f)->length(), (*f)->packed_key(), false, 1}};
  auto fresh = with_regions(m_client, *m_node, added);
  ASSERT_TRUE(fresh.ok()) << fresh.status().to_string();
  EXPECT_EQ((*fresh)->endpoint, m_node->endpoint) << "the keys were added on the endpoint held";
  EXPECT_EQ((*fresh)->reach_words(m_client, k_pages, 1), keyed);
  EXPECT_EQ((*fresh)->reach_frames(m_client, Tier::dram, k_pages * k_page, k_page), keyed);
  EXPECT_EQ((*fresh)->reach_frames(m_client, Tier::dram, 0, k_page), keyed) << "domain 0's keys are kept";
  // Through the new keys, domain 1's frames are written and read back.
  RemoteFrameData frames((m_client), *fresh, Tier::dram, k_timeout, nullptr);
  const uint64_t word = 0x1234'5678'9abc'def0;
  ASSERT_TRUE(frames.write(k_pages * k_page + 64, &word, sizeof word).ok());
  uint64_t back = 0;
  ASSERT_TRUE(frames.read(k_pages * k_page + 64, &back, sizeof back).ok());
  EXPECT_EQ(back, word);
  m_regions.push_back(std::move(*w));
  m_regions.push_back(std::move(*f));
}

INSTANTIATE_TEST_SUITE_P(Paths, RemoteMemoryTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "one_sided" : "messages"; });

}  // namespace
}  // namespace tiermem
