// The short path for a word of a coherent allocation (internal; issue 52):
// one CPU atomic on the mapped word, after the page's version word says the
// translation still holds and its daemon is still the one mapped. The
// general path (ClientCore::atomic_once) takes a translation from the cache,
// decides routes, records the words it would lock and counts through mutexes
// and shared pointers: some 350 ns around a 20 ns atomic. A coherent page
// never moves and its atomics take no lock, so what the general path learns
// the first time (where the word's frames and version words are mapped) is
// kept here and used while three loads still agree with it:
//   - the route's generation is the current one (this client freed nothing,
//     forgot no node since; ClientCore::forget and forget_node bump it);
//   - the page's version word is of the epoch the translation saw (a free,
//     by anyone, gives the page a new epoch before its frames go back);
//   - the daemon serving the frames is the one mapped, and alive
//     (VersionWords::check_owner, as every direct write checks).
// Anything else (not learnt, overwritten, a check that fails, an error of
// the atomic itself) is left to the general path, which says what is wrong.
//
// Thread-safe. Routes are immutable once published and live as long as this
// object (a bounded number: past k_most, nothing more is learnt), so a reader
// never sees one freed.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <tiermem/types.h>

#include "client/translation_cache.hpp"
#include "pages/seqlock_copy.hpp"

namespace tiermem::detail {

class CoherentWords {
 public:
  struct Route {
    Gva base;                   // the allocation's first byte
    uint64_t first = 0;         // GVA offsets [first, end) of one extent
    uint64_t end = 0;
    uint64_t frame_first = 0;   // the frame offset of `first`
    uint64_t first_page = 0;    // the allocation's first version word
    uint64_t page_size = 0;
    FrameData* frames = nullptr;   // mapped frames (this node's, or a sibling's)
    VersionWords* words = nullptr; // the home's mapped version words
    std::shared_ptr<const CachedAllocation> alloc;  // the versions it was translated at
    std::shared_ptr<const void> keep[2];  // what keeps `frames` and `words` mapped
    uint8_t path = 0;           // ClientCore's Path, for its counters
    uint64_t generation = 0;    // set by learn()
  };

  // Runs `op` on the word at `gva` (8-byte aligned: the caller checked) when
  // a route learnt before still holds. true: done, *old is the word before
  // and *path the route's path; false: nothing was done.
  bool run(Gva gva, uint64_t page_size, WordOp op, uint64_t operand, uint64_t compare, uint64_t* old,
           uint8_t* path) const;
  // Keeps `route` for the words of its extent on the page of `at` (not
  // frames that persist).
  void learn(Gva at, Route route);
  // Every route learnt so far is void.
  void forget_all() { m_generation.fetch_add(1, std::memory_order_acq_rel); }

 private:
  static constexpr size_t k_slots = 64;
  static constexpr size_t k_most = 1024;
  static size_t slot_of(Gva gva, uint64_t page_size);
  std::array<std::atomic<const Route*>, k_slots> m_slots{};
  std::atomic<uint64_t> m_generation{1};
  std::mutex m_mutex;
  std::vector<std::unique_ptr<Route>> m_routes;  // every route published
};

}  // namespace tiermem::detail
