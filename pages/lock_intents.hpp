// Page locks belong to a session (S3). A client records every page lock it
// takes or is about to take in a log of its own (a file the daemon made for
// its session and maps too): the node holding the version word, the page,
// and the value the word has while the client holds it. When the session
// ends and its process is gone, the daemon breaks the locks the log still
// shows: a word that still has exactly the recorded value is moved on to the
// next stable value and its page is marked torn (the write that held it was
// never acknowledged; the bytes may be partly its). A word that moved on
// since is somebody else's and is left alone, so a stale record can never
// break a live writer's lock.
//
// The client is trusted with nothing here: a wrong record can at worst break
// a lock of its own tenant's pages (the only words it can write anyway).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>

#include "pages/seqlock_copy.hpp"

namespace tiermem {

struct LockIntent {
  uint64_t page = 0;    // 0: free entry (page 0 is never allocated)
  uint64_t locked = 0;  // the word's value while held (odd)
  uint64_t node = 0;    // the home of the version word
};

inline constexpr uint64_t k_intents_magic = 0x31305454'4e494d54;  // "TMINTT01"
inline constexpr size_t k_intent_log_bytes = 1 << 20;
inline constexpr size_t k_intents = (k_intent_log_bytes - 64) / sizeof(LockIntent);

struct IntentLogHeader {
  uint64_t magic = 0;
  uint64_t session = 0;
  uint64_t pid = 0;
  uint64_t next = 0;  // where add() starts looking for a free entry (a hint)
  uint64_t reserved[4] = {};
};
static_assert(sizeof(IntentLogHeader) == 64);

// A view of a log in memory mapped by this process (the client's or the
// daemon's mapping). Thread-safe: entries are claimed with atomics.
class IntentLog {
 public:
  IntentLog() = default;
  explicit IntentLog(std::byte* base) : m_base(base) {}
  bool valid() const { return m_base != nullptr; }

  // Records a lock about to be taken; the entry's index. Errors: busy (the
  // log is full: more pages locked at once than it holds).
  Result<size_t> add(NodeId node, uint64_t page, uint64_t locked);
  // Forgets entry `index` (released, or never taken).
  void remove(size_t index);
  // Every entry in use now, of those with indexes [first, first + count).
  std::vector<LockIntent> entries(size_t first = 0, size_t count = k_intents) const;

 private:
  uint64_t& next() const { return reinterpret_cast<IntentLogHeader*>(m_base)->next; }
  LockIntent* entry(size_t i) const {
    return reinterpret_cast<LockIntent*>(m_base + sizeof(IntentLogHeader)) + i;
  }
  std::byte* m_base = nullptr;
};

// Version words whose locks are recorded in a log (wraps the words a copy
// goes through; everything else is passed on).
class RecordedVersionWords final : public VersionWords {
 public:
  RecordedVersionWords(VersionWords& inner, IntentLog log, NodeId home) : m_inner(inner), m_log(log), m_home(home) {}
  Status load(uint64_t first, size_t count, uint64_t* out) override { return m_inner.load(first, count, out); }
  Status compare_swap(uint64_t page, uint64_t expected, uint64_t desired, uint64_t* old) override;
  Status release(std::span<const uint64_t> pages) override;
  bool batches_locks() const override { return m_inner.batches_locks(); }
  // Each lock is recorded before the batch can take it, like compare_swap.
  Status compare_swap_all(uint64_t first, size_t count, const uint64_t* expected, uint64_t* old) override;
  // Not recorded: the home takes and lets go of the locks within the one
  // request; this process holds none of them at any time.
  Status locked_copy(const PageRange& range, std::span<const CopySegment> segments, bool to_memory,
                     uint64_t* blocked, uint64_t* seen) override {
    return m_inner.locked_copy(range, segments, to_memory, blocked, seen);
  }
  Status locked_atomic(uint64_t page, uint64_t cached, FrameData& data, uint64_t frame_offset, WordOp op,
                       uint64_t operand, uint64_t compare, uint64_t* old, uint64_t* seen, bool coherent) override {
    return m_inner.locked_atomic(page, cached, data, frame_offset, op, operand, compare, old, seen, coherent);
  }
  void mark_written(uint64_t page, uint64_t offset, uint64_t length, bool dirty) override {
    m_inner.mark_written(page, offset, length, dirty);
  }
  Status snapshot(uint64_t first, size_t count, std::span<const CopySegment> segments, uint64_t* before,
                  uint64_t* after) override {
    return m_inner.snapshot(first, count, segments, before, after);
  }
  Status check_owner() override { return m_inner.check_owner(); }

 private:
  VersionWords& m_inner;
  IntentLog m_log;
  NodeId m_home;
  // The pages this object locked, with their entries in the log.
  std::vector<std::pair<uint64_t, size_t>> m_held;
};

// The daemon's side: breaks the lock of `word` when it still has the value
// `locked`; true when it did (the caller marks the page torn).
bool break_lock(uint64_t& word, uint64_t locked);

}  // namespace tiermem
