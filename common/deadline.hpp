// A deadline for the blocking work one thread does for one call (QoS classes,
// H3): while a ScopedDeadline is alive, one-sided operations, requests to
// the daemon and requests between daemons wait at most until it, and a
// request passes what is left of it on (Request.deadline_ms).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace tiermem {

class ScopedDeadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ScopedDeadline(Clock::time_point at) : m_previous(current()) {
    if (current() == Clock::time_point{} || at < current()) current() = at;
  }
  ~ScopedDeadline() { current() = m_previous; }
  ScopedDeadline(const ScopedDeadline&) = delete;
  ScopedDeadline& operator=(const ScopedDeadline&) = delete;

  static bool active() { return current() != Clock::time_point{}; }
  // `configured` (0: none), or less when this thread's deadline is nearer;
  // at least 1 ms, so that a wait past the deadline fails at once.
  static std::chrono::milliseconds bound(std::chrono::milliseconds configured) {
    if (!active()) return configured;
    const auto left = std::max<std::chrono::milliseconds>(
        std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(current() - Clock::now()));
    return configured.count() > 0 ? std::min(configured, left) : left;
  }
  // Milliseconds left (at least 1); 0 when no deadline is set.
  static uint64_t remaining_ms() { return active() ? static_cast<uint64_t>(bound({}).count()) : 0; }
  static bool passed() { return active() && Clock::now() >= current(); }
  static Clock::time_point at() { return current(); }

 private:
  static Clock::time_point& current() {
    static thread_local Clock::time_point deadline{};
    return deadline;
  }
  Clock::time_point m_previous;
};

}  // namespace tiermem
