#include "tests/support/test_daemon.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace tiermem::test {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

int connect_unix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string tiermemd_path() { return env_or("TIERMEMD", "tiermemd"); }
std::string tiermemctl_path() { return env_or("TIERMEMCTL", "tiermemctl"); }

std::string make_temp_dir_in(const std::string& parent, const std::string& prefix) {
  std::string templ = parent + "/" + prefix + "-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return {};
  return templ;
}

std::string make_temp_dir(const std::string& prefix) { return make_temp_dir_in(env_or("TMPDIR", "/tmp"), prefix); }

TestDaemon::TestDaemon(const DaemonOptions& o) : m_options(o) {
  m_own_dir = o.dir.empty();
  m_dir = m_own_dir ? make_temp_dir("tiermem-test") : o.dir;
  std::filesystem::create_directories(m_dir);
  m_socket = m_dir + "/tiermemd.sock";
  m_log = m_dir + "/tiermemd.log";
  m_config = m_dir + "/tiermemd.toml";
  // The node's shared memory and its PMEM pool go to /dev/shm where it
  // exists: persisting there is a memory copy, on the test machine's disk
  // it is an msync of milliseconds.
  const std::string shm_parent = !o.shm_parent.empty()                    ? o.shm_parent
                                 : std::filesystem::is_directory("/dev/shm") ? "/dev/shm"
                                                                             : m_dir;
  m_pmem_dir = make_temp_dir_in(shm_parent, "tiermem-pmem");
  m_dram_dir = make_temp_dir_in(shm_parent, "tiermem-dram");
  {
    std::ofstream out(m_config);
    out << "[node]\nid = " << o.node_id << "\n"
        << "[control]\nsocket = \"" << m_socket << "\"\nmax_frame_bytes = \"" << o.max_frame
        << "\"\nmax_inline_bytes = \"" << o.max_inline << "\"\n" << o.control_toml
        << "[mapping]\npage_size = \"" << o.page_size << "\"\n" << o.mapping_toml
        << "[tiers.vram]\nenabled = " << (o.vram ? "true" : "false") << "\nrequired = "
        << (o.vram ? "true" : "false") << "\ndevice = " << o.vram_device << "\ncapacity = \"" << o.vram_capacity
        << "\"\n"
        << "[tiers.dram]\ncapacity = \"" << o.dram << "\"\npath = \"" << m_dram_dir << "\"\n"
        << "[tiers.pmem]\npath = \"" << m_pmem_dir << "\"\ncapacity = \"" << o.pmem << "\"\n"
        << "[log]\nlevel = \"debug\"\n";
    if (!o.cluster_file.empty()) {
      out << "[cluster]\nfile = \"" << o.cluster_file << "\"\nsecret_file = \"" << o.secret_file << "\"\n"
          << o.cluster_timing;
    }
    if (!o.tls.empty() || !o.fabric.empty() || !o.provider.empty()) {
      out << "[transport]\n";
      if (!o.tls.empty()) out << "tls = \"" << o.tls << "\"\n";
      if (!o.fabric.empty()) out << "fabric = \"" << o.fabric << "\"\n";
      if (!o.provider.empty()) out << "provider = \"" << o.provider << "\"\n";
    }
    if (o.metrics) {
      m_metrics_port = free_port();
      out << "[metrics]\nlisten = \"127.0.0.1:" << m_metrics_port << "\"\n";
    }
    out << o.extra_toml;
  }
  m_ready = start();
}

bool TestDaemon::start() {
  m_pid = ::fork();
  if (m_pid == 0) {
    const int fd = ::open(m_log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<std::string> argv = m_options.wrapper;
    argv.push_back(tiermemd_path());
    argv.push_back("--config");
    argv.push_back(m_config);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  m_ended.clear();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline && alive()) {
    if (std::filesystem::exists(m_socket) && connect("probe") != nullptr) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (m_pid > 0) m_ended = "did not answer within 10 s of its start";
  return false;
}

void TestDaemon::kill() {
  if (m_pid <= 0) return;
  ::kill(m_pid, SIGKILL);
  int status = 0;
  ::waitpid(m_pid, &status, 0);
  m_pid = -1;
  m_ready = false;
}

bool TestDaemon::restart() {
  if (m_pid > 0) stop();
  m_ready = start();
  return m_ready;
}

TestDaemon::~TestDaemon() {
  stop();
  std::error_code ec;
  if (m_own_dir) std::filesystem::remove_all(m_dir, ec);
  if (!m_pmem_dir.empty()) std::filesystem::remove_all(m_pmem_dir, ec);
  if (!m_dram_dir.empty()) std::filesystem::remove_all(m_dram_dir, ec);
}

bool TestDaemon::alive() {
  if (m_pid <= 0) return false;
  int status = 0;
  if (::waitpid(m_pid, &status, WNOHANG) == m_pid) {
    m_pid = -1;
    m_ended = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                                        strsignal(WTERMSIG(status)) + ")"
                                  : "exited with status " + std::to_string(WEXITSTATUS(status));
    return false;
  }
  return true;
}

std::string TestDaemon::log() const {
  // A daemon that ended on its own: how (a crash leaves no line of its own).
  return read_file(m_log) + (m_ended.empty() ? "" : "[test] the daemon " + m_ended + "\n");
}

std::unique_ptr<Client> TestDaemon::connect(const std::string& name) const {
  auto client = Client::connect({.socket_path = m_socket, .client_name = name});
  return client.ok() ? std::move(client).value() : nullptr;
}

int TestDaemon::stop() {
  if (m_pid <= 0) return -1;
  ::kill(m_pid, SIGTERM);
  int status = 0;
  // A loaded CI machine may take seconds to drain a daemon; 20 s is a hang.
  for (int i = 0; i < 2000; ++i) {
    if (::waitpid(m_pid, &status, WNOHANG) == m_pid) {
      m_pid = -1;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      std::fprintf(stderr, "tiermemd (%s) died by signal %d (%s) on SIGTERM; its log:\n%s\n", m_socket.c_str(),
                   WTERMSIG(status), ::strsignal(WTERMSIG(status)), log().c_str());
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::fprintf(stderr, "tiermemd (%s) did not stop within 20 s of SIGTERM; killed; its log:\n%s\n", m_socket.c_str(),
               log().c_str());
  ::kill(m_pid, SIGKILL);
  ::waitpid(m_pid, &status, 0);
  m_pid = -1;
  return -1;
}

namespace {

// Whether a TCP listener could bind 127.0.0.1:`port` now.
bool port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// Claims `port` for this process among the test processes of this machine:
// binds a Unix socket of the abstract namespace named after it (one bind
// per name; the kernel drops it however the process ends, and it leaves no
// file behind). Another test process that picked the same port before
// either bound it moves on to another. False when someone else holds it.
bool claim_port(int port) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;  // no claims here: the bind check alone decides
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string name = "tiermem-test-port-" + std::to_string(port);
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // sun_path[0] == 0: abstract
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    ::close(fd);
    return false;
  }
  return true;  // the socket stays open: the claim lasts as long as this process
}

}  // namespace

// Ports come from below the kernel's ephemeral range: a port the kernel
// hands out (to a port-0 bind, or to any outgoing connection of this or a
// parallel test, UCX's included) may otherwise take the port between this
// check and the daemon's bind. Parallel tests pick at random, each process
// never hands the same port twice, and a port is claimed among the test
// processes of the machine (claim_port) before it is handed out: two of them
// picking one port before either daemon bound it took a CI run down once.
int free_port() {
  static std::mutex mu;
  static std::set<int> handed;
  static std::mt19937 rng{std::random_device{}()};
  int low = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> low;
  const int first = 10000, last = low - 1;
  std::lock_guard lock(mu);
  if (last - first >= 1000) {
    for (int tries = 0; tries < 200; ++tries) {
      const int port = std::uniform_int_distribution<int>(first, last)(rng);
      if (handed.count(port) == 0 && port_free(port) && claim_port(port)) {
        handed.insert(port);
        return port;
      }
    }
  }
  // No room below the ephemeral range: let the kernel choose.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

NodeHealth health_of(Client& c, NodeId node) {
  auto nodes = c.nodes();
  if (!nodes.ok()) return NodeHealth::unknown;
  for (const NodeInfo& n : *nodes) {
    if (n.node == node) return n.health;
  }
  return NodeHealth::unknown;
}

std::string write_secret(const std::string& dir) {
  const std::string path = dir + "/cluster.secret";
  {
    std::ofstream out(path);
    std::random_device rd;
    for (int i = 0; i < 32; ++i) out << "0123456789abcdef"[rd() % 16];
    out << "\n";
  }
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  return path;
}

TestCluster::TestCluster(int nodes, const DaemonOptions& base)
    : TestCluster(nodes, base, [](int) { return "127.0.0.1:" + std::to_string(free_port()); },
                  [](int, DaemonOptions&) {}) {}

TestCluster::TestCluster(int nodes, const DaemonOptions& base, const std::function<std::string(int)>& control,
                         const std::function<void(int, DaemonOptions&)>& place) {
  m_dir = make_temp_dir("tiermem-cluster");
  m_secret = write_secret(m_dir);
  const std::string file = m_dir + "/cluster.toml";
  {
    std::ofstream out(file);
    for (int id = 1; id <= nodes; ++id) out << "[[node]]\nid = " << id << "\ncontrol = \"" << control(id) << "\"\n";
  }
  for (int id = 1; id <= nodes; ++id) {
    DaemonOptions o = base;
    o.node_id = id;
    o.cluster_file = file;
    if (o.secret_file.empty()) o.secret_file = m_secret;
    o.dir = m_dir + "/node" + std::to_string(id);
    place(id, o);
    m_daemons.push_back(std::make_unique<TestDaemon>(o));
  }
}

TestCluster::~TestCluster() {
  m_daemons.clear();
  std::error_code ec;
  // TIERMEM_TEST_KEEP=1 leaves the logs behind for a post-mortem.
  if (std::getenv("TIERMEM_TEST_KEEP") == nullptr) std::filesystem::remove_all(m_dir, ec);
  else std::fprintf(stderr, "kept %s\n", m_dir.c_str());
}

bool TestCluster::ready() const {
  for (const auto& d : m_daemons) {
    if (!d->ready()) return false;
  }
  return true;
}

bool TestCluster::wait_connected(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    for (const auto& d : m_daemons) {
      auto c = d->connect("wait");
      auto nodes = c ? c->nodes() : Result<std::vector<NodeInfo>>(Status(ErrorCode::connection_failed, "down"));
      if (!nodes.ok() || nodes->size() != m_daemons.size()) {
        all = false;
        break;
      }
      for (const auto& n : *nodes) all = all && (n.state == NodeState::self || n.state == NodeState::connected);
      if (!all) break;
    }
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

std::string TestCluster::logs() const {
  std::string out;
  for (size_t i = 0; i < m_daemons.size(); ++i) {
    out += "--- node " + std::to_string(i + 1) + " ---\n" + m_daemons[i]->log();
  }
  return out;
}

CommandResult run_command(const std::vector<std::string>& argv, const std::string& input) {
  const std::string dir = make_temp_dir("tiermem-cmd");
  const std::string in_path = dir + "/in", out_path = dir + "/out", err_path = dir + "/err";
  std::ofstream(in_path) << input;
  CommandResult result;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int in = ::open(in_path.c_str(), O_RDONLY);
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());  // plain names are looked up in PATH
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return result;
}

CommandResult run_ctl(const std::string& socket, const std::vector<std::string>& args,
                      const std::string& input) {
  std::vector<std::string> argv = {tiermemctl_path(), "--socket", socket};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, input);
}

}  // namespace tiermem::test

namespace tiermem::test {

bool stop_process(pid_t pid) {
  if (::kill(pid, SIGSTOP) != 0) return false;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < end) {
    bool all = true;
    std::error_code ec;
    for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
      std::ifstream in(t.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      // pid (comm) STATE ...: the state follows the last ')'.
      const size_t close = stat.rfind(')');
      const char state = close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
      if (state != 'T' && state != 't') all = false;
    }
    if (all && !ec) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

}  // namespace tiermem::test
