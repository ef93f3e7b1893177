#include "tests/support/test_daemon.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace tiermem::test {
namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string tiermemd_path() { return env_or("TIERMEMD", "tiermemd"); }
std::string tiermemctl_path() { return env_or("TIERMEMCTL", "tiermemctl"); }

std::string make_temp_dir(const std::string& prefix) {
  std::string templ = env_or("TMPDIR", "/tmp") + "/" + prefix + "-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return {};
  return templ;
}

TestDaemon::TestDaemon(const DaemonOptions& o) {
  m_dir = make_temp_dir("tiermem-test");
  m_socket = m_dir + "/tiermemd.sock";
  m_log = m_dir + "/tiermemd.log";
  const std::string config = m_dir + "/tiermemd.toml";
  {
    std::ofstream out(config);
    out << "[node]\nid = " << o.node_id << "\n"
        << "[control]\nsocket = \"" << m_socket << "\"\nmax_frame_bytes = \"" << o.max_frame
        << "\"\nmax_inline_bytes = \"" << o.max_inline << "\"\n"
        << "[mapping]\npage_size = \"" << o.page_size << "\"\n"
        << "[tiers.vram]\nenabled = " << (o.vram ? "true" : "false") << "\nrequired = "
        << (o.vram ? "true" : "false") << "\ncapacity = \"" << o.vram_capacity << "\"\n"
        << "[tiers.dram]\ncapacity = \"" << o.dram << "\"\n"
        << "[tiers.pmem]\npath = \"" << m_dir << "/pmem.pool\"\ncapacity = \"" << o.pmem << "\"\n"
        << "[log]\nlevel = \"debug\"\n"
        << o.extra_toml;
  }
  m_pid = ::fork();
  if (m_pid == 0) {
    const int fd = ::open(m_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const std::string bin = tiermemd_path();
    ::execl(bin.c_str(), bin.c_str(), "--config", config.c_str(), static_cast<char*>(nullptr));
    std::fprintf(stderr, "exec %s: %s\n", bin.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline && alive()) {
    if (std::filesystem::exists(m_socket) && connect("probe") != nullptr) {
      m_ready = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TestDaemon::~TestDaemon() {
  stop();
  std::error_code ec;
  std::filesystem::remove_all(m_dir, ec);
}

bool TestDaemon::alive() {
  if (m_pid <= 0) return false;
  int status = 0;
  if (::waitpid(m_pid, &status, WNOHANG) == m_pid) {
    m_pid = -1;
    return false;
  }
  return true;
}

std::string TestDaemon::log() const { return read_file(m_log); }

std::unique_ptr<Client> TestDaemon::connect(const std::string& name) const {
  auto client = Client::connect({.socket_path = m_socket, .client_name = name});
  return client.ok() ? std::move(client).value() : nullptr;
}

int TestDaemon::stop() {
  if (m_pid <= 0) return -1;
  ::kill(m_pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 500; ++i) {
    if (::waitpid(m_pid, &status, WNOHANG) == m_pid) {
      m_pid = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(m_pid, SIGKILL);
  ::waitpid(m_pid, &status, 0);
  m_pid = -1;
  return -1;
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
    ::execv(args[0], args.data());
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
