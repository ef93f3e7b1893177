// Leases (daemon/leases.hpp) with real processes: what a client keeps at
// the daemon beyond one connection. Pins stay while the process lives, per
// Client object; session allocations wait the grace for any Client of the
// process; an exited process lets everything go.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "daemon/leases.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

Gva gva(uint64_t offset, uint32_t generation = 7) {
  Gva g;
  g.node = 1;
  g.generation = generation;
  g.offset = offset;
  return g;
}

size_t count(const std::vector<Gva>& v, uint64_t offset) {
  return static_cast<size_t>(std::count_if(v.begin(), v.end(), [&](const Gva& g) { return g.offset == offset; }));
}

// A process that lives until ended.
class Process {
 public:
  Process() : m_pid(::fork()) {
    if (m_pid == 0) {
      ::pause();
      ::_exit(0);
    }
  }
  ~Process() { end(); }
  pid_t pid() const { return m_pid; }
  void end() {
    if (m_pid <= 0) return;
    ::kill(m_pid, SIGKILL);
    ::waitpid(m_pid, nullptr, 0);
    m_pid = -1;
  }

 private:
  pid_t m_pid;
};

TEST(LeasesTest, PinsStayWhileTheProcessLivesAndANewSessionKeepsThoseItStillMaps) {
  Process p;
  Leases leases(1000ms);
  const ClientKey a{p.pid(), 1000, 11};
  leases.pin(a, gva(0x10000));
  leases.pin(a, gva(0x20000));
  leases.pin(a, gva(0x20000));  // mapped twice
  Leases::Held now = leases.end_session(a, 1, {});
  EXPECT_TRUE(now.empty()) << "the process lives: its mappings stay pinned";
  EXPECT_EQ(leases.pins(), 3u);
  EXPECT_TRUE(leases.expired().empty());

  // It connects again, still mapping 0x20000 once and 0x30000 (which it
  // never pinned here: a restarted daemon's, say).
  std::vector<Gva> owned;
  std::vector<bool> kept;
  Leases::Held let_go = leases.begin_session(a, {gva(0x20000, 0), gva(0x30000)}, &owned, &kept);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_TRUE(kept[0]) << "a pin kept all along (the generation a client sends may be 0)";
  EXPECT_FALSE(kept[1]) << "nothing kept for a mapping never pinned here";
  EXPECT_EQ(count(let_go.pins, 0x10000), 1u) << "unmapped while the connection was down: let go";
  EXPECT_EQ(count(let_go.pins, 0x20000), 1u) << "mapped twice, still mapped once: one pin goes";
  EXPECT_EQ(leases.pins(), 1u);
  auto unpinned = leases.unpin(a, gva(0x20000, 0));
  ASSERT_TRUE(unpinned.has_value());
  EXPECT_EQ(unpinned->generation, 7u) << "the pin as it was taken";
  EXPECT_FALSE(leases.unpin(a, gva(0x20000)).has_value()) << "not pinned twice";
  EXPECT_EQ(leases.pins(), 0u);
}

TEST(LeasesTest, PinsAreEachClientsOfTheProcessAndAllGoWhenItExits) {
  Process p;
  Leases leases(1000ms);
  const ClientKey a{p.pid(), 1000, 11}, b{p.pid(), 1000, 22};
  leases.pin(a, gva(0x10000));
  leases.pin(b, gva(0x40000));
  EXPECT_FALSE(leases.unpin(b, gva(0x10000)).has_value()) << "another Client's pin";
  (void)leases.end_session(a, 1, {});
  std::vector<Gva> owned;
  std::vector<bool> kept;
  Leases::Held let_go = leases.begin_session(a, {}, &owned, &kept);
  EXPECT_EQ(count(let_go.pins, 0x10000), 1u);
  EXPECT_EQ(count(let_go.pins, 0x40000), 0u) << "client a's new session let go of client b's mapping";
  EXPECT_EQ(leases.pins(), 1u);
  p.end();
  Leases::Held gone = leases.expired();
  EXPECT_EQ(count(gone.pins, 0x40000), 1u) << "an exited process keeps nothing";
  EXPECT_EQ(leases.pins(), 0u);
}

TEST(LeasesTest, SessionAllocationsWaitTheGraceForAnyClientOfTheProcessButThoseAPinHolds) {
  Process p;
  Leases leases(200ms);
  const ClientKey a{p.pid(), 1000, 11}, b{p.pid(), 1000, 22};
  leases.pin(a, gva(0x20000));
  Leases::Held now = leases.end_session(a, 1, {gva(0x10000), gva(0x20000)});
  EXPECT_TRUE(now.empty());
  // Another Client of the same process takes them back within the grace.
  std::vector<Gva> owned;
  std::vector<bool> kept;
  (void)leases.begin_session(b, {}, &owned, &kept);
  EXPECT_EQ(owned.size(), 2u);
  EXPECT_EQ(leases.pins(), 1u) << "client a's pin is not client b's to let go";

  // Ended again, and nobody comes back: after the grace the allocation no
  // pin holds is freed; the mapped one waits for its pin.
  (void)leases.end_session(b, 2, owned);
  EXPECT_TRUE(leases.expired().owned.empty()) << "freed within the grace";
  std::this_thread::sleep_for(300ms);
  Leases::Held later = leases.expired();
  EXPECT_EQ(count(later.owned, 0x10000), 1u);
  EXPECT_EQ(count(later.owned, 0x20000), 0u) << "freed while mapped";
  ASSERT_TRUE(leases.unpin(a, gva(0x20000)).has_value());
  EXPECT_EQ(count(leases.expired().owned, 0x20000), 1u) << "unmapped: its grace is long past";
}

TEST(LeasesTest, AnExitedProcessLetsEverythingGoAtOnce) {
  Process p;
  Leases leases(10s);
  const ClientKey a{p.pid(), 1000, 11};
  leases.pin(a, gva(0x10000));
  p.end();
  Leases::Held now = leases.end_session(a, 1, {gva(0x50000)});
  EXPECT_EQ(count(now.owned, 0x50000), 1u) << "no grace for a process that is gone";
  EXPECT_EQ(count(now.pins, 0x10000), 1u);
  EXPECT_EQ(leases.pins(), 0u);
  // And without a grace period, what no pin holds goes at once.
  Process q;
  Leases none(0ms);
  const ClientKey c{q.pid(), 1000, 1};
  none.pin(c, gva(0x60000));
  Leases::Held at_once = none.end_session(c, 1, {gva(0x60000), gva(0x70000)});
  EXPECT_EQ(count(at_once.owned, 0x70000), 1u);
  EXPECT_EQ(count(at_once.owned, 0x60000), 0u) << "a mapped session allocation waits for its pin";
}

}  // namespace
}  // namespace tiermem
