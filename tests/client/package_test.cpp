// libtiermem as a user gets it: installed (meson install into a temporary
// DESTDIR), then a program built with nothing but `pkg-config --cflags --libs
// tiermem` (shared) and `pkg-config --static ...` (static), run against a real
// daemon; and the shared library's exported symbols, which must be the public
// API only.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <tiermem/client.h>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

namespace fs = std::filesystem;
using test::run_command;

std::string build_root() {
  const char* b = std::getenv("TIERMEM_BUILD_ROOT");
  return b != nullptr ? b : "";
}

std::string shell_quote(const std::string& s) { return "'" + s + "'"; }

// A sh -c command line, so that $(pkg-config ...) is expanded as a user's
// shell would.
test::CommandResult sh(const std::string& command) { return run_command({"/bin/sh", "-c", command}); }

class PackageTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    s_dest = test::make_temp_dir("tiermem-install");
    auto install = run_command({"meson", "install", "-C", build_root(), "--no-rebuild", "--quiet", "--destdir", s_dest});
    ASSERT_EQ(install.exit_code, 0) << install.out << install.err;
    for (const auto& e : fs::recursive_directory_iterator(s_dest)) {
      if (e.path().filename() == "tiermem.pc") s_pc_dir = e.path().parent_path().string();
      if (e.path().filename() == "libtiermem.so") s_lib_dir = e.path().parent_path().string();
    }
    ASSERT_FALSE(s_pc_dir.empty()) << "no tiermem.pc installed under " << s_dest;
    ASSERT_FALSE(s_lib_dir.empty()) << "no libtiermem.so installed under " << s_dest;
  }
  static void TearDownTestSuite() { fs::remove_all(s_dest); }

  void SetUp() override { ASSERT_TRUE(m_daemon.ready()) << m_daemon.log(); }

  // pkg-config of the tree under `sysroot` (the DESTDIR, or a copy of it).
  static std::string pkg_config_env(const std::string& sysroot, const std::string& pc_dir) {
    return "PKG_CONFIG_SYSROOT_DIR=" + shell_quote(sysroot) + " PKG_CONFIG_PATH=" + shell_quote(pc_dir) +
           " PKG_CONFIG_LIBDIR=/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/lib/pkgconfig:/usr/share/pkgconfig";
  }

  // Builds the shipped example with only the flags pkg-config gives (and no
  // -std: the .pc must bring it), returns the program's path.
  static std::string build_example(const std::string& env, const std::string& pkg_args, const std::string& out) {
    const std::string example = std::string(TIERMEM_SOURCE_ROOT) + "/client/examples/tiermem_example.cpp";
    auto cc = sh(env + " sh -c 'exec g++ " + shell_quote(example) + " -o " + shell_quote(out) +
                 " $(pkg-config " + pkg_args + " tiermem)'");
    EXPECT_EQ(cc.exit_code, 0) << cc.out << cc.err;
    return out;
  }

  test::CommandResult run_example(const std::string& program, const std::string& lib_path) {
    return run_command({"env", "LD_LIBRARY_PATH=" + lib_path, "TIERMEM_SOCKET=" + m_daemon.socket(), program});
  }

  static std::string s_dest, s_pc_dir, s_lib_dir;
  test::TestDaemon m_daemon;
};
std::string PackageTest::s_dest, PackageTest::s_pc_dir, PackageTest::s_lib_dir;

TEST_F(PackageTest, CflagsCarryTheLanguageStandardTheHeadersNeed) {
  auto flags = sh(pkg_config_env(s_dest, s_pc_dir) + " pkg-config --cflags tiermem");
  ASSERT_EQ(flags.exit_code, 0) << flags.err;
  EXPECT_NE(flags.out.find("-std=c++20"), std::string::npos) << flags.out;
}

TEST_F(PackageTest, SharedConsumerBuildsWithPkgConfigAloneAndRuns) {
  const std::string program = build_example(pkg_config_env(s_dest, s_pc_dir), "--cflags --libs", s_dest + "/example_shared");
  auto ldd = run_command({"env", "LD_LIBRARY_PATH=" + s_lib_dir, "ldd", program});
  EXPECT_NE(ldd.out.find("libtiermem.so.0 => " + s_lib_dir), std::string::npos) << ldd.out;
  auto run = run_example(program, s_lib_dir);
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("dram "), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("MISMATCH"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("identical"), std::string::npos) << run.out;
}

TEST_F(PackageTest, StaticConsumerLinksWithPkgConfigStatic) {
  // A tree with the archive only, so that -ltiermem can only mean libtiermem.a.
  const std::string tree = s_dest + "-static";
  fs::remove_all(tree);
  fs::copy(s_dest, tree, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  std::string lib_dir = tree + s_lib_dir.substr(s_dest.size());
  for (const auto& e : fs::directory_iterator(lib_dir)) {
    if (e.path().filename().string().rfind("libtiermem.so", 0) == 0) fs::remove(e.path());
  }
  const std::string pc_dir = tree + s_pc_dir.substr(s_dest.size());
  const std::string program = build_example(pkg_config_env(tree, pc_dir), "--static --cflags --libs", tree + "/example_static");
  auto ldd = run_command({"ldd", program});
  EXPECT_EQ(ldd.out.find("libtiermem"), std::string::npos) << "linked statically: " << ldd.out;
  auto run = run_example(program, "");
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("identical"), std::string::npos) << run.out;
  EXPECT_EQ(run.out.find("MISMATCH"), std::string::npos) << run.out;
  fs::remove_all(tree);
}

// The CMake package as installed: find_package(tiermem 0.1) from the
// DESTDIR's <libdir>/cmake/tiermem gives tiermem::tiermem (the shared
// library) and tiermem::tiermem_static (the archive, with its dependencies);
// the example builds against each with nothing else said, and runs; a
// version the package is not is refused.
TEST_F(PackageTest, CMakeConsumerFindsTheSharedAndTheStaticTarget) {
  std::string config_dir;
  for (const auto& e : fs::recursive_directory_iterator(s_dest)) {
    if (e.path().filename() == "tiermemConfig.cmake") config_dir = e.path().parent_path().string();
  }
  ASSERT_FALSE(config_dir.empty()) << "no tiermemConfig.cmake installed under " << s_dest;
  EXPECT_TRUE(fs::exists(config_dir + "/tiermemConfigVersion.cmake"));
  const std::string dir = s_dest + "-cmake";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(std::string(TIERMEM_SOURCE_ROOT) + "/client/examples/tiermem_example.cpp", dir + "/example.cpp");
  auto project = [&](const std::string& version) {
    std::ofstream(dir + "/CMakeLists.txt")
        << "cmake_minimum_required(VERSION 3.16)\nproject(consumer CXX)\nfind_package(tiermem " << version
        << " REQUIRED)\nadd_executable(example_shared example.cpp)\n"
           "target_link_libraries(example_shared PRIVATE tiermem::tiermem)\n"
           "add_executable(example_static example.cpp)\n"
           "target_link_libraries(example_static PRIVATE tiermem::tiermem_static)\n";
    fs::remove_all(dir + "/build");
    return run_command({"cmake", "-S", dir, "-B", dir + "/build", "-Dtiermem_DIR=" + config_dir});
  };
  auto configured = project("0.1");
  ASSERT_EQ(configured.exit_code, 0) << configured.out << configured.err;
  auto built = run_command({"cmake", "--build", dir + "/build", "-j", "2"});
  ASSERT_EQ(built.exit_code, 0) << built.out << built.err;
  auto shared = run_example(dir + "/build/example_shared", s_lib_dir);
  EXPECT_EQ(shared.exit_code, 0) << shared.out << shared.err;
  EXPECT_NE(shared.out.find("identical"), std::string::npos) << shared.out;
  auto ldd_shared = run_command({"env", "LD_LIBRARY_PATH=" + s_lib_dir, "ldd", dir + "/build/example_shared"});
  EXPECT_NE(ldd_shared.out.find("libtiermem.so.0"), std::string::npos) << ldd_shared.out;
  {
    // The example keeps its named allocations: gone before it runs again.
    auto c = Client::connect({.socket_path = m_daemon.socket()});
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    auto all = (*c)->list();
    ASSERT_TRUE(all.ok());
    for (const AllocationInfo& a : *all) {
      if (a.name.rfind("example-", 0) == 0) {
        EXPECT_TRUE((*c)->free(a.gva).ok()) << a.name;
      }
    }
  }
  auto ldd_static = run_command({"ldd", dir + "/build/example_static"});
  EXPECT_EQ(ldd_static.out.find("libtiermem"), std::string::npos) << "linked statically: " << ldd_static.out;
  auto statically = run_example(dir + "/build/example_static", "");
  EXPECT_EQ(statically.exit_code, 0) << statically.out << statically.err;
  EXPECT_NE(statically.out.find("identical"), std::string::npos) << statically.out;
  auto too_new = project("9.0");
  EXPECT_NE(too_new.exit_code, 0) << "a version the package is not was taken";
  EXPECT_NE((too_new.out + too_new.err).find("tiermem"), std::string::npos) << too_new.out << too_new.err;
  fs::remove_all(dir);
}

// The Python package as `meson install` lays it out: imported from the
// DESTDIR's site-packages (not the build tree) with the installed
// libtiermem.so, it talks to a daemon.
TEST_F(PackageTest, InstalledPythonPackageImportsAndWorks) {
  if (!TIERMEM_HAVE_PYTHON) GTEST_SKIP() << "the Python module is not built (see the build summary)";
  std::string site;
  for (const auto& e : fs::recursive_directory_iterator(s_dest)) {
    if (e.path().filename().string().rfind("_tiermem.", 0) == 0) site = e.path().parent_path().parent_path().string();
  }
  ASSERT_FALSE(site.empty()) << "no _tiermem extension installed under " << s_dest;
  const std::string script =
      "import tiermem, sys\n"
      "assert tiermem.__file__.startswith(sys.argv[1]), tiermem.__file__\n"
      "with tiermem.connect() as c:\n"
      "    with c.alloc(4096) as a:\n"
      "        c.write(a, b'installed')\n"
      "        print(c.read(a, 9).decode(), tiermem.__file__)\n";
  auto run = run_command({"env", "PYTHONPATH=" + site, "LD_LIBRARY_PATH=" + s_lib_dir,
                          "TIERMEM_SOCKET=" + m_daemon.socket(), "/usr/bin/python3", "-c", script, site});
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("installed " + site), std::string::npos) << run.out << run.err;
}

// The systemd unit as installed: generated for the prefix (ExecStart names
// the installed tiermemd), clean under `systemd-analyze verify`, and
// hardened to an exposure of at most 4.0 (`systemd-analyze security`).
TEST_F(PackageTest, InstalledUnitVerifiesAndIsHardened) {
  if (test::run_command({"/bin/sh", "-c", "command -v systemd-analyze"}).exit_code != 0) {
    GTEST_SKIP() << "no systemd-analyze here (Debian's systemd package)";
  }
  std::string unit, tiermemd;
  for (const auto& e : fs::recursive_directory_iterator(s_dest)) {
    if (e.path().filename() == "tiermemd.service") unit = e.path().string();
    if (e.path().filename() == "tiermemd" && e.path().parent_path().filename() == "sbin") tiermemd = e.path().string();
  }
  ASSERT_FALSE(unit.empty()) << "no tiermemd.service installed under " << s_dest;
  ASSERT_FALSE(tiermemd.empty()) << "no sbin/tiermemd installed under " << s_dest;
  std::ifstream in(unit);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string installed = tiermemd.substr(s_dest.size());  // its path on the target system
  EXPECT_NE(text.find("ExecStart=" + installed + " --config "), std::string::npos) << text;
  EXPECT_FALSE(std::regex_search(text, std::regex("@[A-Z]+@"))) << "an unsubstituted @VARIABLE@:\n" << text;
  // verify resolves ExecStart= and the units it orders against under --root:
  // the DESTDIR, with this system's units and kill (ExecReload) beside it.
  const std::string root = s_dest + "-verify";
  fs::remove_all(root);
  fs::copy(s_dest, root, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  fs::create_directories(root + "/usr/lib/systemd/system");
  fs::copy("/usr/lib/systemd/system", root + "/usr/lib/systemd/system",
           fs::copy_options::recursive | fs::copy_options::copy_symlinks | fs::copy_options::skip_existing);
  fs::create_directories(root + "/bin");
  fs::copy_file("/bin/kill", root + "/bin/kill", fs::copy_options::overwrite_existing);
  auto verify = run_command({"systemd-analyze", "verify", "--root=" + root, unit.substr(s_dest.size())});
  fs::remove_all(root);
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  EXPECT_EQ(verify.err.find("tiermemd.service"), std::string::npos) << "warnings about the unit:\n" << verify.err;
  auto security = run_command({"systemd-analyze", "security", "--offline=yes", "--threshold=40", unit});
  EXPECT_EQ(security.exit_code, 0) << security.out << security.err;
  std::smatch score;
  ASSERT_TRUE(std::regex_search(security.out, score, std::regex("Overall exposure level for \\S+: ([0-9.]+)")))
      << security.out << security.err;
  EXPECT_LE(std::stod(score[1]), 4.0) << security.out;
  std::printf("systemd-analyze security: %s\n", score[1].str().c_str());
}

// The exported symbols are the public API (include/tiermem/) and nothing of
// what is linked in below it: no protobuf, no internal class or namespace.
TEST_F(PackageTest, SharedLibraryExportsOnlyThePublicApi) {
  auto nm = run_command({"nm", "-DC", "--defined-only", s_lib_dir + "/libtiermem.so"});
  ASSERT_EQ(nm.exit_code, 0) << nm.err;
  const std::regex internal(
      "google::protobuf|tiermem::(proto|wire|ucx_detail|transport_detail|detail::ClientCore|exec)|ClientCore|AddressSpace|"
      "RpcConnection|UcxTransport|RemoteVersionWords|RemoteFrameData|LocalVersionWords|copy_through_layout|"
      "seqlocked_");
  // The public names (and a private constructor of a public class).
  const std::regex public_api(
      "tiermem::(Client|Mapping|Batch|Status|Gva|detail::abort_on_error_value|error_code_name|tier_name|parse_tier|"
      "page_flags_text|node_state_name|node_health_name|replica_state_name|qos_class_name|parse_qos_class|parse_size|format_size|format_rate)\\b");
  std::istringstream lines(nm.out);
  std::string line;
  size_t exported = 0;
  while (std::getline(lines, line)) {
    EXPECT_FALSE(std::regex_search(line, internal)) << "internal symbol exported: " << line;
    if (line.find("tiermem::") == std::string::npos) continue;
    ++exported;
    EXPECT_TRUE(std::regex_search(line, public_api)) << "not part of the public API: " << line;
  }
  EXPECT_GT(exported, 20u) << nm.out;
}

}  // namespace
}  // namespace tiermem
