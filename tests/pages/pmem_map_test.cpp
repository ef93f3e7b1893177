// PMEM files mapped with libpmem2 (pages/pmem_map) and the frames a client
// writes through them (MappedFrameData): a write returns only once its bytes
// are in the file and made durable the way libpmem2 chose for the mapping.
#include "pages/pmem_map.hpp"
#include "tiermem_config.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "common/unique_fd.hpp"
#include "pages/seqlock_copy.hpp"

namespace tiermem {
namespace {

constexpr size_t k_file = 4 << 20;

// A file of `k_file` bytes on /dev/shm (where test daemons keep their PMEM
// pools), given storage as the daemon gives frames theirs; unlinked at once.
UniqueFd pool_file() {
  char path[] = "/dev/shm/tiermem-pmem-map-test-XXXXXX";
  UniqueFd fd(::mkstemp(path));
  if (!fd.valid()) return fd;
  ::unlink(path);
  if (::fallocate(fd.get(), 0, 0, k_file) != 0) fd.reset();
  return fd;
}

// What a separate descriptor of the file reads at `offset`.
std::vector<unsigned char> file_bytes(int fd, size_t offset, size_t n) {
  std::vector<unsigned char> out(n);
  if (::pread(fd, out.data(), n, static_cast<off_t>(offset)) != static_cast<ssize_t>(n)) out.clear();
  return out;
}

std::vector<unsigned char> pattern(size_t n, unsigned char first) {
  std::vector<unsigned char> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : m_name(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(m_name); }

 private:
  const char* m_name;
};

// Writes through both kinds of durability: the bytes are in the file, read
// back through another descriptor, when write() and atomic() return.
void expect_writes_reach_the_file(int fd, const PmemMap& map) {
  MappedFrameData frames(map.data(), map.size(), true, map.durability());
  const auto bytes = pattern(64 << 10, 3);
  // Unaligned, across a system page boundary, and at the end of the file.
  for (size_t offset : {size_t{100}, size_t{8192 - 7}, k_file - bytes.size()}) {
    ASSERT_TRUE(frames.write(offset, bytes.data(), bytes.size()).ok());
    EXPECT_EQ(file_bytes(fd, offset, bytes.size()), bytes) << "at " << offset;
  }
  uint64_t old = 0;
  ASSERT_TRUE(frames.atomic(1 << 20, WordOp::fetch_add, 41, 0, &old).ok());
  ASSERT_TRUE(frames.atomic(1 << 20, WordOp::fetch_add, 1, 0, &old).ok());
  EXPECT_EQ(old, 41u);
  uint64_t word = 0;
  ASSERT_EQ(::pread(fd, &word, 8, 1 << 20), 8);
  EXPECT_EQ(word, 42u);
  EXPECT_EQ(frames.write(k_file - 8, bytes.data(), 16).code(), ErrorCode::stale_translation)
      << "a write past the mapping is refused before a byte is written";
}

// An ordinary file (tmpfs here): libpmem2 would msync it, so the writer
// msyncs it itself (and can report a failure).
TEST(PmemMapTest, AnOrdinaryFileIsMsyncedByTheWriter) {
  UniqueFd fd = pool_file();
  ASSERT_TRUE(fd.valid());
  auto map = PmemMap::map(fd.get(), k_file, "the test file");
  ASSERT_TRUE(map.ok()) << map.status().to_string();
  EXPECT_EQ(map->size(), k_file);
  EXPECT_FALSE(map->flushes_from_user_space());
  EXPECT_EQ(map->durability().copy, nullptr);
  EXPECT_EQ(map->durability().persist, nullptr);
  expect_writes_reach_the_file(fd.get(), *map);
}

// Where libpmem2 flushes from user space (DAX; forced here, as libpmem2's
// tests do, since no DAX file is at hand) its functions are the ones used.
TEST(PmemMapTest, WhereLibpmem2FlushesFromUserSpaceItsFunctionsAreUsed) {
#if !TIERMEM_HAVE_PMEM2
  GTEST_SKIP() << "built without libpmem2: every PMEM file is mapped with mmap and written back with msync";
#endif
  UniqueFd fd = pool_file();
  ASSERT_TRUE(fd.valid());
  ScopedEnv force("PMEM2_FORCE_GRANULARITY", "CACHE_LINE");
  auto map = PmemMap::map(fd.get(), k_file, "the test file");
  ASSERT_TRUE(map.ok()) << map.status().to_string();
  EXPECT_TRUE(map->flushes_from_user_space());
  EXPECT_NE(map->durability().copy, nullptr);
  EXPECT_NE(map->durability().persist, nullptr);
  expect_writes_reach_the_file(fd.get(), *map);
}

TEST(PmemMapTest, AFileShorterThanTheMappingIsAClearError) {
  UniqueFd fd = pool_file();
  ASSERT_TRUE(fd.valid());
  auto map = PmemMap::map(fd.get(), 2 * k_file, "the PMEM file of domain 3");
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(map.status().code(), ErrorCode::io_error);
  EXPECT_NE(map.status().message().find("the PMEM file of domain 3"), std::string::npos) << map.status().to_string();
}

// What the durability functions were asked to do, and what the frames held
// at that moment.
struct Recorded {
  std::vector<std::pair<const void*, size_t>> copies, persists;
  std::vector<unsigned char> word_at_persist;
};
Recorded g_recorded;

void* recording_copy(void* dst, const void* src, size_t length, unsigned flags) {
  EXPECT_EQ(flags, 0u) << "flags 0: copy, then make durable";
  g_recorded.copies.emplace_back(dst, length);
  return std::memcpy(dst, src, length);
}
void recording_persist(const void* at, size_t length) {
  g_recorded.persists.emplace_back(at, length);
  const auto* p = static_cast<const unsigned char*>(at);
  g_recorded.word_at_persist.assign(p, p + length);
}

// The frames call exactly the durability step the mapping chose, on exactly
// the bytes written, before they return; a volatile tier never does.
TEST(PmemMapTest, EveryWriteAndAtomicIsMadeDurableBeforeItReturns) {
  std::vector<std::byte> memory(1 << 16);
  g_recorded = {};
  MappedFrameData frames(memory.data(), memory.size(), true, {recording_copy, recording_persist});
  const auto bytes = pattern(3000, 9);
  ASSERT_TRUE(frames.write(777, bytes.data(), bytes.size()).ok());
  ASSERT_EQ(g_recorded.copies.size(), 1u);
  EXPECT_EQ(g_recorded.copies[0].first, memory.data() + 777);
  EXPECT_EQ(g_recorded.copies[0].second, bytes.size());
  EXPECT_EQ(std::memcmp(memory.data() + 777, bytes.data(), bytes.size()), 0);
  EXPECT_TRUE(g_recorded.persists.empty()) << "the copy function already made the write durable";

  uint64_t old = 0;
  ASSERT_TRUE(frames.atomic(4096, WordOp::compare_swap, 5, 0, &old).ok());
  ASSERT_EQ(g_recorded.persists.size(), 1u);
  EXPECT_EQ(g_recorded.persists[0].first, memory.data() + 4096);
  EXPECT_EQ(g_recorded.persists[0].second, 8u);
  uint64_t persisted = 0;
  ASSERT_EQ(g_recorded.word_at_persist.size(), 8u);
  std::memcpy(&persisted, g_recorded.word_at_persist.data(), 8);
  EXPECT_EQ(persisted, 5u) << "the word is persisted after the atomic changed it";

  g_recorded = {};
  MappedFrameData volatile_frames(memory.data(), memory.size(), false, {recording_copy, recording_persist});
  ASSERT_TRUE(volatile_frames.write(0, bytes.data(), bytes.size()).ok());
  ASSERT_TRUE(volatile_frames.atomic(8, WordOp::fetch_add, 1, 0, &old).ok());
  EXPECT_TRUE(g_recorded.copies.empty());
  EXPECT_TRUE(g_recorded.persists.empty());
}

}  // namespace
}  // namespace tiermem
