// A Mapping never outlives what it maps (S1). After its daemon restarts, a
// mapping whose allocation did not come back — a session allocation, or one
// freed while its process could not pin it again — is revoked: its memory
// is replaced with inaccessible memory, so a store through it faults in the
// mapping process instead of landing in the allocation that now holds the
// frames; Mapping::status() and persist() say why, and the client's
// on_mapping_revoked callback is told. A mapping whose allocation came back
// on the same frames stays, pinned again (durability_test covers that).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <tiermem/client.h>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

constexpr size_t k_bytes = 128 << 10;

test::DaemonOptions small_pages() {
  test::DaemonOptions o;
  o.page_size = "64KiB";
  o.mapping_toml = "sub_page_max = \"0\"\n";  // every allocation on frames of its own
  o.extra_toml = "[recovery]\nstale_writer_grace_ms = 200\n";
  return o;
}

// What on_mapping_revoked was told.
struct Revocations {
  std::mutex mutex;
  std::vector<std::pair<Gva, Status>> seen;
  ClientOptions options(const std::string& socket) {
    ClientOptions o;
    o.socket_path = socket;
    o.on_mapping_revoked = [this](Gva g, const Status& s) {
      std::lock_guard lock(mutex);
      seen.emplace_back(g, s);
    };
    return o;
  }
  size_t count() {
    std::lock_guard lock(mutex);
    return seen.size();
  }
};

// Waits up to 10 s for `m` to be revoked.
Status wait_revoked(const Mapping& m) {
  Status s;
  for (int i = 0; i < 1000 && (s = m.status()).ok(); ++i) std::this_thread::sleep_for(10ms);
  return s;
}

// A store through `p` in a child process: the signal that ended it (0: it
// exited, the store went through).
int store_in_child(std::byte* p) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::memcpy(p, "stale", 5);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

// An allocation of `c` on the frames `old` had (tries every free frame of
// the tier; fails the test when none lands there).
AllocationInfo alloc_over(Client& c, const Extent& old) {
  for (int i = 0; i < 1024; ++i) {
    auto a = c.alloc(k_bytes, {.tier = Tier::dram, .strict = true});
    if (!a.ok()) break;
    auto t = c.translate(a->gva);
    if (t.ok() && !t->extents.empty() && t->extents[0].frame_offset == old.frame_offset) return *a;
  }
  ADD_FAILURE() << "no new allocation got the frames at " << old.frame_offset;
  return {};
}

enum class Stop { sigkill, sigterm };

class RevokeTest : public ::testing::TestWithParam<Stop> {
 protected:
  void down(test::TestDaemon& d) {
    if (GetParam() == Stop::sigkill) {
      d.kill();
    } else {
      ASSERT_EQ(d.stop(), 0) << d.log();
    }
  }
};

// The case: a session allocation, mapped, does not come back with
// the daemon; a new allocation of the same tenant gets its frames. The old
// mapping is revoked before anything is written through it.
TEST_P(RevokeTest, AMappingOfASessionAllocationIsRevokedWhenItsDaemonGoes) {
  test::TestDaemon daemon(small_pages());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  Revocations told;
  auto a = Client::connect(told.options(daemon.socket()));
  ASSERT_TRUE(a.ok());
  auto scratch = (*a)->alloc(k_bytes, {.tier = Tier::dram, .strict = true, .lifetime = Lifetime::session});
  ASSERT_TRUE(scratch.ok());
  auto where = (*a)->translate(scratch->gva);
  ASSERT_TRUE(where.ok() && !where->extents.empty());
  auto m = (*a)->map(scratch->gva);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  std::memcpy(m->data(), "mine", 4);
  EXPECT_TRUE(m->status().ok());

  down(daemon);
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  const Status revoked = wait_revoked(*m);
  EXPECT_EQ(revoked.code(), ErrorCode::not_allocated) << revoked.to_string();
  EXPECT_NE(revoked.message().find("session"), std::string::npos) << revoked.message();

  auto b = daemon.connect("b");
  const AllocationInfo theirs = alloc_over(*b, where->extents[0]);
  ASSERT_FALSE(theirs.gva.is_null());
  const auto bytes = test::pattern(k_bytes, 7);
  ASSERT_TRUE(b->write(theirs.gva, bytes.data(), bytes.size()).ok());

  EXPECT_EQ(store_in_child(m->data()), SIGSEGV) << "a store through the revoked mapping did not fault";
  std::vector<unsigned char> back(k_bytes);
  ASSERT_TRUE(b->read(theirs.gva, back.data(), back.size()).ok());
  EXPECT_TRUE(back == bytes) << "the new allocation was written through the old mapping";
  EXPECT_EQ(m->persist(0, 4).code(), revoked.code());
  ASSERT_EQ(told.count(), 1u);
  EXPECT_EQ(told.seen[0].first, scratch->gva);
  EXPECT_EQ(told.seen[0].second.code(), revoked.code());
  *m = Mapping();  // released without a fault, and nothing is unpinned twice
  EXPECT_TRUE((*a)->stat().ok());
  EXPECT_TRUE(daemon.alive());
}

// A persistent allocation, mapped by another process that is stopped across
// the restart (so it cannot pin it again in time), is freed by its tenant and
// its frames go to a new allocation. When the process runs again its mapping
// is revoked before its next store lands.
TEST_P(RevokeTest, AMappingWhoseAllocationWasFreedMeanwhileIsRevoked) {
  test::TestDaemon daemon(small_pages());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto c = daemon.connect("owner");
  auto kept = c->alloc(k_bytes, {.tier = Tier::dram, .strict = true, .name = "kept"});
  ASSERT_TRUE(kept.ok());
  auto where = c->translate(kept->gva);
  ASSERT_TRUE(where.ok());

  const std::string out = daemon.dir() + "/maphold.out";
  const pid_t holder = ::fork();
  if (holder == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 1);
    const char* probe = std::getenv("TIERMEM_PROBE");
    ::execl(probe, probe, daemon.socket().c_str(), "maphold", kept->gva.to_string().c_str(), nullptr);
    ::_exit(127);
  }
  const auto output = [&] {
    std::stringstream text;
    text << std::ifstream(out).rdbuf();
    return text.str();
  };
  const auto said = [&](const std::string& what) { return output().find(what) != std::string::npos; };
  for (int i = 0; i < 500 && !said("ok mapped"); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(said("ok mapped"));
  EXPECT_EQ(c->free(kept->gva).code(), ErrorCode::failed_precondition) << "mapped: pinned";
  ASSERT_TRUE(test::stop_process(holder));

  down(daemon);
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  // The new daemon knows nothing of the stopped process's pin.
  ASSERT_TRUE(c->free(kept->gva).ok());
  const AllocationInfo theirs = alloc_over(*c, where->extents[0]);
  ASSERT_FALSE(theirs.gva.is_null());
  const auto bytes = test::pattern(k_bytes, 9);
  ASSERT_TRUE(c->write(theirs.gva, bytes.data(), bytes.size()).ok());

  ::kill(holder, SIGCONT);
  int status = 0;
  ::waitpid(holder, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << "the late store did not fault";
  EXPECT_TRUE(said("revoked " + std::to_string(static_cast<unsigned>(ErrorCode::not_allocated)))) << output();
  EXPECT_FALSE(said("wrote"));
  std::vector<unsigned char> back(k_bytes);
  ASSERT_TRUE(c->read(theirs.gva, back.data(), back.size()).ok());
  EXPECT_TRUE(back == bytes) << "the new allocation was written through the old mapping";
}

INSTANTIATE_TEST_SUITE_P(Stops, RevokeTest, ::testing::Values(Stop::sigkill, Stop::sigterm),
                         [](const auto& info) { return info.param == Stop::sigkill ? "sigkill" : "sigterm"; });

// A client that does not connect again (reconnect_timeout 0) cannot pin its
// mappings on a new daemon: they are all revoked when its daemon dies.
TEST(RevokeWithoutReconnectTest, EveryMappingIsRevokedWhenTheDaemonDies) {
  test::TestDaemon daemon(small_pages());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  Revocations told;
  ClientOptions o = told.options(daemon.socket());
  o.reconnect_timeout = 0ms;
  auto c = Client::connect(o);
  ASSERT_TRUE(c.ok());
  auto a = (*c)->alloc(k_bytes, {.tier = Tier::dram, .strict = true});
  ASSERT_TRUE(a.ok());
  auto m = (*c)->map(a->gva);
  ASSERT_TRUE(m.ok());
  daemon.kill();
  const Status revoked = wait_revoked(*m);
  EXPECT_EQ(revoked.code(), ErrorCode::unavailable) << revoked.to_string();
  EXPECT_NE(revoked.message().find("reconnect_timeout"), std::string::npos) << revoked.message();
  EXPECT_EQ(store_in_child(m->data()), SIGSEGV);
  EXPECT_EQ(told.count(), 1u);
}

}  // namespace
}  // namespace tiermem
