#include "mapping/version_segments.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <condition_variable>
#include <thread>

#include <tiermem/status_macros.h>

namespace tiermem {
namespace {

std::string segment_path(const std::string& dir, uint32_t domain) {
  return dir + "/versions." + std::to_string(domain);
}

// Waits until no word in `words` is odd (locked) or the deadline passes;
// returns how many are still locked.
size_t wait_unlocked(const uint64_t* words, uint64_t count, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    size_t locked = 0;
    for (uint64_t i = 0; i < count; ++i) {
      locked += std::atomic_ref<const uint64_t>(words[i]).load(std::memory_order_acquire) & 1;
    }
    if (locked == 0 || std::chrono::steady_clock::now() >= deadline) return locked;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Retires one segment file: incarnation 0 first (seq_cst: a client that
// takes a lock after this sees it), then waits for the locks taken before.
size_t retire_one(const std::string& path, std::chrono::steady_clock::time_point deadline) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return 0;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < k_segment_header_bytes) return 0;
  const auto size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return 0;
  auto* h = static_cast<SegmentHeader*>(p);
  size_t locked = 0;
  if (h->magic == SegmentHeader::k_magic) {
    std::atomic_ref<uint64_t>(h->incarnation).store(0, std::memory_order_seq_cst);
    const uint64_t words = std::min<uint64_t>(h->pages, (size - k_segment_header_bytes) / sizeof(uint64_t));
    locked = wait_unlocked(reinterpret_cast<const uint64_t*>(static_cast<std::byte*>(p) + k_segment_header_bytes),
                           words, deadline);
  }
  ::munmap(p, size);
  return locked;
}

}  // namespace

VersionSegments::Retired VersionSegments::retire_stale(const std::string& dir, std::chrono::milliseconds grace,
                                                       bool remove) {
  Retired out;
  std::error_code ec;
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("versions.", 0) != 0) continue;
    out.locked_pages += retire_one(e.path().string(), deadline);
    ++out.segments;
    if (remove) std::filesystem::remove(e.path(), ec);
  }
  return out;
}

bool VersionSegments::adoptable(const Options& o) {
  const uint64_t file_bytes = k_segment_header_bytes + 3 * o.pages_per_domain * sizeof(uint64_t);
  for (uint32_t d = 0; d < o.domains; ++d) {
    UniqueFd fd(::open(segment_path(o.dir, d).c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != file_bytes) return false;
    SegmentHeader h;
    if (::pread(fd.get(), &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) return false;
    if (h.magic != SegmentHeader::k_magic || h.layout != SegmentHeader::k_layout || h.node != o.node ||
        h.domain != d || h.pages != o.pages_per_domain || h.page_size != o.page_size ||
        h.memory_generation != o.memory_generation) {
      return false;
    }
  }
  return true;
}

Result<std::unique_ptr<VersionSegments>> VersionSegments::create(const Options& o) {
  if (o.domains == 0 || o.pages_per_domain == 0 || o.pages_per_domain % k_pages_per_domain_unit != 0) {
    return Status(ErrorCode::invalid_argument, "version segments need at least one domain and a multiple of " +
                                                   std::to_string(k_pages_per_domain_unit) + " pages per domain");
  }
  auto s = std::unique_ptr<VersionSegments>(new VersionSegments);
  s->m_domains = o.domains;
  s->m_pages_per_domain = o.pages_per_domain;
  s->m_memory_generation = o.memory_generation;
  const uint64_t words_bytes = s->domain_words_bytes();
  TIERMEM_ASSIGN_OR_RETURN(s->m_headers, Reservation::reserve(o.domains * k_segment_header_bytes, "version headers"));
  TIERMEM_ASSIGN_OR_RETURN(s->m_word_space, Reservation::reserve(o.domains * words_bytes, "version words"));
  TIERMEM_ASSIGN_OR_RETURN(s->m_l3_space, Reservation::reserve(o.domains * 2 * words_bytes, "L3 words"));
  s->m_adopted = o.adopt && o.memory_generation != 0 && adoptable(o);
  for (uint32_t d = 0; d < o.domains; ++d) {
    const std::string path = segment_path(o.dir, d);
    std::error_code ec;
    if (!s->m_adopted) std::filesystem::remove(path, ec);  // a fresh file: nothing of an earlier daemon's
    TIERMEM_ASSIGN_OR_RETURN(auto fd, open_segment(path, s->file_bytes()));
    TIERMEM_RETURN_IF_ERROR(s->m_headers.map(d * k_segment_header_bytes, k_segment_header_bytes, fd.get(), 0));
    TIERMEM_RETURN_IF_ERROR(s->m_word_space.map(d * words_bytes, words_bytes, fd.get(), k_segment_header_bytes));
    TIERMEM_RETURN_IF_ERROR(
        s->m_l3_space.map(d * 2 * words_bytes, 2 * words_bytes, fd.get(), k_segment_header_bytes + words_bytes));
    s->m_fds.push_back(std::move(fd));
    SegmentHeader* h = s->header_of(d);
    h->layout = SegmentHeader::k_layout;
    h->node = o.node;
    h->domain = d;
    h->memory_generation = o.memory_generation;
    h->pages = o.pages_per_domain;
    h->page_size = o.page_size;
    std::atomic_ref<uint64_t>(h->incarnation).store(o.incarnation, std::memory_order_seq_cst);
    std::atomic_ref<uint64_t>(h->magic).store(SegmentHeader::k_magic, std::memory_order_release);
  }
  s->m_words = reinterpret_cast<uint64_t*>(s->m_word_space.base());
  s->m_l3 = reinterpret_cast<uint64_t*>(s->m_l3_space.base());
  return s;
}

SegmentHeader* VersionSegments::header_of(uint32_t domain) const {
  return reinterpret_cast<SegmentHeader*>(m_headers.base() + uint64_t{domain} * k_segment_header_bytes);
}

const SegmentHeader& VersionSegments::header(uint32_t domain) const { return *header_of(domain); }

void VersionSegments::set_tenant(uint32_t domain, std::string_view tenant) {
  SegmentHeader* h = header_of(domain);
  std::memset(h->tenant, 0, sizeof h->tenant);
  std::memcpy(h->tenant, tenant.data(), std::min(tenant.size(), sizeof h->tenant - 1));
}

}  // namespace tiermem

namespace tiermem {

struct LivenessHolder::State {
  std::mutex mutex;
  std::condition_variable cv;
  bool held = false, stop = false;
  std::thread thread;
};

LivenessHolder::LivenessHolder(VersionSegments& segments) : m_state(std::make_unique<State>()) {
  State& st = *m_state;
  st.thread = std::thread([&st, &segments] {
    std::vector<pthread_mutex_t*> held;
    for (uint32_t d = 0; d < segments.domains(); ++d) {
      pthread_mutex_t* m = segments.alive_mutex(d);
      // Anew every start: an adopted segment's mutex is its dead owner's.
      pthread_mutexattr_t attr;
      pthread_mutexattr_init(&attr);
      pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
      pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
      const bool ok = pthread_mutex_init(m, &attr) == 0 && pthread_mutex_lock(m) == 0;
      pthread_mutexattr_destroy(&attr);
      if (ok) held.push_back(m);
    }
    std::unique_lock lock(st.mutex);
    st.held = true;
    st.cv.notify_all();
    st.cv.wait(lock, [&st] { return st.stop; });
    for (pthread_mutex_t* m : held) pthread_mutex_unlock(m);
  });
  std::unique_lock lock(st.mutex);
  st.cv.wait(lock, [&st] { return st.held; });
}

LivenessHolder::~LivenessHolder() {
  {
    std::lock_guard lock(m_state->mutex);
    m_state->stop = true;
  }
  m_state->cv.notify_all();
  m_state->thread.join();
}

}  // namespace tiermem
