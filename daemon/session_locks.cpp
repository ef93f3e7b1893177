#include "daemon/session_locks.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/shared_memory.hpp"
#include "daemon/peer_manager.hpp"
#include "mapping/address_space.hpp"
#include "pages/lock_intents.hpp"

namespace tiermem {
namespace {

// The process behind a session, by a descriptor that cannot name another
// process later (pid reuse). Invalid when the process is already gone.
UniqueFd open_pidfd(pid_t pid) {
  if (pid <= 0) return UniqueFd();
  return UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
}

// True when the process has exited (or cannot be watched).
bool exited(const UniqueFd& pidfd) {
  if (!pidfd.valid()) return true;
  pollfd p{pidfd.get(), POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

}  // namespace

struct SessionLocks::Log {
  uint64_t session = 0;
  pid_t pid = 0;
  Identity who;
  SharedMemory memory;
  UniqueFd pidfd;
  std::chrono::steady_clock::time_point give_up;  // break even if the process lives on
};

SessionLocks::SessionLocks(AddressSpace& space, PeerManager* peers, std::chrono::milliseconds grace)
    : m_space(space), m_peers(peers), m_grace(grace) {
  m_reaper = std::thread([this] { reap(); });
}

SessionLocks::~SessionLocks() {
  {
    std::lock_guard lock(m_mutex);
    m_stop = true;
  }
  m_wake.notify_all();
  m_reaper.join();
}

Result<int> SessionLocks::open(uint64_t id, pid_t pid, const Identity& who) {
  std::lock_guard lock(m_mutex);
  if (auto it = m_open.find(id); it != m_open.end()) return it->second->memory.fd();
  auto memory = SharedMemory::create("tiermem-locks." + std::to_string(id), k_intent_log_bytes);
  if (!memory.ok()) return memory.status().with_context("lock log of session " + std::to_string(id));
  auto log = std::make_unique<Log>();
  log->session = id;
  log->pid = pid;
  log->who = who;
  log->memory = std::move(memory).value();
  log->pidfd = open_pidfd(pid);
  auto* header = reinterpret_cast<IntentLogHeader*>(log->memory.data());
  header->magic = k_intents_magic;
  header->session = id;
  header->pid = static_cast<uint64_t>(pid);
  const int fd = log->memory.fd();
  m_open.emplace(id, std::move(log));
  return fd;
}

void SessionLocks::end(uint64_t id) {
  {
    std::lock_guard lock(m_mutex);
    auto it = m_open.find(id);
    if (it == m_open.end()) return;
    it->second->give_up = std::chrono::steady_clock::now() + m_grace;
    m_ended.push_back(std::move(it->second));
    m_open.erase(it);
  }
  m_wake.notify_all();
}

size_t SessionLocks::pending() const {
  std::lock_guard lock(m_mutex);
  return m_ended.size();
}

// Every few milliseconds while sessions wait: the logs of those whose
// process exited (or whose grace ran out) are read and their locks broken.
void SessionLocks::reap() {
  std::unique_lock lock(m_mutex);
  for (;;) {
    m_wake.wait_for(lock, std::chrono::milliseconds(m_ended.empty() ? 1000 : 5),
                    [this] { return m_stop; });
    if (m_stop) return;
    std::vector<std::unique_ptr<Log>> ready;
    const auto now = std::chrono::steady_clock::now();
    for (auto it = m_ended.begin(); it != m_ended.end();) {
      if (exited((*it)->pidfd) || now >= (*it)->give_up) {
        ready.push_back(std::move(*it));
        it = m_ended.erase(it);
      } else {
        ++it;
      }
    }
    if (ready.empty()) continue;
    lock.unlock();
    for (const auto& log : ready) {
      const bool alive = !exited(log->pidfd);
      const uint64_t n = break_locks(*log);
      if (n > 0 || alive) {
        spdlog::warn("session {} (pid {}, {}) ended holding {} page lock(s){}; broken, pages flagged torn", log->session,
                     log->pid, log->who.describe(), n,
                     alive ? " and its process still runs after recovery.stale_writer_grace_ms" : "");
      }
      m_broken += n;
    }
    lock.lock();
  }
}

namespace {

// The entries of a log in the parts of its memfd that were ever written
// (SEEK_DATA): reading the rest would give it memory only to find zeros.
std::vector<LockIntent> written_entries(const SharedMemory& memory) {
  const IntentLog intents(memory.data());
  std::vector<LockIntent> out;
  off_t at = 0;
  const auto size = static_cast<off_t>(memory.size());
  while (at < size) {
    const off_t data = ::lseek(memory.fd(), at, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;  // no data after `at`
      return intents.entries();   // cannot tell: all of it
    }
    off_t hole = ::lseek(memory.fd(), data, SEEK_HOLE);
    if (hole < 0) hole = size;
    const auto entry_of = [](off_t byte) {
      return byte <= static_cast<off_t>(sizeof(IntentLogHeader))
                 ? size_t{0}
                 : static_cast<size_t>(byte - static_cast<off_t>(sizeof(IntentLogHeader))) / sizeof(LockIntent);
    };
    const size_t first = entry_of(data);
    const size_t last = entry_of(hole + static_cast<off_t>(sizeof(LockIntent)) - 1);
    for (const LockIntent& e : intents.entries(first, last - first)) out.push_back(e);
    at = hole;
  }
  return out;
}

}  // namespace

uint64_t SessionLocks::break_locks(const Log& log) {
  std::map<NodeId, std::vector<LockIntent>> remote;
  uint64_t broken = 0;
  for (const LockIntent& e : written_entries(log.memory)) {
    if (e.node == m_space.node()) {
      broken += m_space.break_dead_lock(e.page, e.locked, log.who.tenant, log.who.is_operator) ? 1 : 0;
    } else if (e.node <= 0xffff && m_peers != nullptr) {
      remote[static_cast<NodeId>(e.node)].push_back(e);
    }
  }
  for (const auto& [node, locks] : remote) {
    std::vector<std::pair<uint64_t, uint64_t>> records;
    for (const LockIntent& e : locks) records.emplace_back(e.page, e.locked);
    auto response = m_peers->stub(node, log.who).break_locks(records);
    if (response.ok()) {
      broken += *response;
    } else {
      spdlog::warn("breaking {} page lock(s) of dead session {} on node {}: {}", locks.size(), log.session, node,
                   response.status().message());
    }
  }
  return broken;
}

}  // namespace tiermem
