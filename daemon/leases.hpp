// Leases (O6): what a client process keeps at the daemon beyond one
// connection.
//   - Its pins (the allocations it mapped) are kept for as long as the
//     process lives: its address space maps those frames, whatever became of
//     its connection, so nothing may free or migrate them under it. Pins are
//     kept per Client object of the process (the random id it says in every
//     hello): a new session of that client says which mappings it still has;
//     it keeps their pins, and pins no mapping claims (an unmap its broken
//     connection never carried) are let go. The process's exit lets them all
//     go.
//   - The session allocations of a session that ended while its process
//     lives wait `lease.grace_ms` for the process to connect again (any
//     Client of it) and take them back; then they are freed (those a pin of
//     the process still holds wait for the pin). A process that is gone (its
//     pidfd says so) cannot come back: its allocations go at once, its pins
//     with them.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include <tiermem/gva.h>

#include "common/unique_fd.hpp"

namespace tiermem {

// One client of the daemon: a Client object of a process.
struct ClientKey {
  pid_t pid = 0;
  uid_t uid = 0;
  uint64_t client = 0;  // the random id of its hello (0: a client that sends none)
};

class Leases {
 public:
  explicit Leases(std::chrono::milliseconds grace) : m_grace(grace) {}

  // What is to be let go of: session allocations to free, pins to unpin
  // (one entry per pin).
  struct Held {
    std::vector<Gva> owned;
    std::vector<Gva> pins;
    bool empty() const { return owned.empty() && pins.empty(); }
  };

  // Records a pin the caller took for `key` (a map).
  void pin(const ClientKey& key, Gva gva);
  // Takes one pin of the allocation of `gva` off `key` (an unmap) and
  // returns it (as pinned); nothing when it has none. The caller unpins.
  std::optional<Gva> unpin(const ClientKey& key, Gva gva);
  // Session `session` of `key` ended with session allocations `owned`.
  // Returns what to let go of now: everything of the client when its
  // process has exited; without a grace period the allocations no pin holds.
  Held end_session(const ClientKey& key, uint64_t session, std::vector<Gva> owned);
  // A new session of `key`, whose process still maps `mapped` (one entry
  // per mapping): the session allocations kept for it go to *owned; kept[i]
  // says whether mapped[i]'s pin was kept all along (the mapping is valid as
  // it is). Returns pins no mapping claims, to unpin.
  Held begin_session(const ClientKey& key, const std::vector<Gva>& mapped, std::vector<Gva>* owned,
                     std::vector<bool>* kept);
  // What to let go of now: session allocations whose grace passed and no
  // pin holds, and everything of clients whose process exited.
  Held expired();
  // Pins held now, by every client (tiermemctl status, tests).
  size_t pins() const;

 private:
  struct Ended {
    uint64_t session = 0;
    std::chrono::steady_clock::time_point until;
    std::vector<Gva> owned;
  };
  struct Process {
    UniqueFd pidfd;  // readable once it exited
    std::map<uint64_t, std::vector<Gva>> pins;  // by client id
    std::vector<Ended> ended;
    bool pinned(const Gva& g) const;
    bool empty() const;
  };
  using ProcessKey = std::pair<pid_t, uid_t>;
  // The process's record (made, with its pidfd, when missing).
  Process& record(const ClientKey& key);

  std::chrono::milliseconds m_grace;
  mutable std::mutex m_mutex;
  std::map<ProcessKey, Process> m_processes;
};

}  // namespace tiermem
