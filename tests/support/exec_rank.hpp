// A rank of tiermem-exec running in the background, for tests and
// benchmarks: `tiermem-exec train ARGS` with the rank, world size and
// socket in its environment, stdout and stderr appended to a log file.
// The binary is $TIERMEM_EXEC, else tiermem-exec on the PATH.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace tiermem::test {

class ExecRank {
 public:
  // `wrapper`: a prefix for the command (e.g. Network::exec_in).
  ExecRank(int rank, int world, const std::string& socket, std::vector<std::string> args, const std::string& log,
           const std::vector<std::string>& wrapper = {});
  ~ExecRank();  // SIGKILL, if still running
  ExecRank(const ExecRank&) = delete;
  ExecRank& operator=(const ExecRank&) = delete;

  // Waits for it to end: its exit status, or 128 + the signal.
  int wait();
  void kill();  // SIGKILL and reap
  void signal(int sig);
  pid_t pid() const { return m_pid; }
  // Everything it wrote so far.
  std::string log() const;

 private:
  pid_t m_pid = -1;
  std::string m_log;
};

// The tiermem-exec binary the ranks run.
std::string exec_path();

}  // namespace tiermem::test
