#include "tests/support/exec_rank.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tiermem::test {

std::string exec_path() { return std::getenv("TIERMEM_EXEC") ? std::getenv("TIERMEM_EXEC") : "tiermem-exec"; }

ExecRank::ExecRank(int rank, int world, const std::string& socket, std::vector<std::string> args,
                   const std::string& log, const std::vector<std::string>& wrapper)
    : m_log(log) {
  args.insert(args.begin(), {exec_path(), "train"});
  args.insert(args.begin(), wrapper.begin(), wrapper.end());
  m_pid = ::fork();
  if (m_pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::setenv("TIERMEM_RANK", std::to_string(rank).c_str(), 1);
    ::setenv("TIERMEM_WORLD_SIZE", std::to_string(world).c_str(), 1);
    ::setenv("TIERMEM_SOCKET", socket.c_str(), 1);
    // Every rank of a test is on this host: they share its cores.
    ::setenv("TIERMEM_LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 0);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
}

ExecRank::~ExecRank() {
  if (m_pid > 0) kill();
}

int ExecRank::wait() {
  int status = 0;
  ::waitpid(m_pid, &status, 0);
  m_pid = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void ExecRank::kill() {
  if (m_pid <= 0) return;
  ::kill(m_pid, SIGKILL);
  ::waitpid(m_pid, nullptr, 0);
  m_pid = -1;
}

void ExecRank::signal(int sig) {
  if (m_pid > 0) ::kill(m_pid, sig);
}

std::string ExecRank::log() const {
  std::ifstream in(m_log);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace tiermem::test
