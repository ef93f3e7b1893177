// tiermemctl against a real tiermemd.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using test::run_ctl;

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

class CtlTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(m_daemon.ready()) << m_daemon.log(); }
  test::CommandResult ctl(const std::vector<std::string>& args, const std::string& input = "") {
    return run_ctl(m_daemon.socket(), args, input);
  }
  test::TestDaemon m_daemon;
};

TEST_F(CtlTest, AllocWriteReadFreeOnEachTier) {
  for (const std::string tier : {"dram", "pmem"}) {
    auto alloc = ctl({"alloc", "3MiB", "--tier", tier, "--name", "blob-" + tier});
    ASSERT_EQ(alloc.exit_code, 0) << alloc.err;
    const std::string gva = trim(alloc.out);
    ASSERT_TRUE(Gva::parse(gva).ok()) << "alloc prints the GVA: " << alloc.out;
    const std::string payload = "tiermemctl bytes on " + tier + std::string(1000, '!');
    auto write = ctl({"write", gva, "-"}, payload);
    ASSERT_EQ(write.exit_code, 0) << write.err;
    EXPECT_NE(write.out.find("wrote " + std::to_string(payload.size()) + " bytes"), std::string::npos);
    auto read = ctl({"read", gva, std::to_string(payload.size())});
    ASSERT_EQ(read.exit_code, 0) << read.err;
    EXPECT_EQ(read.out, payload);
    auto translate = ctl({"translate", gva});
    ASSERT_EQ(translate.exit_code, 0);
    EXPECT_NE(translate.out.find("tier " + tier), std::string::npos) << translate.out;
    auto free = ctl({"free", gva});
    EXPECT_EQ(free.exit_code, 0) << free.err;
    auto again = ctl({"free", gva});
    EXPECT_EQ(again.exit_code, 1);
    EXPECT_NE(again.err.find("not_allocated"), std::string::npos) << again.err;
  }
}

TEST_F(CtlTest, JsonOutputIsParseable) {
  auto alloc = ctl({"--json", "alloc", "64KiB", "-t", "pmem", "-n", "j"});
  ASSERT_EQ(alloc.exit_code, 0) << alloc.err;
  const auto a = nlohmann::json::parse(alloc.out);
  EXPECT_EQ(a["tier"], "pmem");
  EXPECT_EQ(a["size"], 65536);
  EXPECT_EQ(a["name"], "j");
  const std::string gva = a["gva"];

  const auto status = nlohmann::json::parse(ctl({"--json", "status"}).out);
  EXPECT_EQ(status["node"], 1);
  EXPECT_EQ(status["allocations"], 1);
  ASSERT_EQ(status["tiers"].size(), 2u);
  EXPECT_EQ(status["tiers"][1]["used_bytes"], 2 << 20);

  const auto ls = nlohmann::json::parse(ctl({"--json", "ls"}).out);
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(ls[0]["gva"], gva);

  ASSERT_EQ(ctl({"write", gva, "-"}, "abc").exit_code, 0);
  const auto read = nlohmann::json::parse(ctl({"--json", "read", gva, "3"}).out);
  EXPECT_EQ(read["data_base64"], "YWJj");

  const auto t = nlohmann::json::parse(ctl({"--json", "translate", gva}).out);
  EXPECT_EQ(t["page"]["tier"], "pmem");
  EXPECT_EQ(t["page"]["flags"], "RW--D--");
  EXPECT_EQ(t["page"]["valid_mask"], "0000000000000001");

  const auto dump = nlohmann::json::parse(ctl({"--json", "dump"}).out);
  EXPECT_EQ(dump["pages"].size(), 1u);
  EXPECT_EQ(dump["allocations"][0]["gva"], gva);
  EXPECT_EQ(nlohmann::json::parse(ctl({"--json", "free", gva}).out)["freed"], gva);
}

TEST_F(CtlTest, HumanTablesShowTheTiers) {
  ASSERT_EQ(ctl({"alloc", "1MiB", "--name", "visible"}).exit_code, 0);
  auto status = ctl({"status"});
  ASSERT_EQ(status.exit_code, 0);
  EXPECT_NE(status.out.find("TIER"), std::string::npos);
  EXPECT_NE(status.out.find("dram"), std::string::npos);
  EXPECT_NE(status.out.find("pmem"), std::string::npos);
  auto ls = ctl({"ls"});
  EXPECT_NE(ls.out.find("visible"), std::string::npos);
  auto dump = ctl({"dump"});
  EXPECT_NE(dump.out.find("mapping table of node 1"), std::string::npos);
  EXPECT_NE(dump.out.find("visible"), std::string::npos);
}

TEST_F(CtlTest, ErrorsExitNonZeroWithOneLine) {
  const std::vector<std::vector<std::string>> cases = {
      {"alloc", "12 parsecs"},
      {"alloc", "1MiB", "--tier", "flash"},
      {"free", "nonsense"},
      {"free", "0001:0000000000000000"},
      {"read", "0001:00000000deadbeef", "4"},
      {"alloc", "1TiB", "--tier", "dram", "--strict"},
  };
  for (const auto& args : cases) {
    auto r = ctl(args);
    EXPECT_EQ(r.exit_code, 1) << args[0] << " " << args[1];
    EXPECT_EQ(r.err.rfind("tiermemctl: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  }
  auto usage = ctl({"alloc"});
  EXPECT_EQ(usage.exit_code, 2);
  auto no_daemon = test::run_ctl("/tmp/none.sock", {"status"});
  EXPECT_EQ(no_daemon.exit_code, 1);
  EXPECT_NE(no_daemon.err.find("cannot connect to tiermemd at /tmp/none.sock"), std::string::npos);
}

TEST_F(CtlTest, ReadPastTheEndIsRefused) {
  const std::string gva = trim(ctl({"alloc", "100"}).out);
  auto r = ctl({"read", gva, "101"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("out_of_range"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tiermem
