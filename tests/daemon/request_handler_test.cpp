// The control protocol's rules, asserted on a RequestHandler over a real
// in-process AddressSpace (DRAM and PMEM tiers in files under /dev/shm), with
// hand-built requests and sessions: admission (hello or authentication
// first, peer-only requests), tenants against each other, the data requests,
// malformed and absurd input, session allocations, and the work a handler
// hands back as Reply::deferred. No sockets and no daemon process: the
// integration suites (bad_input, security, client) keep testing the same
// rules through real daemons.
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

namespace tiermem {
namespace {

using namespace std::chrono_literals;

constexpr NodeId k_node = 1;
constexpr uint64_t k_page = 4096;
constexpr uint64_t k_incarnation = 11;
constexpr uid_t k_alice = 1000;
constexpr uid_t k_bob = 1001;
constexpr uid_t k_unlisted = 2000;
constexpr gid_t k_users = 100;
constexpr gid_t k_admin_group = 4242;
constexpr uint64_t k_bob_dram_quota = 64 << 10;

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

std::string bytes(size_t n, unsigned seed) {
  const std::vector<unsigned char> p = test::pattern(n, seed);
  return {p.begin(), p.end()};
}

// --- requests -------------------------------------------------------------

proto::Request hello_request(uint32_t version = proto::PROTOCOL_VERSION_CURRENT, uint64_t client_id = 0) {
  proto::Request r;
  r.mutable_hello()->set_protocol_version(version);
  r.mutable_hello()->set_client_name("request_handler_test");
  r.mutable_hello()->set_client_id(client_id);
  return r;
}

proto::Request alloc_request(uint64_t size, proto::Tier tier = proto::TIER_DRAM, bool session = false) {
  proto::Request r;
  r.mutable_alloc()->set_size(size);
  r.mutable_alloc()->set_tier(tier);
  r.mutable_alloc()->set_session(session);
  return r;
}

// The GVA `plus` bytes into allocation `a` (with its generation).
proto::Gva at(const proto::AllocationInfo& a, uint64_t plus = 0) {
  proto::Gva g = a.gva();
  g.set_offset(g.offset() + plus);
  return g;
}

// `node` is as wide as the wire's field (NodeId is 16 bits).
proto::Gva gva(uint32_t node, uint64_t offset) {
  proto::Gva g;
  g.set_node(node);
  g.set_offset(offset);
  return g;
}

proto::Request translate_request(const proto::Gva& g) {
  proto::Request r;
  *r.mutable_translate()->mutable_gva() = g;
  return r;
}

proto::Request read_request(const proto::Gva& g, uint64_t length) {
  proto::Request r;
  *r.mutable_read()->mutable_gva() = g;
  r.mutable_read()->set_length(length);
  return r;
}

proto::Request write_request(const proto::Gva& g, std::string data) {
  proto::Request r;
  *r.mutable_write()->mutable_gva() = g;
  r.mutable_write()->set_data(std::move(data));
  return r;
}

proto::Request free_request(const proto::Gva& g) {
  proto::Request r;
  *r.mutable_free()->mutable_gva() = g;
  return r;
}

proto::Request stat_request() {
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

// --- admission ----------------------------------------------------------------

TEST_F(RequestHandlerTest, NothingIsServedOnAUnixSessionBeforeHello) {
  SessionState s = unix_session(k_alice);
  for (proto::Request r : {alloc_request(4096), stat_request(), translate_request(gva(k_node, k_page))}) {
    const Answer a = call(s, r);
    EXPECT_TRUE(is_error(a, ErrorCode::unexpected_message, "the first request on a connection must be hello"));
    EXPECT_TRUE(a.close_after) << "the server closes a session that did not say hello first";
    EXPECT_FALSE(s.greeted);
  }
  EXPECT_EQ(m_space->allocation_count(), 0u) << "the alloc before hello allocated nothing";
}

TEST_F(RequestHandlerTest, RequestWithoutBodyBeforeHelloClosesTheSession) {
  SessionState s = unix_session(k_alice);
  const Answer a = call(s, proto::Request());
  EXPECT_TRUE(is_error(a, ErrorCode::unexpected_message, "must be hello"));
  EXPECT_TRUE(a.close_after);
}

TEST_F(RequestHandlerTest, HelloOfAnotherProtocolVersionIsRefusedAndCloses) {
  for (uint32_t version : {0u, 2u, 77u}) {
    SessionState s = unix_session(k_alice);
    const Answer a = call(s, hello_request(version));
    EXPECT_TRUE(is_error(a, ErrorCode::protocol_mismatch, "client speaks protocol " + std::to_string(version)));
    EXPECT_TRUE(a.close_after);
    EXPECT_FALSE(s.greeted);
    EXPECT_FALSE(a.response.has_hello()) << "a refused hello carries no session description";
    // Had the server not closed it, the session would still be unserved.
    EXPECT_TRUE(is_error(call(s, stat_request()), ErrorCode::unexpected_message));
  }
}

TEST_F(RequestHandlerTest, HelloNamesTheTenantTheOperatorAndTheNode) {
  SessionState alice = unix_session(k_alice);
  const Answer a = call(alice, hello_request());
  ASSERT_TRUE(is_ok(a));
  EXPECT_FALSE(a.close_after);
  const proto::HelloResponse& h = a.response.hello();
  EXPECT_EQ(h.tenant(), "alice");
  EXPECT_FALSE(h.is_operator());
  EXPECT_EQ(h.protocol_version(), static_cast<uint32_t>(proto::PROTOCOL_VERSION_CURRENT));
  EXPECT_EQ(h.node_id(), k_node);
  EXPECT_EQ(h.page_size(), k_page);
  EXPECT_EQ(h.incarnation(), k_incarnation);
  EXPECT_EQ(h.session_id(), alice.id);
  EXPECT_EQ(h.max_frame_bytes(), m_config.max_frame_bytes);
  EXPECT_EQ(alice.who.tenant, "alice");

  SessionState root = unix_session(0, 0);
  const Answer r = call(root, hello_request());
  ASSERT_TRUE(is_ok(r));
  EXPECT_TRUE(r.response.hello().is_operator());
  EXPECT_EQ(r.response.hello().tenant(), "uid:0");

  SessionState admin = unix_session(k_unlisted, k_admin_group);
  const Answer ad = call(admin, hello_request());
  ASSERT_TRUE(is_ok(ad));
  EXPECT_TRUE(ad.response.hello().is_operator()) << "a member of tenants.admin_group is an operator";
  EXPECT_EQ(ad.response.hello().tenant(), "uid:" + std::to_string(k_unlisted));
}

TEST_F(RequestHandlerTest, UnlistedUidIsRefusedWhenTheConfigurationSaysSo) {
  DaemonConfig c = base_config();
  c.unlisted_refused = true;
  start(c);
  SessionState stranger = unix_session(k_unlisted);
  const Answer a = call(stranger, hello_request());
  EXPECT_TRUE(is_error(a, ErrorCode::permission_denied, "uid 2000 belongs to no tenant"));
  EXPECT_TRUE(a.close_after);
  EXPECT_FALSE(stranger.greeted);
  SessionState alice = client(k_alice);
  EXPECT_EQ(alice.who.tenant, "alice");
  SessionState root = client(0, 0);
  EXPECT_TRUE(root.who.is_operator) << "operators are served though they are in no tenant";
}

TEST_F(RequestHandlerTest, TcpSessionMustAuthenticateBeforeAnything) {
  for (proto::Request r : {hello_request(), stat_request(), alloc_request(4096)}) {
    SessionState s = tcp_session();
    const Answer a = call(s, r);
    EXPECT_TRUE(is_error(a, ErrorCode::unexpected_message, "must authenticate first (peer_challenge"));
    EXPECT_TRUE(a.close_after);
    EXPECT_FALSE(s.greeted);
  }
  EXPECT_EQ(m_space->allocation_count(), 0u);
}

TEST_F(RequestHandlerTest, TcpPeerHelloWithoutAChallengeIsRefused) {
  SessionState s = tcp_session();
  proto::Request r;
  r.mutable_peer_hello()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  r.mutable_peer_hello()->mutable_self()->set_node_id(2);
  r.mutable_peer_hello()->set_proof(std::string(32, 'p'));
  const Answer a = call(s, r);
  EXPECT_TRUE(is_error(a, ErrorCode::unexpected_message, "must authenticate first"));
  EXPECT_TRUE(a.close_after);
  EXPECT_FALSE(s.peer);
}

TEST_F(RequestHandlerTest, PeerChallengeOfAnotherProtocolVersionIsRefusedAndCloses) {
  SessionState s = tcp_session();
  proto::Request r;
  r.mutable_peer_challenge()->set_protocol_version(5);
  r.mutable_peer_challenge()->set_node_id(2);
  const Answer a = call(s, r);
  EXPECT_TRUE(is_error(a, ErrorCode::protocol_mismatch, "peer node 2 speaks protocol 5"));
  EXPECT_TRUE(a.close_after);
}

TEST_F(RequestHandlerTest, DaemonRunningAloneTakesNoPeers) {
  SessionState s = tcp_session();
  proto::Request r;
  r.mutable_peer_challenge()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  r.mutable_peer_challenge()->set_node_id(2);
  r.mutable_peer_challenge()->set_nonce(std::string(32, 'n'));
  const Answer a = call(s, r);
  EXPECT_TRUE(is_error(a, ErrorCode::permission_denied, "runs alone and takes no peers"));
  EXPECT_TRUE(a.close_after);
  EXPECT_FALSE(s.greeted);
  EXPECT_TRUE(s.challenge_nonce.empty()) << "no challenge was issued, so no peer_hello can follow";
}

TEST_F(RequestHandlerTest, PeerChallengeOnTheUnixSocketIsRefused) {
  proto::Request challenge;
  challenge.mutable_peer_challenge()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  challenge.mutable_peer_challenge()->set_node_id(2);
  SessionState fresh = unix_session(k_alice);
  const Answer first = call(fresh, challenge);
  EXPECT_TRUE(is_error(first, ErrorCode::unexpected_message, "must be hello"));
  EXPECT_TRUE(first.close_after);
  SessionState alice = client(k_alice);
  const Answer later = call(alice, challenge);
  EXPECT_TRUE(is_error(later, ErrorCode::unexpected_message, "peers connect over TCP"));
  EXPECT_FALSE(alice.peer);
}

// --- peer-only requests -------------------------------------------------------

// One request of each kind only daemons ask of each other, and its name.
std::vector<std::pair<std::string, proto::Request>> peer_only_requests() {
  std::vector<std::pair<std::string, proto::Request>> out;
  proto::Request r;
  r.mutable_ping();
  out.emplace_back("ping", r);
  r.mutable_node_info();
  out.emplace_back("node_info", r);
  r.mutable_reserve_frames()->set_tier(proto::TIER_DRAM);
  r.mutable_reserve_frames()->set_pages(4);
  out.emplace_back("reserve_frames", r);
  proto::Extent* x = r.mutable_release_frames()->add_extents();
  x->set_tier(proto::TIER_DRAM);
  x->set_node(k_node);
  x->set_length(k_page);
  out.emplace_back("release_frames", r);
  r.mutable_break_locks()->add_locks()->set_page(1);
  out.emplace_back("break_locks", r);
  *r.mutable_replica_ready()->mutable_gva() = gva(k_node, k_page);
  out.emplace_back("replica_ready", r);
  return out;
}

TEST_F(RequestHandlerTest, PeerOnlyRequestsAreRefusedToClientsNamingTheRequest) {
  SessionState alice = client(k_alice);
  const uint64_t free_before = dram_free();
  for (const auto& [name, request] : peer_only_requests()) {
    const Answer a = call(alice, request);
    EXPECT_TRUE(is_error(a, ErrorCode::permission_denied, name + " is for peer daemons only"));
    EXPECT_TRUE(is_error(a, ErrorCode::permission_denied, "tenant 'alice' (uid 1000)")) << name;
    EXPECT_FALSE(a.close_after) << name << ": a refused request does not end a greeted session";
  }
  EXPECT_EQ(dram_free(), free_before) << "reserve_frames reserved nothing";
  expect_still_serving(alice);
}

TEST_F(RequestHandlerTest, PeerOnlyRequestsAreRefusedToOperatorsToo) {
  SessionState root = client(0, 0);
  for (const auto& [name, request] : peer_only_requests()) {
    EXPECT_TRUE(is_error(call(root, request), ErrorCode::permission_denied, name + " is for peer daemons only"));
  }
}

TEST_F(RequestHandlerTest, AnAuthenticatedPeerIsServedPeerRequests) {
  // The state peer_hello leaves (authentication itself needs a PeerManager
  // and a secret): the same ping a client was refused is served.
  SessionState peer = tcp_session();
  peer.greeted = true;
  peer.peer = true;
  peer.peer_node = 2;
  proto::Request ping;
  ping.mutable_ping();
  const Answer a = call(peer, ping);
  ASSERT_TRUE(is_ok(a));
  EXPECT_EQ(a.response.ping().incarnation(), k_incarnation);
  proto::Request info;
  info.mutable_node_info();
  const Answer i = call(peer, info);
  ASSERT_TRUE(is_ok(i));
  EXPECT_EQ(i.response.node_info().self().node_id(), k_node);
}

TEST_F(RequestHandlerTest, ByHomeFromAClientIsRefusedAndWritesNothing) {
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, k_page);
  proto::Request w = write_request(at(a), std::string(64, 'x'));
  w.set_by_home(true);
  const Answer answer = call(alice, w);
  EXPECT_TRUE(is_error(answer, ErrorCode::permission_denied, "by_home is for the daemon that is the home of a copy"));
  EXPECT_FALSE(answer.close_after);
  EXPECT_EQ(read_bytes(alice, at(a), 64), std::string(64, '\0'));
}

TEST_F(RequestHandlerTest, AClientCannotClaimAnotherTenantInTheRequest) {
  // Request.tenant and is_operator are believed from authenticated peers
  // only: a client's own session says who it is.
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, k_page);
  SessionState bob = client(k_bob);
  proto::Request r = read_request(at(a), 16);
  r.set_tenant("alice");
  r.set_is_operator(true);
  EXPECT_TRUE(is_error(call(bob, r), ErrorCode::permission_denied, "tenant 'bob'"));
}

TEST_F(RequestHandlerTest, AClientCannotMakeACopyOfAnAllocation) {
  // Copies (replica_of) are made by the home daemon of the allocation only.
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, k_page);
  proto::Request copy = alloc_request(k_page);
  *copy.mutable_alloc()->mutable_replica_of() = at(a);
  copy.mutable_alloc()->set_replica_ready(true);
  EXPECT_TRUE(is_error(call(alice, copy), ErrorCode::permission_denied, "makes copies of it"));
  EXPECT_EQ(m_space->allocation_count(), 1u);
}

TEST_F(RequestHandlerTest, APeerActsForTheTenantItRelays) {
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, k_page);
  SessionState peer = tcp_session();
  peer.greeted = true;
  peer.peer = true;
  peer.peer_node = 2;
  proto::Request as_bob = write_request(at(a), "bob's");
  as_bob.set_tenant("bob");
  as_bob.set_uid(k_bob);
  EXPECT_TRUE(is_error(call(peer, as_bob), ErrorCode::permission_denied, "tenant 'bob' (uid 1001) may not write"));
  proto::Request as_alice = write_request(at(a), "alice's");
  as_alice.set_tenant("alice");
  as_alice.set_uid(k_alice);
  EXPECT_TRUE(is_ok(call(peer, as_alice)));
  EXPECT_EQ(read_bytes(alice, at(a), 7), "alice's");
}

// --- data requests ------------------------------------------------------------

TEST_F(RequestHandlerTest, AllocWriteReadFreeRoundTrip) {
  SessionState alice = client(k_alice);
  const uint64_t size = 2 * k_page + 1000;
  const Answer made = call(alice, alloc_request(size));
  ASSERT_TRUE(is_ok(made));
  const proto::AllocationInfo a = made.response.alloc().allocation();
  EXPECT_EQ(a.gva().node(), k_node);
  EXPECT_NE(a.gva().offset(), 0u);
  EXPECT_EQ(a.size(), size);
  EXPECT_EQ(a.pages(), 3u);
  EXPECT_EQ(a.tier(), proto::TIER_DRAM);
  EXPECT_EQ(a.tenant(), "alice");
  EXPECT_EQ(a.owner_uid(), k_alice);

  const std::string data = bytes(size, 1);
  const Answer w = call(alice, write_request(at(a), data));
  ASSERT_TRUE(is_ok(w));
  EXPECT_EQ(w.response.write().written(), size);
  EXPECT_EQ(read_bytes(alice, at(a), size), data);
  // Inside it, at an offset across a page boundary.
  const std::string patch = bytes(300, 2);
  ASSERT_TRUE(is_ok(call(alice, write_request(at(a, k_page - 100), patch))));
  EXPECT_EQ(read_bytes(alice, at(a, k_page - 100), patch.size()), patch);
  EXPECT_EQ(read_bytes(alice, at(a), 100), data.substr(0, 100));

  const Answer f = call(alice, free_request(at(a)));
  ASSERT_TRUE(is_ok(f));
  EXPECT_TRUE(f.response.has_free());
  EXPECT_EQ(m_space->allocation_count(), 0u);
}

TEST_F(RequestHandlerTest, TranslateDescribesTheAllocationAndItsLayout) {
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, 3 * k_page, proto::TIER_PMEM);
  const Answer t = call(alice, translate_request(at(a, k_page + 5)));
  ASSERT_TRUE(is_ok(t));
  const proto::TranslateResponse& r = t.response.translate();
  EXPECT_EQ(r.allocation().gva().offset(), a.gva().offset());
  EXPECT_EQ(r.allocation().gva().generation(), a.gva().generation());
  EXPECT_EQ(r.offset_in_allocation(), k_page + 5);
  EXPECT_EQ(r.allocation().tier(), proto::TIER_PMEM);
  EXPECT_EQ(r.home_incarnation(), k_incarnation);
  EXPECT_EQ(r.page_versions_size(), 3);
  uint64_t mapped = 0;
  for (const proto::Extent& x : r.extents()) mapped += x.length();
  EXPECT_EQ(mapped, 3 * k_page) << "the extents cover the allocation";
  ASSERT_EQ(r.pages_size(), 1);
  EXPECT_EQ(r.pages(0).page_index(), r.first_page_index() + 1) << "the page holding the GVA";
}

TEST_F(RequestHandlerTest, FreedAllocationIsNotAllocatedAfterwards) {
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, 2 * k_page);
  ASSERT_TRUE(is_ok(call(alice, free_request(at(a)))));
  const std::string freed = "freed at generation " + std::to_string(a.gva().generation());
  EXPECT_TRUE(is_error(call(alice, translate_request(at(a))), ErrorCode::not_allocated, freed));
  EXPECT_TRUE(is_error(call(alice, read_request(at(a), 8)), ErrorCode::not_allocated, freed));
  EXPECT_TRUE(is_error(call(alice, write_request(at(a), "late")), ErrorCode::not_allocated, freed));
  EXPECT_TRUE(is_error(call(alice, free_request(at(a))), ErrorCode::not_allocated, freed)) << "a double free";
  proto::Gva unchecked = at(a, k_page);
  unchecked.set_generation(0);
  EXPECT_TRUE(is_error(call(alice, translate_request(unchecked)), ErrorCode::not_allocated, "is not allocated"));
  expect_still_serving(alice);
}

TEST_F(RequestHandlerTest, GvaOfAnotherGenerationIsStale) {
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, k_page);
  proto::Gva old = at(a);
  old.set_generation(a.gva().generation() + 1);
  EXPECT_TRUE(is_error(call(alice, write_request(old, "x")), ErrorCode::stale_generation, "the old one was freed"));
  EXPECT_TRUE(is_error(call(alice, free_request(old)), ErrorCode::stale_generation));
  EXPECT_EQ(m_space->allocation_count(), 1u) << "a stale free frees nothing";
}

TEST_F(RequestHandlerTest, UnknownGvaIsNotAllocatedAndServingGoesOn) {
  SessionState alice = client(k_alice);
  const proto::Gva never = gva(k_node, 64 * k_page);
  EXPECT_TRUE(is_error(call(alice, translate_request(never)), ErrorCode::not_allocated, "never allocated"));
  EXPECT_TRUE(is_error(call(alice, read_request(never, 16)), ErrorCode::not_allocated, "never allocated"));
  EXPECT_TRUE(is_error(call(alice, write_request(never, "x")), ErrorCode::not_allocated, "never allocated"));
  EXPECT_TRUE(is_error(call(alice, free_request(never)), ErrorCode::not_allocated, "never allocated"));
  const proto::Gva beyond = gva(k_node, uint64_t{1} << 60);
  EXPECT_TRUE(is_error(call(alice, translate_request(beyond)), ErrorCode::not_allocated, "beyond node 1's address range"));
  EXPECT_TRUE(is_error(call(alice, translate_request(gva(k_node, 0))), ErrorCode::not_allocated)) << "the null GVA";
  const proto::AllocationInfo a = allocate(alice, k_page);
  EXPECT_TRUE(is_ok(call(alice, translate_request(at(a)))));
}

TEST_F(RequestHandlerTest, GvaOfAnotherNodeIsRefusedByADaemonRunningAlone) {
  SessionState alice = client(k_alice);
  const Answer a = call(alice, read_request(gva(7, k_page), 8));
  EXPECT_FALSE(a.deferred);
  EXPECT_TRUE(is_error(a, ErrorCode::bad_gva, "node 7 is not in the cluster (this daemon runs alone"));
  proto::Request elsewhere = alloc_request(k_page);
  elsewhere.set_node(9);
  EXPECT_TRUE(is_error(call(alice, elsewhere), ErrorCode::bad_gva, "node 9 is not in the cluster"));
  EXPECT_EQ(m_space->allocation_count(), 0u);
}

TEST_F(RequestHandlerTest, ReadPastTheEndOfAnAllocationIsOutOfRange) {
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, 2 * k_page);
  const Answer past = call(alice, read_request(at(a, k_page), k_page + 1));
  EXPECT_TRUE(is_error(past, ErrorCode::out_of_range, "runs past the end of allocation"));
  EXPECT_FALSE(past.response.has_read()) << "no bytes come with a refused read";
  EXPECT_TRUE(is_error(call(alice, read_request(at(a, 2 * k_page - 1), 2)), ErrorCode::out_of_range));
  EXPECT_EQ(read_bytes(alice, at(a, k_page), k_page).size(), k_page) << "up to the end is fine";
}

TEST_F(RequestHandlerTest, ReadPastTheEndOfASmallAllocationIsOutOfRange) {
  // Small allocations share a page (sub-page slots): the end is the
  // allocation's, not the page's.
  SessionState alice = client(k_alice);
  const proto::AllocationInfo small = allocate(alice, 100);
  const proto::AllocationInfo neighbour = allocate(alice, 100);
  ASSERT_TRUE(is_ok(call(alice, write_request(at(neighbour), bytes(100, 3)))));
  EXPECT_TRUE(is_error(call(alice, read_request(at(small), 101)), ErrorCode::out_of_range, "of 100 bytes"));
  EXPECT_TRUE(is_error(call(alice, read_request(at(small, 50), 51)), ErrorCode::out_of_range));
  EXPECT_EQ(read_bytes(alice, at(small), 100), std::string(100, '\0'));
}

TEST_F(RequestHandlerTest, WritePastTheEndIsRefusedAndWritesNothing) {
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, 2 * k_page);
  const Answer w = call(alice, write_request(at(a, 2 * k_page - 10), std::string(20, 'y')));
  EXPECT_TRUE(is_error(w, ErrorCode::out_of_range, "write of 20 bytes"));
  EXPECT_EQ(read_bytes(alice, at(a, 2 * k_page - 10), 10), std::string(10, '\0'))
      << "the part that fit was not written either";
}

TEST_F(RequestHandlerTest, ReadLongerThanTheInlineLimitIsRefused) {
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, k_page);
  for (uint64_t length : {m_config.max_inline_bytes + 1, uint64_t{1} << 62, std::numeric_limits<uint64_t>::max()}) {
    const Answer r = call(alice, read_request(at(a), length));
    EXPECT_TRUE(is_error(r, ErrorCode::invalid_argument, "exceeds max_inline_bytes")) << length;
  }
  expect_still_serving(alice);
}

TEST_F(RequestHandlerTest, AbsurdAllocationSizesAreRefusedAndServingGoesOn) {
  SessionState alice = client(k_alice);
  EXPECT_TRUE(is_error(call(alice, alloc_request(0)), ErrorCode::invalid_argument, "cannot allocate 0 bytes"));
  for (uint64_t size : {(uint64_t{1} << 62) + 1, std::numeric_limits<uint64_t>::max()}) {
    EXPECT_TRUE(is_error(call(alice, alloc_request(size)), ErrorCode::invalid_argument, "is absurdly large")) << size;
  }
  // 2^62 is under that bound: more than every tier has.
  const Answer huge = call(alice, alloc_request(uint64_t{1} << 62, proto::TIER_AUTO));
  EXPECT_TRUE(is_error(huge, ErrorCode::tier_exhausted, "free memory or allow fallback"));
  EXPECT_EQ(m_space->allocation_count(), 0u);
  const proto::AllocationInfo a = allocate(alice, k_page);
  EXPECT_TRUE(is_ok(call(alice, write_request(at(a), "still serving"))));
}

TEST_F(RequestHandlerTest, RequestWithoutBodyIsMalformedAndServingGoesOn) {
  SessionState alice = client(k_alice);
  const Answer a = call(alice, proto::Request());
  EXPECT_TRUE(is_error(a, ErrorCode::malformed_frame, "request has no body"));
  EXPECT_FALSE(a.close_after);
  expect_still_serving(alice);
}

TEST_F(RequestHandlerTest, EnumOutOfRangeIsRefusedNamingTheField) {
  SessionState alice = client(k_alice);
  const Answer a = call(alice, alloc_request(k_page, static_cast<proto::Tier>(99)));
  EXPECT_TRUE(is_error(a, ErrorCode::invalid_argument, "request field alloc.tier is 99, which is no Tier"));
  EXPECT_EQ(m_space->allocation_count(), 0u) << "tier 99 is not taken for auto";
  const proto::AllocationInfo g = allocate(alice, k_page);
  proto::Request atomic;
  *atomic.mutable_atomic()->mutable_gva() = at(g);
  atomic.mutable_atomic()->set_op(static_cast<proto::AtomicOp>(7));
  EXPECT_TRUE(is_error(call(alice, atomic), ErrorCode::invalid_argument, "atomic.op is 7")) << "not a compare-swap";
}

TEST_F(RequestHandlerTest, NodeIdBeyondSixteenBitsIsRefused) {
  SessionState alice = client(k_alice);
  proto::Request r = alloc_request(k_page);
  r.set_node(65536 + k_node);  // was node 1 once, truncated
  EXPECT_TRUE(is_error(call(alice, r), ErrorCode::invalid_argument, "node ids are 1 to 65535"));
  EXPECT_TRUE(is_error(call(alice, read_request(gva(0x10001, k_page), 8)), ErrorCode::invalid_argument,
                       "read.gva.node is 65537"));
  EXPECT_EQ(m_space->allocation_count(), 0u);
}

TEST_F(RequestHandlerTest, AtomicsChangeTheWordAndAnswerItsOldValue) {
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, k_page);
  proto::Request add;
  *add.mutable_atomic()->mutable_gva() = at(a, 8);
  add.mutable_atomic()->set_op(proto::ATOMIC_FETCH_ADD);
  add.mutable_atomic()->set_operand(5);
  EXPECT_EQ(call(alice, add).response.atomic().old_value(), 0u);
  EXPECT_EQ(call(alice, add).response.atomic().old_value(), 5u);
  proto::Request cas = add;
  cas.mutable_atomic()->set_op(proto::ATOMIC_COMPARE_SWAP);
  cas.mutable_atomic()->set_compare(10);
  cas.mutable_atomic()->set_operand(42);
  EXPECT_EQ(call(alice, cas).response.atomic().old_value(), 10u);
  EXPECT_EQ(call(alice, cas).response.atomic().old_value(), 42u) << "no swap: 42 is not 10";
  proto::Request unaligned = add;
  *unaligned.mutable_atomic()->mutable_gva() = at(a, 3);
  EXPECT_TRUE(is_error(call(alice, unaligned), ErrorCode::invalid_argument, "8-byte aligned"));
}

// --- tenants --------------------------------------------------------------

class TenantsTest : public RequestHandlerTest {
 protected:
  void SetUp() override {
    RequestHandlerTest::SetUp();
    m_alice = client(k_alice);
    m_bob = client(k_bob);
    m_allocation = allocate(m_alice, 2 * k_page);
    m_data = bytes(2 * k_page, 9);
    ASSERT_TRUE(is_ok(call(m_alice, write_request(at(m_allocation), m_data))));
  }
  // "tenant 'bob' (uid 1001) may not <verb> <gva>: allocation <gva> belongs to tenant 'alice'"
  std::string refusal(const std::string& verb) const {
    return "tenant 'bob' (uid 1001) may not " + verb;
  }

  SessionState m_alice;
  SessionState m_bob;
  proto::AllocationInfo m_allocation;
  std::string m_data;
};

TEST_F(TenantsTest, AnotherTenantsReadIsRefusedNamingBothTenants) {
  const Answer a = call(m_bob, read_request(at(m_allocation), 64));
  EXPECT_TRUE(is_error(a, ErrorCode::permission_denied, refusal("read")));
  EXPECT_TRUE(is_error(a, ErrorCode::permission_denied, "belongs to tenant 'alice'"));
  EXPECT_FALSE(a.response.has_read()) << "no bytes of alice's come back";
  EXPECT_FALSE(a.close_after);
}

TEST_F(TenantsTest, AnotherTenantsWriteIsRefusedAndTheOwnersBytesStay) {
  const Answer a = call(m_bob, write_request(at(m_allocation, 100), std::string(500, 'b')));
  EXPECT_TRUE(is_error(a, ErrorCode::permission_denied, refusal("write")));
  EXPECT_TRUE(is_error(a, ErrorCode::permission_denied, "belongs to tenant 'alice'"));
  EXPECT_EQ(read_bytes(m_alice, at(m_allocation), m_data.size()), m_data);
}

TEST_F(TenantsTest, AnotherTenantsFreeIsRefusedAndTheAllocationStays) {
  const Answer a = call(m_bob, free_request(at(m_allocation)));
  EXPECT_TRUE(is_error(a, ErrorCode::permission_denied, refusal("free")));
  EXPECT_TRUE(is_error(a, ErrorCode::permission_denied, "belongs to tenant 'alice'"));
  EXPECT_TRUE(is_ok(call(m_alice, translate_request(at(m_allocation)))));
  EXPECT_EQ(read_bytes(m_alice, at(m_allocation), m_data.size()), m_data);
}

TEST_F(TenantsTest, AnotherTenantsTranslateAndAtomicAreRefused) {
  EXPECT_TRUE(is_error(call(m_bob, translate_request(at(m_allocation))), ErrorCode::permission_denied,
                       refusal("translate")));
  proto::Request add;
  *add.mutable_atomic()->mutable_gva() = at(m_allocation);
  add.mutable_atomic()->set_op(proto::ATOMIC_FETCH_ADD);
  add.mutable_atomic()->set_operand(1);
  EXPECT_TRUE(is_error(call(m_bob, add), ErrorCode::permission_denied, refusal("run an atomic on")));
  EXPECT_EQ(read_bytes(m_alice, at(m_allocation), 8), m_data.substr(0, 8));
}

TEST_F(TenantsTest, AnOperatorMayReadAndWriteEveryTenantsMemory) {
  SessionState root = client(0, 0);
  EXPECT_EQ(read_bytes(root, at(m_allocation), m_data.size()), m_data);
  SessionState admin = client(k_unlisted, k_admin_group);
  EXPECT_EQ(read_bytes(admin, at(m_allocation, 10), 10), m_data.substr(10, 10));
  ASSERT_TRUE(is_ok(call(admin, write_request(at(m_allocation), "op"))));
  EXPECT_EQ(read_bytes(m_alice, at(m_allocation), 2), "op");
}

TEST_F(TenantsTest, ListAndLookupShowATenantItsOwnOnly) {
  proto::Request named = alloc_request(k_page);
  named.mutable_alloc()->set_name("alice-table");
  ASSERT_TRUE(is_ok(call(m_alice, named)));
  const proto::AllocationInfo bobs = allocate(m_bob, k_page);
  proto::Request list;
  list.mutable_list();
  const Answer bob_list = call(m_bob, list);
  ASSERT_TRUE(is_ok(bob_list));
  ASSERT_EQ(bob_list.response.list().allocations_size(), 1);
  EXPECT_EQ(bob_list.response.list().allocations(0).gva().offset(), bobs.gva().offset());
  SessionState root = client(0, 0);
  EXPECT_EQ(call(root, list).response.list().allocations_size(), 3);
  proto::Request lookup;
  lookup.mutable_lookup()->set_name("alice-table");
  EXPECT_TRUE(is_error(call(m_bob, lookup), ErrorCode::permission_denied, "may not look up 'alice-table'"));
  EXPECT_TRUE(is_ok(call(m_alice, lookup)));
}

TEST_F(TenantsTest, MetricsAreForOperatorsOnly) {
  proto::Request metrics;
  metrics.mutable_metrics();
  EXPECT_TRUE(is_error(call(m_alice, metrics), ErrorCode::permission_denied, "operators only"));
  SessionState root = client(0, 0);
  const Answer a = call(root, metrics);
  ASSERT_TRUE(is_ok(a));
  EXPECT_NE(a.response.metrics().text().find("tenant=\"alice\""), std::string::npos)
      << "alice's requests were counted";
}

TEST_F(TenantsTest, ATenantsQuotaIsEnforced) {
  proto::Request strict = alloc_request(2 * k_bob_dram_quota);
  strict.mutable_alloc()->set_strict(true);
  EXPECT_TRUE(is_error(call(m_bob, strict), ErrorCode::quota_exceeded, "free some of the tenant's memory"));
  const Answer spilled = call(m_bob, alloc_request(2 * k_bob_dram_quota));
  ASSERT_TRUE(is_ok(spilled));
  EXPECT_EQ(spilled.response.alloc().allocation().tier(), proto::TIER_PMEM) << "past its DRAM quota, down the chain";
  EXPECT_EQ(allocate(m_alice, 2 * k_bob_dram_quota).tier(), proto::TIER_DRAM) << "alice has no quota";
}

// --- session allocations --------------------------------------------------------

TEST_F(RequestHandlerTest, SessionAllocationIsFreedWhenTheSessionEnds) {
  SessionState alice = client(k_alice);  // pid 0: a process that is gone once its session ends
  const proto::AllocationInfo temporary = allocate(alice, k_page, proto::TIER_DRAM, true);
  const proto::AllocationInfo kept = allocate(alice, k_page);
  EXPECT_TRUE(temporary.session());
  EXPECT_FALSE(kept.session());
  m_handler->end_session(alice);
  SessionState later = client(k_alice);
  EXPECT_TRUE(is_error(call(later, translate_request(at(temporary))), ErrorCode::not_allocated));
  EXPECT_TRUE(is_ok(call(later, translate_request(at(kept)))));
  EXPECT_EQ(m_space->allocation_count(), 1u);
}

TEST_F(RequestHandlerTest, SessionAllocationOfALiveProcessWaitsForItsLease) {
  DaemonConfig c = base_config();
  c.lease_grace_ms = 100;
  start(c);
  SessionState first = unix_session(k_alice);
  first.pid = ::getpid();  // lives on after its session: it may connect again
  ASSERT_TRUE(is_ok(call(first, hello_request(proto::PROTOCOL_VERSION_CURRENT, 77))));
  const proto::AllocationInfo temporary = allocate(first, k_page, proto::TIER_DRAM, true);
  m_handler->end_session(first);
  m_handler->sweep_leases();
  EXPECT_EQ(m_space->allocation_count(), 1u) << "kept for lease.grace_ms";
  // The process connects again within the grace: the allocation is its new
  // session's, and outlives the grace.
  SessionState second = unix_session(k_alice);
  second.pid = ::getpid();
  ASSERT_TRUE(is_ok(call(second, hello_request(proto::PROTOCOL_VERSION_CURRENT, 77))));
  ASSERT_EQ(second.owned.size(), 1u);
  EXPECT_EQ(second.owned[0].offset, temporary.gva().offset());
  std::this_thread::sleep_for(200ms);
  m_handler->sweep_leases();
  EXPECT_TRUE(is_ok(call(second, translate_request(at(temporary)))));
  // Its second session ends, and no one takes it back in time.
  m_handler->end_session(second);
  std::this_thread::sleep_for(200ms);
  m_handler->sweep_leases();
  EXPECT_EQ(m_space->allocation_count(), 0u);
}

TEST_F(RequestHandlerTest, SessionAllocationOnAnotherNodeIsRefused) {
  SessionState alice = client(k_alice);
  proto::Request r = alloc_request(k_page, proto::TIER_DRAM, true);
  r.set_node(2);
  EXPECT_TRUE(is_error(call(alice, r), ErrorCode::not_supported, "session allocations live on the client's own node"));
  EXPECT_TRUE(alice.owned.empty());
}

// --- work off the control threads ---------------------------------------------

TEST_F(RequestHandlerTest, PersistFramesIsDeferredAndChecksTheTenant) {
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, 2 * k_page, proto::TIER_PMEM);
  const Answer t = call(alice, translate_request(at(a)));
  ASSERT_TRUE(is_ok(t));
  ASSERT_GT(t.response.translate().extents_size(), 0);
  const proto::Extent x = t.response.translate().extents(0);
  proto::Request persist;
  persist.mutable_persist_frames()->set_tier(proto::TIER_PMEM);
  persist.mutable_persist_frames()->set_frame_offset(x.frame_offset());
  persist.mutable_persist_frames()->set_length(x.length());
  const Answer own = call(alice, persist);
  EXPECT_TRUE(own.deferred) << "msync may take milliseconds: off the control threads";
  EXPECT_TRUE(is_ok(own));
  EXPECT_TRUE(own.response.has_persist_frames());

  SessionState bob = client(k_bob);
  allocate(bob, k_page, proto::TIER_PMEM);  // a domain of his own
  const Answer other = call(bob, persist);
  EXPECT_TRUE(other.deferred);
  EXPECT_TRUE(is_error(other, ErrorCode::permission_denied, "may not persist frames of another tenant"));

  proto::Request outside = persist;
  outside.mutable_persist_frames()->set_frame_offset(uint64_t{1} << 50);
  EXPECT_TRUE(is_error(call(alice, outside), ErrorCode::out_of_range, "outside the tier's frames"));
}

TEST_F(RequestHandlerTest, MigrateIsDeferredAndKeepsTheBytes) {
  SessionState alice = client(k_alice);
  const proto::AllocationInfo a = allocate(alice, 2 * k_page);
  const std::string data = bytes(2 * k_page, 4);
  ASSERT_TRUE(is_ok(call(alice, write_request(at(a), data))));
  proto::Request migrate;
  *migrate.mutable_migrate()->mutable_gva() = at(a);
  migrate.mutable_migrate()->set_tier(proto::TIER_PMEM);

  SessionState bob = client(k_bob);
  const Answer refused = call(bob, migrate);
  EXPECT_FALSE(refused.deferred) << "refused before any work";
  EXPECT_TRUE(is_error(refused, ErrorCode::permission_denied, "tenant 'bob' (uid 1001) may not migrate"));

  const Answer moved = call(alice, migrate);
  EXPECT_TRUE(moved.deferred);
  ASSERT_TRUE(is_ok(moved));
  EXPECT_EQ(moved.response.migrate().allocation().tier(), proto::TIER_PMEM);
  EXPECT_EQ(moved.response.migrate().pages_moved(), 2u);
  EXPECT_EQ(read_bytes(alice, at(a), data.size()), data);
}

}  // namespace
}  // namespace tiermem
