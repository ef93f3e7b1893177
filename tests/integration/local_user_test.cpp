// What any local user, or a tenant, can do to a daemon that serves others
// (S3, S4, O5): the four ways of issue 46, run as a hostile user would (bob,
// a real user, through tests/support/tenant_probe.cpp and plane_probe.cpp),
// and each time the daemon lives, restarts, and serves the others.
//   - squatting the names of libfabric shm queues in /dev/shm;
//   - growing the tier files a tenant is handed past its quota, and filling
//     their file system with them;
//   - flooding a tenant plane's listener with connections that never prove
//     anything (UCX ones and bare TCP ones);
//   - killing clients that wire up to a daemon over UCX's shared memory.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/tenant_fixture.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;
using test::code;
using test::Outcome;

// The last pid the kernel handed out (the next ones follow it).
long last_pid() {
  std::ifstream in("/proc/sys/kernel/ns_last_pid");
  long pid = 0;
  in >> pid;
  return pid;
}

// The length of a file (-1: none).
long long file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
}

// A process started as `user` with setpriv, its stdout on a pipe.
struct Started {
  pid_t pid = -1;
  int out = -1;
};

Started start_as(const test::User& user, std::vector<std::string> args) {
  std::vector<std::string> argv = {"setpriv", "--reuid=" + std::to_string(user.uid),
                                   "--regid=" + std::to_string(user.gid), "--clear-groups"};
  argv.insert(argv.end(), args.begin(), args.end());
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    std::vector<char*> raw;
    for (std::string& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    ::execvp(raw[0], raw.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

// The first line from `fd` that starts with "ok" or "error" (a probe's
// verdict; UCX writes its own lines to stdout too), waiting up to `timeout`.
std::string read_verdict(int fd, std::chrono::milliseconds timeout) {
  std::string line;
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char c = 0;
    if (::read(fd, &c, 1) != 1) break;
    if (c != '\n') {
      line += c;
      continue;
    }
    if (line.rfind("ok", 0) == 0 || line.rfind("error", 0) == 0) return line;
    line.clear();
  }
  return line;
}

class LocalUserTest : public test::TenantTest {
 protected:
  test::DaemonOptions options() const {
    return {.extra_toml = tenants_toml(), .control_toml = "socket_mode = \"0666\"\n"};
  }
  void open_cluster(test::TestCluster& cluster) {
    for (size_t i = 1; i <= cluster.size(); ++i) open_to_users(cluster.node(static_cast<int>(i)));
    std::filesystem::permissions(cluster.dir(), std::filesystem::perms(0755));
  }
  // Where "what=N" says N in `text` (-1: not said).
  static long long figure(const std::string& text, const std::string& what) {
    const size_t at = text.find(what + "=");
    return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + what.size() + 1);
  }
};

// --- 1. libfabric shm queue names -------------------------------------------------

// Bob makes empty files, and 16 MiB ones anyone may write, under every name
// libfabric's shm provider would give the queues of the next few hundred
// processes ("<pid>:<uid>:<n>"). Root daemons then start, give a new tenant
// a plane (a new queue), serve root clients over shm and restart: no
// SIGBUS, no EBUSY, the clients' operations really go over the data plane
// (nothing silently through the daemon), and no byte lands in bob's files.
TEST_F(LocalUserTest, SquattedShmQueueNamesHarmNoDaemonAndNoClient) {
  ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);  // nodes as hosts: clients use the data plane
  const std::string shm = "/dev/shm";
  const long from = last_pid() + 1;
  const std::string script =
      "cd " + shm + " && for p in $(seq " + std::to_string(from) + " " + std::to_string(from + 400) +
      "); do for n in 0 1 2 3 4 5 6 7; do : > \"$p:0:$n\"; done; "
      "truncate -s 16M \"$p:0:8\"; chmod 666 \"$p:0:8\"; done";
  const auto squatted = test::run_command({"setpriv", "--reuid=" + std::to_string(s_bob->uid),
                                           "--regid=" + std::to_string(s_bob->gid), "--clear-groups", "sh", "-c",
                                           script});
  ASSERT_EQ(squatted.exit_code, 0) << squatted.err;
  auto squats = [&] {
    std::vector<std::string> out;
    for (long p = from; p <= from + 400; ++p) {
      for (int n = 0; n <= 8; ++n) out.push_back(shm + "/" + std::to_string(p) + ":0:" + std::to_string(n));
    }
    return out;
  }();
  {
    test::TestCluster cluster(2, options().over("ofi-shm"));
    ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
    open_cluster(cluster);
    auto root = cluster.node(1).connect("root");
    ASSERT_NE(root, nullptr);
    auto a = root->alloc(1 << 20, {.tier = Tier::dram, .node = 2});
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    const auto data = test::pattern(1 << 20, 3);
    ASSERT_TRUE(root->write(a->gva, data.data(), data.size()).ok());
    // A new tenant gets memory on node 2: a plane (and a queue) of its own.
    const Outcome hers = as(&*s_alice, cluster.node(1).socket(), {"alloc", "1048576", "dram", "alice-shm", "2"});
    ASSERT_TRUE(hers.ok) << hers.text;
    std::vector<unsigned char> back(data.size());
    ASSERT_TRUE(root->read(a->gva, back.data(), back.size()).ok());
    EXPECT_EQ(back, data);
    const AccessCounters n = root->access_counters();
    EXPECT_GT(n.message, 0u) << "the root client's operations did not travel over the shm data plane";
    EXPECT_EQ(n.plane_fallbacks, 0u);
    // Node 2 restarts on the same names' directory.
    ASSERT_EQ(cluster.node(2).stop(), 0) << cluster.node(2).log();
    ASSERT_TRUE(cluster.node(2).restart()) << cluster.node(2).log();
    ASSERT_TRUE(cluster.wait_connected()) << cluster.logs();
    auto again = cluster.node(1).connect("root-again");
    ASSERT_NE(again, nullptr);
    ASSERT_TRUE(again->read(a->gva, back.data(), back.size()).ok());
    EXPECT_EQ(back, data);
    EXPECT_TRUE(cluster.node(1).alive() && cluster.node(2).alive());
    EXPECT_EQ(cluster.logs().find("killed by signal"), std::string::npos);
  }
  // Bob's files are as he made them: nobody wrote into them.
  size_t checked = 0;
  for (const std::string& path : squats) {
    const long long size = file_size(path);
    if (size < 0) continue;  // swept? only dead pids' files of its own user are: never bob's
    ++checked;
    EXPECT_EQ(size, path.ends_with(":8") ? 16 << 20 : 0) << path;
    if (path.ends_with(":8")) {
      std::ifstream in(path, std::ios::binary);
      std::string head(4096, '\0');
      in.read(head.data(), static_cast<std::streamsize>(head.size()));
      EXPECT_EQ(head.find_first_not_of('\0'), std::string::npos) << "bytes landed in " << path;
    }
    std::filesystem::remove(path);
  }
  EXPECT_EQ(checked, squats.size());
  ::unsetenv("TIERMEM_MAP_SAME_HOST");
}

// --- 2. tier files past a tenant's quota ------------------------------------------

// Bob grows his DRAM and PMEM files by 1 GiB each and writes into the
// growth: the running daemon cuts them back within a few sweeps, says so by
// name, and counts the storage it gave back; his memory keeps its bytes.
TEST_F(LocalUserTest, ATenantsGrownFilesAreCutBackToItsQuota) {
  test::TestDaemon daemon(options());
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  open_to_users(daemon);
  const std::string sock = daemon.socket();
  const Outcome made = as(&*s_bob, sock, {"alloc", "1048576", "dram", "bob-dram"});
  const Outcome made_p = as(&*s_bob, sock, {"alloc", "1048576", "pmem", "bob-pmem"});
  ASSERT_TRUE(made.ok && made_p.ok) << made.text << " / " << made_p.text;
  ASSERT_TRUE(as(&*s_bob, sock, {"--direct", "write", made.text, "bob's"}).ok);
  std::vector<std::string> files;
  for (const auto& dir : {daemon.dram_dir(), daemon.pmem_dir()}) {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("dram.", 0) == 0 || name.rfind("pmem.", 0) == 0) files.push_back(e.path().string());
    }
  }
  std::map<std::string, long long> before;
  for (const auto& f : files) before[f] = file_size(f);
  for (const char* what : {"dram-grow", "pmem-grow"}) {
    const Outcome grown = as(&*s_bob, sock, {"damage", what});
    ASSERT_TRUE(grown.ok) << what << ": " << grown.text;
  }
  const auto until = std::chrono::steady_clock::now() + 5s;
  auto all_back = [&] {
    for (const auto& f : files) {
      if (file_size(f) != before[f]) return false;
    }
    return true;
  };
  // The sweep cuts a file back first and counts and logs it after, so the
  // counters are waited for too (a file can also be cut in the next sweep).
  auto root = daemon.connect("root");
  auto stat = root->stat();
  auto counted = [&] {
    stat = root->stat();
    return stat.ok() && stat->files_trimmed >= 2 && daemon.log().find("tenant 'bob' grew") != std::string::npos;
  };
  while (!(all_back() && counted()) && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(all_back()) << "a grown file was not cut back within 5 s";
  ASSERT_TRUE(stat.ok());
  EXPECT_GE(stat->files_trimmed, 2u);
  EXPECT_GE(stat->trimmed_bytes, uint64_t{30} << 20) << "bob's 2 x 16 MiB of growth were not given back";
  const std::string log = daemon.log();
  EXPECT_NE(log.find("tenant 'bob' grew"), std::string::npos) << log;
  const Outcome back = as(&*s_bob, sock, {"--direct", "read", made.text, "5"});
  EXPECT_TRUE(back.ok && back.text == "bob's") << back.text;
  const auto ctl = test::run_ctl(sock, {"status"});
  EXPECT_NE(ctl.out.find("trimmed:"), std::string::npos) << ctl.out;
  EXPECT_TRUE(daemon.alive());
}

// A tmpfs of 200 MiB stands in for /dev/shm. Bob fills it through his own
// DRAM file (grown past his quota) and punches holes into his DRAM and
// version words, so that the daemon's next touch of them needs storage that
// is not there. Alice allocates meanwhile; the daemon stops on SIGTERM
// (exit 0, no SIGBUS), bob fills it again, the daemon is killed and starts
// again: alice's memory comes back byte for byte, and she works on.
TEST_F(LocalUserTest, AFullFileSystemCostsOnlyTheTenantWhoFilledIt) {
  const std::string mount = test::make_temp_dir("tiermem-small-shm");
  if (::mount("tmpfs", mount.c_str(), "tmpfs", 0, "size=200m,mode=0755") != 0) {
    std::filesystem::remove(mount);
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  {
    test::DaemonOptions o = options();
    o.shm_parent = mount;
    o.dram = "32MiB";
    o.pmem = "32MiB";
    test::TestDaemon daemon(o);
    ASSERT_TRUE(daemon.ready()) << daemon.log();
    open_to_users(daemon);
    std::filesystem::permissions(mount, std::filesystem::perms(0755));
    const std::string sock = daemon.socket();
    const Outcome hers = as(&*s_alice, sock, {"alloc", "4194304", "dram", "alice-dram"});
    const Outcome his = as(&*s_bob, sock, {"alloc", "4194304", "dram", "bob-dram"});
    ASSERT_TRUE(hers.ok && his.ok) << hers.text << " / " << his.text;
    ASSERT_TRUE(as(&*s_alice, sock, {"--direct", "write", hers.text, "alice's"}).ok);
    const Outcome filled = as(&*s_bob, sock, {"damage", "dram-fill"});
    ASSERT_TRUE(filled.ok) << filled.text;
    // Alice gets memory still, and bob's pages are touched by the daemon.
    const Outcome more = as(&*s_alice, sock, {"alloc", "4194304", "dram", "alice-more"});
    EXPECT_TRUE(more.ok) << more.text;
    (void)as(&*s_bob, sock, {"--daemon", "write", his.text, "bob again"});
    (void)as(&*s_bob, sock, {"alloc", "4194304", "dram", "bob-more"});
    EXPECT_EQ(daemon.stop(), 0) << daemon.log();
    ASSERT_TRUE(daemon.restart()) << daemon.log();
    open_to_users(daemon);
    ASSERT_TRUE(as(&*s_bob, sock, {"damage", "dram-fill"}).ok);
    daemon.kill();
    ASSERT_TRUE(daemon.restart()) << daemon.log();
    open_to_users(daemon);
    const Outcome back = as(&*s_alice, sock, {"--direct", "read", hers.text, "7"});
    EXPECT_TRUE(back.ok && back.text == "alice's") << back.text;
    if (more.ok) {
      EXPECT_TRUE(as(&*s_alice, sock, {"free", more.text}).ok);
    }
    const Outcome fresh = as(&*s_alice, sock, {"alloc", "4194304", "dram"});
    EXPECT_TRUE(fresh.ok) << fresh.text;
    const std::string log = daemon.log();
    EXPECT_NE(log.find("tenant 'bob' grew"), std::string::npos) << log;
    EXPECT_TRUE(daemon.alive());
    EXPECT_EQ(daemon.log().find("killed by signal"), std::string::npos) << daemon.log();
  }
  ::umount2(mount.c_str(), MNT_DETACH);
  std::filesystem::remove(mount);
}

// --- 3. the admission window --------------------------------------------------------

// Bob floods alice's plane on node 2 with 1,500 connections that never say
// hello (UCX ones through the connection manager, or bare TCP ones). Alice's
// new clients meanwhile reach her memory there through her plane within
// their deadline; the daemon logs what it turned away and from whom; both
// daemons stop cleanly on SIGTERM.
class FloodTest : public LocalUserTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(FloodTest, AFloodOfUnprovenConnectionsTurnsAwayOnlyItsOwn) {
  ::setenv("UCX_TLS", "tcp", 1);
  ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);  // nodes as hosts: clients use the data plane
  test::TestCluster cluster(2, options());
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  open_cluster(cluster);
  const std::string sock1 = cluster.node(1).socket();
  const Outcome hers = as(&*s_alice, sock1, {"alloc", "1048576", "dram", "alice-plane", "2"});
  ASSERT_TRUE(hers.ok) << hers.text;
  ASSERT_TRUE(as(&*s_alice, sock1, {"--direct", "write", hers.text, "alice!!!"}).ok);
  const std::string drop = cluster.dir() + "/views";
  std::filesystem::create_directory(drop);
  std::filesystem::permissions(drop, std::filesystem::perms(0777));
  const std::string file = drop + "/alice-view";
  const Outcome view = as(&*s_alice, sock1, {"keys", "2", file}, std::nullopt, "plane_probe");
  ASSERT_TRUE(view.ok && view.text.find("plane") != std::string::npos) << view.text;
  const Started flood =
      start_as(*s_bob, {s_probe_dir + "/plane_probe", sock1, "flood", "2", file, "1500", "30", GetParam()});
  ASSERT_GT(flood.pid, 0);
  const std::string up = read_verdict(flood.out, 60s);
  ASSERT_EQ(up.rfind("ok flooding", 0), 0u) << up;
  const long long flooding = std::atoll(up.c_str() + 12);
  std::printf("bob holds %lld %s connections to alice's plane\n", flooding, GetParam().c_str());
  EXPECT_GE(flooding, 1100);
  for (int i = 0; i < 3; ++i) {
    const Outcome routed = as(&*s_alice, sock1, {"route", hers.text});
    ASSERT_TRUE(routed.ok) << "alice's new client during the flood: " << routed.text;
    EXPECT_GT(figure(routed.text, "message"), 0) << routed.text;
    EXPECT_EQ(figure(routed.text, "fallbacks"), 0) << routed.text;
    EXPECT_LT(figure(routed.text, "ms"), 5000) << routed.text;
  }
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (cluster.node(2).log().find("turned away") == std::string::npos && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(100ms);
  }
  if (GetParam() == "ucx") {
    const std::string log = cluster.node(2).log();
    EXPECT_NE(log.find("turned away"), std::string::npos) << log.substr(log.size() > 4000 ? log.size() - 4000 : 0);
    EXPECT_NE(log.find("uid " + std::to_string(s_bob->uid)), std::string::npos) << "the source is not named";
  }
  EXPECT_TRUE(cluster.node(1).alive() && cluster.node(2).alive());
  // Stopped while the flood still holds its connections.
  EXPECT_EQ(cluster.node(2).stop(), 0) << cluster.node(2).log();
  EXPECT_EQ(cluster.node(1).stop(), 0) << cluster.node(1).log();
  ::kill(flood.pid, SIGKILL);
  ::waitpid(flood.pid, nullptr, 0);
  ::close(flood.out);
  ::unsetenv("UCX_TLS");
  ::unsetenv("TIERMEM_MAP_SAME_HOST");
}

INSTANTIATE_TEST_SUITE_P(Kinds, FloodTest, ::testing::Values("ucx", "tcp"));

// --- 4. clients killed while wiring up over shared memory -------------------------

// Daemons whose UCX has shared memory only (no listener: they reach each
// other by worker address) and clients that treat every node as another
// host: a client is never given a worker address to wire up to (it goes
// through its daemon), so clients killed at any moment leave no half-made
// endpoint in a daemon's receive FIFO, and the home serves on.
TEST_F(LocalUserTest, ClientsKilledOverSharedMemoryLeaveTheHomeServing) {
  ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);
  test::DaemonOptions o = options();
  o.tls = "sm,self";
  test::TestCluster cluster(2, o);
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  auto owner = cluster.node(2).connect("owner");
  auto block = owner->alloc(1 << 20, {.tier = Tier::dram});
  ASSERT_TRUE(block.ok());
  const auto data = test::pattern(1 << 20, 9);
  ASSERT_TRUE(owner->write(block->gva, data.data(), data.size()).ok());
  const char* worker = std::getenv("TIERMEM_LOAD_WORKER");
  ASSERT_NE(worker, nullptr);
  std::mt19937 rng(5);
  for (int round = 0; round < 60; ++round) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execl(worker, worker, "--direct", cluster.node(1).socket().c_str(), "30",
              ("read:" + block->gva.to_string() + ":65536").c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  auto reader = cluster.node(1).connect("reader");
  ASSERT_NE(reader, nullptr);
  std::vector<unsigned char> back(data.size());
  const auto start = std::chrono::steady_clock::now();
  const Status s = reader->read(block->gva, back.data(), back.size());
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(back, data);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  const AccessCounters n = reader->access_counters();
  EXPECT_EQ(n.message + n.direct_remote, 0u) << "a client wired up to a daemon over shared memory";
  EXPECT_GT(n.through_daemon, 0u);
  EXPECT_TRUE(cluster.node(1).alive() && cluster.node(2).alive());
  ::unsetenv("TIERMEM_MAP_SAME_HOST");
}

}  // namespace
}  // namespace tiermem
