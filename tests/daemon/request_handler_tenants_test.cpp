// The request handler's rules between tenants, for session allocations and
// for the work it hands back as Reply::deferred, asserted on a RequestHandler
// over a real in-process AddressSpace (handler_fixture.hpp); the integration
// suites (security, tenant_restart, client) keep testing them through real
// daemons.
#include "tests/daemon/handler_fixture.hpp"

namespace tiermem::handler_test {
namespace {
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
}  // namespace tiermem::handler_test
