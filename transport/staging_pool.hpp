// Buffers the target stages large messages and answers in, kept for the next
// one: a fresh buffer of a mebibyte or more comes from mmap and costs a page
// fault per 4 KiB on first touch (about as long as copying it), every time.
// Thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace tiermem::transport_detail {

class StagingPool;

// A buffer of at least size() bytes; goes back to its pool when destroyed.
class StagingBuffer {
 public:
  StagingBuffer() = default;
  StagingBuffer(StagingPool* pool, std::unique_ptr<std::byte[]> bytes, size_t capacity, size_t size)
      : m_pool(pool), m_bytes(std::move(bytes)), m_capacity(capacity), m_size(size) {}
  StagingBuffer(StagingBuffer&&) noexcept = default;
  StagingBuffer& operator=(StagingBuffer&& other) noexcept {
    release();
    m_pool = other.m_pool;
    m_bytes = std::move(other.m_bytes);
    m_capacity = other.m_capacity;
    m_size = other.m_size;
    return *this;
  }
  ~StagingBuffer() { release(); }
  std::byte* data() const { return m_bytes.get(); }
  size_t size() const { return m_size; }

 private:
  void release();
  StagingPool* m_pool = nullptr;
  std::unique_ptr<std::byte[]> m_bytes;
  size_t m_capacity = 0;
  size_t m_size = 0;
};

class StagingPool {
 public:
  // Buffers smaller than this are not kept (malloc serves them from its heap).
  static constexpr size_t k_smallest_kept = 64 << 10;
  // At most this many bytes wait in the pool.
  static constexpr size_t k_kept_bytes = 64 << 20;

  StagingBuffer take(size_t size) {
    const size_t capacity = size < k_smallest_kept ? size : round_up(size);
    if (capacity >= k_smallest_kept) {
      std::lock_guard lock(m_lock);
      for (size_t i = 0; i < m_free.size(); ++i) {
        if (m_free[i].capacity != capacity) continue;
        auto bytes = std::move(m_free[i].bytes);
        m_free.erase(m_free.begin() + static_cast<std::ptrdiff_t>(i));
        m_kept -= capacity;
        return StagingBuffer(this, std::move(bytes), capacity, size);
      }
    }
    return StagingBuffer(this, std::unique_ptr<std::byte[]>(new std::byte[capacity == 0 ? 1 : capacity]), capacity,
                         size);
  }

  void give(std::unique_ptr<std::byte[]> bytes, size_t capacity) {
    if (capacity < k_smallest_kept) return;
    std::lock_guard lock(m_lock);
    if (m_kept + capacity > k_kept_bytes) return;
    m_kept += capacity;
    m_free.push_back({std::move(bytes), capacity});
  }

 private:
  static size_t round_up(size_t n) {
    size_t c = k_smallest_kept;
    while (c < n) c <<= 1;
    return c;
  }
  struct Free {
    std::unique_ptr<std::byte[]> bytes;
    size_t capacity;
  };
  std::mutex m_lock;
  std::vector<Free> m_free;
  size_t m_kept = 0;
};

inline void StagingBuffer::release() {
  if (m_pool != nullptr && m_bytes) m_pool->give(std::move(m_bytes), m_capacity);
  m_bytes.reset();
}

}  // namespace tiermem::transport_detail
