#include "mapping/seqlock_copy.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "mapping/page_table.hpp"
#include "mapping/version.hpp"

namespace tiermem {
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

Status seqlocked_write(VersionWords& words, FrameData& data, const CopyRun& run, const void* src,
                       std::chrono::milliseconds timeout) {
  const uint64_t n = run_pages(run);
  WordBuffer locked(n);
  std::vector<uint64_t> held;
  held.reserve(n);
  auto give_back = [&] { return words.release(held); };
  version::SpinWait wait(timeout);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t page = run.first_page + i;
    const uint16_t epoch = version::epoch_of(run.cached[i]);
    uint64_t expected = run.cached[i];
    for (;;) {
      if (version::epoch_of(expected) != epoch) {
        (void)give_back();
        return stale_translation();
      }
      if (!version::is_locked(expected)) {
        uint64_t old = 0;
        Status s = words.compare_swap(page, expected, expected + 1, &old);
        if (!s.ok()) {
          (void)give_back();
          return s;
        }
        if (old == expected) break;
        expected = old;  // someone wrote since: try again from what is there
        continue;
      }
      if (!wait.again()) {
        (void)give_back();
        return busy(page);
      }
      Status s = words.load(page, 1, &expected);
      if (!s.ok()) {
        (void)give_back();
        return s;
      }
    }
    locked[i] = expected + 1;
    held.push_back(page);
  }
  Status s = data.write(run.frame_offset, src, run.length);
  if (s.ok()) {
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t from = i == 0 ? run.offset : 0;
      const uint64_t to = std::min<uint64_t>(run.page_size, run.offset + run.length - i * run.page_size);
      words.mark_written(run.first_page + i, from, to - from, !data.persistent());
    }
  }
  Status r = give_back();
  return s.ok() ? r : s;
}

Status seqlocked_read(VersionWords& words, FrameData& data, const CopyRun& run, void* dst,
                      std::chrono::milliseconds timeout) {
  const uint64_t n = run_pages(run);
  WordBuffer before(n), after(n);
  version::SpinWait wait(timeout);
  for (;;) {
    Status s = words.load(run.first_page, n, before.data());
    if (!s.ok()) return s;
    uint64_t locked_page = ~uint64_t{0};
    for (uint64_t i = 0; i < n; ++i) {
      if (version::epoch_of(before[i]) != version::epoch_of(run.cached[i])) return stale_translation();
      if (version::is_locked(before[i]) && locked_page == ~uint64_t{0}) locked_page = run.first_page + i;
    }
    if (locked_page == ~uint64_t{0}) {
      s = data.read(run.frame_offset, dst, run.length);
      if (!s.ok()) return s;
      std::atomic_thread_fence(std::memory_order_acquire);
      s = words.load(run.first_page, n, after.data());
      if (!s.ok()) return s;
      if (std::memcmp(before.data(), after.data(), n * sizeof(uint64_t)) == 0) return Status();
      locked_page = run.first_page;
    }
    if (!wait.again()) return busy(locked_page);
  }
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
  if (coherent) return data.atomic(frame_offset, op, operand, compare, old);
  uint64_t expected = cached;
  version::SpinWait wait(timeout);
  for (;;) {
    if (version::epoch_of(expected) != version::epoch_of(cached)) return stale_translation();
    if (!version::is_locked(expected)) {
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
  Status s = data.atomic(frame_offset, op, operand, compare, old);
  const uint64_t held[1] = {page};
  Status r = words.release(held);
  return s.ok() ? r : s;
}

Status copy_through_layout(const LayoutView& layout, MemoryAccess& access, uint64_t offset,
                           std::byte* buffer, size_t length, bool to_memory,
                           std::chrono::milliseconds timeout, uint64_t max_run) {
  if (offset > layout.size || length > layout.size - offset) {
    return Status(ErrorCode::out_of_range, "range of " + std::to_string(length) + " bytes at offset " +
                                               std::to_string(offset) + " runs past the end of an allocation of " +
                                               std::to_string(layout.size) + " bytes");
  }
  auto versions = access.versions(layout.home);
  if (!versions.ok()) return versions.status();
  size_t x = 0;
  while (length > 0) {
    while (x < layout.extents.size() &&
           offset >= layout.extents[x].gva_offset + layout.extents[x].length) {
      ++x;
    }
    if (x == layout.extents.size() || offset < layout.extents[x].gva_offset) return stale_translation();
    const Extent& e = layout.extents[x];
    auto frames = access.frames(e.node, e.tier);
    if (!frames.ok()) return frames.status();
    const uint64_t in_extent = offset - e.gva_offset;
    const size_t n = std::min<uint64_t>({length, e.length - in_extent, max_run});
    const uint64_t page_index = offset / layout.page_size;
    if (page_index + run_pages({.page_size = layout.page_size, .offset = offset % layout.page_size, .length = n}) >
        layout.page_versions.size()) {
      return stale_translation();
    }
    CopyRun run;
    run.first_page = layout.first_page + page_index;
    run.cached = layout.page_versions.data() + page_index;
    run.page_size = layout.page_size;
    run.offset = offset % layout.page_size;
    run.length = n;
    run.frame_offset = e.frame_offset + in_extent;
    Status s = to_memory ? seqlocked_write(**versions, **frames, run, buffer, timeout)
                         : seqlocked_read(**versions, **frames, run, buffer, timeout);
    if (!s.ok()) return s;
    buffer += n;
    offset += n;
    length -= n;
  }
  return Status();
}

Status LocalVersionWords::load(uint64_t first, size_t count, uint64_t* out) {
  if (first + count > m_count) return Status(ErrorCode::out_of_range, "version word beyond the array");
  for (size_t i = 0; i < count; ++i) out[i] = version::load(m_words[first + i]);
  return Status();
}

Status LocalVersionWords::compare_swap(uint64_t page, uint64_t expected, uint64_t desired, uint64_t* old) {
  if (page >= m_count) return Status(ErrorCode::out_of_range, "version word beyond the array");
  uint64_t seen = expected;
  version::WordRef(m_words[page]).compare_exchange_strong(seen, desired, std::memory_order_acquire,
                                                          std::memory_order_relaxed);
  *old = seen;
  return Status();
}

Status LocalVersionWords::release(std::span<const uint64_t> pages) {
  for (uint64_t page : pages) version::WordRef(m_words[page]).fetch_add(1, std::memory_order_release);
  return Status();
}

void LocalVersionWords::mark_written(uint64_t page, uint64_t offset, uint64_t length, bool dirty) {
  if (m_l3 == nullptr || page >= m_count) return;
  mark_sub_blocks(m_l3 + page * k_l3_words_per_page, m_page_size, offset, length, dirty);
}

Status BackendFrameData::read(uint64_t frame_offset, void* dst, size_t length) {
  if (frame_offset + length > m_backend.capacity()) return stale_translation();
  return m_backend.read(frame_offset, dst, length);
}

Status BackendFrameData::write(uint64_t frame_offset, const void* src, size_t length) {
  if (frame_offset + length > m_backend.capacity()) return stale_translation();
  return m_backend.write(frame_offset, src, length);
}

Status BackendFrameData::atomic(uint64_t frame_offset, WordOp op, uint64_t operand,
                                uint64_t compare, uint64_t* old) {
  if (frame_offset % 8 != 0 || frame_offset + 8 > m_backend.capacity()) return stale_translation();
  std::byte* base = m_backend.host_base();
  if (base == nullptr) {
    return Status(ErrorCode::not_supported, std::string("atomics on the ") +
                                                std::string(tier_name(m_backend.tier())) +
                                                " tier are not supported");
  }
  *old = host_atomic(base + frame_offset, op, operand, compare);
  if (m_backend.persistent()) return m_backend.persist(frame_offset, 8);
  return Status();
}

Status MappedFrameData::atomic(uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare,
                               uint64_t* old) {
  if (frame_offset % 8 != 0 || frame_offset + 8 > m_length) return stale_translation();
  *old = host_atomic(m_base + frame_offset, op, operand, compare);
  if (!m_persistent) return Status();
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(m_base + frame_offset) & ~(page - 1);
  if (::msync(reinterpret_cast<void*>(start), page, MS_SYNC) != 0) {
    return Status(ErrorCode::io_error, std::string("msync of PMEM word: ") + std::strerror(errno));
  }
  return Status();
}

Status MappedFrameData::read(uint64_t frame_offset, void* dst, size_t length) {
  if (frame_offset + length > m_length) return stale_translation();
  std::memcpy(dst, m_base + frame_offset, length);
  return Status();
}

Status MappedFrameData::write(uint64_t frame_offset, const void* src, size_t length) {
  if (frame_offset + length > m_length) return stale_translation();
  std::memcpy(m_base + frame_offset, src, length);
  if (!m_persistent) return Status();
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(m_base + frame_offset) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(m_base + frame_offset + length);
  if (::msync(reinterpret_cast<void*>(start), end - start, MS_SYNC) != 0) {
    return Status(ErrorCode::io_error, std::string("msync of PMEM range: ") + std::strerror(errno));
  }
  return Status();
}

}  // namespace tiermem
