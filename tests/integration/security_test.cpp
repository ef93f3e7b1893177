// Safety (S2, O5, M7): nothing is ever acknowledged into memory its writer
// does not own, and nobody gets what they were not given. Real daemons and
// real processes: a client that outlives its daemon, frames lent by a peer
// that restarted, two daemons on one pool, a client asking what only peers
// may, an unauthenticated TCP client and a daemon with the wrong secret, and
// tenants (users made by the test) against each other, on one node and
// across two.
#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "common/frame.hpp"
#include "control.pb.h"
#include "tests/support/tenant_fixture.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;
using test::code;
using test::Outcome;
using test::TenantTest;

int tcp_connect(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  ::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// One request on a raw connection; false when no answer came.
bool ask(int fd, proto::Request& request, proto::Response* out) {
  if (!wire::send_frame(fd, request.SerializeAsString()).ok()) return false;
  std::string payload;
  if (!wire::recv_frame(fd, 1 << 24, &payload, nullptr).ok()) return false;
  return out->ParseFromString(payload);
}

// --- a client that outlives its daemon ------------------------------------------------

struct StaleCase {
  Tier tier;
  bool durable;  // metadata.enabled: the allocation outlives the daemon
};

class StaleClientTest : public ::testing::TestWithParam<StaleCase> {};

// Client A writes through its mappings and cached translations while the
// daemon is SIGKILLed and restarted; client B of the new daemon allocates
// too. With durable metadata A's allocation survives the restart, so A's
// writes may go on being acknowledged, but only into A's own memory; without
// it the new daemon forgot A's allocation, and not one of A's writes after
// the death may be acknowledged. Either way B's bytes stay B's.
TEST_P(StaleClientTest, WritesOfAClientWhoseDaemonDiedLandOnlyInItsOwnMemory) {
  const StaleCase c = GetParam();
  test::DaemonOptions o;
  if (!c.durable) o.extra_toml = "[metadata]\nenabled = false\n";
  test::TestDaemon daemon(o);
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto a = daemon.connect("A");
  auto mine = a->alloc(1 << 20, {.tier = c.tier, .strict = true});
  ASSERT_TRUE(mine.ok());
  const auto old_bytes = test::pattern(64 << 10, 1);
  ASSERT_TRUE(a->write(mine->gva, old_bytes.data(), old_bytes.size()).ok());
  ASSERT_GT(a->access_counters().direct_local, 0u) << "A writes directly";

  std::atomic<bool> dead{false}, stop{false};
  std::atomic<int> acknowledged_after_death{0};
  std::thread writer([&] {
    while (!stop.load()) {
      const bool was_dead = dead.load();
      if (a->write(mine->gva, old_bytes.data(), old_bytes.size()).ok() && was_dead) ++acknowledged_after_death;
    }
  });
  std::this_thread::sleep_for(100ms);
  daemon.kill();
  dead = true;
  ASSERT_TRUE(daemon.restart()) << daemon.log();
  auto b = daemon.connect("B");
  auto theirs = b->alloc(1 << 20, {.tier = c.tier, .strict = true});
  ASSERT_TRUE(theirs.ok());
  const auto new_bytes = test::pattern(64 << 10, 2);
  ASSERT_TRUE(b->write(theirs->gva, new_bytes.data(), new_bytes.size()).ok());
  std::this_thread::sleep_for(300ms);  // A keeps trying meanwhile
  stop = true;
  writer.join();

  const Status late = a->write(mine->gva, old_bytes.data(), old_bytes.size());
  if (c.durable) {
    EXPECT_TRUE(late.ok()) << "A's allocation survived, and A reconnected: " << late.to_string();
    auto ta = b->translate(theirs->gva);
    auto tm = a->translate(mine->gva);
    ASSERT_TRUE(ta.ok() && tm.ok());
    EXPECT_NE(ta->extents[0].frame_offset, tm->extents[0].frame_offset) << "B was given A's frames";
    std::vector<unsigned char> mine_back(old_bytes.size());
    ASSERT_TRUE(a->read(mine->gva, mine_back.data(), mine_back.size()).ok());
    EXPECT_EQ(mine_back, old_bytes);
  } else {
    EXPECT_EQ(acknowledged_after_death.load(), 0) << "writes acknowledged after the daemon died";
    EXPECT_TRUE(late.code() == ErrorCode::unavailable || late.code() == ErrorCode::not_allocated ||
                late.code() == ErrorCode::stale_generation)
        << late.to_string();
  }
  std::vector<unsigned char> back(new_bytes.size());
  ASSERT_TRUE(b->read(theirs->gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, new_bytes) << "B reads A's bytes";
}

INSTANTIATE_TEST_SUITE_P(Tiers, StaleClientTest,
                         ::testing::Values(StaleCase{Tier::dram, true}, StaleCase{Tier::pmem, true},
                                           StaleCase{Tier::dram, false}, StaleCase{Tier::pmem, false}),
                         [](const auto& info) {
                           return std::string(tier_name(info.param.tier)) +
                                  (info.param.durable ? "_durable" : "_forgetful");
                         });

// Memory migrated onto frames node 2 lent, then node 2 reboots (its shared
// memory goes, so its memory is made anew) and hands frames to someone else:
// the old owner's reads and writes fail with data_lost instead of reaching
// the new bytes. (A restart that keeps the memory keeps the lent frames: see
// durability_test.)
TEST(LentFramesTest, FramesOfAPeerThatRestartedAreLostNotShared) {
  test::TestCluster cluster(2);
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  auto owner = cluster.node(1).connect("owner");
  auto a = owner->alloc(1 << 20, {.tier = Tier::dram, .name = "moved"});
  ASSERT_TRUE(a.ok());
  const auto data = test::pattern(1 << 20, 3);
  ASSERT_TRUE(owner->write(a->gva, data.data(), data.size()).ok());
  auto moved = owner->migrate(a->gva, Tier::dram, 2);
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  std::vector<unsigned char> back(data.size());
  ASSERT_TRUE(owner->read(a->gva, back.data(), back.size()).ok());
  ASSERT_EQ(back, data);

  cluster.node(2).kill();
  std::filesystem::remove_all(cluster.node(2).dram_dir());  // what a reboot does to /dev/shm
  ASSERT_TRUE(cluster.node(2).restart()) << cluster.logs();
  ASSERT_TRUE(cluster.wait_connected()) << cluster.logs();
  auto other = cluster.node(2).connect("newcomer");
  auto fresh = other->alloc(1 << 20, {.tier = Tier::dram});
  ASSERT_TRUE(fresh.ok());
  const auto theirs = test::pattern(1 << 20, 4);
  ASSERT_TRUE(other->write(fresh->gva, theirs.data(), theirs.size()).ok());

  Status r;
  for (int i = 0; i < 50; ++i) {  // the home learns of the restart by heartbeat
    r = owner->read(a->gva, back.data(), back.size());
    if (r.code() == ErrorCode::data_lost) break;
    ASSERT_FALSE(r.ok() && back == theirs) << "the old owner read the new owner's bytes";
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(r.code(), ErrorCode::data_lost) << r.to_string();
  const Status w = owner->write(a->gva, data.data(), data.size());
  EXPECT_EQ(w.code(), ErrorCode::data_lost) << w.to_string();
  std::vector<unsigned char> check(theirs.size());
  ASSERT_TRUE(other->read(fresh->gva, check.data(), check.size()).ok());
  EXPECT_EQ(check, theirs) << "the old owner's write landed in the new owner's memory";
  auto info = owner->lookup("moved");
  ASSERT_TRUE(info.ok());
  EXPECT_GT(info->lost_pages, 0u);
  EXPECT_TRUE(owner->free(a->gva).ok()) << "lost memory can still be freed";
}

// --- daemons -------------------------------------------------------------------------

TEST(DaemonLockTest, ASecondDaemonOnTheSamePmemPoolRefusesToStart) {
  test::TestDaemon first;
  ASSERT_TRUE(first.ready()) << first.log();
  const std::string dir = test::make_temp_dir("tiermem-second");
  const std::string path = dir + "/d.toml";
  std::ofstream(path) << "[node]\nid = 7\n[control]\nsocket = \"" << dir << "/s.sock\"\n"
                      << "[tiers.vram]\nenabled = false\n[tiers.dram]\ncapacity = \"8MiB\"\npath = \"" << dir
                      << "/shm\"\n[tiers.pmem]\ncapacity = \"8MiB\"\npath = \"" << first.pmem_dir() << "\"\n";
  auto r = test::run_command({test::tiermemd_path(), "--config", path});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("in use by another tiermemd (pid " + std::to_string(first.pid()) + ")"), std::string::npos)
      << r.err;
  // The same for the node's shared memory.
  std::ofstream(path) << "[node]\nid = 7\n[control]\nsocket = \"" << dir << "/s.sock\"\n"
                      << "[tiers.vram]\nenabled = false\n[tiers.dram]\ncapacity = \"8MiB\"\npath = \""
                      << first.dram_dir() << "\"\n[tiers.pmem]\nenabled = false\n";
  r = test::run_command({test::tiermemd_path(), "--config", path});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("in use by another tiermemd"), std::string::npos) << r.err;
  auto c = first.connect();
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->alloc(4096, {.tier = Tier::pmem}).ok()) << "the first daemon is unaffected";
  std::filesystem::remove_all(dir);
}

// reserve_frames took all PMEM, release_frames of a live frame let the next
// allocation alias it (and of a free one aborted the daemon): they are for
// authenticated peers only.
TEST(PeerOnlyTest, AClientMayNotAskWhatOnlyPeersMay) {
  test::TestDaemon daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto c = daemon.connect("bystander");
  auto a = c->alloc(1 << 20, {.tier = Tier::pmem});
  ASSERT_TRUE(a.ok());
  const auto data = test::pattern(1 << 20, 5);
  ASSERT_TRUE(c->write(a->gva, data.data(), data.size()).ok());
  auto t = c->translate(a->gva);
  ASSERT_TRUE(t.ok());
  const uint64_t used_before = c->stat()->tiers[1].used_bytes;

  const int fd = test::connect_unix(daemon.socket());
  ASSERT_GE(fd, 0);
  proto::Request hello;
  hello.mutable_hello()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  proto::Response r;
  ASSERT_TRUE(ask(fd, hello, &r));
  ASSERT_EQ(r.status().code(), 0u);
  std::vector<proto::Request> asks(6);
  asks[0].mutable_reserve_frames()->set_tier(proto::TIER_PMEM);
  asks[0].mutable_reserve_frames()->set_pages(1u << 20);
  auto* live = asks[1].mutable_release_frames()->add_extents();
  live->set_tier(proto::TIER_PMEM);
  live->set_node(t->extents[0].node);
  live->set_frame_offset(t->extents[0].frame_offset);
  live->set_length(t->extents[0].length);
  auto* huge = asks[2].mutable_release_frames()->add_extents();
  huge->set_tier(proto::TIER_PMEM);
  huge->set_frame_offset(1ull << 40);
  huge->set_length(1ull << 40);
  asks[3].mutable_ping();
  asks[4].mutable_node_info();
  asks[5].mutable_break_locks()->add_locks()->set_page(1);
  for (proto::Request& q : asks) {
    ASSERT_TRUE(ask(fd, q, &r)) << q.ShortDebugString();
    EXPECT_EQ(r.status().code(), code(ErrorCode::permission_denied)) << q.ShortDebugString();
    EXPECT_NE(r.status().message().find("peer daemons only"), std::string::npos) << r.status().message();
  }
  ::close(fd);
  ASSERT_TRUE(daemon.alive()) << daemon.log();
  EXPECT_EQ(c->stat()->tiers[1].used_bytes, used_before) << "frames were taken or given back";
  auto b = c->alloc(1 << 20, {.tier = Tier::pmem});
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(c->write(b->gva, test::pattern(1 << 20, 6).data(), 1 << 20).ok());
  std::vector<unsigned char> back(data.size());
  ASSERT_TRUE(c->read(a->gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, data) << "a new allocation aliases a live one";
}

// The peer port serves authenticated daemons only: a raw TCP client is a
// client of nothing, a wrong proof closes the connection, and a daemon with
// another secret never joins.
TEST(PeerAuthTest, TcpSessionsMustAuthenticateAndAWrongSecretNeverJoins) {
  const std::string dir = test::make_temp_dir("tiermem-auth");
  const std::string secret = test::write_secret(dir);
  const std::string wrong_dir = dir + "/wrong";
  std::filesystem::create_directories(wrong_dir);
  const std::string wrong = test::write_secret(wrong_dir);
  const std::string cluster = dir + "/cluster.toml";
  const int port1 = test::free_port();
  {
    std::ofstream out(cluster);
    out << "[[node]]\nid = 1\ncontrol = \"127.0.0.1:" << port1 << "\"\n";
    out << "[[node]]\nid = 2\ncontrol = \"127.0.0.1:" << test::free_port() << "\"\n";
  }
  test::TestDaemon one({.node_id = 1, .cluster_file = cluster, .secret_file = secret, .dir = dir + "/node1"});
  test::TestDaemon two({.node_id = 2, .cluster_file = cluster, .secret_file = wrong, .dir = dir + "/node2"});
  ASSERT_TRUE(one.ready() && two.ready()) << one.log() << two.log();
  const std::string peer = "127.0.0.1:" + std::to_string(port1);

  // A client's hello, and any request, on the peer port.
  int fd = tcp_connect(peer);
  ASSERT_GE(fd, 0);
  proto::Request hello;
  hello.mutable_hello()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  proto::Response r;
  ASSERT_TRUE(ask(fd, hello, &r));
  EXPECT_EQ(r.status().code(), code(ErrorCode::unexpected_message));
  EXPECT_NE(r.status().message().find("must authenticate first"), std::string::npos) << r.status().message();
  char c;
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0) << "the connection stays open";
  ::close(fd);

  // A challenge as node 2, then a made-up proof.
  fd = tcp_connect(peer);
  proto::Request challenge;
  challenge.mutable_peer_challenge()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  challenge.mutable_peer_challenge()->set_node_id(2);
  challenge.mutable_peer_challenge()->set_nonce(std::string(32, 'n'));
  ASSERT_TRUE(ask(fd, challenge, &r));
  ASSERT_EQ(r.status().code(), 0u) << r.status().message();
  EXPECT_EQ(r.peer_challenge().proof().size(), 32u) << "an HMAC-SHA256 proof, never the secret";
  proto::Request peer_hello;
  peer_hello.mutable_peer_hello()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  peer_hello.mutable_peer_hello()->mutable_self()->set_node_id(2);
  peer_hello.mutable_peer_hello()->set_proof(std::string(32, 'p'));
  ASSERT_TRUE(ask(fd, peer_hello, &r));
  EXPECT_EQ(r.status().code(), code(ErrorCode::permission_denied));
  EXPECT_NE(r.status().message().find("cluster secret"), std::string::npos) << r.status().message();
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0);
  ::close(fd);

  // Node 2 knows another secret: it stays out, and both say why.
  std::this_thread::sleep_for(2s);
  auto client = one.connect();
  auto nodes = client->nodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_NE((*nodes)[1].state, NodeState::connected);
  EXPECT_TRUE(client->alloc(4096, {.node = 2}).status().code() != ErrorCode::ok);
  const std::string logs = one.log() + two.log();
  EXPECT_NE(logs.find("cluster secret"), std::string::npos) << logs;
  std::filesystem::remove_all(dir);
}

// --- tenants -------------------------------------------------------------------------

// Users, the probe and TenantTest: tests/support/tenant_fixture.hpp.

// A non-root trainer in the socket's group (control.socket_group) works end
// to end; a user outside it is refused by the socket's permissions, with a
// message that says which group admits.
TEST_F(TenantTest, AUserInTheSocketGroupConnectsAndOneOutsideIsToldWhy) {
  const std::string group = "tiermem-users";
  if (::getgrnam(group.c_str()) == nullptr) {
    ASSERT_EQ(test::run_command({"groupadd", "--system", group}).exit_code, 0);
  }
  const gid_t gid = ::getgrnam(group.c_str())->gr_gid;
  test::TestDaemon daemon({.extra_toml = tenants_toml(),
                           .control_toml = "socket_group = \"" + group + "\"\nsocket_mode = \"0660\"\n"});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  open_to_users(daemon);
  struct stat st {};
  ASSERT_EQ(::stat(daemon.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, gid);
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  const Outcome made = as(&*s_alice, daemon.socket(), {"alloc", "65536", "dram"}, gid);
  ASSERT_TRUE(made.ok) << made.text;
  EXPECT_TRUE(as(&*s_alice, daemon.socket(), {"write", made.text, "from a trainer in the group"}, gid).ok);
  const Outcome back = as(&*s_alice, daemon.socket(), {"read", made.text, "27"}, gid);
  EXPECT_TRUE(back.ok && back.text.find("from a trainer in the group") != std::string::npos) << back.text;

  // The metrics name every tenant: only operators get them.
  const Outcome metrics = as(&*s_alice, daemon.socket(), {"metrics"}, gid);
  EXPECT_FALSE(metrics.ok) << metrics.text;
  EXPECT_EQ(metrics.code, static_cast<uint32_t>(ErrorCode::permission_denied)) << metrics.text;
  EXPECT_NE(metrics.text.find("operators only"), std::string::npos) << metrics.text;
  const Outcome as_root = as(nullptr, daemon.socket(), {"metrics"});
  EXPECT_TRUE(as_root.ok && std::stoul(as_root.text) > 1000) << as_root.text;

  const Outcome refused = as(&*s_bob, daemon.socket(), {"stat"});
  EXPECT_FALSE(refused.ok);
  EXPECT_EQ(refused.code, static_cast<uint32_t>(ErrorCode::permission_denied)) << refused.text;
  EXPECT_NE(refused.text.find("permission denied"), std::string::npos) << refused.text;
  EXPECT_NE(refused.text.find("group '" + group + "'"), std::string::npos) << refused.text;
}

TEST_F(TenantTest, ATenantTouchesOnlyItsOwnMemoryOnANode) {
  test::TestDaemon daemon({.extra_toml = tenants_toml(), .control_toml = "socket_mode = \"0666\"\n"});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  open_to_users(daemon);
  const std::string sock = daemon.socket();
  const Outcome made = as(&*s_alice, sock, {"alloc", "1048576", "dram", "alice-weights"});
  ASSERT_TRUE(made.ok) << made.text;
  const std::string gva = made.text;
  // Alice: everything, directly and through the daemon.
  for (const auto& args : std::vector<std::vector<std::string>>{{"--direct", "write", gva, "alice"},
                                                                 {"--daemon", "read", gva, "5"},
                                                                 {"--direct", "read", gva, "5"},
                                                                 {"map", gva},
                                                                 {"fetch_add", gva + ""},
                                                                 {"lookup", "alice-weights"}}) {
    const Outcome o = as(&*s_alice, sock, args);
    EXPECT_TRUE(o.ok) << args[0] << " " << args[1] << ": " << o.text;
  }
  expect_all_refused(sock, gva, "alice-weights", true);
  // Bob has memory of his own, in files alice is never given.
  const Outcome bobs = as(&*s_bob, sock, {"alloc", "1048576", "dram"});
  ASSERT_TRUE(bobs.ok) << bobs.text;
  EXPECT_TRUE(as(&*s_bob, sock, {"--direct", "write", bobs.text, "bob"}).ok);
  EXPECT_TRUE(as(&*s_bob, sock, {"map", bobs.text}).ok);
  EXPECT_EQ(as(&*s_alice, sock, {"--direct", "read", bobs.text, "3"}).code, code(ErrorCode::permission_denied));
  // What the kernel enforces: each is handed the files of its own domain
  // only (the files themselves are 0600, root's).
  const Outcome alice_files = as(&*s_alice, sock, {"regions"});
  const Outcome bob_files = as(&*s_bob, sock, {"regions"});
  EXPECT_TRUE(alice_files.ok && alice_files.text == "alice") << alice_files.text;
  EXPECT_TRUE(bob_files.ok && bob_files.text == "bob") << bob_files.text;
  // The operator sees and reads both.
  const Outcome all = as(nullptr, sock, {"list"});
  ASSERT_TRUE(all.ok) << all.text;
  EXPECT_NE(all.text.find(gva), std::string::npos);
  EXPECT_NE(all.text.find(bobs.text), std::string::npos);
  const Outcome root_read = as(nullptr, sock, {"--daemon", "read", gva, "5"});
  EXPECT_TRUE(root_read.ok && root_read.text == "blice") << "alice's bytes, after her fetch_add: " << root_read.text;
  // Alice's quota: 8 MiB of DRAM, 2 MiB (one page) used.
  const Outcome over = as(&*s_alice, sock, {"alloc", "8388608", "dram"});
  EXPECT_EQ(over.code, code(ErrorCode::quota_exceeded)) << over.text;
  EXPECT_NE(over.text.find("8 MiB"), std::string::npos) << over.text;
  // Still hers to free.
  EXPECT_TRUE(as(&*s_alice, sock, {"free", gva}).ok);
  EXPECT_TRUE(daemon.alive());
}

// Small allocations share pages (M10), but only with their own tenant's:
// bob is refused everything on alice's, her neighbours keep their bytes
// through direct and daemon writes, and a free leaves the neighbour intact.
TEST_F(TenantTest, SmallAllocationsSharePagesOnlyWithinATenant) {
  test::TestDaemon daemon({.extra_toml = tenants_toml(), .control_toml = "socket_mode = \"0666\"\n"});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  open_to_users(daemon);
  const std::string sock = daemon.socket();
  const Outcome a1 = as(&*s_alice, sock, {"alloc", "100", "dram", "alice-small"});
  const Outcome a2 = as(&*s_alice, sock, {"alloc", "100", "dram"});
  const Outcome b1 = as(&*s_bob, sock, {"alloc", "100", "dram"});
  ASSERT_TRUE(a1.ok && a2.ok && b1.ok) << a1.text << " / " << a2.text << " / " << b1.text;
  const auto page_of = [](const std::string& text) { return Gva::parse(text).value().offset >> 21; };
  EXPECT_EQ(page_of(a1.text), page_of(a2.text)) << "alice's small allocations share a page";
  EXPECT_NE(page_of(a1.text), page_of(b1.text)) << "bob's is in a page of his own";
  EXPECT_TRUE(as(&*s_alice, sock, {"--direct", "write", a1.text, "first"}).ok);
  EXPECT_TRUE(as(&*s_alice, sock, {"--daemon", "write", a2.text, "second"}).ok);
  EXPECT_TRUE(as(&*s_bob, sock, {"--direct", "write", b1.text, "bobs"}).ok);
  for (const char* mode : {"--direct", "--daemon"}) {
    const Outcome r1 = as(&*s_alice, sock, {mode, "read", a1.text, "5"});
    const Outcome r2 = as(&*s_alice, sock, {mode, "read", a2.text, "6"});
    EXPECT_TRUE(r1.ok && r1.text == "first") << mode << ": " << r1.text;
    EXPECT_TRUE(r2.ok && r2.text == "second") << mode << ": " << r2.text;
  }
  const Outcome mapped = as(&*s_alice, sock, {"map", a1.text});
  EXPECT_TRUE(mapped.ok && mapped.text == "100:first") << "the mapping starts at the allocation: " << mapped.text;
  expect_all_refused(sock, a1.text, "alice-small", true);
  EXPECT_EQ(as(&*s_alice, sock, {"--direct", "read", b1.text, "4"}).code, code(ErrorCode::permission_denied));
  // A free is of that allocation only.
  EXPECT_TRUE(as(&*s_alice, sock, {"free", a2.text}).ok);
  const Outcome gone = as(&*s_alice, sock, {"--direct", "read", a2.text, "6"});
  EXPECT_FALSE(gone.ok) << gone.text;
  const Outcome kept = as(&*s_alice, sock, {"--direct", "read", a1.text, "5"});
  EXPECT_TRUE(kept.ok && kept.text == "first") << kept.text;
  EXPECT_TRUE(daemon.alive());
}

// The data-plane cases run on each fabric: UCX, and libfabric's tcp;ofi_rxm
// (planes are transports of their own there too). Not libfabric's shm: its
// queues are files of their owner, and a client of another user cannot
// attach to the daemon's (fi_av_insert: EINVAL), so tenants of other users
// have no data plane over it; their memory on other nodes goes through their
// daemon (the case after these).
class TenantPlaneTest : public TenantTest, public ::testing::WithParamInterface<std::string> {
 protected:
  test::DaemonOptions cluster_options() const {
    test::DaemonOptions o{.extra_toml = tenants_toml(), .control_toml = "socket_mode = \"0666\"\n"};
    if (GetParam() == "ofi-tcp") {
      o.fabric = "libfabric";
      o.provider = "tcp;ofi_rxm";
    }
    return o;
  }
};

TEST_P(TenantPlaneTest, ATenantTouchesOnlyItsOwnMemoryAcrossDaemons) {
  test::TestCluster cluster(2, cluster_options());
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  open_to_users(cluster.node(1));
  open_to_users(cluster.node(2));
  std::filesystem::permissions(cluster.dir(), std::filesystem::perms(0755));
  const std::string sock1 = cluster.node(1).socket(), sock2 = cluster.node(2).socket();
  // Alice, on node 1, puts memory on node 2.
  const Outcome made = as(&*s_alice, sock1, {"alloc", "1048576", "dram", "alice-remote", "2"});
  ASSERT_TRUE(made.ok) << made.text;
  const std::string gva = made.text;
  EXPECT_TRUE(as(&*s_alice, sock1, {"--direct", "write", gva, "alice"}).ok);
  const Outcome back = as(&*s_alice, sock1, {"--direct", "read", gva, "5"});
  EXPECT_TRUE(back.ok && back.text == "alice") << back.text;
  EXPECT_TRUE(as(&*s_alice, sock2, {"--direct", "read", gva, "5"}).ok);
  // Bob, from either node.
  expect_all_refused(sock1, gva, "alice-remote", false);
  expect_all_refused(sock2, gva, "alice-remote", true);
  const Outcome lookup2 = as(&*s_bob, sock1, {"lookup", "alice-remote", "2"});
  EXPECT_EQ(lookup2.code, code(ErrorCode::permission_denied)) << lookup2.text;
  // Bob's memory migrated onto node 2 stays bob's.
  const Outcome bobs = as(&*s_bob, sock1, {"alloc", "1048576", "dram"});
  ASSERT_TRUE(bobs.ok) << bobs.text;
  const Outcome moved = as(&*s_bob, sock1, {"migrate", bobs.text, "dram", "2"});
  EXPECT_TRUE(moved.ok) << moved.text;
  EXPECT_EQ(as(&*s_alice, sock1, {"--direct", "read", bobs.text, "3"}).code, code(ErrorCode::permission_denied));
  EXPECT_TRUE(cluster.node(1).alive() && cluster.node(2).alive());
}

// Each tenant reaches another node's memory through a data plane of its own
// there (its own UCX context and listener, only its regions registered):
// bob, holding alice's keys and knowing where her listener is, reaches
// nothing of hers, neither with her keys through his plane nor through her
// listener with a guessed token or his own.
TEST_P(TenantPlaneTest, EachTenantHasItsOwnDataPlaneAtANode) {
  if (GetParam() == "ucx") ::setenv("UCX_TLS", "tcp", 1);
  ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);  // nodes as hosts: clients go through the data plane
  test::TestCluster cluster(2, cluster_options());
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  open_to_users(cluster.node(1));
  open_to_users(cluster.node(2));
  std::filesystem::permissions(cluster.dir(), std::filesystem::perms(0755));
  const std::string sock1 = cluster.node(1).socket();
  const Outcome hers = as(&*s_alice, sock1, {"alloc", "1048576", "dram", "alice-plane", "2"});
  const Outcome his = as(&*s_bob, sock1, {"alloc", "1048576", "dram", "bob-plane", "2"});
  ASSERT_TRUE(hers.ok && his.ok) << hers.text << " / " << his.text;
  const Outcome wrote = as(&*s_alice, sock1, {"--direct", "write", hers.text, "alice"});
  EXPECT_TRUE(wrote.ok) << wrote.text;
  // What alice's daemon tells her of node 2: her plane, her keys.
  const std::string drop = cluster.dir() + "/views";
  std::filesystem::create_directory(drop);
  std::filesystem::permissions(drop, std::filesystem::perms(0777));
  const std::string file = drop + "/alice-view";
  const Outcome view = as(&*s_alice, sock1, {"keys", "2", file}, std::nullopt, "plane_probe");
  ASSERT_TRUE(view.ok) << view.text;
  EXPECT_NE(view.text.find("plane"), std::string::npos) << view.text;
  const Outcome attack = as(&*s_bob, sock1, {"attack", "2", file}, std::nullopt, "plane_probe");
  ASSERT_TRUE(attack.ok) << attack.text;
  EXPECT_NE(attack.text.find("reached=0 "), std::string::npos) << attack.text;
  EXPECT_NE(attack.text.find("distinct=1"), std::string::npos) << attack.text;
  EXPECT_EQ(attack.text.find("refused=0 "), std::string::npos) << attack.text;
  // Her bytes are hers, and still reached through her plane; node 2 serves.
  const Outcome back = as(&*s_alice, sock1, {"--direct", "read", hers.text, "5"});
  EXPECT_TRUE(back.ok && back.text == "alice") << back.text;
  EXPECT_TRUE(as(&*s_bob, sock1, {"--direct", "write", his.text, "bob"}).ok);
  EXPECT_TRUE(cluster.node(1).alive() && cluster.node(2).alive());
  ::unsetenv("UCX_TLS");
  ::unsetenv("TIERMEM_MAP_SAME_HOST");
}

// Over libfabric shm, daemons of root and clients of other users: a client
// cannot attach to a node's plane (shm's queues are its owner's), and its
// remote operations go through its daemon instead of failing; the other
// tenant still reaches none of it.
TEST_F(TenantTest, OverLibfabricShmAClientOfAnotherUserGoesThroughItsDaemon) {
  ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);  // nodes as hosts: clients would use the data plane
  test::DaemonOptions o{.extra_toml = tenants_toml(), .control_toml = "socket_mode = \"0666\"\n"};
  test::TestCluster cluster(2, o.over("ofi-shm"));
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  open_to_users(cluster.node(1));
  open_to_users(cluster.node(2));
  std::filesystem::permissions(cluster.dir(), std::filesystem::perms(0755));
  const std::string sock1 = cluster.node(1).socket();
  const Outcome made = as(&*s_alice, sock1, {"alloc", "1048576", "dram", "alice-shm", "2"});
  ASSERT_TRUE(made.ok) << made.text;
  const Outcome wrote = as(&*s_alice, sock1, {"--direct", "write", made.text, "alice"});
  EXPECT_TRUE(wrote.ok) << wrote.text;
  const Outcome back = as(&*s_alice, sock1, {"--direct", "read", made.text, "5"});
  EXPECT_TRUE(back.ok && back.text == "alice") << back.text;
  expect_all_refused(sock1, made.text, "alice-shm", false);
  EXPECT_TRUE(cluster.node(1).alive() && cluster.node(2).alive());
  ::unsetenv("TIERMEM_MAP_SAME_HOST");
}

INSTANTIATE_TEST_SUITE_P(Fabrics, TenantPlaneTest, ::testing::Values("ucx", "ofi-tcp"), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

}  // namespace
}  // namespace tiermem
