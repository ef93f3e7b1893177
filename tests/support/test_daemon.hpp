// Starts a real tiermemd for a test: a temporary directory holds its config,
// socket and PMEM pool; the process is stopped (SIGTERM, then SIGKILL) when
// the object goes away. Paths of the binaries come from the environment that
// meson test sets (TIERMEMD, TIERMEMCTL).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <tiermem/client.h>

namespace tiermem::test {

struct DaemonOptions {
  int node_id = 1;
  std::string dram = "64MiB";
  std::string pmem = "64MiB";
  std::string page_size = "2MiB";
  std::string max_frame = "4MiB";
  std::string max_inline = "1MiB";
  bool vram = false;
  std::string vram_capacity = "256MiB";
  int vram_device = 0;  // [tiers.vram] device (the CUDA ordinal)
  std::string extra_toml;  // appended verbatim (new tables only)
  std::string control_toml;  // keys added to [control]
  std::string mapping_toml;  // keys added to [mapping] (sub_page_max = "0", ...)
  std::string cluster_file;  // [cluster] file; empty: alone
  std::string secret_file;   // [cluster] secret_file (TestCluster writes one)
  // [cluster] timing keys
  std::string cluster_timing = "reconnect_interval_ms = 200\nheartbeat_interval_ms = 300\npeer_timeout_ms = 3000\n";
  std::string tls;           // [transport] tls
  std::string fabric;        // [transport] fabric ("ucx", "libfabric"); empty: the default (ucx)
  std::string provider;      // [transport] provider (libfabric's)
  std::string dir;           // working directory; empty: a new temporary one
  std::string shm_parent;    // where its DRAM and PMEM directories go; empty: /dev/shm
  bool metrics = false;      // [metrics] listen on 127.0.0.1 and a free port (metrics_port())
  // Prefix for the command (e.g. {"ip", "netns", "exec", "ns1"}).
  std::vector<std::string> wrapper;

  // These options over the fabric a fault test's parameter names: "ucx"
  // (UCX as the daemon chooses it: shared memory and TCP), "ofi-tcp"
  // (libfabric's tcp;ofi_rxm) or "ofi-shm" (libfabric's shm).
  DaemonOptions& over(const std::string& fabric_param) {
    if (fabric_param.rfind("ofi-", 0) == 0) {
      fabric = "libfabric";
      provider = fabric_param == "ofi-tcp" ? "tcp;ofi_rxm" : fabric_param.substr(4);
      tls.clear();
    }
    return *this;
  }
};

// The fabrics the fault and durability suites' remote cases run over, and
// GoogleTest's names for them (which take no '-').
inline const std::string k_fault_fabrics[] = {"ucx", "ofi-tcp", "ofi-shm"};
inline std::string fabric_name(const std::string& param) {
  std::string name = param;
  for (char& c : name) c = c == '-' ? '_' : c;
  return name;
}

class TestDaemon {
 public:
  explicit TestDaemon(const DaemonOptions& options = {});
  ~TestDaemon();
  TestDaemon(const TestDaemon&) = delete;
  TestDaemon& operator=(const TestDaemon&) = delete;

  // True once the daemon answers on its socket (waits up to 10 s).
  bool ready() const { return m_ready; }
  const std::string& socket() const { return m_socket; }
  const std::string& dir() const { return m_dir; }
  const std::string& dram_dir() const { return m_dram_dir; }
  const std::string& pmem_dir() const { return m_pmem_dir; }
  const std::string& config_path() const { return m_config; }
  const std::string& log_path() const { return m_log; }
  std::string log() const;
  pid_t pid() const { return m_pid; }
  // The Prometheus endpoint's port (DaemonOptions::metrics), else 0.
  int metrics_port() const { return m_metrics_port; }
  // True while the process has not exited.
  bool alive();

  std::unique_ptr<Client> connect(const std::string& name = "test") const;
  // Sends SIGTERM and waits; returns the exit status (or -1).
  int stop();
  // SIGKILL, no clean-up by the daemon.
  void kill();
  // Starts the same daemon again (same config, socket and pool).
  bool restart();

 private:
  bool start();

  DaemonOptions m_options;
  std::string m_config;
  bool m_own_dir = true;
  std::string m_pmem_dir;  // on /dev/shm, removed with the daemon
  std::string m_dram_dir;  // the node's shared memory, on /dev/shm
  std::string m_dir;
  std::string m_socket;
  std::string m_log;
  pid_t m_pid = -1;
  int m_metrics_port = 0;
  std::string m_ended;  // how the process ended on its own, for log()
  bool m_ready = false;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs a program (a path, or a name looked up in PATH) with arguments,
// feeding `input` on stdin; captures output.
CommandResult run_command(const std::vector<std::string>& argv, const std::string& input = "");
// Runs tiermemctl against `socket`.
CommandResult run_ctl(const std::string& socket, const std::vector<std::string>& args,
                      const std::string& input = "");

// A few daemons forming one cluster on this machine (loopback TCP).
class TestCluster {
 public:
  // `nodes` daemons with ids 1..nodes; `base` options apply to each.
  TestCluster(int nodes, const DaemonOptions& base = {});
  // The same, with each node's control address ("host:port") and options of
  // the caller's choice (tests/support/netns.hpp).
  TestCluster(int nodes, const DaemonOptions& base, const std::function<std::string(int id)>& control,
              const std::function<void(int id, DaemonOptions&)>& place);
  ~TestCluster();
  bool ready() const;
  // Waits until every daemon sees every other as connected.
  bool wait_connected(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  TestDaemon& node(int id) { return *m_daemons.at(static_cast<size_t>(id - 1)); }
  size_t size() const { return m_daemons.size(); }
  const std::string& dir() const { return m_dir; }
  const std::string& secret_file() const { return m_secret; }
  std::string logs() const;

 private:
  std::string m_dir;
  std::string m_secret;
  std::vector<std::unique_ptr<TestDaemon>> m_daemons;
};

// The health of `node` as `c`'s daemon sees it (unknown when it cannot say).
NodeHealth health_of(Client& c, NodeId node);

// SIGSTOP to `pid`, returning once every thread of it is stopped (the
// signal is delivered asynchronously: a thread running on another core
// finishes what it does first). False if that takes more than 2 s.
bool stop_process(pid_t pid);

// A cluster secret (32 random hex digits, mode 0600) in `dir`; its path.
std::string write_secret(const std::string& dir);

// `n` bytes from a seeded generator: data a test can check byte for byte.
std::vector<unsigned char> pattern(size_t n, unsigned seed);

// $NAME when set and not empty, else `fallback`.
std::string env_or(const char* name, const std::string& fallback);
// A file's bytes ("" when it cannot be read).
std::string read_file(const std::string& path);
// A raw connection to a Unix socket (no hello): its descriptor, or -1.
int connect_unix(const std::string& path);

// A TCP port nobody listens on right now.
int free_port();

std::string tiermemd_path();
std::string tiermemctl_path();
// A fresh directory under $TMPDIR (or /tmp), removed by the caller if wanted.
std::string make_temp_dir(const std::string& prefix);
std::string make_temp_dir_in(const std::string& parent, const std::string& prefix);

}  // namespace tiermem::test
