// The manual pages (O7): tiermemd(8), tiermemctl(8) and tiermem-exec(1) are
// printed by the programs from their own CLI11 definitions (--man, which the
// build runs and installs), so the page and --help name the same options:
// checked here for the program and every subcommand, and that the built page
// is what the program prints. tiermemd.toml(5) names every key of the
// shipped example (which names every key the daemon reads: config_test).
// Each page renders without a warning (groff -ww), where groff is installed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using test::env_or;
using test::run_command;
using test::read_file;

// Long options named in `text` (roff's \- read as -, its font changes
// \fB, \fI, \fR dropped).
std::set<std::string> long_options(std::string text) {
  text = std::regex_replace(text, std::regex(R"(\\f[BIRP])"), "");
  text = std::regex_replace(text, std::regex(R"(\\-)"), "-");
  std::set<std::string> out;
  const std::regex option(R"((^|[^A-Za-z0-9-])--([a-z][a-z0-9-]*))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), option); it != std::sregex_iterator(); ++it) {
    out.insert((*it)[2].str());
  }
  return out;
}

std::string joined(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += " --" + x;
  return out;
}

void expect_renders(const std::string& page, const std::string& what) {
  if (!std::filesystem::exists("/usr/bin/groff")) return;
  const std::string file = test::make_temp_dir("tiermem-man") + "/page";
  std::ofstream(file) << page;
  auto r = run_command({"/usr/bin/groff", "-man", "-ww", "-z", file});
  EXPECT_EQ(r.exit_code, 0) << what << r.err;
  EXPECT_EQ(r.err, "") << what << ": groff warns:\n" << r.err;
  std::filesystem::remove_all(std::filesystem::path(file).parent_path());
}

struct Program {
  const char* env;
  const char* fallback;  // under the build root
  const char* page;      // the built page, under the build root
};

class ManTest : public ::testing::TestWithParam<Program> {};

TEST_P(ManTest, ThePageAndHelpNameTheSameOptionsAndTheBuiltPageIsThePrograms) {
  const Program& p = GetParam();
  const std::string root = env_or("TIERMEM_BUILD_ROOT", "");
  ASSERT_FALSE(root.empty()) << "TIERMEM_BUILD_ROOT is not set";
  const std::string program = env_or(p.env, root + "/" + p.fallback);
  auto man = run_command({program, "--man"});
  ASSERT_EQ(man.exit_code, 0) << man.err;
  ASSERT_EQ(man.out.rfind(".TH ", 0), 0u) << man.out.substr(0, 200);
  ASSERT_TRUE(std::filesystem::exists(root + "/" + p.page)) << p.page << " was not built";
  EXPECT_EQ(read_file(root + "/" + p.page), man.out) << "the built page is not what the program prints";
  // --help of the program and of every subcommand the page lists.
  auto help = run_command({program, "--help"});
  ASSERT_EQ(help.exit_code, 0) << help.err;
  std::string all_help = help.out;
  const std::regex sub(R"(\n\.SS ([a-z][a-z0-9-]*)\n)");
  int subcommands = 0;
  for (auto it = std::sregex_iterator(man.out.begin(), man.out.end(), sub); it != std::sregex_iterator(); ++it) {
    auto h = run_command({program, (*it)[1].str(), "--help"});
    EXPECT_EQ(h.exit_code, 0) << (*it)[1].str() << ": " << h.err;
    all_help += h.out;
    ++subcommands;
  }
  const std::set<std::string> in_help = long_options(all_help), in_page = long_options(man.out);
  EXPECT_FALSE(in_help.empty());
  EXPECT_EQ(in_page, in_help) << "in the page:" << joined(in_page) << "\nin --help:" << joined(in_help);
  EXPECT_EQ(in_page.count("man"), 0u) << "--man is hidden";
  std::printf("%s: %zu long options, %d subcommand(s)\n", p.page, in_page.size(), subcommands);
  expect_renders(man.out, p.page);
}

INSTANTIATE_TEST_SUITE_P(Programs, ManTest,
                         ::testing::Values(Program{"TIERMEMD", "daemon/tiermemd", "daemon/tiermemd.8"},
                                           Program{"TIERMEMCTL", "tools/tiermemctl", "tools/tiermemctl.8"},
                                           Program{"TIERMEM_EXEC", "executor/tiermem-exec", "executor/tiermem-exec.1"}),
                         [](const ::testing::TestParamInfo<Program>& info) {
                           std::string name = info.param.page;
                           name = name.substr(name.rfind('/') + 1);
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

TEST(ManConfigTest, TheConfigPageNamesEveryKeyOfTheShippedExample) {
  const std::string root = env_or("TIERMEM_BUILD_ROOT", "");
  ASSERT_FALSE(root.empty()) << "TIERMEM_BUILD_ROOT is not set";
  const std::string page = read_file(root + "/daemon/tiermemd.toml.5");
  ASSERT_EQ(page.rfind(".TH TIERMEMD.TOML 5", 0), 0u) << page.substr(0, 200);
  std::istringstream example(read_file(std::string(TIERMEM_SOURCE_ROOT) + "/config/tiermemd.toml"));
  const std::regex key(R"(^([A-Za-z0-9_.]+)\s*=)");
  int keys = 0;
  for (std::string line; std::getline(example, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, key)) continue;
    ++keys;
    EXPECT_NE(page.find("\\fB" + m[1].str() + "\\fR = "), std::string::npos) << m[1].str() << " is not in the page";
  }
  EXPECT_GT(keys, 50);
  expect_renders(page, "tiermemd.toml.5");
}

}  // namespace
}  // namespace tiermem
