// The layout of a domain's header file, header.<k> (mapping/version_segments.hpp
// makes and keeps those files): what a client maps read-only to learn whether
// the daemon that serves a domain is still the one it talks to, and alive.
// Apart from the daemon's VersionSegments so that libtiermem includes only the
// layout, not the daemon's code.
#pragma once

#include <pthread.h>

#include <cstdint>

namespace tiermem {

struct SegmentHeader {
  static constexpr uint64_t k_magic = 0x31305352'45564d54;  // "TMVERS01"
  // 2: the header in a file of its own (1 had it in the words' first page,
  // where clients could write it).
  static constexpr uint64_t k_layout = 2;
  uint64_t magic = 0;
  uint64_t layout = 0;
  uint64_t node = 0;
  uint64_t domain = 0;
  uint64_t incarnation = 0;        // of the serving daemon; 0: retired, never use
  uint64_t memory_generation = 0;  // of the domain: random, new whenever its files are made anew
  uint64_t pages = 0;              // R
  uint64_t page_size = 0;
  char tenant[64] = {};            // the domain's tenant; empty while unassigned
  // The serving daemon's liveness: a robust, process-shared mutex that one
  // of its threads holds for as long as it serves (LivenessHolder). When the
  // process dies, however it dies, the kernel marks the mutex's futex word
  // FUTEX_OWNER_DIED while the process exits, before its sockets close and
  // before a waitpid() returns, so a client reads in one load what its
  // watcher thread would learn only later. All zeros: nobody holds it (a
  // process that only maps the words, like a unit test).
  pthread_mutex_t alive{};
};
// The futex word of SegmentHeader::alive (glibc keeps it first).
inline const uint32_t* alive_word(const SegmentHeader& h) { return reinterpret_cast<const uint32_t*>(&h.alive); }
// The daemon that held `word` died.
inline bool owner_died(uint32_t word) { return (word & 0x40000000u) != 0; }  // FUTEX_OWNER_DIED
static_assert(sizeof(SegmentHeader) <= 4096, "the header fits its page");

inline constexpr uint64_t k_segment_header_bytes = 4096;
// Pages per domain are a multiple of this, so that each domain's words are
// whole system pages (they are mapped side by side).
inline constexpr uint64_t k_pages_per_domain_unit = 512;

}  // namespace tiermem
