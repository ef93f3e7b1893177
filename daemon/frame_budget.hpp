// What control frames may cost a daemon (S3): the bytes of frames being
// received or handled, until their reply is sent, are bounded in all
// (control.frame_budget_bytes) and per uid (control.frame_budget_per_uid_bytes).
// A claim that does not fit waits its turn instead of being refused: first
// come, first served for the budget of all; a uid at its own limit holds
// up only itself. A waiter is woken by a callback, so that the control
// server's coroutines wait without holding a thread (control_server.cpp),
// and tests can drive it with plain threads.
//
// Why a claim is a whole frame, not the bytes read so far: two frames half
// read, each waiting for the room the other holds, would wait for each
// other until their deadline, and big writes would be refused instead of
// slowed. A claim is taken in one piece, by a session that holds nothing
// else of the budget (a read's reply is the exception: see control_server),
// so every claim is granted once the ones before it are done.
//
// The first k_unclaimed_frame_bytes of every frame are outside the budget:
// most requests are that small and never touch its lock, and a session
// holds at most that much before it claims (bounded by the connection
// limits, like the socket buffers every connection has).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <tiermem/status.h>

namespace tiermem {

// Bytes of a frame a session reads before it claims the frame's size.
inline constexpr uint64_t k_unclaimed_frame_bytes = 64 << 10;
// The smallest buffer a frame starts in.
inline constexpr uint64_t k_min_frame_buffer = 4 << 10;

// How large the buffer of a frame of `length` bytes grows to when the
// `have` bytes it holds fill it and `waiting` more are in the socket: what
// has arrived, or twice what it holds (fewer copies of a large frame), and
// never more than the frame. Announcing a size commits nothing.
uint64_t next_frame_capacity(uint64_t have, uint64_t waiting, uint64_t length);

class FrameBudget {
 public:
  using Clock = std::chrono::steady_clock;

  // `total` and `per_uid` in bytes; each at least the largest frame (the
  // configuration checks it).
  FrameBudget(uint64_t total, uint64_t per_uid);

  // One claim in line. granted() once the bytes are the claimant's.
  class Claim {
   public:
    bool granted() const;

   private:
    friend class FrameBudget;
    uid_t uid = 0;
    std::string who;
    uint64_t bytes = 0;
    Clock::time_point since;
    std::atomic<bool> is_granted{false};  // set under the budget's lock, read by the claimant
    std::function<void()> wake;
  };

  // Claims `bytes` for `uid` (`who`: its name in errors, "uid 1000"):
  // granted at once when they fit and nobody waits before them; else
  // queued, and `wake` runs once (on the thread that gave bytes back, with
  // no lock held) when they are granted.
  std::shared_ptr<Claim> claim(uid_t uid, std::string who, uint64_t bytes, std::function<void()> wake);
  // Ends a wait: OK when the claim was granted (its bytes are held now),
  // else it leaves the line and the error says so. Errors: busy, naming
  // the budget that is full, what it holds and how long the claim waited.
  Status settle(const std::shared_ptr<Claim>& claim);
  // Gives `bytes` of `uid` back, granting waiting claims that fit now.
  void release(uid_t uid, uint64_t bytes);
  // From now on nothing is granted nor woken (the server stops).
  void close();

  // Bytes held in all and by `uid` (for tests and logs).
  uint64_t held() const;
  uint64_t held_by(uid_t uid) const;
  size_t waiting() const;

 private:
  bool fits(uid_t uid, uint64_t bytes) const;
  // Grants queued claims in order; returns the callbacks to run unlocked.
  std::vector<std::function<void()>> grant_locked();
  void take_locked(uid_t uid, uint64_t bytes);

  const uint64_t m_total;
  const uint64_t m_per_uid;
  mutable std::mutex m_mutex;
  uint64_t m_held = 0;
  std::map<uid_t, uint64_t> m_held_by;
  std::deque<std::shared_ptr<Claim>> m_line;
  bool m_closed = false;
};

}  // namespace tiermem
