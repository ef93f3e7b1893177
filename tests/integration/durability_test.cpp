// Durability (H5, issue 10): what a daemon acknowledged survives its crash or
// restart. Real daemons, killed with SIGKILL or stopped with SIGTERM and
// started again on the same pool and shared memory; a reboot is simulated by
// removing the node's shared memory before the start. The crash test with
// many kills under load is tests/support/torture.cpp (the 'torture' test).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

test::DaemonOptions small_pages() {
  test::DaemonOptions o;
  o.page_size = "64KiB";
  o.extra_toml = "[recovery]\nstale_writer_grace_ms = 200\n";
  return o;
}

// The bytes at `gva`; empty when the read failed (its status in *status).
std::vector<unsigned char> read_all(Client& c, Gva gva, size_t n, Status* status = nullptr) {
  std::vector<unsigned char> out(n);
  const Status s = c.read(gva, out.data(), out.size());
  if (status != nullptr) *status = s;
  if (!s.ok()) out.clear();
  return out;
}

enum class Stop { sigkill, sigterm };

class RestartTest : public ::testing::TestWithParam<Stop> {
 protected:
  void down(test::TestDaemon& d) {
    if (GetParam() == Stop::sigkill) {
      d.kill();
    } else {
      EXPECT_EQ(d.stop(), 0);
    }
  }
};

// Named allocations in DRAM and PMEM, written, then the daemon goes away and
// comes back: the same names lead to the same GVAs with the same bytes.
TEST_P(RestartTest, AllocationsNamesAndBytesSurvive) {
  test::TestDaemon daemon(small_pages());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  const auto dram_bytes = test::pattern(300 << 10, 1), pmem_bytes = test::pattern(200 << 10, 2);
  Gva dram_gva, pmem_gva;
  {
    auto c = daemon.connect();
    auto d = c->alloc(dram_bytes.size(), {.tier = Tier::dram, .strict = true, .name = "weights"});
    auto p = c->alloc(pmem_bytes.size(), {.tier = Tier::pmem, .strict = true, .name = "optimizer"});
    ASSERT_TRUE(d.ok() && p.ok());
    ASSERT_TRUE(c->write(d->gva, dram_bytes.data(), dram_bytes.size()).ok());
    ASSERT_TRUE(c->write(p->gva, pmem_bytes.data(), pmem_bytes.size()).ok());
    dram_gva = d->gva;
    pmem_gva = p->gva;
  }
  down(daemon);
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  auto c = daemon.connect();
  auto d = c->lookup("weights");
  auto p = c->lookup("optimizer");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(d->gva, dram_gva);
  EXPECT_EQ(p->gva, pmem_gva);
  EXPECT_EQ(d->tier, Tier::dram);
  EXPECT_EQ(p->size, pmem_bytes.size());
  EXPECT_EQ(d->lost_pages, 0u);
  EXPECT_EQ(read_all(*c, dram_gva, dram_bytes.size()), dram_bytes);
  EXPECT_EQ(read_all(*c, pmem_gva, pmem_bytes.size()), pmem_bytes);
  auto stat = c->stat();
  ASSERT_TRUE(stat.ok());
  EXPECT_TRUE(stat->recovery.durable);
  EXPECT_TRUE(stat->recovery.memory_adopted);
  EXPECT_EQ(stat->recovery.allocations, 2u);
  EXPECT_EQ(stat->recovery.starts, 2u);
  EXPECT_EQ(stat->allocations, 2u);
  EXPECT_NE(daemon.log().find("recovered 2 allocation(s)"), std::string::npos) << daemon.log();
  // The recovered memory is what it was: its frames are not handed out twice.
  auto fresh = c->alloc(dram_bytes.size(), {.tier = Tier::dram});
  ASSERT_TRUE(fresh.ok());
  const auto other = test::pattern(dram_bytes.size(), 9);
  ASSERT_TRUE(c->write(fresh->gva, other.data(), other.size()).ok());
  EXPECT_EQ(read_all(*c, dram_gva, dram_bytes.size()), dram_bytes);
}

// A freed allocation never comes back, and its GVA stays stale: generations
// go on from where they were.
TEST_P(RestartTest, FreedStaysFreedAndGenerationsGoOn) {
  test::TestDaemon daemon(small_pages());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  Gva freed, kept;
  {
    auto c = daemon.connect();
    auto a = c->alloc(100 << 10, {.tier = Tier::pmem, .name = "freed"});
    auto b = c->alloc(100 << 10, {.tier = Tier::dram, .name = "kept"});
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(c->free(a->gva).ok());
    freed = a->gva;
    kept = b->gva;
  }
  down(daemon);
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  auto c = daemon.connect();
  EXPECT_EQ(c->lookup("freed").status().code(), ErrorCode::not_found);
  Status s;
  (void)read_all(*c, freed, 16, &s);
  EXPECT_TRUE(s.code() == ErrorCode::not_allocated || s.code() == ErrorCode::stale_generation) << s.to_string();
  auto again = c->alloc(100 << 10, {.tier = Tier::pmem, .name = "freed"});
  ASSERT_TRUE(again.ok()) << "the name is free again";
  const uint32_t next = kept.generation + 1 == 0 ? 1 : kept.generation + 1;
  EXPECT_EQ(again->gva.generation, next) << "generations continue from the record";
  EXPECT_NE(again->gva, freed);
  (void)read_all(*c, freed, 16, &s);
  EXPECT_FALSE(s.ok()) << "the old GVA reaches the new allocation";
}

// A client connected across the restart is not restarted: its next calls
// connect again by themselves and reach the same memory, directly.
TEST_P(RestartTest, AClientCarriesOnAcrossTheRestart) {
  test::TestDaemon daemon(small_pages());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto c = daemon.connect("survivor");
  auto a = c->alloc(256 << 10, {.tier = Tier::dram, .strict = true, .name = "live"});
  ASSERT_TRUE(a.ok());
  const auto before = test::pattern(256 << 10, 3), after = test::pattern(256 << 10, 4);
  ASSERT_TRUE(c->write(a->gva, before.data(), before.size()).ok());
  down(daemon);
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  EXPECT_EQ(read_all(*c, a->gva, before.size()), before);
  const uint64_t direct = c->access_counters().direct_local;
  ASSERT_TRUE(c->write(a->gva, after.data(), after.size()).ok());
  EXPECT_GT(c->access_counters().direct_local, direct) << "after the reconnect writes go straight to memory again";
  auto other = daemon.connect("other");
  EXPECT_EQ(read_all(*other, a->gva, after.size()), after);
  auto stat = c->stat();
  ASSERT_TRUE(stat.ok());
  EXPECT_EQ(stat->recovery.starts, 2u) << "the client talks to the new daemon";
}

// A Mapping made before the restart still reaches the same memory after it,
// and its allocation is pinned again once the client has reconnected: nobody
// migrates it from under the mapping; released, it can be migrated.
TEST_P(RestartTest, AMappingStaysMappedAndPinnedAcrossTheRestart) {
  test::TestDaemon daemon(small_pages());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto c = daemon.connect("mapper");
  auto a = c->alloc(128 << 10, {.tier = Tier::dram, .strict = true, .name = "mapped"});
  ASSERT_TRUE(a.ok());
  auto m = c->map(a->gva);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  down(daemon);
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  ASSERT_TRUE(c->stat().ok()) << "the client reconnects (and pins again)";
  const auto bytes = test::pattern(128 << 10, 8);
  std::memcpy(m->data(), bytes.data(), bytes.size());
  auto other = daemon.connect("other");
  EXPECT_EQ(read_all(*other, a->gva, bytes.size()), bytes) << "stores through the old mapping reach the memory";
  auto moved = other->migrate(a->gva, Tier::pmem);
  EXPECT_EQ(moved.status().code(), ErrorCode::failed_precondition) << moved.status().to_string();
  *m = Mapping();  // unmapped, through the new connection
  auto later = other->migrate(a->gva, Tier::pmem);
  EXPECT_TRUE(later.ok()) << later.status().to_string();
  EXPECT_EQ(read_all(*other, a->gva, bytes.size()), bytes);
}

INSTANTIATE_TEST_SUITE_P(Stops, RestartTest, ::testing::Values(Stop::sigkill, Stop::sigterm),
                         [](const auto& info) { return info.param == Stop::sigkill ? "sigkill" : "sigterm"; });

// A reboot takes the node's shared memory: DRAM allocations are reported lost
// by name and GVA (reads fail with data_lost; free works), PMEM ones come back
// with their bytes.
TEST(RebootTest, DramIsReportedLostAndPmemComesBack) {
  test::TestDaemon daemon(small_pages());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  const auto bytes = test::pattern(128 << 10, 5);
  Gva dram_gva, pmem_gva;
  {
    auto c = daemon.connect();
    auto d = c->alloc(bytes.size(), {.tier = Tier::dram, .strict = true, .name = "activations"});
    auto p = c->alloc(bytes.size(), {.tier = Tier::pmem, .strict = true, .name = "checkpoint"});
    ASSERT_TRUE(d.ok() && p.ok());
    ASSERT_TRUE(c->write(d->gva, bytes.data(), bytes.size()).ok());
    ASSERT_TRUE(c->write(p->gva, bytes.data(), bytes.size()).ok());
    dram_gva = d->gva;
    pmem_gva = p->gva;
  }
  daemon.kill();
  std::filesystem::remove_all(daemon.dram_dir());  // what a reboot does to /dev/shm
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  auto c = daemon.connect();
  auto stat = c->stat();
  ASSERT_TRUE(stat.ok());
  EXPECT_FALSE(stat->recovery.memory_adopted);
  EXPECT_EQ(stat->recovery.lost_allocations, 1u);
  ASSERT_EQ(stat->recovery.lost.size(), 1u);
  EXPECT_NE(stat->recovery.lost[0].find("activations"), std::string::npos);
  EXPECT_NE(stat->recovery.lost[0].find(dram_gva.to_string()), std::string::npos);
  EXPECT_NE(daemon.log().find("lost: 'activations' " + dram_gva.to_string()), std::string::npos) << daemon.log();
  auto lost = c->lookup("activations");
  ASSERT_TRUE(lost.ok());
  EXPECT_EQ(lost->lost_pages, lost->pages);
  Status s;
  (void)read_all(*c, dram_gva, bytes.size(), &s);
  EXPECT_EQ(s.code(), ErrorCode::data_lost) << s.to_string();
  EXPECT_EQ(c->write(dram_gva, bytes.data(), bytes.size()).code(), ErrorCode::data_lost);
  EXPECT_EQ(read_all(*c, pmem_gva, bytes.size()), bytes);
  EXPECT_TRUE(c->free(dram_gva).ok());
  // Lost stays lost over the next start, and the freed one stays freed.
  daemon.kill();
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  c = daemon.connect();
  EXPECT_EQ(c->lookup("activations").status().code(), ErrorCode::not_found);
  EXPECT_EQ(read_all(*c, pmem_gva, bytes.size()), bytes);
}

// Session allocations go with the session that made them and never come back
// after a restart; persistent ones (the default) stay.
TEST(LifetimeTest, SessionAllocationsGoWithTheirSession) {
  test::TestDaemon daemon(small_pages());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto keeper = daemon.connect("keeper");
  {
    auto c = daemon.connect("scratch");
    auto s = c->alloc(64 << 10, {.name = "scratch", .lifetime = Lifetime::session});
    auto p = c->alloc(64 << 10, {.name = "kept"});
    ASSERT_TRUE(s.ok() && p.ok());
    EXPECT_EQ(s->lifetime, Lifetime::session);
    EXPECT_EQ(p->lifetime, Lifetime::persistent) << "persistent is the default";
    auto seen = keeper->lookup("scratch");
    ASSERT_TRUE(seen.ok());
    EXPECT_EQ(seen->lifetime, Lifetime::session);
  }
  // This process lives on: the allocation waits lease.grace_ms (1 s) for it
  // to connect again (LeaseTest), then goes.
  Status gone;
  for (int i = 0; i < 250; ++i) {
    gone = keeper->lookup("scratch").status();
    if (gone.code() == ErrorCode::not_found) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(gone.code(), ErrorCode::not_found) << "the session's allocation outlived it";
  EXPECT_TRUE(keeper->lookup("kept").ok());

  auto s = keeper->alloc(64 << 10, {.name = "scratch2", .lifetime = Lifetime::session});
  ASSERT_TRUE(s.ok());
  daemon.kill();
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  auto c = daemon.connect();
  EXPECT_EQ(c->lookup("scratch2").status().code(), ErrorCode::not_found) << "a session allocation came back";
  EXPECT_TRUE(c->lookup("kept").ok());
  auto elsewhere = c->alloc(64 << 10, {.node = 7, .lifetime = Lifetime::session});
  EXPECT_EQ(elsewhere.status().code(), ErrorCode::not_supported) << elsewhere.status().to_string();
}

// Leases: the session allocations of a connection that ends while its
// process lives wait lease.grace_ms for that process to connect again, which
// takes them back; after the grace, or at once when the process is gone,
// they are freed.
TEST(LeaseTest, ALiveProcessTakesItsSessionAllocationsBackWithinTheGrace) {
  auto o = small_pages();
  o.extra_toml = "[lease]\ngrace_ms = 600\n";
  test::TestDaemon daemon(o);
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  // Looked at from another process: a lookup of this one would be a hello
  // of this pid, which takes the lease.
  auto exists = [&](const std::string& name) {
    return test::run_ctl(daemon.socket(), {"lookup", name}).exit_code == 0;
  };
  ASSERT_TRUE(daemon.connect("first")->alloc(64 << 10, {.name = "lease-a", .lifetime = Lifetime::session}).ok());
  EXPECT_TRUE(exists("lease-a")) << "freed with no grace:\n" << daemon.log();
  for (int i = 0; i < 100 && daemon.log().find("kept 600 ms") == std::string::npos; ++i) {
    std::this_thread::sleep_for(5ms);  // the daemon saw the first connection end
  }
  auto again = daemon.connect("second");  // the same process, a new connection: it takes the lease
  ASSERT_NE(again, nullptr);
  std::this_thread::sleep_for(1500ms);
  EXPECT_TRUE(exists("lease-a")) << "the new connection did not take it back:\n" << daemon.log();
  EXPECT_NE(daemon.log().find("took back 1 session allocation(s)"), std::string::npos) << daemon.log();
  again.reset();
  bool gone = false;
  for (int i = 0; i < 60 && !gone; ++i) {
    std::this_thread::sleep_for(50ms);
    gone = !exists("lease-a");
  }
  EXPECT_TRUE(gone) << "outlived its lease:\n" << daemon.log();
  EXPECT_NE(daemon.log().find("the lease of session"), std::string::npos) << daemon.log();

  // A process that is gone cannot come back: no grace.
  const pid_t pid = ::fork();
  if (pid == 0) {
    auto c = Client::connect({.socket_path = daemon.socket()});
    ::_exit(c.ok() && (*c)->alloc(64 << 10, {.name = "lease-b", .lifetime = Lifetime::session}).ok() ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  gone = false;
  for (int i = 0; i < 20 && !gone; ++i) {
    std::this_thread::sleep_for(25ms);
    gone = !exists("lease-b");
  }
  EXPECT_TRUE(gone) << "a dead process's session allocation waited:\n" << daemon.log();
}

// The pool belongs to one geometry: a daemon started with another page size
// refuses to start and says why, and the old one's allocations are intact.
TEST(MetadataTest, APoolOfAnotherGeometryIsRefused) {
  test::TestDaemon daemon(small_pages());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  ASSERT_TRUE(daemon.connect()->alloc(64 << 10, {.tier = Tier::pmem, .name = "precious"}).ok());
  ASSERT_EQ(daemon.stop(), 0);
  std::stringstream text;
  text << std::ifstream(daemon.config_path()).rdbuf();
  const std::string original = text.str();
  std::ofstream(daemon.config_path()) << std::regex_replace(original, std::regex("64KiB"), "128KiB");
  EXPECT_FALSE(daemon.restart());
  EXPECT_NE(daemon.log().find("was made for page size 65536, the configuration says 131072"), std::string::npos)
      << daemon.log();
  std::ofstream(daemon.config_path()) << original;
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  EXPECT_TRUE(daemon.connect()->lookup("precious").ok());
}

// A write to PMEM is acknowledged once durable: the bytes a client wrote
// straight into its own node's PMEM (its libpmem2 mapping of the pool file)
// are in the pool file when the call returns, even when the writer is
// SIGKILLed right after; read back through a descriptor of the file itself,
// then through a daemon restarted after a SIGKILL. Writes at odd offsets, one
// across a page boundary, a 1 MiB one, and an atomic on a PMEM word.
TEST(PmemWriteTest, AnAcknowledgedWriteIsInThePoolFileWhenItsWriterIsKilledRightAfter) {
  test::TestDaemon daemon(small_pages());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto c = daemon.connect();
  auto a = c->alloc(2 << 20, {.tier = Tier::pmem, .strict = true, .name = "journal"});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  struct Piece {
    uint64_t offset;
    std::vector<unsigned char> bytes;
  };
  const std::vector<Piece> pieces = {{100, test::pattern(4096, 1)},
                                     {(64 << 10) - 3000, test::pattern(64 << 10, 2)},  // across a page boundary
                                     {(1 << 20) - 1, test::pattern(1 << 20, 3)}};
  constexpr uint64_t k_word = 8 << 10;  // an 8-byte word fetch_add'ed from 41 to 42
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The writer: every call acknowledged, how many went straight to memory
    // (not through the daemon) told, then killed at once.
    auto w = Client::connect({.socket_path = daemon.socket()});
    bool ok = w.ok();
    for (const Piece& p : pieces) ok = ok && (*w)->write(a->gva.plus(p.offset), p.bytes.data(), p.bytes.size()).ok();
    ok = ok && (*w)->fetch_add(a->gva.plus(k_word), 41).ok() && (*w)->fetch_add(a->gva.plus(k_word), 1).ok();
    const uint64_t direct = ok ? (*w)->access_counters().direct_local : 0;
    (void)!::write(report[1], &direct, sizeof direct);
    ::raise(SIGKILL);
    ::_exit(1);
  }
  ::close(report[1]);
  uint64_t direct = 0;
  ASSERT_EQ(::read(report[0], &direct, sizeof direct), static_cast<ssize_t>(sizeof direct));
  ::close(report[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(direct, pieces.size() + 2) << "every call went straight into the client's mapping of the pool";

  // The pool file through a descriptor of its own: one tenant, domain 0,
  // whose file starts at frame offset 0.
  auto t = c->translate(a->gva);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::string pool = daemon.pmem_dir() + "/pmem.0";
  std::ifstream file(pool, std::ios::binary);
  ASSERT_TRUE(file) << pool;
  const auto in_file = [&](uint64_t offset, size_t n) {
    std::vector<unsigned char> out(n);
    for (size_t done = 0; done < n;) {
      const uint64_t at = offset + done;
      const Extent* x = nullptr;
      for (const Extent& e : t->extents) {
        if (at >= e.gva_offset && at < e.gva_offset + e.length) x = &e;
      }
      if (x == nullptr || x->tier != Tier::pmem) {
        ADD_FAILURE() << "no PMEM extent holds byte " << at;
        return std::vector<unsigned char>();
      }
      const size_t run = std::min<uint64_t>(n - done, x->gva_offset + x->length - at);
      file.seekg(static_cast<std::streamoff>(x->frame_offset + (at - x->gva_offset)));
      file.read(reinterpret_cast<char*>(out.data() + done), static_cast<std::streamsize>(run));
      if (!file) return std::vector<unsigned char>();
      done += run;
    }
    return out;
  };
  for (const Piece& p : pieces) EXPECT_EQ(in_file(p.offset, p.bytes.size()), p.bytes) << "at " << p.offset;
  std::vector<unsigned char> word(8);
  const uint64_t forty_two = 42;
  std::memcpy(word.data(), &forty_two, 8);
  EXPECT_EQ(in_file(k_word, 8), word);

  c.reset();
  daemon.kill();
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  c = daemon.connect();
  for (const Piece& p : pieces) EXPECT_EQ(read_all(*c, a->gva.plus(p.offset), p.bytes.size()), p.bytes);
  EXPECT_EQ(read_all(*c, a->gva.plus(k_word), 8), word);
}

// metadata.enabled = false: the daemon forgets everything when it stops, as
// documented.
TEST(MetadataTest, WithoutMetadataARestartForgets) {
  auto o = small_pages();
  o.extra_toml += "[metadata]\nenabled = false\n";
  test::TestDaemon daemon(o);
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  ASSERT_TRUE(daemon.connect()->alloc(64 << 10, {.name = "ephemeral"}).ok());
  daemon.kill();
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  auto c = daemon.connect();
  EXPECT_EQ(c->lookup("ephemeral").status().code(), ErrorCode::not_found);
  auto stat = c->stat();
  ASSERT_TRUE(stat.ok());
  EXPECT_FALSE(stat->recovery.durable);
}

// Pages migrated onto frames a peer lent: the peer's restart keeps them lent
// (its records), the home's restart keeps them in the allocation (its
// records), and the bytes stay reachable; a free gives them back.
class ClusterDurabilityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ClusterDurabilityTest, PagesOnAPeerSurviveEitherNodesRestart) {
  test::TestCluster cluster(2, small_pages().over(GetParam()));
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  const auto data = test::pattern(256 << 10, 6);
  Gva gva;
  uint64_t used_before = 0;
  {
    auto c = cluster.node(1).connect("owner");
    auto a = c->alloc(data.size(), {.tier = Tier::dram, .name = "abroad"});
    ASSERT_TRUE(a.ok());
    gva = a->gva;
    ASSERT_TRUE(c->write(gva, data.data(), data.size()).ok());
    auto on2 = cluster.node(2).connect()->stat();
    ASSERT_TRUE(on2.ok());
    used_before = on2->tiers[0].used_bytes + on2->tiers[1].used_bytes;
    ASSERT_TRUE(c->migrate(gva, Tier::dram, 2).ok());
  }
  const auto used_on_2 = [&] {
    auto st = cluster.node(2).connect()->stat();
    return st.ok() ? st->tiers[0].used_bytes + st->tiers[1].used_bytes : 0;
  };
  EXPECT_GT(used_on_2(), used_before);
  for (int node : {2, 1}) {
    cluster.node(node).kill();
    ASSERT_TRUE(cluster.node(node).restart()) << cluster.logs();
    ASSERT_TRUE(cluster.wait_connected()) << cluster.logs();
    auto c = cluster.node(1).connect("after-" + std::to_string(node));
    auto found = c->lookup("abroad");
    ASSERT_TRUE(found.ok()) << found.status().to_string();
    EXPECT_EQ(found->gva, gva);
    EXPECT_EQ(found->lost_pages, 0u);
    EXPECT_EQ(read_all(*c, gva, data.size()), data) << "after node " << node << " restarted";
    auto t = c->translate(gva);
    ASSERT_TRUE(t.ok());
    for (const Extent& x : t->extents) EXPECT_EQ(x.node, 2u);
  }
  ASSERT_TRUE(cluster.node(1).connect()->free(gva).ok());
  EXPECT_EQ(used_on_2(), used_before) << "node 2's frames were not given back";
}

INSTANTIATE_TEST_SUITE_P(Fabrics, ClusterDurabilityTest, ::testing::ValuesIn(test::k_fault_fabrics),
                         [](const auto& info) { return test::fabric_name(info.param); });

}  // namespace
}  // namespace tiermem
