// Tenants made of real users for the security tests: two system users made
// once (tiermem-alice, tiermem-bob), and TenantTest, which runs one
// libtiermem call as either of them (tests/support/tenant_probe.cpp under
// setpriv) and reads its outcome. Needs root (useradd, setpriv); skips
// otherwise.
#pragma once

#include <pwd.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <tiermem/status.h>

#include "tests/support/test_daemon.hpp"

namespace tiermem::test {

inline uint32_t code(ErrorCode c) { return static_cast<uint32_t>(c); }

struct User {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
};

// A system user made for the test (kept: users are cheap, and a second run
// finds them).
inline std::optional<User> ensure_user(const std::string& name) {
  if (::getpwnam(name.c_str()) == nullptr) {
    auto r = run_command({"useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name});
    if (r.exit_code != 0) return std::nullopt;
  }
  const passwd* pw = ::getpwnam(name.c_str());
  if (pw == nullptr) return std::nullopt;
  return User{name, pw->pw_uid, pw->pw_gid};
}

// The outcome of one probe call.
struct Outcome {
  bool ok = false;
  uint32_t code = 0;
  std::string text;  // the result, or the error message
};

class TenantTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (::geteuid() != 0) return;
    s_alice = ensure_user("tiermem-alice");
    s_bob = ensure_user("tiermem-bob");
    // The probe runs as them: a copy they may execute.
    s_probe_dir = make_temp_dir("tiermem-probe");
    std::filesystem::permissions(s_probe_dir, std::filesystem::perms(0755));
    const char* probe = std::getenv("TIERMEM_PROBE");
    if (probe != nullptr) {
      std::filesystem::copy_file(probe, s_probe_dir + "/tenant_probe");
      std::filesystem::permissions(s_probe_dir + "/tenant_probe", std::filesystem::perms(0755));
    }
    if (const char* plane = std::getenv("TIERMEM_PLANE_PROBE"); plane != nullptr) {
      std::filesystem::copy_file(plane, s_probe_dir + "/plane_probe");
      std::filesystem::permissions(s_probe_dir + "/plane_probe", std::filesystem::perms(0755));
    }
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    if (!s_probe_dir.empty()) std::filesystem::remove_all(s_probe_dir, ec);
  }
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "making users needs root";
    if (!s_alice || !s_bob) GTEST_SKIP() << "useradd failed";
    ASSERT_TRUE(std::filesystem::exists(s_probe_dir + "/tenant_probe")) << "TIERMEM_PROBE is not set";
  }

  static std::string tenants_toml() {
    return "[[tenant]]\nname = \"alice\"\nuids = [" + std::to_string(s_alice->uid) +
           "]\nquota = { dram = \"8MiB\" }\n[[tenant]]\nname = \"bob\"\nuids = [" + std::to_string(s_bob->uid) +
           "]\n";
  }
  // Lets the users reach the daemon's socket.
  static void open_to_users(const TestDaemon& d) {
    std::filesystem::permissions(d.dir(), std::filesystem::perms(0755));
  }

  // One call as `user` (nullptr: as root, an operator).
  // `group`: a supplementary group it has (else none).
  // `program`: the probe (tenant_probe, or plane_probe).
  Outcome as(const User* user, const std::string& socket, std::vector<std::string> args,
             std::optional<gid_t> group = std::nullopt, const std::string& program = "tenant_probe") {
    std::vector<std::string> argv;
    if (user != nullptr) {
      argv = {"setpriv", "--reuid=" + std::to_string(user->uid), "--regid=" + std::to_string(user->gid),
              group ? "--groups=" + std::to_string(*group) : "--clear-groups"};
    }
    argv.push_back(s_probe_dir + "/" + program);
    argv.push_back(socket);
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run_command(argv);
    Outcome o;
    std::istringstream in(r.out);
    std::string word;
    in >> word;
    if (word == "ok") {
      o.ok = true;
      std::getline(in >> std::ws, o.text);
    } else if (word == "error") {
      in >> o.code;
      std::getline(in >> std::ws, o.text);
    } else {
      o.text = "probe failed (rc " + std::to_string(r.exit_code) + "): " + r.out + r.err;
    }
    while (!o.text.empty() && std::isspace(static_cast<unsigned char>(o.text.back()))) o.text.pop_back();
    return o;
  }

  // Every request bob may make on alice's allocation at `gva` is refused,
  // naming both tenants. `home`: the socket is of the allocation's node
  // (mappings and lookups by name are of local memory only).
  void expect_all_refused(const std::string& socket, const std::string& gva, const std::string& name, bool home) {
    std::vector<std::vector<std::string>> attempts = {
        {"--daemon", "read", gva, "8"}, {"--direct", "read", gva, "8"},     {"--daemon", "write", gva, "bob was here"},
        {"--direct", "write", gva, "bob was here"}, {"translate", gva},      {"fetch_add", gva},
        {"compare_swap", gva},       {"migrate", gva, "pmem"},             {"free", gva},
    };
    if (home) {
      attempts.push_back({"map", gva});
      attempts.push_back({"lookup", name});
    }
    for (const auto& args : attempts) {
      const Outcome o = as(&*s_bob, socket, args);
      std::string what;
      for (const auto& a : args) what += a + " ";
      EXPECT_FALSE(o.ok) << "bob may " << what << ": " << o.text;
      EXPECT_EQ(o.code, code(ErrorCode::permission_denied)) << what << ": " << o.text;
      EXPECT_NE(o.text.find("tenant 'bob'"), std::string::npos) << what << ": " << o.text;
      EXPECT_NE(o.text.find("'alice'"), std::string::npos) << what << ": " << o.text;
    }
    const Outcome listed = as(&*s_bob, socket, {"list"});
    ASSERT_TRUE(listed.ok) << listed.text;
    EXPECT_EQ(listed.text.find(gva), std::string::npos) << "bob's listing shows alice's allocation";
  }

  static inline std::optional<User> s_alice, s_bob;
  static inline std::string s_probe_dir;
};

}  // namespace tiermem::test
