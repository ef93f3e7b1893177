// The fixture of the request handler's unit tests (request_handler_test.cpp,
// request_handler_tenants_test.cpp): a RequestHandler over a real in-process
// AddressSpace (DRAM and PMEM tiers in files under /dev/shm), hand-built
// requests and sessions, and the handler's answers with their deferred work
// run. No sockets and no daemon process.
#pragma once

#include "daemon/request_handler.hpp"

#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "control.pb.h"
#include "daemon/config.hpp"
#include "daemon/tenants.hpp"
#include "mapping/address_space.hpp"
#include "tests/support/test_daemon.hpp"
#include "tiers/segment_file.hpp"
#include "tiers/tier_backend.hpp"

namespace tiermem::handler_test {

using namespace std::chrono_literals;

inline constexpr NodeId k_node = 1;
inline constexpr uint64_t k_page = 4096;
inline constexpr uint64_t k_incarnation = 11;
inline constexpr uid_t k_alice = 1000;
inline constexpr uid_t k_bob = 1001;
inline constexpr uid_t k_unlisted = 2000;
inline constexpr gid_t k_users = 100;
inline constexpr gid_t k_admin_group = 4242;
inline constexpr uint64_t k_bob_dram_quota = 64 << 10;

// One answer of the handler, its deferred work (if any) run.
struct Answer {
  proto::Response response;
  bool close_after = false;
  bool deferred = false;  // the handler handed the work off its control threads
  ErrorCode code() const { return static_cast<ErrorCode>(response.status().code()); }
  const std::string& message() const { return response.status().message(); }
};

// Whether `a` failed with `code` and a message containing `part`.
::testing::AssertionResult is_error(const Answer& a, ErrorCode code, std::string_view part = {}) {
  if (a.code() != code) {
    return ::testing::AssertionFailure() << "got " << error_code_name(a.code()) << " (\"" << a.message()
                                         << "\"), expected " << error_code_name(code);
  }
  if (a.message().find(part) == std::string::npos) {
    return ::testing::AssertionFailure() << "message \"" << a.message() << "\" does not say \"" << part << "\"";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult is_ok(const Answer& a) {
  if (a.code() == ErrorCode::ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << error_code_name(a.code()) << ": " << a.message();
}

inline std::string bytes(size_t n, unsigned seed) {
  const std::vector<unsigned char> p = test::pattern(n, seed);
  return {p.begin(), p.end()};
}

// --- requests -------------------------------------------------------------

inline proto::Request hello_request(uint32_t version = proto::PROTOCOL_VERSION_CURRENT, uint64_t client_id = 0) {
  proto::Request r;
  r.mutable_hello()->set_protocol_version(version);
  r.mutable_hello()->set_client_name("request_handler_test");
  r.mutable_hello()->set_client_id(client_id);
  return r;
}

inline proto::Request alloc_request(uint64_t size, proto::Tier tier = proto::TIER_DRAM, bool session = false) {
  proto::Request r;
  r.mutable_alloc()->set_size(size);
  r.mutable_alloc()->set_tier(tier);
  r.mutable_alloc()->set_session(session);
  return r;
}

// The GVA `plus` bytes into allocation `a` (with its generation).
inline proto::Gva at(const proto::AllocationInfo& a, uint64_t plus = 0) {
  proto::Gva g = a.gva();
  g.set_offset(g.offset() + plus);
  return g;
}

// `node` is as wide as the wire's field (NodeId is 16 bits).
inline proto::Gva gva(uint32_t node, uint64_t offset) {
  proto::Gva g;
  g.set_node(node);
  g.set_offset(offset);
  return g;
}

inline proto::Request translate_request(const proto::Gva& g) {
  proto::Request r;
  *r.mutable_translate()->mutable_gva() = g;
  return r;
}

inline proto::Request read_request(const proto::Gva& g, uint64_t length) {
  proto::Request r;
  *r.mutable_read()->mutable_gva() = g;
  r.mutable_read()->set_length(length);
  return r;
}

inline proto::Request write_request(const proto::Gva& g, std::string data) {
  proto::Request r;
  *r.mutable_write()->mutable_gva() = g;
  r.mutable_write()->set_data(std::move(data));
  return r;
}

inline proto::Request free_request(const proto::Gva& g) {
  proto::Request r;
  *r.mutable_free()->mutable_gva() = g;
  return r;
}

inline proto::Request stat_request() {
  proto::Request r;
  r.mutable_stat();
  return r;
}

// --- the fixture ------------------------------------------------------------

class RequestHandlerTest : public ::testing::Test {
 protected:
  // Alice and bob are tenants of their own (bob with a DRAM quota); members
  // of k_admin_group and uid 0 are operators; anyone else is "uid:N".
  static DaemonConfig base_config() {
    DaemonConfig c;
    c.node_id = k_node;
    c.page_size = k_page;
    c.max_frame_bytes = 1 << 20;
    c.max_inline_bytes = (1 << 20) - 4096;
    c.max_tenants_per_node = 6;
    c.stale_writer_grace_ms = 0;
    c.admin_group = std::to_string(k_admin_group);
    TenantConfig alice{.name = "alice", .uids = {k_alice}, .gids = {}, .quota = {}};
    TenantConfig bob{.name = "bob", .uids = {k_bob}, .gids = {}, .quota = {}};
    bob.quota[static_cast<size_t>(Tier::dram)] = k_bob_dram_quota;
    c.tenants = {alice, bob};
    return c;
  }

  void SetUp() override { start(base_config()); }
  void TearDown() override { stop(); }

  // A node with `config`, its tiers in a directory of its own.
  void start(DaemonConfig config) {
    stop();
    m_config = std::move(config);
    const std::string parent = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    m_dir = test::make_temp_dir_in(parent, "tiermem-handler");
    ASSERT_FALSE(m_dir.empty());
    auto lock = DirectoryLock::take(m_dir, "the test's shared memory");
    ASSERT_TRUE(lock.ok()) << lock.status().to_string();
    m_lock = std::move(lock).value();
    auto tenants = TenantMap::create(m_config);
    ASSERT_TRUE(tenants.ok()) << tenants.status().to_string();
    m_tenants.emplace(std::move(tenants).value());
    const uint32_t domains = m_config.max_tenants_per_node;
    TierSet tiers;
    auto dram = make_dram_tier({m_dir, 4 << 20, domains});
    auto pmem = make_pmem_tier({m_dir, 2 << 20, domains});
    ASSERT_TRUE(dram.ok()) << dram.status().to_string();
    ASSERT_TRUE(pmem.ok()) << pmem.status().to_string();
    tiers[static_cast<size_t>(Tier::dram)] = std::move(dram).value();
    tiers[static_cast<size_t>(Tier::pmem)] = std::move(pmem).value();
    auto space = AddressSpace::create({.node = k_node,
                                       .page_size = k_page,
                                       .domains = domains,
                                       .sub_page_max = m_config.sub_page_bytes(),
                                       .versions_dir = m_dir,
                                       .incarnation = k_incarnation},
                                      std::move(tiers));
    ASSERT_TRUE(space.ok()) << space.status().to_string();
    m_space = std::move(space).value();
    m_handler = std::make_unique<RequestHandler>(*m_space, m_config, *m_tenants, nullptr, nullptr, ClusterSecret(),
                                                 k_incarnation);
  }

  void stop() {
    m_handler.reset();
    m_space.reset();
    m_tenants.reset();
    m_lock = DirectoryLock();
    if (!m_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(m_dir, ec);
      m_dir.clear();
    }
  }

  // A Unix-socket connection of `uid` that has said nothing yet. Its pid is
  // 0: a process the daemon cannot watch, taken as gone when it ends.
  SessionState unix_session(uid_t uid, gid_t gid = k_users) {
    SessionState s;
    s.id = ++m_sessions;
    s.uid = uid;
    s.gid = gid;
    return s;
  }

  // A TCP connection to the peer port that has said nothing yet.
  SessionState tcp_session() {
    SessionState s;
    s.id = ++m_sessions;
    s.remote = true;
    return s;
  }

  // A client of `uid` after its hello.
  SessionState client(uid_t uid, gid_t gid = k_users) {
    SessionState s = unix_session(uid, gid);
    const Answer a = call(s, hello_request());
    EXPECT_TRUE(is_ok(a));
    EXPECT_TRUE(s.greeted);
    return s;
  }

  // One request as the server hands it over; deferred work runs here, as
  // the server's pool would run it.
  Answer call(SessionState& session, proto::Request request) {
    request.set_id(++m_ids);
    Reply reply = m_handler->handle(request, session);
    Answer a;
    a.deferred = static_cast<bool>(reply.deferred);
    if (reply.deferred) reply = reply.deferred();
    a.response = std::move(reply.response);
    a.close_after = reply.close_after;
    EXPECT_EQ(a.response.id(), request.id()) << "a reply answers its request's id";
    EXPECT_TRUE(a.response.has_status());
    return a;
  }

  proto::AllocationInfo allocate(SessionState& s, uint64_t size, proto::Tier tier = proto::TIER_DRAM,
                                 bool session = false) {
    const Answer a = call(s, alloc_request(size, tier, session));
    EXPECT_TRUE(is_ok(a));
    return a.response.alloc().allocation();
  }

  std::string read_bytes(SessionState& s, const proto::Gva& g, uint64_t length) {
    const Answer a = call(s, read_request(g, length));
    EXPECT_TRUE(is_ok(a));
    return a.response.read().data();
  }

  uint64_t dram_free() const {
    for (const TierStat& t : m_space->tier_stats()) {
      if (t.tier == Tier::dram) return t.free_bytes;
    }
    return 0;
  }

  // That serving goes on: a plain request of `s` succeeds.
  void expect_still_serving(SessionState& s) { EXPECT_TRUE(is_ok(call(s, stat_request()))); }

  DaemonConfig m_config;
  std::string m_dir;
  DirectoryLock m_lock;
  std::optional<TenantMap> m_tenants;
  std::unique_ptr<AddressSpace> m_space;
  std::unique_ptr<RequestHandler> m_handler;
  uint64_t m_sessions = 0;
  uint64_t m_ids = 0;
};


}  // namespace tiermem::handler_test
