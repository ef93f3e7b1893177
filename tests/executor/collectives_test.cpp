// The making of NCCL groups (collectives.hpp, issue 25) against a real
// tiermemd: the id travels through the leader's tiermem allocation, a member
// that read the id of the leader's previous start joins again with the new
// one (whether its stale join hangs or fails), a leader that never comes is
// a timeout naming it, a torn record is not taken, and the check (X8)
// catches members with another plan. NCCL itself
// needs GPUs (suite gpu): here each member's join is a stand-in that joins
// once its id's leader opened it, as NCCL's bootstrap does, and sums words
// between the members in this process.
#include "executor/runtime/exchange/collectives.hpp"

#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "tests/support/test_daemon.hpp"

namespace tiermem::exec {
namespace {

using namespace std::chrono_literals;

// What the members of the stand-in groups share.
struct Hub {
  std::mutex mu;
  std::condition_variable cv;
  std::set<std::string> opened;                   // ids whose leader joined
  std::map<std::string, std::set<int>> arrived;   // id -> members that joined it
  std::map<std::string, std::vector<std::vector<uint64_t>>> words;
  std::vector<std::pair<int, std::string>> attempts;  // (member, id) in join order
  bool stale_fails_fast = false;  // a join of an id no leader opened fails (NCCL: connection refused)
};

class StandIn final : public Collective {
 public:
  StandIn(Hub& hub, std::string id, int size, int rank)
      : m_hub(hub), m_id(std::move(id)), m_size(size), m_rank(rank), m_started(std::chrono::steady_clock::now()) {
    std::lock_guard<std::mutex> lock(hub.mu);
    hub.attempts.emplace_back(rank, m_id);
    if (rank == 0) hub.opened.insert(m_id);
  }
  int size() const override { return m_size; }
  int rank() const override { return m_rank; }
  Result<bool> joined() override {
    std::lock_guard<std::mutex> lock(m_hub.mu);
    if (m_aborted) return Status(ErrorCode::io_error, "aborted");
    if (m_hub.opened.count(m_id) == 0) {
      if (m_hub.stale_fails_fast && std::chrono::steady_clock::now() - m_started > 20ms) {
        return Status(ErrorCode::io_error, "bootstrap: connection refused");
      }
      return false;
    }
    m_hub.arrived[m_id].insert(m_rank);
    return static_cast<int>(m_hub.arrived[m_id].size()) == m_size;
  }
  void abort() override { m_aborted = true; }
  void all_reduce(const float*, float*, int64_t) override {}
  uint64_t all_reduce_beside(float*, int64_t) override { return 0; }
  void wait_beside(uint64_t) override {}
  Result<std::vector<uint64_t>> sum_words(const std::vector<uint64_t>& mine) override {
    std::unique_lock<std::mutex> lock(m_hub.mu);
    auto& posted = m_hub.words[m_id];
    posted.push_back(mine);
    m_hub.cv.notify_all();
    if (!m_hub.cv.wait_for(lock, 10s, [&] { return static_cast<int>(posted.size()) >= m_size; })) {
      return Status(ErrorCode::timeout, "the others' words never came");
    }
    std::vector<uint64_t> sum(mine.size(), 0);
    for (const auto& w : posted) {
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += w[i];
    }
    return sum;
  }
  void beside_time(uint64_t* bytes, double* seconds) override {
    *bytes = 0;
    *seconds = 0;
  }
  std::string library() const override { return "stand-in"; }

 private:
  Hub& m_hub;
  std::string m_id;
  int m_size, m_rank;
  std::chrono::steady_clock::time_point m_started;
  bool m_aborted = false;
};

class CollectivesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_daemon = std::make_unique<test::TestDaemon>();
    ASSERT_TRUE(m_daemon->ready());
  }

  std::unique_ptr<Client> connect() {
    auto c = Client::connect({.socket_path = m_daemon->socket(), .client_name = "collectives test"});
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return std::move(c).value();
  }

  // Member `me` of a group of `ranks` of job `job`, joining through the hub.
  Result<std::unique_ptr<Collective>> member(const std::string& job, const std::vector<int>& ranks, int me,
                                             uint64_t fingerprint, std::chrono::milliseconds timeout,
                                             std::string id = "") {
    auto client = connect();
    JobDirectory dir(*client, job, ranks[static_cast<size_t>(me)], timeout);
    GroupSpec group{"dp.s0.t0", ranks, me};
    GroupJoin how;
    how.make_id = [&]() -> Result<std::string> {
      return id.empty() ? "id of start " + std::to_string(++m_starts) : id;
    };
    how.join = [&](const std::string& with) -> Result<std::unique_ptr<Collective>> {
      return std::unique_ptr<Collective>(std::make_unique<StandIn>(m_hub, with, static_cast<int>(ranks.size()), me));
    };
    return make_group(how, dir, group, fingerprint, timeout);
  }

  std::unique_ptr<test::TestDaemon> m_daemon;
  Hub m_hub;
  std::atomic<int> m_starts{0};
};

TEST_F(CollectivesTest, TheLeadersIdReachesEveryMemberThroughTiermemAndTheGroupChecksOut) {
  const std::vector<int> ranks{0, 2, 4};
  std::vector<std::future<Result<std::unique_ptr<Collective>>>> members;
  for (int me = 0; me < 3; ++me) {
    members.push_back(std::async(std::launch::async, [&, me] { return member("fresh", ranks, me, 77, 20s); }));
  }
  for (auto& f : members) {
    auto made = f.get();
    ASSERT_TRUE(made.ok()) << made.status().to_string();
  }
  {
    std::lock_guard<std::mutex> lock(m_hub.mu);
    ASSERT_EQ(m_hub.attempts.size(), 3u);
    for (const auto& [who, id] : m_hub.attempts) EXPECT_EQ(id, "id of start 1") << "member " << who;
  }
  // The group made, the leader's record is gone: nothing of it left.
  auto client = connect();
  auto record = client->lookup("fresh.r0.nccl-dp.s0.t0");
  ASSERT_FALSE(record.ok());
  EXPECT_EQ(record.status().code(), ErrorCode::not_found) << record.status().to_string();
}

TEST_F(CollectivesTest, ALeaderWhoseMembersNeverComeGivesUpAndLeavesNoRecord) {
  auto made = member("lonely", {0, 1}, 0, 1, 1s);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), ErrorCode::timeout) << made.status().to_string();
  EXPECT_NE(made.status().message().find("the other members did not join"), std::string::npos)
      << made.status().message();
  auto client = connect();
  EXPECT_EQ(client->lookup("lonely.r0.nccl-dp.s0.t0").status().code(), ErrorCode::not_found);
}

TEST_F(CollectivesTest, AMemberThatReadTheIdOfTheLeadersPreviousStartJoinsTheNewOne) {
  for (bool fails_fast : {false, true}) {
    SCOPED_TRACE(fails_fast ? "the stale join fails" : "the stale join hangs");
    m_hub.stale_fails_fast = fails_fast;
    const std::string job = fails_fast ? "stale-fails" : "stale-hangs";
    const std::vector<int> ranks{0, 1};
    {
      // The record a previous start of the leader left behind.
      auto client = connect();
      JobDirectory dir(*client, job, 0, 5s);
      ASSERT_TRUE(publish_id(dir, GroupSpec{"dp.s0.t0", ranks, 0}, IdRecord{41, "old id"}).ok());
    }
    auto follower = std::async(std::launch::async, [&] { return member(job, ranks, 1, 5, 20s); });
    // The follower is on the old id before the leader comes back.
    for (int i = 0; i < 500; ++i) {
      {
        std::lock_guard<std::mutex> lock(m_hub.mu);
        if (!m_hub.attempts.empty()) break;
      }
      std::this_thread::sleep_for(10ms);
    }
    std::this_thread::sleep_for(200ms);
    auto leader = member(job, ranks, 0, 5, 20s, "new id " + job);
    ASSERT_TRUE(leader.ok()) << leader.status().to_string();
    auto joined = follower.get();
    ASSERT_TRUE(joined.ok()) << joined.status().to_string();
    std::lock_guard<std::mutex> lock(m_hub.mu);
    ASSERT_GE(m_hub.attempts.size(), 3u);
    EXPECT_EQ(m_hub.attempts.front(), std::make_pair(1, std::string("old id")));
    EXPECT_EQ(m_hub.attempts.back().second, "new id " + job);
    EXPECT_EQ(m_hub.arrived["new id " + job].size(), 2u);
    m_hub.attempts.clear();
  }
}

TEST_F(CollectivesTest, ALeaderThatNeverComesIsATimeoutNamingIt) {
  const auto started = std::chrono::steady_clock::now();
  auto made = member("no-leader", {3, 7}, 1, 1, 2s);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), ErrorCode::timeout) << made.status().to_string();
  EXPECT_NE(made.status().message().find("rank 3"), std::string::npos) << made.status().message();
  EXPECT_NE(made.status().message().find("dp.s0.t0"), std::string::npos) << made.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 15s);
}

TEST_F(CollectivesTest, ATornRecordIsNotTaken) {
  auto client = connect();
  JobDirectory dir(*client, "torn", 0, 5s);
  const GroupSpec group{"tp.s0.d0", {0, 1}, 0};
  ASSERT_TRUE(publish_id(dir, group, IdRecord{9, std::string(128, 'x')}).ok());
  auto good = read_id(dir, group);
  ASSERT_TRUE(good.ok() && good->has_value()) << good.status().to_string();
  EXPECT_EQ((*good)->nonce, 9u);
  EXPECT_EQ((*good)->id, std::string(128, 'x'));
  // One byte of the id changed under the checksum: a write half done.
  auto region = dir.own("nccl-tp.s0.d0", k_id_record_bytes, AllocOptions{});
  ASSERT_TRUE(region.ok());
  const char y = 'y';
  ASSERT_TRUE(dir.write(region->gva.plus(24 + 5), &y, 1).ok());
  auto torn = read_id(dir, group);
  ASSERT_TRUE(torn.ok());
  EXPECT_FALSE(torn->has_value());
  // A length word scribbled past the record: not taken, nothing read past it.
  ASSERT_TRUE(publish_id(dir, group, IdRecord{10, "short"}).ok());
  const uint64_t huge = ~uint64_t{0} / 2;
  ASSERT_TRUE(dir.write(region->gva.plus(16), &huge, 8).ok());
  auto scribbled = read_id(dir, group);
  ASSERT_TRUE(scribbled.ok());
  EXPECT_FALSE(scribbled->has_value());
  EXPECT_FALSE(publish_id(dir, group, IdRecord{1, std::string(k_id_record_bytes, 'z')}).ok());
}

TEST_F(CollectivesTest, MembersWithAnotherPlanFailTheCheck) {
  const std::vector<int> ranks{0, 1};
  auto a = std::async(std::launch::async, [&] { return member("plans", ranks, 0, 100, 20s); });
  auto b = member("plans", ranks, 1, 101, 20s);
  auto made = a.get();
  for (auto* r : {&made, &b}) {
    ASSERT_FALSE(r->ok());
    EXPECT_EQ(r->status().code(), ErrorCode::internal);
    EXPECT_NE(r->status().message().find("plans differ"), std::string::npos) << r->status().message();
  }
}

TEST(CollectiveGroupsTest, GroupsFollowTheTopology) {
  Topology t;
  t.stages = 2;
  t.tensor_parallel = 2;
  t.replicas = 3;
  t.rank = 7;  // stage 1, tp place 1, replica 1
  auto dp = dp_group(t);
  ASSERT_TRUE(dp.has_value());
  EXPECT_EQ(dp->name, "dp.s1.t1");
  EXPECT_EQ(dp->ranks, (std::vector<int>{3, 7, 11}));
  EXPECT_EQ(dp->me, 1);
  auto tp = tp_group(t);
  ASSERT_TRUE(tp.has_value());
  EXPECT_EQ(tp->name, "tp.s1.d1");
  EXPECT_EQ(tp->ranks, (std::vector<int>{5, 7}));
  EXPECT_EQ(tp->me, 1);
  t.replicas = 1;
  t.tensor_parallel = 1;
  EXPECT_FALSE(dp_group(t).has_value());
  EXPECT_FALSE(tp_group(t).has_value());
}

TEST(CollectiveGroupsTest, NcclOnlyWhereEveryMemberCanAndAClearErrorWhereOneMust) {
  using A = CollectiveAbility;
  const GroupSpec g{"dp.s0.t0", {0, 1, 2}, 0};
  EXPECT_TRUE(*group_uses_nccl(g, {A::nccl, A::nccl, A::must_nccl}));
  EXPECT_FALSE(*group_uses_nccl(g, {A::nccl, A::tiermem, A::nccl}));
  auto bad = group_uses_nccl(g, {A::must_nccl, A::nccl, A::tiermem});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::failed_precondition);
  EXPECT_NE(bad.status().message().find("rank 0 asks for --collectives nccl but rank 2"), std::string::npos)
      << bad.status().message();
  // Two members on one GPU: through tiermem, or refused when NCCL is a must.
  EXPECT_FALSE(*group_uses_nccl(g, {A::nccl, A::nccl, A::nccl}, {11, 13, 11}));
  EXPECT_TRUE(*group_uses_nccl(g, {A::nccl, A::nccl, A::nccl}, {11, 13, 15}));
  auto shared = group_uses_nccl(g, {A::nccl, A::must_nccl, A::nccl}, {11, 13, 11});
  ASSERT_FALSE(shared.ok());
  EXPECT_NE(shared.status().message().find("ranks 0 and 2 compute on the same GPU"), std::string::npos)
      << shared.status().message();
}

}  // namespace
}  // namespace tiermem::exec
