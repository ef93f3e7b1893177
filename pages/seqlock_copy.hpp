// Seqlocked copies of a range of an allocation, independent of where the
// version words and the frames are: local memory (atomics and memcpy) or a
// peer's (transport operations). The client and the daemon both copy
// through these, so the protocol exists once.
//
// Write: lock every page of the range (CAS even v -> v+1, only while the
//   page's epoch is the cached one and no exclusive lock is pending), copy
//   every segment, make the data durable and visible (FrameData::write returns
//   only then), unlock (v+2). The write is acknowledged when the unlock is
//   done. Where the words' home runs messages (VersionWords::locked_copy) it
//   does all of that in one request: it locks the pages in ascending order,
//   and on the first it cannot take lets go of those it took, copies nothing
//   and says which page and word stopped it. Elsewhere the caller locks the
//   pages itself: all at once where the words are remote and one-sided
//   (compare_swap_all: one round trip), else in ascending page order; in both
//   it never waits for a page while holding another.
// Read: load the words of the range (retry while any is locked), copy every
//   segment, load again; accept when nothing changed. The whole range is one
//   snapshot, also when its pages live on different nodes (VersionWords::
//   snapshot does the three steps as one request where it can). After a few
//   attempts that writers keep spoiling, the reader locks the pages like a
//   writer (so a busy range cannot starve it).
// A word of another epoch than the cached one means the translation is stale
// (migration, free): both return `stale` and the caller refreshes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>
#include <tiermem/types.h>

#include "pages/pmem_map.hpp"


namespace tiermem {

struct PageRange;
struct CopySegment;
class FrameData;
enum class WordOp;

// The version words of one home node.
class VersionWords {
 public:
  virtual ~VersionWords() = default;
  // Loads words [first, first+count) into out.
  virtual Status load(uint64_t first, size_t count, uint64_t* out) = 0;
  // CAS of word `page` from `expected` to `desired`; *old receives the value
  // seen (== expected on success).
  virtual Status compare_swap(uint64_t page, uint64_t expected, uint64_t desired, uint64_t* old) = 0;
  // Adds 1 to each listed word (unlocks words this caller locked).
  virtual Status release(std::span<const uint64_t> pages) = 0;
  // Whether compare_swap_all costs about what one compare_swap does (remote
  // words: one round trip for all); the protocol then locks a range at once.
  virtual bool batches_locks() const { return false; }
  // Tries to lock pages [first, first + count) at once: word i by a CAS from
  // expected[i] to expected[i] + 1; old[i] receives the value seen (==
  // expected[i]: this caller holds that page now, and releases it). On an
  // error which pages were taken is unknown (the transport failed).
  virtual Status compare_swap_all(uint64_t first, size_t count, const uint64_t* expected, uint64_t* old) {
    for (size_t i = 0; i < count; ++i) {
      Status s = compare_swap(first + i, expected[i], expected[i] + 1, &old[i]);
      if (!s.ok()) return s;
    }
    return Status();
  }
  // A whole locked copy in one request, where the words' home can run it (it
  // holds every segment's frames too): locks every page of `range` in
  // ascending order (each only while writable and of its cached epoch),
  // copies `segments` (into the frames when `to_memory`), makes them durable
  // where the tier is persistent, releases the pages. Errors: not_supported
  // (the caller takes the locks itself); failed_precondition: page
  // range.first_page + *blocked could not be taken (*seen: its word; nothing
  // was copied and no page stays locked); others as load and the copy.
  virtual Status locked_copy(const PageRange& /*range*/, std::span<const CopySegment> /*segments*/,
                             bool /*to_memory*/, uint64_t* /*blocked*/, uint64_t* /*seen*/) {
    return Status(ErrorCode::not_supported, "no locked copy at the home");
  }
  // The same for an atomic on one data word of page `page` (cached word
  // `cached`) in `data`: take the page, run the atomic (*old: the data word
  // before), make it durable where the tier is persistent, release; in one
  // request. `coherent`: the page is checked, not taken (its epoch must be
  // `cached`'s; a writer's lock does not hold a coherent atomic back).
  // Errors: not_supported; failed_precondition (*seen: the page's word;
  // nothing ran and nothing stays locked); others as the atomic.
  virtual Status locked_atomic(uint64_t /*page*/, uint64_t /*cached*/, FrameData& /*data*/,
                               uint64_t /*frame_offset*/, WordOp /*op*/, uint64_t /*operand*/,
                               uint64_t /*compare*/, uint64_t* /*old*/, uint64_t* /*seen*/, bool /*coherent*/) {
    return Status(ErrorCode::not_supported, "no locked atomic at the home");
  }
  // Records a write in the page's L3 bits, where the words live with them.
  virtual void mark_written(uint64_t /*page*/, uint64_t /*offset*/, uint64_t /*length*/, bool /*dirty*/) {}
  // One optimistic read attempt in one go where that is cheaper than three
  // (words, data, words again as separate round trips): loads the words into
  // `before`, copies `segments`, loads the words into `after`, in that order
  // at the target. not_supported: the caller does the three steps itself.
  virtual Status snapshot(uint64_t /*first*/, size_t /*count*/, std::span<const CopySegment> /*segments*/,
                          uint64_t* /*before*/, uint64_t* /*after*/) {
    return Status(ErrorCode::not_supported, "no snapshot");
  }
  // Called by the protocol once it holds a write's page locks (before the
  // first byte is written) and when a read validated: an error when the
  // memory these words guard is no longer served by the daemon the caller's
  // translation came from (it died and another took over), so nothing is
  // written into, or read from, memory that may be someone else's now.
  // Words reached through a transport are bound to their node's incarnation
  // by the endpoint and need no check.
  virtual Status check_owner() { return Status(); }
};

// 64-bit atomics on data words.
enum class WordOp { fetch_add, compare_swap };

// The frames of one tier of one node.
class FrameData {
 public:
  virtual ~FrameData() = default;
  // Atomic on the 8-byte word at `frame_offset`; *old receives its value
  // before. compare_swap stores `operand` when the word equals `compare`.
  virtual Status atomic(uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare,
                        uint64_t* old) = 0;
  virtual Status read(uint64_t frame_offset, void* dst, size_t length) = 0;
  // Returns once the bytes are visible to every reader and, on a persistent
  // tier, durable.
  virtual Status write(uint64_t frame_offset, const void* src, size_t length) = 0;
  virtual bool persistent() const = 0;
  // Called for every segment of a copy before any page is locked: frames
  // that must first be reached (device memory imported on first use) are
  // made ready. An error ends the copy before it touched anything.
  virtual Status prepare(uint64_t /*frame_offset*/, size_t /*length*/) { return Status(); }
};

// The pages a copy touches: version words [first_page, first_page + count),
// their cached values, and where the copy starts in the first.
struct PageRange {
  uint64_t first_page = 0;
  uint64_t count = 0;
  const uint64_t* cached = nullptr;
  uint64_t page_size = 0;
  uint64_t offset = 0;  // of the copy's first byte in the first page
};

// A CPU atomic on a word of memory mapped into this process (also what UCX's
// emulated atomics do at the target, so the two are atomic with each other).
uint64_t host_atomic(std::byte* word, WordOp op, uint64_t operand, uint64_t compare);

// The error for a translation that went stale; callers refresh and retry.
Status stale_translation();
bool is_stale(const Status& s);
// out_of_range for a read (`write` false) or write of `length` bytes at
// `gva`, `offset` bytes into the allocation at `base` of `size` bytes, that
// runs past its end (clients and daemons say it alike).
Status past_the_end(bool write, uint64_t length, Gva gva, uint64_t offset, Gva base, uint64_t size);

// One physically contiguous piece of a copy.
struct CopySegment {
  FrameData* frames = nullptr;
  uint64_t frame_offset = 0;
  uint64_t range_offset = 0;  // from the copy's first byte
  std::byte* buffer = nullptr;
  size_t length = 0;
};

// Errors: stale (refresh the translation), busy (a page stayed locked past
// `timeout`), and whatever the words or frames return.
Status seqlocked_write(VersionWords& words, const PageRange& pages, std::span<const CopySegment> segments,
                       std::chrono::milliseconds timeout);
Status seqlocked_read(VersionWords& words, const PageRange& pages, std::span<const CopySegment> segments,
                      std::chrono::milliseconds timeout);
// An atomic on one data word of the page whose version word is `page`
// (cached value `cached`). A coherent page is never migrated, so the atomic
// goes straight to the word (one operation); any other page is locked like a
// one-page write around it, so a migration or free cannot lose it.
Status seqlocked_atomic(VersionWords& words, FrameData& data, uint64_t page, uint64_t cached,
                        bool coherent, uint64_t frame_offset, WordOp op, uint64_t operand,
                        uint64_t compare, uint64_t* old, std::chrono::milliseconds timeout);

// Version words in this process's memory (the daemon's array, or a client's
// mapping of one domain of it), with the L3 words beside them when given.
// words[0] is the word of page `first`; pages [first, first + count).
class LocalVersionWords : public VersionWords {
 public:
  LocalVersionWords(uint64_t* words, size_t count, uint64_t* l3 = nullptr, uint64_t page_size = 0,
                    uint64_t first = 0)
      : m_words(words), m_count(count), m_l3(l3), m_page_size(page_size), m_first(first) {}
  Status load(uint64_t first, size_t count, uint64_t* out) override;
  Status compare_swap(uint64_t page, uint64_t expected, uint64_t desired, uint64_t* old) override;
  Status release(std::span<const uint64_t> pages) override;
  void mark_written(uint64_t page, uint64_t offset, uint64_t length, bool dirty) override;

 private:
  bool holds(uint64_t page, size_t count) const {
    return page >= m_first && page - m_first <= m_count && count <= m_count - (page - m_first);
  }
  uint64_t& word(uint64_t page) { return m_words[page - m_first]; }

  uint64_t* m_words;
  size_t m_count;
  uint64_t* m_l3;
  uint64_t m_page_size;
  uint64_t m_first;
};

// Frames in memory mapped into this process. On a persistent tier a write or
// atomic returns once its bytes are durable, made so as `durability` says
// (PmemMap::durability(): libpmem2's functions where it flushes from user
// space, else msync of the pages touched, whose failure is io_error).
class MappedFrameData final : public FrameData {
 public:
  MappedFrameData(std::byte* base, size_t length, bool persistent, Durability durability = {})
      : m_base(base), m_length(length), m_persistent(persistent), m_durability(durability) {}
  Status read(uint64_t frame_offset, void* dst, size_t length) override;
  Status write(uint64_t frame_offset, const void* src, size_t length) override;
  Status atomic(uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare,
                uint64_t* old) override;
  bool persistent() const override { return m_persistent; }

 private:
  // Makes [at, at + length) of the frames durable.
  Status persist(const std::byte* at, size_t length) const;

  std::byte* m_base;
  size_t m_length;
  bool m_persistent;
  Durability m_durability;
};

// Where an allocation's pages are, as a client or daemon caches it.
struct LayoutView {
  NodeId home = 0;                         // holds the version words
  uint64_t first_page = 0;                 // version word of the allocation's first page
  uint64_t page_size = 0;
  uint64_t size = 0;                       // bytes of the allocation
  std::span<const Extent> extents;         // in GVA order, covering every page
  std::span<const uint64_t> page_versions; // cached word of every page
  uint64_t page_offset = 0;                // of the allocation's first byte in its first page
};

// Hands out the accessors for a node's version words and tier frames.
class MemoryAccess {
 public:
  virtual ~MemoryAccess() = default;
  // The words of `home`'s pages from `first_page` on (one domain: an
  // allocation never spans two). Errors: not_supported when this process
  // cannot reach them directly (the caller then goes through a daemon),
  // transport_error when the node is down.
  virtual Result<VersionWords*> versions(NodeId home, uint64_t first_page) = 0;
  virtual Result<FrameData*> frames(NodeId node, Tier tier) = 0;
};

// A copy of [offset, offset+length) of an allocation, laid out: the home's
// words, the pages it touches and one segment per extent it covers (frames
// prepared). Errors: out_of_range (outside the allocation), stale (the
// layout does not cover it), and the accessors'.
struct CopyPlan {
  VersionWords* words = nullptr;
  PageRange range;
  std::vector<CopySegment> segments;
};
Status plan_copy(const LayoutView& layout, MemoryAccess& access, uint64_t offset, std::byte* buffer, size_t length,
                 CopyPlan* plan);

// Copies [offset, offset+length) of an allocation as one seqlocked range (one
// segment per extent it covers). Errors as seqlocked_write/read; out_of_range
// for a range outside the allocation.
Status copy_through_layout(const LayoutView& layout, MemoryAccess& access, uint64_t offset,
                           std::byte* buffer, size_t length, bool to_memory,
                           std::chrono::milliseconds timeout);

}  // namespace tiermem
