#include "pages/lock_intents.hpp"

#include <algorithm>

#include <tiermem/status_macros.h>

#include "pages/version.hpp"

namespace tiermem {

Result<size_t> IntentLog::add(NodeId node, uint64_t page, uint64_t locked) {
  // From the hint on, round the log once (a hint anyone may have scribbled
  // on is only where the search starts).
  const uint64_t start = std::atomic_ref<uint64_t>(next()).load(std::memory_order_relaxed) % k_intents;
  for (size_t n = 0; n < k_intents; ++n) {
    const size_t i = (start + n) % k_intents;
    LockIntent* e = entry(i);
    uint64_t expected = 0;
    // Claim a free entry by its page word; fill the rest after (the daemon
    // reads a log only once its session is over).
    if (std::atomic_ref<uint64_t>(e->page).compare_exchange_strong(expected, page, std::memory_order_acq_rel)) {
      std::atomic_ref<uint64_t>(e->node).store(node, std::memory_order_relaxed);
      std::atomic_ref<uint64_t>(e->locked).store(locked, std::memory_order_release);
      std::atomic_ref<uint64_t>(next()).store(i + 1, std::memory_order_relaxed);
      return i;
    }
  }
  return Status(ErrorCode::busy, "more than " + std::to_string(k_intents) +
                                     " pages locked at once by this client; write in smaller pieces");
}

void IntentLog::remove(size_t index) {
  LockIntent* e = entry(index);
  std::atomic_ref<uint64_t>(e->locked).store(0, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(e->page).store(0, std::memory_order_release);
}

std::vector<LockIntent> IntentLog::entries(size_t first, size_t count) const {
  std::vector<LockIntent> out;
  const size_t end = first + std::min(count, k_intents - std::min(first, k_intents));
  for (size_t i = first; i < end; ++i) {
    const LockIntent* e = entry(i);
    const uint64_t page = std::atomic_ref<const uint64_t>(e->page).load(std::memory_order_acquire);
    if (page == 0) continue;
    out.push_back({page, std::atomic_ref<const uint64_t>(e->locked).load(std::memory_order_relaxed),
                   std::atomic_ref<const uint64_t>(e->node).load(std::memory_order_relaxed)});
  }
  return out;
}

Status RecordedVersionWords::compare_swap(uint64_t page, uint64_t expected, uint64_t desired, uint64_t* old) {
  const bool locking = version::is_locked(desired) && !version::is_locked(expected);
  if (!locking) return m_inner.compare_swap(page, expected, desired, old);
  // Recorded before the lock can be taken: a crash between the two leaves a
  // record of a value the word never had, which breaks nothing.
  TIERMEM_ASSIGN_OR_RETURN(const size_t entry, m_log.add(m_home, page, desired));
  Status s = m_inner.compare_swap(page, expected, desired, old);
  if (s.ok() && *old == expected) {
    m_held.emplace_back(page, entry);
  } else {
    m_log.remove(entry);
  }
  return s;
}

Status RecordedVersionWords::compare_swap_all(uint64_t first, size_t count, const uint64_t* expected,
                                              uint64_t* old) {
  std::vector<size_t> entries;
  entries.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    Result<size_t> entry = m_log.add(m_home, first + i, expected[i] + 1);
    if (!entry.ok()) {
      for (size_t e : entries) m_log.remove(e);
      return entry.status();
    }
    entries.push_back(*entry);
  }
  Status s = m_inner.compare_swap_all(first, count, expected, old);
  // On an error which were taken is unknown: the records stay, for the
  // daemon to deal with if we die (a record of a value the word never had
  // breaks nothing).
  if (!s.ok()) return s;
  for (size_t i = 0; i < count; ++i) {
    if (old[i] == expected[i]) {
      m_held.emplace_back(first + i, entries[i]);
    } else {
      m_log.remove(entries[i]);
    }
  }
  return s;
}

Status RecordedVersionWords::release(std::span<const uint64_t> pages) {
  Status s = m_inner.release(pages);
  // Forgotten once released; when the release failed (a peer went away)
  // the record stays, for the daemon to deal with if we die.
  if (!s.ok()) return s;
  for (uint64_t page : pages) {
    auto it = std::find_if(m_held.begin(), m_held.end(), [&](const auto& h) { return h.first == page; });
    if (it == m_held.end()) continue;
    m_log.remove(it->second);
    m_held.erase(it);
  }
  return s;
}

bool break_lock(uint64_t& word, uint64_t locked) {
  // The next stable value of the same epoch: readers that overlap see the
  // word move and retry; cached translations stay valid. A pending bit the
  // daemon set since (it waits for the page) is kept for it. A record of a
  // value that is not a locked one is a lie and breaks nothing.
  if (!version::is_locked(locked)) return false;
  uint64_t seen = version::WordRef(word).load(std::memory_order_acquire);
  while ((seen & ~version::k_exclusive_pending) == locked) {
    const uint64_t next = (locked + 1) | (seen & version::k_exclusive_pending);
    if (version::WordRef(word).compare_exchange_weak(seen, next, std::memory_order_acq_rel,
                                                     std::memory_order_acquire)) {
      return true;
    }
  }
  return false;
}

}  // namespace tiermem
