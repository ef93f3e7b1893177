#include "pages/seqlock_copy.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <tiermem/status_macros.h>

#include "pages/sub_blocks.hpp"
#include "pages/version.hpp"

namespace tiermem {

void mark_sub_blocks(uint64_t* words, uint64_t page_size, uint64_t offset, uint64_t length,
                     bool dirty) {
  if (length == 0) return;
  const uint64_t block = page_size / k_sub_blocks_per_page;
  const uint64_t first = offset / block;
  const uint64_t count = (offset + length - 1) / block - first + 1;
  const uint64_t bits = count >= 64 ? ~uint64_t{0} : ((uint64_t{1} << count) - 1) << first;
  // Skip the atomic when the bits are already set: the common case for
  // repeated writes, and it keeps the cache line shared.
  for (int i = 0; i < (dirty ? 2 : 1); ++i) {
    std::atomic_ref<uint64_t> w(words[i]);
    if ((w.load(std::memory_order_relaxed) & bits) != bits) w.fetch_or(bits, std::memory_order_relaxed);
  }
}

namespace {

// Small runs keep their words on the stack.
class WordBuffer {
 public:
  explicit WordBuffer(size_t n) {
    if (n > std::size(m_inline)) m_heap.resize(n);
    m_data = n > std::size(m_inline) ? m_heap.data() : m_inline;
  }
  uint64_t* data() { return m_data; }
  uint64_t& operator[](size_t i) { return m_data[i]; }

 private:
  uint64_t m_inline[32];
  std::vector<uint64_t> m_heap;
  uint64_t* m_data;
};

Status busy(uint64_t page) {
  return Status(ErrorCode::busy, "page " + std::to_string(page) +
                                     " stayed locked by another writer (a writer may have stopped mid-write)");
}

}  // namespace

Status stale_translation() {
  return Status(ErrorCode::stale_translation, "the page moved or was freed since it was translated");
}
bool is_stale(const Status& s) { return s.code() == ErrorCode::stale_translation; }

Status past_the_end(bool write, uint64_t length, Gva gva, uint64_t offset, Gva base, uint64_t size) {
  return Status(ErrorCode::out_of_range, std::string(write ? "write" : "read") + " of " + std::to_string(length) +
                                             " bytes at " + gva.to_string() + " (offset " + std::to_string(offset) +
                                             ") runs past the end of allocation " + base.to_string() + " of " +
                                             std::to_string(size) + " bytes");
}

namespace {

// Waits, holding nothing, until page `index` of `range` (whose word was
// `seen`) may be taken: writable, or of another epoch (stale). *seen gets the
// word it ended with.
Status wait_for_page(VersionWords& words, const PageRange& range, uint64_t index, version::SpinWait& wait,
                     uint64_t* seen) {
  for (;;) {
    if (version::epoch_of(*seen) != version::epoch_of(range.cached[index])) return stale_translation();
    if (version::writable(*seen)) return Status();
    if (!wait.again()) return busy(range.first_page + index);
    TIERMEM_RETURN_IF_ERROR(words.load(range.first_page + index, 1, seen));
  }
}

// Batched rounds before lock_pages goes page by page.
constexpr int k_batched_rounds = 4;

// Locks every page of `range` at once where the words take a batch of CASes
// in one go (remote and one-sided: one round trip): CAS them all from what
// we know of them, and when some failed let go of the rest, wait for any
// page that is taken and start over from the words seen. Holding nothing
// while waiting, it cannot deadlock. not_supported (holding nothing): lock
// page by page.
Status lock_pages_batched(VersionWords& words, const PageRange& range, version::SpinWait& wait,
                          std::vector<uint64_t>* held) {
  if (!words.batches_locks()) return Status(ErrorCode::not_supported, "words lock page by page");
  WordBuffer known(range.count), old(range.count);
  for (uint64_t i = 0; i < range.count; ++i) known[i] = range.cached[i];
  for (int round = 0; round < k_batched_rounds; ++round) {
    // A CAS from a locked value would unlock another writer's page: wait
    // (holding nothing) until each page may be taken.
    for (uint64_t i = 0; i < range.count; ++i) {
      if (!version::writable(known[i]) || version::epoch_of(known[i]) != version::epoch_of(range.cached[i])) {
        TIERMEM_RETURN_IF_ERROR(wait_for_page(words, range, i, wait, &known[i]));
      }
    }
    TIERMEM_RETURN_IF_ERROR(words.compare_swap_all(range.first_page, range.count, known.data(), old.data()));
    held->clear();
    for (uint64_t i = 0; i < range.count; ++i) {
      if (old[i] == known[i]) held->push_back(range.first_page + i);
    }
    if (held->size() == range.count) return Status();
    // Some had moved on (or were taken): let go of ours and try again from
    // what is there.
    if (!held->empty()) TIERMEM_RETURN_IF_ERROR(words.release(*held));
    for (uint64_t i = 0; i < range.count; ++i) known[i] = old[i] == known[i] ? old[i] + 2 : old[i];
    held->clear();
  }
  // Others keep getting in between: page by page, ascending.
  return Status(ErrorCode::not_supported, "batched locks keep failing");
}

// Locks the pages of `range` into *held: at once where the words take a
// batch (lock_pages_batched), else in ascending order. It never waits while
// holding a lock: when a page is taken (or wanted exclusively by the
// daemon), it lets go of what it holds, waits for that page, and starts over.
// Holding some pages while waiting for others would let one slow writer keep
// a migration, and everyone behind it, waiting.
Status lock_pages(VersionWords& words, const PageRange& range, version::SpinWait& wait,
                  std::vector<uint64_t>* held) {
  if (Status s = lock_pages_batched(words, range, wait, held); s.code() != ErrorCode::not_supported) return s;
  held->clear();
  WordBuffer known(range.count);
  for (uint64_t i = 0; i < range.count; ++i) known[i] = range.cached[i];
  for (;;) {
    held->clear();
    uint64_t blocked = range.count;  // the index of the page that stopped us
    for (uint64_t i = 0; i < range.count && blocked == range.count; ++i) {
      const uint64_t page = range.first_page + i;
      // Two tries per page: a third means others keep writing it, and holding
      // the pages before it meanwhile would block them for nothing.
      for (int tries = 0;; ++tries) {
        if (version::epoch_of(known[i]) != version::epoch_of(range.cached[i])) {
          (void)words.release(*held);
          held->clear();
          return stale_translation();
        }
        if (!version::writable(known[i]) || (tries >= 2 && !held->empty())) {
          blocked = i;
          break;
        }
        uint64_t old = 0;
        Status s = words.compare_swap(page, known[i], known[i] + 1, &old);
        if (!s.ok()) {
          (void)words.release(*held);
          held->clear();
          return s;
        }
        if (old == known[i]) {
          known[i] = old + 1;
          held->push_back(page);
          break;
        }
        known[i] = old;  // someone wrote since: try again from what is there
      }
    }
    if (blocked == range.count) return Status();
    TIERMEM_RETURN_IF_ERROR(words.release(*held));
    held->clear();
    // Wait, holding nothing, until the page that stopped us is free.
    for (;;) {
      if (!wait.again()) return busy(range.first_page + blocked);
      TIERMEM_RETURN_IF_ERROR(words.load(range.first_page + blocked, 1, &known[blocked]));
      if (version::writable(known[blocked]) ||
          version::epoch_of(known[blocked]) != version::epoch_of(range.cached[blocked])) {
        break;
      }
    }
    // What we released moved on by one; reload the rest on the next CAS.
  }
}

// The home runs the whole locked copy where it can (one request): retried
// while a page is taken, waiting for it holding nothing. not_supported: the
// caller locks the pages itself.
Status locked_copy_at_home(VersionWords& words, const PageRange& range, std::span<const CopySegment> segments,
                           bool to_memory, version::SpinWait& wait) {
  for (;;) {
    uint64_t blocked = 0;
    uint64_t seen = 0;
    Status s = words.locked_copy(range, segments, to_memory, &blocked, &seen);
    if (s.code() != ErrorCode::failed_precondition) return s;
    if (blocked >= range.count) return Status(ErrorCode::internal, "a locked copy blamed a page outside its range");
    TIERMEM_RETURN_IF_ERROR(wait_for_page(words, range, blocked, wait, &seen));
  }
}

Status copy_segments(std::span<const CopySegment> segments, bool to_memory) {
  for (const CopySegment& seg : segments) {
    Status s = to_memory ? seg.frames->write(seg.frame_offset, seg.buffer, seg.length)
                         : seg.frames->read(seg.frame_offset, seg.buffer, seg.length);
    if (!s.ok()) return s;
  }
  return Status();
}

// Reads that writers spoiled this often lock the range instead.
constexpr int k_optimistic_reads = 8;

}  // namespace

Status seqlocked_write(VersionWords& words, const PageRange& range, std::span<const CopySegment> segments,
                       std::chrono::milliseconds timeout) {
  version::SpinWait wait(timeout);
  if (Status s = locked_copy_at_home(words, range, segments, true, wait); s.code() != ErrorCode::not_supported) {
    return s;
  }
  std::vector<uint64_t> held;
  held.reserve(range.count);
  TIERMEM_RETURN_IF_ERROR(lock_pages(words, range, wait, &held));
  if (Status owner = words.check_owner(); !owner.ok()) {
    (void)words.release(held);
    return owner;
  }
  Status s = copy_segments(segments, true);
  if (s.ok()) {
    for (const CopySegment& seg : segments) {
      // The pages this segment touched, and which bytes of them.
      uint64_t at = range.offset + seg.range_offset;
      const uint64_t end = at + seg.length;
      while (at < end) {
        const uint64_t index = at / range.page_size;
        const uint64_t in_page = at % range.page_size;
        const uint64_t n = std::min(end - at, range.page_size - in_page);
        words.mark_written(range.first_page + index, in_page, n, !seg.frames->persistent());
        at += n;
      }
    }
  }
  Status r = words.release(held);
  return s.ok() ? r : s;
}

Status seqlocked_read(VersionWords& words, const PageRange& range, std::span<const CopySegment> segments,
                      std::chrono::milliseconds timeout) {
  WordBuffer before(range.count), after(range.count);
  version::SpinWait wait(timeout);
  bool snapshots = true;
  for (int attempt = 0; attempt < k_optimistic_reads;) {
    if (snapshots) {
      Status s = words.snapshot(range.first_page, range.count, segments, before.data(), after.data());
      if (s.ok()) {
        ++attempt;
        bool usable = true;
        for (uint64_t i = 0; i < range.count; ++i) {
          if (version::epoch_of(before[i]) != version::epoch_of(range.cached[i])) return stale_translation();
          usable = usable && !version::is_locked(before[i]);
        }
        if (usable && std::memcmp(before.data(), after.data(), range.count * sizeof(uint64_t)) == 0) {
          return words.check_owner();
        }
        if (!wait.again()) return busy(range.first_page);
        continue;
      }
      if (s.code() != ErrorCode::not_supported) return s;
      snapshots = false;
    }
    Status s = words.load(range.first_page, range.count, before.data());
    if (!s.ok()) return s;
    uint64_t locked_page = ~uint64_t{0};
    for (uint64_t i = 0; i < range.count; ++i) {
      if (version::epoch_of(before[i]) != version::epoch_of(range.cached[i])) return stale_translation();
      if (version::is_locked(before[i]) && locked_page == ~uint64_t{0}) locked_page = range.first_page + i;
    }
    if (locked_page == ~uint64_t{0}) {
      ++attempt;
      s = copy_segments(segments, false);
      if (!s.ok()) return s;
      std::atomic_thread_fence(std::memory_order_acquire);
      s = words.load(range.first_page, range.count, after.data());
      if (!s.ok()) return s;
      if (std::memcmp(before.data(), after.data(), range.count * sizeof(uint64_t)) == 0) return words.check_owner();
      locked_page = range.first_page;
    }
    if (!wait.again()) return busy(locked_page);
  }
  // Writers keep getting in: take the pages like a writer, copy, let go.
  if (Status s = locked_copy_at_home(words, range, segments, false, wait); s.code() != ErrorCode::not_supported) {
    return s.ok() ? words.check_owner() : s;
  }
  std::vector<uint64_t> held;
  held.reserve(range.count);
  TIERMEM_RETURN_IF_ERROR(lock_pages(words, range, wait, &held));
  Status s = words.check_owner();
  if (s.ok()) s = copy_segments(segments, false);
  Status r = words.release(held);
  return s.ok() ? r : s;
}

uint64_t host_atomic(std::byte* word, WordOp op, uint64_t operand, uint64_t compare) {
  std::atomic_ref<uint64_t> w(*reinterpret_cast<uint64_t*>(word));
  if (op == WordOp::fetch_add) return w.fetch_add(operand, std::memory_order_acq_rel);
  uint64_t seen = compare;
  w.compare_exchange_strong(seen, operand, std::memory_order_acq_rel, std::memory_order_acquire);
  return seen;
}

Status seqlocked_atomic(VersionWords& words, FrameData& data, uint64_t page, uint64_t cached,
                        bool coherent, uint64_t frame_offset, WordOp op, uint64_t operand,
                        uint64_t compare, uint64_t* old, std::chrono::milliseconds timeout) {
  version::SpinWait wait(timeout);
  // The home takes the page, runs the atomic and lets go in one request
  // where it can (the message path). A coherent page's is checked instead
  // of taken, in the same request: a word freed since it was translated is
  // refused (stale) instead of added into whatever took its frames.
  PageRange one;
  one.first_page = page;
  one.count = 1;
  one.cached = &cached;
  for (;;) {
    uint64_t seen = 0;
    Status s = words.locked_atomic(page, cached, data, frame_offset, op, operand, compare, old, &seen, coherent);
    if (s.code() == ErrorCode::not_supported) break;
    if (s.code() != ErrorCode::failed_precondition) return s;
    TIERMEM_RETURN_IF_ERROR(wait_for_page(words, one, 0, wait, &seen));
  }
  if (coherent) {
    // One operation, mapped or in this process: the caller checked the
    // epoch. One-sided callers lock coherent pages too (pass false).
    TIERMEM_RETURN_IF_ERROR(words.check_owner());
    return data.atomic(frame_offset, op, operand, compare, old);
  }
  uint64_t expected = cached;
  for (;;) {
    if (version::epoch_of(expected) != version::epoch_of(cached)) return stale_translation();
    if (version::writable(expected)) {
      uint64_t seen = 0;
      Status s = words.compare_swap(page, expected, expected + 1, &seen);
      if (!s.ok()) return s;
      if (seen == expected) break;
      expected = seen;
      continue;
    }
    if (!wait.again()) return busy(page);
    Status s = words.load(page, 1, &expected);
    if (!s.ok()) return s;
  }
  Status s = words.check_owner();
  if (s.ok()) s = data.atomic(frame_offset, op, operand, compare, old);
  const uint64_t held[1] = {page};
  Status r = words.release(held);
  return s.ok() ? r : s;
}

Status plan_copy(const LayoutView& layout, MemoryAccess& access, uint64_t offset, std::byte* buffer, size_t length,
                 CopyPlan* plan) {
  if (offset > layout.size || length > layout.size - offset) {
    return Status(ErrorCode::out_of_range, "range of " + std::to_string(length) + " bytes at offset " +
                                               std::to_string(offset) + " runs past the end of an allocation of " +
                                               std::to_string(layout.size) + " bytes");
  }
  TIERMEM_ASSIGN_OR_RETURN(plan->words, access.versions(layout.home, layout.first_page));
  // A sub-page allocation starts inside its page (and never leaves it).
  const uint64_t first_index = (layout.page_offset + offset) / layout.page_size;
  const uint64_t last_index = (layout.page_offset + offset + length - 1) / layout.page_size;
  if (last_index >= layout.page_versions.size()) return stale_translation();
  PageRange& range = plan->range;
  range.first_page = layout.first_page + first_index;
  range.count = last_index - first_index + 1;
  range.cached = layout.page_versions.data() + first_index;
  range.page_size = layout.page_size;
  range.offset = (layout.page_offset + offset) % layout.page_size;

  plan->segments.clear();
  uint64_t at = offset;
  size_t x = 0;
  while (at < offset + length) {
    while (x < layout.extents.size() && at >= layout.extents[x].gva_offset + layout.extents[x].length) ++x;
    if (x == layout.extents.size() || at < layout.extents[x].gva_offset) return stale_translation();
    const Extent& e = layout.extents[x];
    TIERMEM_ASSIGN_OR_RETURN(auto frames, access.frames(e.node, e.tier));
    const uint64_t in_extent = at - e.gva_offset;
    CopySegment seg;
    seg.frames = frames;
    seg.frame_offset = e.frame_offset + in_extent;
    seg.range_offset = at - offset;
    seg.buffer = buffer + seg.range_offset;
    seg.length = std::min<uint64_t>(offset + length - at, e.length - in_extent);
    TIERMEM_RETURN_IF_ERROR(frames->prepare(seg.frame_offset, seg.length));
    plan->segments.push_back(seg);
    at += seg.length;
  }
  return Status();
}

Status copy_through_layout(const LayoutView& layout, MemoryAccess& access, uint64_t offset,
                           std::byte* buffer, size_t length, bool to_memory,
                           std::chrono::milliseconds timeout) {
  if (length == 0 && offset <= layout.size) return Status();
  CopyPlan plan;
  TIERMEM_RETURN_IF_ERROR(plan_copy(layout, access, offset, buffer, length, &plan));
  return to_memory ? seqlocked_write(*plan.words, plan.range, plan.segments, timeout)
                   : seqlocked_read(*plan.words, plan.range, plan.segments, timeout);
}

Status LocalVersionWords::load(uint64_t first, size_t count, uint64_t* out) {
  if (!holds(first, count)) return Status(ErrorCode::out_of_range, "version word beyond the array");
  for (size_t i = 0; i < count; ++i) out[i] = version::load(word(first + i));
  return Status();
}

Status LocalVersionWords::compare_swap(uint64_t page, uint64_t expected, uint64_t desired, uint64_t* old) {
  if (!holds(page, 1)) return Status(ErrorCode::out_of_range, "version word beyond the array");
  uint64_t seen = expected;
  // seq_cst: check_owner's load of the segment header after a lock must not
  // be reordered before it (the daemon retires a segment, then looks for locks).
  version::WordRef(word(page)).compare_exchange_strong(seen, desired, std::memory_order_seq_cst,
                                                       std::memory_order_relaxed);
  *old = seen;
  return Status();
}

Status LocalVersionWords::release(std::span<const uint64_t> pages) {
  for (uint64_t page : pages) {
    if (!holds(page, 1)) return Status(ErrorCode::out_of_range, "version word beyond the array");
  }
  for (uint64_t page : pages) version::WordRef(word(page)).fetch_add(1, std::memory_order_release);
  return Status();
}

void LocalVersionWords::mark_written(uint64_t page, uint64_t offset, uint64_t length, bool dirty) {
  if (m_l3 == nullptr || !holds(page, 1)) return;
  mark_sub_blocks(m_l3 + (page - m_first) * k_l3_words_per_page, m_page_size, offset, length, dirty);
}

Status MappedFrameData::atomic(uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare,
                               uint64_t* old) {
  if (frame_offset % 8 != 0 || frame_offset + 8 > m_length) return stale_translation();
  *old = host_atomic(m_base + frame_offset, op, operand, compare);
  return m_persistent ? persist(m_base + frame_offset, 8) : Status();
}

Status MappedFrameData::read(uint64_t frame_offset, void* dst, size_t length) {
  if (frame_offset + length > m_length) return stale_translation();
  std::memcpy(dst, m_base + frame_offset, length);
  return Status();
}

Status MappedFrameData::write(uint64_t frame_offset, const void* src, size_t length) {
  if (frame_offset + length > m_length) return stale_translation();
  std::byte* at = m_base + frame_offset;
  if (m_persistent && m_durability.copy != nullptr) {
    // libpmem2 stores (non-temporal where that pays) and flushes: durable
    // when it returns, with no call into the kernel.
    m_durability.copy(at, src, length, 0);
    return Status();
  }
  std::memcpy(at, src, length);
  return m_persistent ? persist(at, length) : Status();
}

Status MappedFrameData::persist(const std::byte* at, size_t length) const {
  if (m_durability.persist != nullptr) {
    m_durability.persist(at, length);
    return Status();
  }
  // What libpmem2's persist function does for a file it cannot flush from
  // user space (the pages written, msync'ed), except that a failure is
  // reported to the caller instead of ending the process.
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(at) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(at + length);
  int r = 0;
  do {
    r = ::msync(reinterpret_cast<void*>(start), end - start, MS_SYNC);
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    return Status(ErrorCode::io_error, "msync of " + std::to_string(length) + " bytes of PMEM frames at offset " +
                                           std::to_string(at - m_base) + ": " + std::strerror(errno) +
                                           " (the bytes are written but may not be durable; check the file "
                                           "system of the PMEM directory)");
  }
  return Status();
}

}  // namespace tiermem
