// Demotion under capacity pressure (M7): when a tier of this node passes its
// high-water mark, the coldest pages of allocations asked `demotable` move
// to the next tier down (VRAM -> DRAM -> PMEM) until the tier is back under
// its low-water mark, while clients go on reading and writing them.
//
// How cold a page is. A writer bumps a page's version word (the seqlock),
// so a round that finds the word as the round before found it saw no write
// in between; a page's idle rounds count such rounds in a row. Reads leave
// no trace (co-located clients read the tier's memory directly and
// validate against the word; remote ones read one-sided), so "cold" means
// "not written lately": a page read every step but never written goes down
// before one written every step. That fits what training keeps (weights and
// optimizer state are written every step; snapshots, checkpoints and
// finished activations are not) and costs one load per page per round.
//
// A round (every `interval`): for each tier that has a tier below it here,
// look at every demotable page on it, update its idle count; when the
// tier's used frames are above high_water_percent of its capacity, take
// the pages with the most idle rounds (ties by address; a page written
// since the last look, or seen for the first time, is never taken)
// until low_water_percent would be reached, and move them with the
// Migrator (per allocation, in runs; each run commits durably or not at
// all; readers retry and writers wait as for any migration). The pages go
// to the first tier down with free frames. A tier under pressure with
// nothing demotable is left alone (allocations there fall back down the
// chain as M6 says); an allocation whose move fails (its tenant's quota
// below, a client mapping it meanwhile, a page held locked past the lock
// timeout) is counted, logged and left alone for k_backoff_rounds rounds. A
// page whose version word is locked is never idle: no move waits for a
// writer that holds it.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include <tiermem/types.h>

#include "mapping/address_space.hpp"

namespace tiermem {

struct DemotionOptions {
  bool enabled = true;
  uint32_t high_water_percent = 90;  // of a tier's capacity, in frames
  uint32_t low_water_percent = 80;
  std::chrono::milliseconds interval{500};
  std::chrono::milliseconds lock_timeout{5000};  // a page lock the move waits for
};

// What demotion did since the daemon started (metrics, tiermemctl stats).
struct DemotionCounters {
  // Pages moved, by [from][to] (Tier indices).
  std::array<std::array<uint64_t, 4>, 4> pages{};
  uint64_t rounds = 0;          // rounds that found a tier above its high-water mark
  uint64_t failures = 0;        // allocations whose move failed in a round
  uint64_t nothing_to_move = 0; // rounds under pressure with no demotable page unwritten for a round
};

class Demoter {
 public:
  // `limits`: a tenant's quotas (frames taken below count against them).
  Demoter(AddressSpace& space, std::function<TenantLimits(const std::string&)> limits, DemotionOptions options);
  ~Demoter();
  Demoter(const Demoter&) = delete;
  Demoter& operator=(const Demoter&) = delete;

  // Starts the background rounds (no-op when disabled).
  void start();
  // One round now, on the caller's thread (the background rounds call it).
  void round();
  DemotionCounters counters() const;

 private:
  struct Heat {
    uint64_t version = 0;
    uint32_t idle_rounds = 0;
    uint64_t seen = 0;  // the round that last saw it
  };
  void run();
  // Looks at `tier`'s demotable pages and, under pressure, moves the
  // coldest down.
  void round_of(Tier tier);
  // The first tier below `tier` on this node with `pages` free frames (or
  // the first one with any); automatic when there is none.
  Tier destination(Tier tier, uint64_t pages) const;

  AddressSpace& m_space;
  std::function<TenantLimits(const std::string&)> m_limits;
  DemotionOptions m_options;
  static constexpr uint64_t k_backoff_rounds = 20;
  std::unordered_map<uint64_t, Heat> m_heat;  // by page (only the round's thread touches it)
  // Allocations (generation, offset) whose move failed: left alone until
  // that round.
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> m_backoff;
  uint64_t m_round = 0;
  mutable std::mutex m_mutex;  // m_counters, m_stop
  DemotionCounters m_counters;
  std::condition_variable m_wake;
  bool m_stop = false;
  std::thread m_thread;
};

}  // namespace tiermem
