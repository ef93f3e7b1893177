// The control protocol's rules, asserted on a RequestHandler over a real
// in-process AddressSpace (DRAM and PMEM tiers in files under /dev/shm), with
// hand-built requests and sessions: admission (hello or authentication
// first, peer-only requests), tenants against each other, the data requests,
// malformed and absurd input, session allocations, and the work a handler
// hands back as Reply::deferred. No sockets and no daemon process: the
// integration suites (bad_input, security, client) keep testing the same
// rules through real daemons.
#include "tests/daemon/handler_fixture.hpp"

namespace tiermem::handler_test {
namespace {
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

// Who a session is gets settled once: a greeted client cannot say hello
// again, and an authenticated peer cannot take another node's name by a new
// challenge (its node id feeds acting_home and the frames it is lent).
TEST_F(RequestHandlerTest, AGreetedSessionCannotGreetAgain) {
  SessionState alice = client(k_alice);
  const Answer again = call(alice, hello_request());
  EXPECT_TRUE(is_error(again, ErrorCode::unexpected_message, "hello on a connection that said who it is already"));
  expect_still_serving(alice);
  SessionState peer = tcp_session();
  peer.greeted = true;
  peer.peer = true;
  peer.peer_node = 2;
  proto::Request challenge;
  challenge.mutable_peer_challenge()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  challenge.mutable_peer_challenge()->set_node_id(3);
  challenge.mutable_peer_challenge()->set_nonce(std::string(32, 'n'));
  EXPECT_TRUE(is_error(call(peer, challenge), ErrorCode::unexpected_message, "peer_challenge on a connection"));
  EXPECT_EQ(peer.peer_node, 2u);
  proto::Request hello;
  hello.mutable_peer_hello()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  EXPECT_TRUE(is_error(call(peer, hello), ErrorCode::unexpected_message, "peer_hello on a connection"));
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

}  // namespace
}  // namespace tiermem::handler_test
