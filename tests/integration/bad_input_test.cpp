// Bad input never hurts the daemon: garbage and oversized frames, protocol
// violations, bad addresses and a bad config each get a clear error, and
// other clients keep being served with their data intact.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <tuple>

#include <filesystem>
#include <fstream>
#include <random>

#include "common/frame.hpp"
#include "control.pb.h"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

// Reads the daemon's response on a raw connection, if any.
bool read_response(int fd, proto::Response* out) {
  std::string payload;
  if (!wire::recv_frame(fd, 1 << 24, &payload, nullptr).ok()) return false;
  return out->ParseFromString(payload);
}

// A raw connection that said hello: its descriptor, or -1.
int greeted(const std::string& socket) {
  const int fd = test::connect_unix(socket);
  proto::Request hello;
  hello.set_id(1);
  hello.mutable_hello()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  proto::Response r;
  if (fd < 0 || !wire::send_frame(fd, hello.SerializeAsString()).ok() || !read_response(fd, &r) ||
      r.status().code() != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(m_daemon.ready()) << m_daemon.log();
    m_client = m_daemon.connect("bystander");
    auto a = m_client->alloc(1 << 20, {.tier = Tier::pmem, .name = "precious"});
    ASSERT_TRUE(a.ok());
    m_gva = a->gva;
    ASSERT_TRUE(m_client->write(m_gva, k_data, sizeof k_data).ok());
  }
  // The daemon still runs, still serves the old client, and lost nothing.
  void expect_unharmed() {
    ASSERT_TRUE(m_daemon.alive()) << m_daemon.log();
    char back[sizeof k_data] = {};
    ASSERT_TRUE(m_client->read(m_gva, back, sizeof back).ok());
    EXPECT_STREQ(back, k_data);
    auto fresh = m_daemon.connect("fresh");
    ASSERT_NE(fresh, nullptr) << "new clients are still accepted";
    EXPECT_EQ(fresh->lookup("precious")->gva, m_gva);
  }

  static constexpr char k_data[] = "data that must survive";
  test::TestDaemon m_daemon;
  std::unique_ptr<Client> m_client;
  Gva m_gva;
};

TEST_F(BadInputTest, GarbageBytes) {
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    const int fd = test::connect_unix(m_daemon.socket());
    ASSERT_GE(fd, 0);
    std::string junk(1 + rng() % 2000, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    (void)::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    proto::Response r;
    if (read_response(fd, &r)) {
      EXPECT_NE(r.status().code(), 0u) << "garbage must not succeed";
      EXPECT_FALSE(r.status().message().empty());
    }
    ::close(fd);
  }
  expect_unharmed();
}

TEST_F(BadInputTest, OversizedFrameIsRefusedWithAReason) {
  const int fd = test::connect_unix(m_daemon.socket());
  const auto header = wire::encode_frame_header(1u << 30);
  ASSERT_EQ(::send(fd, header.data(), header.size(), MSG_NOSIGNAL), 4);
  proto::Response r;
  ASSERT_TRUE(read_response(fd, &r));
  EXPECT_EQ(r.status().code(), static_cast<uint32_t>(ErrorCode::frame_too_large));
  EXPECT_NE(r.status().message().find("exceeds the daemon's limit"), std::string::npos);
  char c;
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0) << "connection closed after the refusal";
  ::close(fd);
  EXPECT_NE(m_daemon.log().find("bytes exceeds the daemon's limit"), std::string::npos) << "logged once";
  expect_unharmed();
}

TEST_F(BadInputTest, RequestBeforeHelloAndWrongProtocolVersion) {
  int fd = test::connect_unix(m_daemon.socket());
  proto::Request stat;
  stat.set_id(1);
  stat.mutable_stat();
  ASSERT_TRUE(wire::send_frame(fd, stat.SerializeAsString()).ok());
  proto::Response r;
  ASSERT_TRUE(read_response(fd, &r));
  EXPECT_EQ(r.status().code(), static_cast<uint32_t>(ErrorCode::unexpected_message));
  ::close(fd);

  fd = test::connect_unix(m_daemon.socket());
  proto::Request hello;
  hello.set_id(1);
  hello.mutable_hello()->set_protocol_version(99);
  ASSERT_TRUE(wire::send_frame(fd, hello.SerializeAsString()).ok());
  ASSERT_TRUE(read_response(fd, &r));
  EXPECT_EQ(r.status().code(), static_cast<uint32_t>(ErrorCode::protocol_mismatch));
  EXPECT_NE(r.status().message().find("protocol 99"), std::string::npos);
  ::close(fd);
  expect_unharmed();
}

TEST_F(BadInputTest, TruncatedFrameThenHangUp) {
  const int fd = test::connect_unix(m_daemon.socket());
  const auto header = wire::encode_frame_header(1000);
  ASSERT_EQ(::send(fd, header.data(), header.size(), MSG_NOSIGNAL), 4);
  ASSERT_EQ(::send(fd, "abc", 3, MSG_NOSIGNAL), 3);
  ::close(fd);
  expect_unharmed();
}

TEST_F(BadInputTest, UnknownFreedAndOutOfRangeAddresses) {
  Gva unknown = m_gva;
  unknown.offset += 100ull << 30;
  char buf[64];
  Status s = m_client->read(unknown, buf, 8);
  EXPECT_EQ(s.code(), ErrorCode::not_allocated);
  EXPECT_NE(s.message().find(unknown.to_string()), std::string::npos) << s.message();

  EXPECT_EQ(m_client->read(m_gva.plus((1 << 20) - 4), buf, 8).code(), ErrorCode::out_of_range);
  EXPECT_EQ(m_client->write(m_gva.plus(1 << 20), buf, 1).code(), ErrorCode::out_of_range);

  auto other = m_client->alloc(4096);
  ASSERT_TRUE(m_client->free(other->gva).ok());
  s = m_client->free(other->gva);
  EXPECT_EQ(s.code(), ErrorCode::not_allocated) << "double free";
  EXPECT_NE(s.message().find("freed at generation"), std::string::npos);
  EXPECT_EQ(m_client->read(other->gva, buf, 1).code(), ErrorCode::not_allocated);
  EXPECT_EQ(m_client->write(other->gva, buf, 1).code(), ErrorCode::not_allocated);

  Gva foreign = m_gva;
  foreign.node = 42;
  EXPECT_EQ(m_client->read(foreign, buf, 1).code(), ErrorCode::bad_gva);
  EXPECT_EQ(m_client->alloc(0).status().code(), ErrorCode::invalid_argument);
  expect_unharmed();
}

TEST_F(BadInputTest, InlineReadLargerThanTheLimitIsRefused) {
  auto rpc = Client::connect({.socket_path = m_daemon.socket(), .direct_access = false});
  ASSERT_TRUE(rpc.ok());
  // The client splits large reads itself; a raw oversized request is refused.
  const int fd = greeted(m_daemon.socket());
  ASSERT_GE(fd, 0);
  proto::Response r;
  proto::Request read;
  read.set_id(2);
  read.mutable_read()->mutable_gva()->set_node(m_gva.node);
  read.mutable_read()->mutable_gva()->set_offset(m_gva.offset);
  read.mutable_read()->set_length(512 << 20);
  ASSERT_TRUE(wire::send_frame(fd, read.SerializeAsString()).ok());
  ASSERT_TRUE(read_response(fd, &r));
  EXPECT_EQ(r.status().code(), static_cast<uint32_t>(ErrorCode::invalid_argument));
  EXPECT_NE(r.status().message().find("max_inline_bytes"), std::string::npos);
  ::close(fd);
  std::vector<char> big(1 << 20);
  EXPECT_TRUE((*rpc)->read(m_gva, big.data(), big.size()).ok()) << "split into inline-sized requests";
  expect_unharmed();
}

// Enums with numbers that are no value of theirs, and node ids past 16 bits,
// were taken for something else (tier 99 as auto, atomic op 7 as
// compare-swap, node 65537 as node 1).
TEST_F(BadInputTest, UnknownEnumValuesAndNodeIdsPast16BitsAreRefused) {
  const int fd = greeted(m_daemon.socket());
  ASSERT_GE(fd, 0);
  proto::Response r;
  std::vector<std::pair<proto::Request, std::string>> cases(6);
  cases[0].first.mutable_alloc()->set_size(4096);
  cases[0].first.mutable_alloc()->set_tier(static_cast<proto::Tier>(99));
  cases[0].second = "alloc.tier is 99";
  auto* atomic = cases[1].first.mutable_atomic();
  atomic->mutable_gva()->set_node(m_gva.node);
  atomic->mutable_gva()->set_offset(m_gva.offset);
  atomic->set_op(static_cast<proto::AtomicOp>(7));
  cases[1].second = "atomic.op is 7";
  auto* read = cases[2].first.mutable_read();
  read->mutable_gva()->set_node(65536 + m_gva.node);
  read->mutable_gva()->set_offset(m_gva.offset);
  read->set_length(8);
  cases[2].second = "read.gva.node is 65537";
  cases[3].first.set_node(70000);
  cases[3].first.mutable_stat();
  cases[3].second = "field node is 70000";
  auto* migrate = cases[4].first.mutable_migrate();
  migrate->mutable_gva()->set_node(m_gva.node);
  migrate->mutable_gva()->set_offset(m_gva.offset);
  migrate->set_tier(static_cast<proto::Tier>(-3));
  cases[4].second = "migrate.tier is -3";
  cases[5].first.mutable_nodes()->set_from(65536 + m_gva.node);  // another node's view, asked of node 1
  cases[5].second = "nodes.from is 65537";
  for (auto& [request, expected] : cases) {
    ASSERT_TRUE(wire::send_frame(fd, request.SerializeAsString()).ok());
    ASSERT_TRUE(read_response(fd, &r)) << request.ShortDebugString();
    EXPECT_EQ(r.status().code(), static_cast<uint32_t>(ErrorCode::invalid_argument)) << request.ShortDebugString();
    EXPECT_NE(r.status().message().find(expected), std::string::npos) << r.status().message();
  }
  ::close(fd);
  char back[sizeof k_data] = {};
  ASSERT_TRUE(m_client->read(m_gva, back, sizeof back).ok());
  EXPECT_STREQ(back, k_data) << "the atomic with op 7 changed the word";
  EXPECT_EQ(m_client->list()->size(), 1u) << "the alloc with tier 99 was made";
  expect_unharmed();
}

// Asking for VRAM chunks: an unknown tier, a daemon without device memory,
// absurd ranges: clear errors, no descriptor, nothing harmed.
TEST_F(BadInputTest, DeviceChunkRequestsWithoutDeviceMemoryAreRefused) {
  const int fd = greeted(m_daemon.socket());
  ASSERT_GE(fd, 0);
  proto::Response r;
  proto::Request bad_tier;
  bad_tier.mutable_device_chunks()->set_tier(static_cast<proto::Tier>(99));
  ASSERT_TRUE(wire::send_frame(fd, bad_tier.SerializeAsString()).ok());
  ASSERT_TRUE(read_response(fd, &r));
  EXPECT_EQ(r.status().code(), static_cast<uint32_t>(ErrorCode::invalid_argument));
  EXPECT_NE(r.status().message().find("device_chunks.tier is 99"), std::string::npos) << r.status().message();
  for (proto::Tier tier : {proto::TIER_VRAM, proto::TIER_DRAM, proto::TIER_AUTO}) {
    for (uint64_t offset : {uint64_t{0}, ~uint64_t{0} - 5, uint64_t{1} << 62}) {
      proto::Request q;
      q.mutable_device_chunks()->set_tier(tier);
      q.mutable_device_chunks()->set_frame_offset(offset);
      q.mutable_device_chunks()->set_length(~uint64_t{0});
      ASSERT_TRUE(wire::send_frame(fd, q.SerializeAsString()).ok());
      ASSERT_TRUE(read_response(fd, &r)) << q.ShortDebugString();
      EXPECT_EQ(r.status().code(), static_cast<uint32_t>(ErrorCode::not_supported)) << q.ShortDebugString();
      EXPECT_NE(r.status().message().find("tier of device memory"), std::string::npos) << r.status().message();
      EXPECT_EQ(r.fd_count(), 0u);
    }
  }
  ::close(fd);
  expect_unharmed();
}

// What only a copy's home may ask (by_home, replica_ready, an alloc that
// claims to be a copy) is refused to a client, and so is a QoS class that
// does not exist; nothing is made or changed.
TEST_F(BadInputTest, ReplicationAndQosFieldsAClientMayNotSetAreRefused) {
  const int fd = greeted(m_daemon.socket());
  ASSERT_GE(fd, 0);
  std::vector<std::tuple<proto::Request, ErrorCode, std::string>> cases(5);
  auto& [by_home, c0, m0] = cases[0];
  by_home.set_by_home(true);
  by_home.mutable_write()->mutable_gva()->set_node(m_gva.node);
  by_home.mutable_write()->mutable_gva()->set_offset(m_gva.offset);
  by_home.mutable_write()->set_data("scribble");
  c0 = ErrorCode::permission_denied;
  m0 = "by_home is for the daemon that is the home of a copy";
  auto& [ready, c1, m1] = cases[1];
  ready.mutable_replica_ready()->mutable_gva()->set_node(m_gva.node);
  ready.mutable_replica_ready()->mutable_gva()->set_offset(m_gva.offset);
  c1 = ErrorCode::permission_denied;
  m1 = "replica_ready is for peer daemons only";
  auto& [copy, c2, m2] = cases[2];
  copy.mutable_alloc()->set_size(4096);
  copy.mutable_alloc()->mutable_replica_of()->set_node(m_gva.node);
  copy.mutable_alloc()->mutable_replica_of()->set_offset(m_gva.offset);
  c2 = ErrorCode::permission_denied;
  m2 = "only the home of";
  auto& [qos, c3, m3] = cases[3];
  qos.mutable_alloc()->set_size(4096);
  qos.mutable_alloc()->set_qos(9);
  c3 = ErrorCode::invalid_argument;
  m3 = "qos 9 is no QoS class";
  auto& [alone, c4, m4] = cases[4];
  alone.mutable_alloc()->set_size(4096);
  alone.mutable_alloc()->set_replicas(1);
  c4 = ErrorCode::unavailable;
  m4 = "runs alone";
  proto::Response r;
  for (auto& [request, code, expected] : cases) {
    ASSERT_TRUE(wire::send_frame(fd, request.SerializeAsString()).ok());
    ASSERT_TRUE(read_response(fd, &r)) << request.ShortDebugString();
    EXPECT_EQ(r.status().code(), static_cast<uint32_t>(code)) << request.ShortDebugString() << ": "
                                                              << r.status().message();
    EXPECT_NE(r.status().message().find(expected), std::string::npos) << r.status().message();
  }
  ::close(fd);
  EXPECT_EQ(m_client->list()->size(), 1u) << "a refused alloc was made";
  expect_unharmed();
}

// `tiermemctl read GVA 1TiB` died of bad_alloc (rc 134), `read GVA 8GiB` of
// a 64 KiB allocation allocated 8.4 GB before the answer, `write GVA
// /dev/zero` read until memory ran out: now each is checked against the
// allocation first, and the copy goes in pieces.
TEST_F(BadInputTest, CtlReadAndWriteAreBoundedByTheAllocation) {
  auto small = m_client->alloc(64 << 10, {.tier = Tier::dram});
  ASSERT_TRUE(small.ok());
  const std::string gva = small->gva.to_string();
  for (const std::string length : {"1TiB", "8GiB", "65537"}) {
    auto r = test::run_ctl(m_daemon.socket(), {"read", gva, length});
    EXPECT_EQ(r.exit_code, 1) << length << ": " << r.err;
    EXPECT_NE(r.err.find("out_of_range: asked for"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty());
  }
  auto zero = test::run_ctl(m_daemon.socket(), {"write", gva, "/dev/zero"});
  EXPECT_EQ(zero.exit_code, 1) << zero.err;
  EXPECT_NE(zero.err.find("holds more than the 64 KiB"), std::string::npos) << zero.err;
  EXPECT_NE(zero.err.find("nothing was written"), std::string::npos) << zero.err;
  const std::string too_big(65537, 'x');
  auto piped = test::run_ctl(m_daemon.socket(), {"write", gva, "-"}, too_big);
  EXPECT_EQ(piped.exit_code, 1) << piped.err;
  const std::string fits(65536, 'y');
  auto ok = test::run_ctl(m_daemon.socket(), {"write", gva, "-"}, fits);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  auto back = test::run_ctl(m_daemon.socket(), {"read", gva, "64KiB"});
  EXPECT_EQ(back.exit_code, 0) << back.err;
  EXPECT_EQ(back.out, fits);
  // Names: UTF-8 text (protobuf strings), at most 255 bytes, said before
  // sending (a frame protobuf cannot decode would end the session).
  auto bad_name = m_client->alloc(4096, {.name = std::string("bad\xff\xfename")});
  EXPECT_EQ(bad_name.status().code(), ErrorCode::invalid_argument);
  EXPECT_NE(bad_name.status().message().find("not UTF-8"), std::string::npos) << bad_name.status().message();
  EXPECT_EQ(m_client->alloc(4096, {.name = std::string(300, 'n')}).status().code(), ErrorCode::invalid_argument);
  ASSERT_TRUE(m_client->alloc(4096, {.name = "gewichte-\xc3\xbc"}).ok()) << "UTF-8 names are fine";
  auto ls = test::run_ctl(m_daemon.socket(), {"--json", "ls"});
  EXPECT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_NE(ls.out.find("gewichte"), std::string::npos);
  expect_unharmed();
}

// A daemon killed while starting left its whole pre-allocated shared memory
// behind (1.4-5.7 GB of /dev/shm). Frames get storage only when allocated,
// and the next start clears what a dead daemon left.
TEST(BadStartTest, ADaemonKilledWhileStartingLeavesNoSharedMemoryBehind) {
  for (int round = 0; round < 3; ++round) {
    test::TestDaemon daemon({.dram = "4GiB", .pmem = "4GiB"});
    ASSERT_TRUE(daemon.ready()) << daemon.log();
    daemon.kill();
    uint64_t stored = 0, pool = 0;
    for (const std::string& dir : {daemon.dram_dir(), daemon.pmem_dir()}) {
      for (const auto& e : std::filesystem::directory_iterator(dir)) {
        struct stat st {};
        if (::stat(e.path().c_str(), &st) != 0) continue;
        // The metadata pool is kept on purpose (durable): its own bound.
        (e.path().filename() == "metadata.pool" ? pool : stored) += static_cast<uint64_t>(st.st_blocks) * 512;
      }
    }
    EXPECT_LT(stored, 16u << 20) << "a killed daemon of 4 GiB tiers left " << stored << " bytes stored";
    EXPECT_LT(pool, 64u << 20) << "the metadata pool of 65536 records takes " << pool << " bytes";
    ASSERT_TRUE(daemon.restart()) << daemon.log();
    auto c = daemon.connect();
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(c->alloc(1 << 20, {.tier = Tier::dram}).ok());
  }
}

TEST(BadConfigTest, DaemonRefusesToStartAndSaysWhy) {
  const std::string dir = test::make_temp_dir("tiermem-badcfg");
  const std::string path = dir + "/bad.toml";
  std::ofstream(path) << "[tiers.dram]\ncapacity = \"a lot\"\n";
  auto r = test::run_command({test::tiermemd_path(), "--config", path});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(path + ":2: tiers.dram.capacity invalid size 'a lot'"), std::string::npos) << r.err;
  auto check = test::run_command({test::tiermemd_path(), "--check-config", "--config", path});
  EXPECT_EQ(check.exit_code, 2);
  auto missing = test::run_command({test::tiermemd_path(), "--config", dir + "/none.toml"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("cannot read config file"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// Numbers too large for their type used to escape the parsers as exceptions
// and abort the daemon (rc 134): now config errors (rc 2) naming file and line.
TEST(BadConfigTest, OverflowingNumbersAreConfigErrorsNotCrashes) {
  const std::string dir = test::make_temp_dir("tiermem-overflow");
  const std::string mode = dir + "/mode.toml";
  std::ofstream(mode) << "[control]\nsocket_mode = \"7777777777777777777777777777\"\n";
  auto r = test::run_command({test::tiermemd_path(), "--check-config", "--config", mode});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(mode + ":2: control.socket_mode must be an octal mode"), std::string::npos) << r.err;
  const std::string cluster = dir + "/cluster.toml";
  std::ofstream(cluster) << "[[node]]\nid = 1\ncontrol = \"127.0.0.1:99999999999999999999999\"\n";
  const std::string with_cluster = dir + "/node.toml";
  std::ofstream(with_cluster) << "[cluster]\nfile = \"" << cluster << "\"\n";
  auto c = test::run_command({test::tiermemd_path(), "--check-config", "--config", with_cluster});
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_NE(c.err.find(cluster + ":1: node.control must be \"host:port\""), std::string::npos) << c.err;
  std::filesystem::remove_all(dir);
}

TEST(BadConfigTest, SecondDaemonOnTheSameSocketRefusesToStart) {
  test::TestDaemon first;
  ASSERT_TRUE(first.ready());
  const std::string dir = test::make_temp_dir("tiermem-dup");
  const std::string path = dir + "/d.toml";
  std::ofstream(path) << "[control]\nsocket = \"" << first.socket() << "\"\n[tiers.pmem]\nenabled = false\n"
                      << "[tiers.vram]\nenabled = false\n[tiers.dram]\ncapacity = \"8MiB\"\n";
  auto r = test::run_command({test::tiermemd_path(), "--config", path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("another daemon is already serving"), std::string::npos) << r.err;
  EXPECT_NE(first.connect(), nullptr) << "the first daemon is unaffected";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tiermem
