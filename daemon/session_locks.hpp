// The page locks of dead clients (S3). Each client session gets a lock log
// (pages/lock_intents.hpp): a memfd the client maps with its regions and
// records every page lock in before it takes it. When the session ends, the
// daemon waits for the client's process to exit (a pidfd; at most
// recovery.stale_writer_grace_ms), then breaks every lock the log still
// shows, on this node and, through the peers, on the home nodes of remote
// pages; each page broken is flagged torn. The waiting and breaking run on
// a thread of their own, never on a control thread.
//
// Only locks of the session's own tenant's pages are broken (the home node
// checks the tenant too): a client that lies in its log can at worst break a
// lock of its own tenant's, which it could scribble on anyway.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <tiermem/status.h>

#include "common/unique_fd.hpp"
#include "daemon/tenants.hpp"

namespace tiermem {

class AddressSpace;
class PeerManager;

class SessionLocks {
 public:
  // `peers` is null for a daemon that runs alone.
  SessionLocks(AddressSpace& space, PeerManager* peers, std::chrono::milliseconds grace);
  ~SessionLocks();
  SessionLocks(const SessionLocks&) = delete;
  SessionLocks& operator=(const SessionLocks&) = delete;

  // The log of session `id` (made on first use): its descriptor, valid until
  // the session ends. Errors: io_error (memfd, mmap).
  Result<int> open(uint64_t id, pid_t pid, const Identity& who);
  // The session ended: its locks are broken once its process is gone.
  void end(uint64_t id);

  // Sessions whose locks are still to be broken (tests, stat).
  size_t pending() const;
  // Locks broken so far, over every session.
  uint64_t broken() const { return m_broken.load(); }

 private:
  struct Log;
  void reap();
  // Breaks what `log` still holds; how many were broken.
  uint64_t break_locks(const Log& log);

  AddressSpace& m_space;
  PeerManager* m_peers;
  std::chrono::milliseconds m_grace;

  mutable std::mutex m_mutex;
  std::condition_variable m_wake;
  bool m_stop = false;
  std::map<uint64_t, std::unique_ptr<Log>> m_open;  // by session id
  std::deque<std::unique_ptr<Log>> m_ended;
  std::atomic<uint64_t> m_broken{0};
  std::thread m_reaper;
};

}  // namespace tiermem
