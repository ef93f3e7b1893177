// Check-in edges of the health graph (H1): from every client session of this
// daemon (trainers, executor ranks, tools) to the daemon. A client announces
// in its hello how often it checks in (ClientOptions::checkin_interval) and
// then sends a CheckInRequest that often from its watcher thread; any other
// request counts as a check-in too. An edge is HEALTHY while the client keeps
// to that, DEGRADED after health.degraded_after_missed intervals without one,
// UNREACHABLE after health.unreachable_after_ms (and at least one interval
// after it became degraded); it ends when the session's
// connection closes. sweep() logs each transition once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <tiermem/types.h>

#include "control.pb.h"

namespace tiermem {

class CheckIns {
 public:
  CheckIns(uint64_t degraded_after_missed, std::chrono::milliseconds unreachable_after)
      : m_degraded_after(degraded_after_missed), m_unreachable_after(unreachable_after) {}

  // A client session said hello announcing `interval_ms` (0: no check-ins).
  void opened(uint64_t session, const std::string& name, pid_t pid, uid_t uid, const std::string& tenant,
              uint32_t interval_ms);
  // A request (a check-in or any other) arrived on `session`.
  void seen(uint64_t session);
  // Its connection closed.
  void closed(uint64_t session);

  // Brings every edge's state up to date, logging the changes. Returns when
  // to sweep again (half the shortest interval, between 5 ms and 500 ms).
  std::chrono::milliseconds sweep();
  // Every edge, as of now.
  std::vector<proto::ClientEdge> edges();

 private:
  using Clock = std::chrono::steady_clock;
  struct Edge {
    std::string name, tenant;
    pid_t pid = 0;
    uid_t uid = 0;
    uint32_t interval_ms = 0;
    Clock::time_point last;
    uint64_t last_unix_ms = 0;
    NodeHealth health = NodeHealth::healthy;
    uint64_t since_unix_ms = 0;
  };
  // The state `e` is in at `now` (and how many intervals it missed).
  NodeHealth state_of(const Edge& e, Clock::time_point now, uint32_t* missed) const;
  // Updates e.health, logging a change.
  void update(uint64_t session, Edge& e, Clock::time_point now);

  const uint64_t m_degraded_after;
  const std::chrono::milliseconds m_unreachable_after;
  std::mutex m_mutex;
  std::map<uint64_t, Edge> m_edges;
};

}  // namespace tiermem
