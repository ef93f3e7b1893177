// Leases of session allocations (O6): when a session ends while its process
// lives on (its connection broke, or it closed one Client and opens
// another), its session allocations wait `lease.grace_ms` for that process
// to connect again and take them back; then they are freed. A process that
// is gone (its pidfd says so) cannot come back: its allocations go at once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#include <tiermem/gva.h>

#include "common/unique_fd.hpp"

namespace tiermem {

class Leases {
 public:
  explicit Leases(std::chrono::milliseconds grace) : m_grace(grace) {}

  // Holds `owned` of ended session `session` for the grace period. False
  // (the caller frees them now) without a grace period, or when process
  // `pid` has exited.
  bool hold(uint64_t session, pid_t pid, uid_t uid, std::vector<Gva> owned);
  // What process `pid` (of `uid`) still holds: a new session of it takes it.
  std::vector<Gva> take(pid_t pid, uid_t uid);
  // Leases whose grace passed or whose process exited: to be freed.
  std::vector<Gva> expired();

 private:
  struct Lease {
    uint64_t session = 0;
    pid_t pid = 0;
    uid_t uid = 0;
    UniqueFd pidfd;
    std::chrono::steady_clock::time_point until;
    std::vector<Gva> owned;
  };
  std::chrono::milliseconds m_grace;
  std::mutex m_mutex;
  std::vector<Lease> m_leases;
};

}  // namespace tiermem
