#include "transport/ofi/ofi_shm_sweep.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <memory>

namespace tiermem::ofi_detail {

namespace {

// The pid of a queue's name "<pid>:<domain>:<endpoint>", else 0.
pid_t pid_of_queue(const char* name) {
  int pid = 0;
  unsigned domain = 0, endpoint = 0;
  int used = 0;
  if (std::sscanf(name, "%d:%u:%u%n", &pid, &domain, &endpoint, &used) != 3 || name[used] != '\0') return 0;
  return pid > 0 ? static_cast<pid_t>(pid) : 0;
}

}  // namespace

ShmSweep sweep_dead_shm_queues(const std::string& dir) {
  ShmSweep swept;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (d == nullptr) return swept;
  const int fd = ::dirfd(d.get());
  const uid_t me = ::geteuid();
  while (const dirent* e = ::readdir(d.get())) {
    const pid_t pid = pid_of_queue(e->d_name);
    if (pid == 0) continue;
    struct stat st {};
    if (::fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != me) continue;
    // Alive (or not ours to ask: EPERM): kept. Only a pid no process has.
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (::unlinkat(fd, e->d_name, 0) == 0) {
      ++swept.files;
      swept.bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return swept;
}

ShmSweep sweep_dead_shm_queues_now_and_then() {
  // One sweep per process at most every 30 s: a daemon's tenant planes each
  // have a progress thread that asks.
  static std::atomic<int64_t> last{0};
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t seen = last.load(std::memory_order_relaxed);
  if (seen != 0 && now - seen < 30) return {};
  if (!last.compare_exchange_strong(seen, now)) return {};
  return sweep_dead_shm_queues("/dev/shm");
}

}  // namespace tiermem::ofi_detail
