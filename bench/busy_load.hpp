// "A trainer computing": one process per core spinning in a busy loop at
// normal priority, for as long as the object lives (the children die with
// this process too).
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

namespace tiermem::bench {

class BusyLoad {
 public:
  explicit BusyLoad(int processes) {
    for (int i = 0; i < processes; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        volatile unsigned long n = 0;
        for (;;) n = n + 1;
      }
      if (pid > 0) m_children.push_back(pid);
    }
  }
  ~BusyLoad() {
    for (pid_t pid : m_children) ::kill(pid, SIGKILL);
    for (pid_t pid : m_children) ::waitpid(pid, nullptr, 0);
  }
  BusyLoad(const BusyLoad&) = delete;
  BusyLoad& operator=(const BusyLoad&) = delete;

 private:
  std::vector<pid_t> m_children;
};

}  // namespace tiermem::bench
