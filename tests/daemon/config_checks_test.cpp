// tiermemd --check-config checks what a start would trip over (issue 28):
// every file it passes starts, and every file a start refuses for something
// it could see, it refuses first, with the same message naming the file, the
// key, its value and what is expected. Real tiermemd processes; the start of
// a refused file must commit nothing (its memory directories stay unmade).
#include "daemon/config_checks.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "common/cuda_driver.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

bool has_gpu() {
  std::string why;
  const cuda::Driver* d = cuda::load_driver(&why);
  int count = 0;
  return d != nullptr && d->device_get_count(&count) == cuda::k_success && count > 0;
}

class ConfigChecksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_dir = test::make_temp_dir("tiermem-checks");
    ASSERT_FALSE(m_dir.empty());
    const std::string shm = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : m_dir;
    m_shm = test::make_temp_dir_in(shm, "tiermem-checks");
    m_dram = m_shm + "/dram";
    m_pmem = m_shm + "/pmem";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(m_dir, ec);
    std::filesystem::remove_all(m_shm, ec);
  }

  // A configuration that starts, with `extra` appended (new tables, or keys
  // that replace the base's: the base writes each table once, and TOML
  // refuses a key twice, so callers replace through `dram`, `pmem`, ...).
  std::string write(const std::string& name, const std::string& extra, const std::string& socket = "",
                    const std::string& dram = "", const std::string& pmem = "") {
    const std::string path = m_dir + "/" + name + ".toml";
    std::ofstream(path) << "[control]\nsocket = \"" << (socket.empty() ? m_dir + "/" + name + ".sock" : socket)
                        << "\"\n[tiers.vram]\nenabled = false\n[tiers.dram]\ncapacity = \"8MiB\"\npath = \""
                        << (dram.empty() ? m_dram : dram) << "\"\n[tiers.pmem]\ncapacity = \"8MiB\"\npath = \""
                        << (pmem.empty() ? m_pmem : pmem) << "\"\n"
                        << extra;
    return path;
  }

  // A two-node cluster file naming this node (1) and a peer.
  std::string cluster_file() {
    const std::string path = m_dir + "/cluster.toml";
    std::ofstream(path) << "[[node]]\nid = 1\ncontrol = \"127.0.0.1:" << test::free_port()
                        << "\"\n[[node]]\nid = 2\ncontrol = \"127.0.0.1:" << test::free_port() << "\"\n";
    return path;
  }
  std::string with_secret(const std::string& secret) {
    return "[cluster]\nfile = \"" + cluster_file() + "\"\nsecret_file = \"" + secret + "\"\n";
  }

  // --check-config refuses `path` (exit 2) saying each of `said`, and a
  // start refuses it the same way before it makes anything.
  void expect_refused(const std::string& path, const std::vector<std::string>& said) {
    SCOPED_TRACE(path);
    auto check = test::run_command({test::tiermemd_path(), "--check-config", "--config", path});
    EXPECT_EQ(check.exit_code, 2) << check.out << check.err;
    EXPECT_EQ(check.out.find("configuration is valid"), std::string::npos) << check.out;
    // A start that is not refused serves until `timeout` ends it (124).
    auto start = test::run_command({"timeout", "20", test::tiermemd_path(), "--config", path});
    EXPECT_EQ(start.exit_code, 2) << start.err;
    for (const std::string& s : said) {
      EXPECT_NE(check.err.find(s), std::string::npos) << "--check-config lacks '" << s << "':\n" << check.err;
      EXPECT_NE(start.err.find(s), std::string::npos) << "the start lacks '" << s << "':\n" << start.err;
    }
    EXPECT_FALSE(std::filesystem::exists(m_dram)) << "a refused start made the shared memory directory";
    EXPECT_FALSE(std::filesystem::exists(m_pmem)) << "a refused start made the PMEM directory";
  }

  std::string m_dir, m_shm, m_dram, m_pmem;
};

TEST_F(ConfigChecksTest, ASecretFileOthersCanReadIsRefused) {
  const std::string secret = test::write_secret(m_dir);
  ASSERT_EQ(::chmod(secret.c_str(), 0644), 0);
  const std::string path = write("open", with_secret(secret));
  expect_refused(path, {path + ": cluster.secret_file = \"" + secret +
                            "\": mode 0644 lets other users read the cluster secret",
                        "expected a regular file of mode 0600 (chmod 600 " + secret + ")"});
}

TEST_F(ConfigChecksTest, AnEmptyMissingOrDirectorySecretIsRefused) {
  const std::string empty = m_dir + "/empty.secret";
  std::ofstream(empty).close();
  ASSERT_EQ(::chmod(empty.c_str(), 0600), 0);
  expect_refused(write("empty", with_secret(empty)),
                 {"cluster.secret_file = \"" + empty + "\": holds 0 byte(s) of secret (it is empty); expected at "
                  "least 16"});
  const std::string missing = m_dir + "/missing.secret";
  expect_refused(write("missing", with_secret(missing)),
                 {"cluster.secret_file = \"" + missing + "\": does not exist; expected a regular file of mode 0600"});
  const std::string dir = m_dir + "/secret.d";
  std::filesystem::create_directory(dir);
  expect_refused(write("dir", with_secret(dir)),
                 {"cluster.secret_file = \"" + dir + "\": is a directory; expected a regular file of mode 0600"});
  expect_refused(write("unset", with_secret("")),
                 {"cluster.secret_file is not set, and a daemon with peers needs it"});
}

TEST_F(ConfigChecksTest, AnAdminGroupThatIsNoGroupIsRefused) {
  const std::string path = write("admin", "[tenants]\nadmin_group = \"no-such-group-tiermem\"\n");
  expect_refused(path, {path + ": tenants.admin_group = \"no-such-group-tiermem\": is not a group on this machine; "
                               "expected a group's name or number"});
}

TEST_F(ConfigChecksTest, ASocketThatCannotBeMadeOrIsAFileIsRefused) {
  const std::string file = m_dir + "/plain";
  std::ofstream(file) << "precious\n";
  expect_refused(write("under", "", file + "/tiermemd.sock"),
                 {"control.socket = \"" + file + "/tiermemd.sock\": " + file +
                  " is a regular file, not a directory, so the socket cannot be made there"});
  // The daemon used to unlink whatever was there (nobody listens on a
  // regular file) and bind in its place.
  expect_refused(write("file", "", file),
                 {"control.socket = \"" + file + "\": is a regular file, not a socket, and the daemon replaces "
                  "nothing else"});
  std::ifstream in(file);
  std::string kept;
  std::getline(in, kept);
  EXPECT_EQ(kept, "precious") << "the file named as socket is left alone";
}

TEST_F(ConfigChecksTest, TierDirectoriesThatAreNoDirectoriesAreRefused) {
  expect_refused(write("pmem", "", "", "", "/dev/null"),
                 {"tiers.pmem.path = \"/dev/null\": is a character device, not a directory; expected a directory "
                  "for the PMEM pools"});
  expect_refused(write("dram", "", "", "/dev/null"),
                 {"tiers.dram.path = \"/dev/null\": is a character device, not a directory; expected a directory "
                  "for the node's shared memory"});
  expect_refused(write("dram_under", "", "", "/dev/null/dram"),
                 {"tiers.dram.path = \"/dev/null/dram\": /dev/null is a character device, so the directory cannot "
                  "be made"});
}

TEST_F(ConfigChecksTest, VramRequiredWithoutAGpuIsRefused) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is here: the VRAM tier can start";
  const std::string path = m_dir + "/vram.toml";
  std::ofstream(path) << "[control]\nsocket = \"" << m_dir << "/vram.sock\"\n[tiers.vram]\nenabled = true\n"
                      << "required = true\n[tiers.dram]\ncapacity = \"8MiB\"\npath = \"" << m_dram
                      << "\"\n[tiers.pmem]\ncapacity = \"8MiB\"\npath = \"" << m_pmem << "\"\n";
  expect_refused(path, {path + ": tiers.vram.required = true: no GPU the daemon can use here",
                        "expected a machine with a CUDA GPU and its driver, or required = false"});
}

TEST_F(ConfigChecksTest, AMetadataPathThatIsADirectoryIsRefused) {
  const std::string dir = m_dir + "/meta";
  std::filesystem::create_directory(dir);
  // It used to say "negative size" (PMDK's word for a directory).
  expect_refused(write("meta", "[metadata]\npath = \"" + dir + "\"\n"),
                 {"metadata.path = \"" + dir + "\": is a directory; expected the pool's file (such as " + dir +
                  "/metadata.pool)"});
  expect_refused(write("meta_dir", "[metadata]\npath = \"" + m_dir + "/none/metadata.pool\"\n"),
                 {"its directory " + m_dir + "/none does not exist", "mkdir -p " + m_dir + "/none"});
}

TEST_F(ConfigChecksTest, UnknownTransportsAndDevicesAreRefused) {
  // It used to say "ucp_init: No such device".
  expect_refused(write("tls", "[transport]\ntls = \"bogus\"\n"),
                 {"transport.tls = \"bogus\": UCX knows no transport 'bogus'; expected \"all\" or a comma-separated "
                  "list of self, tcp,"});
  expect_refused(write("tls_empty", "[transport]\ntls = \"tcp,\"\n"),
                 {"transport.tls = \"tcp,\": an empty transport name"});
  // It used to start with only a UCX warning.
  expect_refused(write("devices", "[transport]\ndevices = \"nonexistent0\"\n"),
                 {"transport.devices = \"nonexistent0\": no device nonexistent0 on this machine; expected \"all\" "
                  "or a comma-separated list of this machine's devices (",
                  "lo"});
  expect_refused(write("port", "[transport]\ndevices = \"lo:x\"\n"), {"'x' after lo: is not a port number"});
}

TEST(TransportNamesTest, UcxNamesAndAliasesAreAcceptedOthersAreNot) {
  for (const std::string ok : {"", "all", "tcp", "sm,tcp", "^sm,tcp", "rc_x,dc_x,self", "^ib", "cuda,rocm,ugni"}) {
    EXPECT_TRUE(check_transport_names(ok, "t.toml").ok()) << ok;
  }
  for (const std::string bad : {"bogus", "tcp,bogus", "^", "tcp,", "^all", "TCP", "tcp sm", "rdmacm"}) {
    const Status s = check_transport_names(bad, "t.toml");
    EXPECT_EQ(s.code(), ErrorCode::config_error) << bad;
    EXPECT_EQ(s.message().rfind("t.toml: transport.tls = \"" + bad + "\": ", 0), 0u) << s.message();
  }
}

// A transport UCX knows but cannot use here: the start names the key, not
// only UCX's words.
TEST_F(ConfigChecksTest, ATransportUcxCannotStartIsToldByItsKey) {
  if (std::filesystem::exists("/sys/class/infiniband")) GTEST_SKIP() << "RDMA devices here: rc may start";
  const std::string path = write("rc", "[transport]\ntls = \"rc\"\n");
  auto check = test::run_command({test::tiermemd_path(), "--check-config", "--config", path});
  EXPECT_EQ(check.exit_code, 0) << check.err;
  EXPECT_NE(check.out.find("that UCX starts on this machine's devices with transport.tls = \"rc\""), std::string::npos)
      << "says that only a start can check it:\n" << check.out;
  auto start = test::run_command({"timeout", "20", test::tiermemd_path(), "--config", path});
  EXPECT_EQ(start.exit_code, 1) << start.err;
  EXPECT_NE(start.err.find(path + ": transport.tls = \"rc\": UCX could not start with this (starting the data plane "
                                  "(ucx): ucp_init:"),
            std::string::npos)
      << start.err;
}

// libfabric: --check-config leaves the provider to the start, and a start
// whose provider cannot run says so by the keys that chose it.
TEST_F(ConfigChecksTest, ALibfabricProviderThatCannotStartIsToldByItsKeys) {
  const std::string path =
      write("ofi", "[transport]\nfabric = \"libfabric\"\nprovider = \"no_such_provider\"\n");
  auto check = test::run_command({test::tiermemd_path(), "--check-config", "--config", path});
  EXPECT_EQ(check.exit_code, 0) << check.err;
  EXPECT_NE(check.out.find("that libfabric's provider \"no_such_provider\" (transport.provider) starts on this "
                           "machine's devices"),
            std::string::npos)
      << "says that only a start can check it:\n" << check.out;
  auto start = test::run_command({"timeout", "20", test::tiermemd_path(), "--config", path});
  EXPECT_EQ(start.exit_code, 1) << start.err;
  EXPECT_NE(start.err.find(path + ": transport.fabric = \"libfabric\" with transport.provider = "
                                  "\"no_such_provider\": the data plane could not start ("),
            std::string::npos)
      << start.err;
  EXPECT_FALSE(std::filesystem::exists(m_dram)) << "a refused start commits nothing";
}

// What passes starts; --check-config passes while a daemon serves on the
// same file (systemd's ExecStartPre runs it before each start), and says what
// only the start can check.
TEST(ConfigChecksServeTest, AValidConfigurationPassesAndStarts) {
  test::DaemonOptions o;
  o.tls = "tcp,sm,self";
  o.extra_toml = "devices = \"lo\"\n";  // into [transport], the last table written
  test::TestDaemon daemon(o);
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto check = test::run_command({test::tiermemd_path(), "--check-config", "--config", daemon.config_path()});
  EXPECT_EQ(check.exit_code, 0) << check.err;
  EXPECT_NE(check.out.find(daemon.config_path() + ": configuration is valid"), std::string::npos) << check.out;
  EXPECT_NE(check.out.find("only a start can check:\n  that no other tiermemd holds tiers.dram.path " +
                           daemon.dram_dir()),
            std::string::npos)
      << check.out;
  EXPECT_TRUE(check.err.empty()) << check.err;
}

// Two daemons given one metadata.path (and directories of their own): the
// second says who holds the pool and which key to change, and the first
// serves on.
TEST(ConfigChecksServeTest, ASharedMetadataPoolIsRefusedNamingItsHolder) {
  const std::string dir = test::make_temp_dir("tiermem-shared-pool");
  const std::string pool = dir + "/metadata.pool";
  test::DaemonOptions o;
  o.extra_toml = "[metadata]\npath = \"" + pool + "\"\n";
  test::TestDaemon first(o);
  ASSERT_TRUE(first.ready()) << first.log();
  o.node_id = 2;
  test::TestDaemon second(o);
  EXPECT_FALSE(second.ready()) << "two daemons share one pool";
  EXPECT_NE(second.log().find("metadata pool " + pool + " is in use by another tiermemd (pid " +
                              std::to_string(first.pid()) + "); two daemons must never share one: give each daemon "
                                                            "its own metadata.path"),
            std::string::npos)
      << second.log();
  EXPECT_NE(first.connect(), nullptr) << "the first daemon serves on";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tiermem
