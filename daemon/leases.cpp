#include "daemon/leases.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

namespace tiermem {
namespace {

// Whether the process of `pidfd` has exited (a pidfd polls readable then).
bool exited(const UniqueFd& pidfd) {
  if (!pidfd.valid()) return true;
  pollfd p{.fd = pidfd.get(), .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, 0) != 0;
}

}  // namespace

bool Leases::hold(uint64_t session, pid_t pid, uid_t uid, std::vector<Gva> owned) {
  if (m_grace.count() <= 0 || owned.empty() || pid <= 0) return false;
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (exited(pidfd)) return false;
  spdlog::info("session {} of pid {} ended with {} session allocation(s): kept {} ms for that process to connect "
               "again (lease.grace_ms)",
               session, pid, owned.size(), m_grace.count());
  std::lock_guard lock(m_mutex);
  m_leases.push_back(Lease{session, pid, uid, std::move(pidfd), std::chrono::steady_clock::now() + m_grace,
                           std::move(owned)});
  return true;
}

std::vector<Gva> Leases::take(pid_t pid, uid_t uid) {
  std::vector<Gva> out;
  std::lock_guard lock(m_mutex);
  for (auto it = m_leases.begin(); it != m_leases.end();) {
    if (it->pid == pid && it->uid == uid && !exited(it->pidfd)) {
      out.insert(out.end(), it->owned.begin(), it->owned.end());
      it = m_leases.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<Gva> Leases::expired() {
  std::vector<Gva> out;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(m_mutex);
  for (auto it = m_leases.begin(); it != m_leases.end();) {
    if (now >= it->until || exited(it->pidfd)) {
      spdlog::info("the lease of session {} (pid {}) ended: freeing its {} session allocation(s)", it->session,
                   it->pid, it->owned.size());
      out.insert(out.end(), it->owned.begin(), it->owned.end());
      it = m_leases.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace tiermem
