// tiermemctl against a real tiermemd.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

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
  EXPECT_EQ(status["fabric"], "ucx") << "the default fabric";
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
  EXPECT_NE(status.out.find("\ndata plane: ucx\n"), std::string::npos) << status.out;
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

// Numbers out of range used to say CLI11's "Could not convert: --node =
// 70000"; now each option says its range, as a usage error (exit 2).
TEST_F(CtlTest, NumericOptionsOutOfRangeSayTheirRange) {
  const std::string gva = trim(ctl({"alloc", "100"}).out);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--node", "70000", "status"}, "--node: 70000 is out of range: node ids are 1-65535"},
      {{"--node", "0", "ls"}, "--node: 0 is out of range: node ids are 1-65535"},
      {{"-N", "99999999999999999999999", "status"}, "--node: 99999999999999999999999 is out of range"},
      {{"--node", "abc", "status"}, "--node: 'abc' is not a whole number: node ids are 1-65535"},
      {{"--node", "-1", "status"}, "--node: '-1' is not a whole number: node ids are 1-65535"},
      {{"migrate", gva, "--tier", "pmem", "--to-node", "70000"}, "--to-node: 70000 is out of range: node ids are 1-65535"},
      {{"alloc", "1MiB", "--replicas", std::to_string(k_max_replicas + 1)},
       "--replicas: " + std::to_string(k_max_replicas + 1) + " is out of range: replicas are 0-" +
           std::to_string(k_max_replicas)},
  };
  for (const auto& [args, said] : cases) {
    auto r = ctl(args);
    EXPECT_EQ(r.exit_code, 2) << args[1];
    EXPECT_NE(r.err.find(said), std::string::npos) << r.err;
  }
  auto json = ctl({"--json", "--node", "70000", "status"});
  EXPECT_EQ(json.exit_code, 2);
  EXPECT_EQ(nlohmann::json::parse(json.out)["error"]["message"], "--node: 70000 is out of range: node ids are 1-65535")
      << json.out;
  EXPECT_EQ(ctl({"--node", "1", "status"}).exit_code, 0) << "the node's own id is in range";
}

// read GVA 0 used to print nothing and exit 0, like a read of empty memory.
TEST_F(CtlTest, ReadingZeroBytesSaysSo) {
  const std::string gva = trim(ctl({"alloc", "100"}).out);
  ASSERT_EQ(ctl({"write", gva, "-"}, "abc").exit_code, 0);
  auto r = ctl({"read", gva, "0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "tiermemctl: read " + gva + ": LENGTH is 0: nothing was read\n");
  auto json = ctl({"--json", "read", gva, "0"});
  EXPECT_EQ(json.exit_code, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["length"], 0);
  EXPECT_EQ(j["data_base64"], "");
  ASSERT_EQ(ctl({"free", gva}).exit_code, 0);
  EXPECT_EQ(ctl({"read", gva, "0"}).exit_code, 1) << "zero bytes of a freed allocation is still an error";
}

// ls --tier DRAM listed nothing (parse_tier took it, the filter compared
// "dram" with "DRAM"), and --tier auto always nothing.
TEST_F(CtlTest, TierFiltersTakeAnyCaseAndRefuseAuto) {
  ASSERT_EQ(ctl({"alloc", "64KiB", "--tier", "dram", "--name", "upper"}).exit_code, 0);
  auto upper = nlohmann::json::parse(ctl({"--json", "ls", "--tier", "DRAM"}).out);
  ASSERT_EQ(upper.size(), 1u);
  EXPECT_EQ(upper[0]["name"], "upper");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"ls", "--tier", "auto"}, {"free", "--name-prefix", "up", "--tier", "auto"}}) {
    auto r = ctl(args);
    EXPECT_EQ(r.exit_code, 1) << args[0];
    EXPECT_NE(r.err.find("--tier auto: an allocation is on vram, dram or pmem, never on auto"), std::string::npos)
        << r.err;
  }
  EXPECT_EQ(nlohmann::json::parse(ctl({"--json", "ls"}).out).size(), 1u) << "nothing was freed";
}

// A socket path that cannot be tiermemd's used to say "Connection refused"
// (a regular file) or only "No such file or directory".
TEST(CtlSocketTest, APathThatIsNoSocketOrMissingSaysSo) {
  auto file = run_ctl("/etc/passwd", {"status"});
  EXPECT_EQ(file.exit_code, 1);
  EXPECT_NE(file.err.find("cannot connect to tiermemd at /etc/passwd (from --socket): /etc/passwd is not a socket "
                          "(a regular file), so no tiermemd serves there: give tiermemctl the control.socket of "
                          "tiermemd's configuration"),
            std::string::npos)
      << file.err;
  const std::string dir = test::make_temp_dir("tiermem-nosock");
  auto directory = run_ctl(dir, {"status"});
  EXPECT_EQ(directory.exit_code, 1);
  EXPECT_NE(directory.err.find(dir + " is not a socket (a directory)"), std::string::npos) << directory.err;
  auto missing = run_ctl(dir + "/none.sock", {"status"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("cannot connect to tiermemd at " + dir + "/none.sock (from --socket): it does not "
                             "exist: is tiermemd running, and with control.socket = \"" + dir + "/none.sock\"?"),
            std::string::npos)
      << missing.err;
  ::setenv("TIERMEM_SOCKET", "/etc/passwd", 1);
  auto env = test::run_command({test::tiermemctl_path(), "--json", "status"});
  ::unsetenv("TIERMEM_SOCKET");
  EXPECT_EQ(env.exit_code, 1);
  const auto e = nlohmann::json::parse(env.out);
  EXPECT_EQ(e["error"]["code"], "connection_failed");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("/etc/passwd (from $TIERMEM_SOCKET): /etc/passwd is not a "
                                                          "socket"),
            std::string::npos)
      << env.out;
  std::filesystem::remove_all(dir);
}

// The operator's commands (O3): lookup, filtered ls, bulk free by name
// prefix or tenant, stats, "did you mean", JSON errors.
TEST_F(CtlTest, LookupLsFiltersAndBulkFree) {
  for (const std::string name : {"job7.rank0.params", "job7.rank1.params", "job8.rank0.params"}) {
    ASSERT_EQ(ctl({"alloc", "64KiB", "--tier", name.find("rank1") != std::string::npos ? "pmem" : "dram", "--name",
                   name})
                  .exit_code,
              0);
  }
  auto found = ctl({"--json", "lookup", "job7.rank1.params"});
  ASSERT_EQ(found.exit_code, 0) << found.err;
  EXPECT_EQ(nlohmann::json::parse(found.out)["tier"], "pmem");
  EXPECT_EQ(ctl({"lookup", "job9"}).exit_code, 1);

  auto job7 = nlohmann::json::parse(ctl({"--json", "ls", "--name-prefix", "job7."}).out);
  EXPECT_EQ(job7.size(), 2u) << job7.dump();
  auto dram = nlohmann::json::parse(ctl({"--json", "ls", "--name-prefix", "job", "--tier", "dram"}).out);
  EXPECT_EQ(dram.size(), 2u) << dram.dump();
  const std::string tenant = job7[0]["tenant"];
  EXPECT_EQ(nlohmann::json::parse(ctl({"--json", "ls", "--tenant", tenant}).out).size(), 3u);
  EXPECT_EQ(nlohmann::json::parse(ctl({"--json", "ls", "--tenant", "nobody"}).out).size(), 0u);

  auto dry = ctl({"free", "--name-prefix", "job7.", "--dry-run"});
  EXPECT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_NE(dry.out.find("would free 2 allocation(s)"), std::string::npos) << dry.out;
  EXPECT_EQ(nlohmann::json::parse(ctl({"--json", "ls", "--name-prefix", "job7."}).out).size(), 2u);
  auto bulk = ctl({"--json", "free", "--name-prefix", "job7."});
  EXPECT_EQ(bulk.exit_code, 0) << bulk.err;
  EXPECT_EQ(nlohmann::json::parse(bulk.out)["freed"].size(), 2u) << bulk.out;
  EXPECT_EQ(nlohmann::json::parse(ctl({"--json", "ls", "--name-prefix", "job"}).out).size(), 1u);
  // A mapped one cannot go: it fails alone, the rest are freed, exit 1.
  auto client = m_daemon.connect();
  auto pinned = client->alloc(64 << 10, {.name = "job8.rank1.pinned"});
  ASSERT_TRUE(pinned.ok());
  auto mapping = client->map(pinned->gva);
  ASSERT_TRUE(mapping.ok()) << mapping.status().to_string();
  auto partial = ctl({"free", "--tenant", tenant, "--name-prefix", "job8."});
  EXPECT_EQ(partial.exit_code, 1);
  EXPECT_NE(partial.out.find("freed 1 allocation(s)"), std::string::npos) << partial.out;
  EXPECT_NE(partial.err.find("failed_precondition"), std::string::npos) << partial.err;
  // Refused usage: no target, or a GVA and a filter.
  EXPECT_EQ(ctl({"free"}).exit_code, 2);
  EXPECT_EQ(ctl({"free", "--tier", "dram"}).exit_code, 2);
  EXPECT_EQ(ctl({"free", pinned->gva.to_string(), "--tenant", tenant}).exit_code, 2);
}

TEST_F(CtlTest, StatsShowTheCountersTheMetricsShow) {
  ASSERT_EQ(ctl({"alloc", "64KiB"}).exit_code, 0);
  auto stats = ctl({"stats", "requests_total"});
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  EXPECT_NE(stats.out.find("tiermem_requests_total"), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("type=alloc result=ok"), std::string::npos) << stats.out;
  auto json = nlohmann::json::parse(ctl({"--json", "stats", "tier_capacity_bytes"}).out);
  ASSERT_FALSE(json.empty());
  bool dram = false;
  for (const auto& s : json) {
    EXPECT_EQ(s["name"], "tiermem_tier_capacity_bytes");
    if (s["labels"]["tier"] == "dram") dram = s["value"] == 64.0 * 1024 * 1024;
  }
  EXPECT_TRUE(dram) << json.dump();
}

TEST(CtlStatsTest, WithMetricsDisabledStatsSaysSo) {
  test::TestDaemon daemon({.extra_toml = "[metrics]\nenabled = false\n"});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto r = run_ctl(daemon.socket(), {"stats"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("metrics.enabled is false"), std::string::npos) << r.err;
}

TEST_F(CtlTest, AMistypedCommandSuggestsAndJsonErrorsAreJson) {
  auto typo = ctl({"lss"});
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(typo.err.find("unknown command 'lss'; did you mean 'ls'?"), std::string::npos) << typo.err;
  auto prefix = ctl({"--socket", m_daemon.socket(), "migr", "x"});
  EXPECT_NE(prefix.err.find("did you mean 'migrate'?"), std::string::npos) << prefix.err;
  EXPECT_EQ(ctl({"frobnicate"}).err.find("did you mean"), std::string::npos);

  auto failed = ctl({"--json", "free", "0001:0000000000000000"});
  EXPECT_EQ(failed.exit_code, 1);
  const auto e = nlohmann::json::parse(failed.out);
  EXPECT_EQ(e["error"]["code"], "not_allocated") << failed.out;
  EXPECT_FALSE(e["error"]["message"].get<std::string>().empty());
  auto usage = ctl({"--json", "alloc"});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_EQ(nlohmann::json::parse(usage.out)["error"]["what"], "usage") << usage.out;
  auto typo_json = ctl({"--json", "helth"});
  EXPECT_EQ(typo_json.exit_code, 2);
  EXPECT_NE(nlohmann::json::parse(typo_json.out)["error"]["message"].get<std::string>().find("did you mean 'health'"),
            std::string::npos);
}

// tiermemd's own command line: usage errors exit 2 (not CLI11's codes).
TEST(TiermemdTest, UsageErrorsExitTwo) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--bogus"}, {"--log-level", "loud", "--check-config"}, {"--config"}}) {
    std::vector<std::string> argv = {test::tiermemd_path()};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = test::run_command(argv);
    EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << r.out << r.err;
  }
  auto help = test::run_command({test::tiermemd_path(), "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--log-level"), std::string::npos) << help.out;
}

// SIGHUP (systemctl reload) applies a changed log level; a broken file
// changes nothing and the daemon serves on. A JOURNAL_STREAM that is not
// stderr (inherited from a unit by a process whose stderr went elsewhere)
// leaves the log as text in that file.
TEST(TiermemdTest, SighupReloadsTheLogLevel) {
  ::setenv("JOURNAL_STREAM", "1:1", 1);
  test::TestDaemon daemon;
  ::unsetenv("JOURNAL_STREAM");
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  EXPECT_NE(daemon.log().find("tiermemd[") , std::string::npos) << "text log lines: " << daemon.log();
  std::stringstream text;
  text << std::ifstream(daemon.config_path()).rdbuf();
  const std::string original = text.str();
  std::ofstream(daemon.config_path()) << std::regex_replace(original, std::regex("level = \"debug\""),
                                                            "level = \"warn\"");
  ::kill(daemon.pid(), SIGHUP);
  auto wait_for = [&](const std::string& line) {
    for (int i = 0; i < 200 && daemon.log().find(line) == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return daemon.log().find(line) != std::string::npos;
  };
  EXPECT_TRUE(wait_for("SIGHUP: reloaded " + daemon.config_path() + ": log level warn")) << daemon.log();
  const size_t before = daemon.log().size();
  ASSERT_NE(daemon.connect(), nullptr);  // session open/close are debug lines: no longer logged
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(daemon.log().substr(before).find("session"), std::string::npos) << daemon.log().substr(before);
  std::ofstream(daemon.config_path()) << original << "[nonsense\n";
  ::kill(daemon.pid(), SIGHUP);
  EXPECT_TRUE(wait_for("nothing changed")) << daemon.log();
  EXPECT_TRUE(daemon.alive());
  EXPECT_NE(daemon.connect(), nullptr);
}

}  // namespace
}  // namespace tiermem
