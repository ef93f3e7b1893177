// Page version words (M4) and the seqlock discipline that guards page data.
//
// Each page has one 64-bit word:  [ epoch : 16 | pending : 1 | sequence : 47 ]
//   sequence even  - the page is stable;
//   sequence odd   - a writer (or migration, or free) is changing it;
//   pending        - the daemon wants the page exclusively (migration, free):
//                    writers do not take it any more, so it gets it as soon
//                    as the current writer is done (no starvation);
//   epoch          - bumped whenever the page's translation changes (alloc,
//                    free, migration), so a client that cached the
//                    translation with another epoch knows it is stale.
//
// Writers: lock (CAS even v -> v+1), change the data, unlock (store v+2,
// release). Readers (FaRM-style optimistic): v1 = load-acquire (retry while
// odd), copy the data, acquire fence, v2 = load; accept the copy only when
// v1 == v2. Remote peers do the same with one-sided atomics on the same words,
// which is why the words live in one plain aligned array (VersionArray).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace tiermem::version {

inline constexpr unsigned k_epoch_shift = 48;
inline constexpr uint64_t k_sequence_mask = (uint64_t{1} << k_epoch_shift) - 1;
inline constexpr uint64_t k_exclusive_pending = uint64_t{1} << 47;

inline bool is_locked(uint64_t v) { return (v & 1) != 0; }
// A writer may take the page: not locked, and nobody waits for it exclusively.
inline bool writable(uint64_t v) { return (v & (1 | k_exclusive_pending)) == 0; }
inline uint16_t epoch_of(uint64_t v) { return static_cast<uint16_t>(v >> k_epoch_shift); }
inline uint64_t sequence_of(uint64_t v) { return v & k_sequence_mask; }
// A stable word of the next epoch: what a translation change leaves behind.
inline uint64_t next_epoch(uint64_t v) {
  return static_cast<uint64_t>(static_cast<uint16_t>(epoch_of(v) + 1)) << k_epoch_shift;
}

using WordRef = std::atomic_ref<uint64_t>;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Moves the word of a page nobody may hold (a free one) to the next epoch,
// whatever a client wrote into it; never waits.
inline void advance_epoch(uint64_t& word) {
  uint64_t v = WordRef(word).load(std::memory_order_relaxed);
  for (int tries = 0; tries < 8; ++tries) {
    if (WordRef(word).compare_exchange_weak(v, next_epoch(v), std::memory_order_acq_rel, std::memory_order_relaxed)) {
      return;
    }
  }
  WordRef(word).store(next_epoch(v), std::memory_order_release);
}

// Releases a locked word into the next epoch: the translation changed.
inline void unlock_new_epoch(uint64_t& word, uint64_t locked) {
  WordRef(word).store(next_epoch(locked), std::memory_order_release);
}

// A bounded wait, for loops on words that others (clients) can write: the
// daemon must not hang on a word left locked by a client that died mid-write,
// so its waits give up after `timeout`.
class SpinWait {
 public:
  explicit SpinWait(std::chrono::nanoseconds timeout)
      : m_deadline(std::chrono::steady_clock::now() + timeout) {}
  // Pauses; false once the deadline has passed.
  bool again() {
    if (++m_spins < 1024) {
      cpu_relax();
      return true;
    }
    std::this_thread::yield();
    return (m_spins & 63) != 0 || std::chrono::steady_clock::now() < m_deadline;
  }

 private:
  std::chrono::steady_clock::time_point m_deadline;
  unsigned m_spins = 0;
};

// The daemon's exclusive lock (migration, free): announces itself so new
// writers hold off, then takes the lock when the current writer releases it.
// On timeout withdraws the announcement and returns false.
inline bool lock_exclusive_for(uint64_t& word, std::chrono::nanoseconds timeout, uint64_t* locked) {
  WordRef(word).fetch_or(k_exclusive_pending, std::memory_order_acq_rel);
  SpinWait wait(timeout);
  uint64_t v = WordRef(word).load(std::memory_order_relaxed);
  for (;;) {
    if (!is_locked(v) &&
        WordRef(word).compare_exchange_strong(v, v + 1, std::memory_order_acquire, std::memory_order_relaxed)) {
      *locked = v + 1;
      return true;
    }
    if (!wait.again()) {
      WordRef(word).fetch_and(~k_exclusive_pending, std::memory_order_acq_rel);
      return false;
    }
    v = WordRef(word).load(std::memory_order_relaxed);
  }
}

// Releases an exclusive lock without a translation change.
inline void unlock_exclusive(uint64_t& word, uint64_t locked) {
  WordRef(word).store((locked + 1) & ~k_exclusive_pending, std::memory_order_release);
}

inline uint64_t load(uint64_t& word) { return WordRef(word).load(std::memory_order_acquire); }

}  // namespace tiermem::version
