#include "mapping/version_segments.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <condition_variable>
#include <thread>
#include <vector>

#include <tiermem/status_macros.h>

#include "common/random.hpp"
#include "tiers/tier_backend.hpp"

namespace tiermem {
namespace {

std::string words_path(const std::string& dir, uint32_t domain) { return dir + "/versions." + std::to_string(domain); }
std::string header_path(const std::string& dir, uint32_t domain) { return dir + "/header." + std::to_string(domain); }

// Layout 1 (before the header had a file of its own): the header in the
// first page of versions.<k>, its words after it.
constexpr uint64_t k_legacy_layout = 1;

// Waits until no word of the `count` at byte `offset` of the file at
// `path` is odd (locked) or the deadline passes; returns how many are still
// locked. Read with pread, never mapped: the file is a tenant's, which may
// have punched holes in it and filled its file system, and a read fault on
// a hole of a shared mapping needs storage (SIGBUS when there is none),
// where pread sees zeros.
size_t wait_unlocked(const std::string& path, uint64_t offset, uint64_t count,
                     std::chrono::steady_clock::time_point deadline) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid()) return 0;
  std::vector<uint64_t> words(std::min<uint64_t>(count, uint64_t{1} << 16));
  for (;;) {
    size_t locked = 0;
    for (uint64_t at = 0; at < count; at += words.size()) {
      const uint64_t n = std::min<uint64_t>(words.size(), count - at);
      const ssize_t got = ::pread(fd.get(), words.data(), n * sizeof(uint64_t),
                                  static_cast<off_t>(offset + at * sizeof(uint64_t)));
      if (got <= 0) break;
      for (size_t i = 0; i < static_cast<size_t>(got) / sizeof(uint64_t); ++i) locked += words[i] & 1;
    }
    if (locked == 0 || std::chrono::steady_clock::now() >= deadline) return locked;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// A whole file mapped shared (read-write unless `read_only`); unmapped when
// it goes. Empty when the file cannot be opened or mapped.
struct FileMap {
  FileMap(const std::string& path, bool read_only) {
    UniqueFd fd(::open(path.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC));
    struct stat st {};
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || st.st_size <= 0) return;
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), read_only ? PROT_READ : PROT_READ | PROT_WRITE,
                     MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return;
    data = static_cast<std::byte*>(p);
    size = static_cast<size_t>(st.st_size);
  }
  ~FileMap() {
    if (data != nullptr) ::munmap(data, size);
  }
  FileMap(const FileMap&) = delete;
  FileMap& operator=(const FileMap&) = delete;
  std::byte* data = nullptr;
  size_t size = 0;
};

// Retires one domain's segment: incarnation 0 in its header first
// (seq_cst: a client that takes a lock after this sees it), then waits for
// the locks taken before in its words. Returns the pages still locked.
size_t retire_one(const std::string& header, const std::string& words,
                  std::chrono::steady_clock::time_point deadline) {
  FileMap h(header, false);
  if (h.size < sizeof(SegmentHeader)) return 0;
  auto* hdr = reinterpret_cast<SegmentHeader*>(h.data);
  if (hdr->magic != SegmentHeader::k_magic) return 0;
  std::atomic_ref<uint64_t>(hdr->incarnation).store(0, std::memory_order_seq_cst);
  struct stat st {};
  if (::stat(words.c_str(), &st) != 0) return 0;
  const uint64_t count = std::min<uint64_t>(hdr->pages, static_cast<uint64_t>(st.st_size) / sizeof(uint64_t));
  return wait_unlocked(words, 0, count, deadline);
}

// The same for a words file of layout 1, whose header is its first page.
size_t retire_legacy(const std::string& words, std::chrono::steady_clock::time_point deadline) {
  uint64_t pages = 0, size = 0;
  {
    FileMap w(words, false);
    if (w.size < k_segment_header_bytes) return 0;
    auto* hdr = reinterpret_cast<SegmentHeader*>(w.data);
    if (hdr->magic != SegmentHeader::k_magic || hdr->layout != k_legacy_layout) return 0;
    std::atomic_ref<uint64_t>(hdr->incarnation).store(0, std::memory_order_seq_cst);
    pages = hdr->pages;
    size = w.size;
  }
  const uint64_t count = std::min<uint64_t>(pages, (size - k_segment_header_bytes) / sizeof(uint64_t));
  return wait_unlocked(words, k_segment_header_bytes, count, deadline);
}

}  // namespace

VersionSegments::Retired VersionSegments::retire_stale(const std::string& dir, std::chrono::milliseconds grace,
                                                       bool remove) {
  Retired out;
  std::error_code ec;
  const auto deadline = std::chrono::steady_clock::now() + grace;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("versions.", 0) == 0 || name.rfind("header.", 0) == 0) files.push_back(e.path());
  }
  for (const auto& path : files) {
    const std::string name = path.filename().string();
    if (name.rfind("header.", 0) == 0) {
      const std::string words = dir + "/versions." + name.substr(std::strlen("header."));
      out.locked_pages += retire_one(path.string(), words, deadline);
      ++out.segments;
    } else if (!std::filesystem::exists(dir + "/header." + name.substr(std::strlen("versions.")), ec)) {
      out.locked_pages += retire_legacy(path.string(), deadline);
      ++out.segments;
    }
  }
  if (remove) {
    for (const auto& path : files) std::filesystem::remove(path, ec);
  }
  return out;
}

std::string VersionSegments::unadoptable(const Options& o, uint32_t d, uint64_t generation) {
  if (generation == 0) return "no memory generation was recorded for it";
  const std::string hpath = header_path(o.dir, d);
  UniqueFd hfd(::open(hpath.c_str(), O_RDONLY | O_CLOEXEC));
  if (!hfd.valid()) {
    return "its header " + hpath + " is missing (" + std::strerror(errno) + "): the node's shared memory is gone "
           "(a reboot) or was made by an older tiermemd";
  }
  SegmentHeader h;
  if (::pread(hfd.get(), &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) return "its header " + hpath + " is short";
  if (h.magic != SegmentHeader::k_magic || h.layout != SegmentHeader::k_layout) {
    return "its header " + hpath + " is not a tiermem header of layout " + std::to_string(SegmentHeader::k_layout);
  }
  if (h.node != o.node || h.domain != d || h.pages != o.pages_per_domain || h.page_size != o.page_size) {
    return "its header " + hpath + " is of another node or geometry";
  }
  if (h.memory_generation != generation) {
    return "its files are of another memory generation than the metadata recorded (made anew since)";
  }
  const std::string wpath = words_path(o.dir, d);
  struct stat st {};
  const uint64_t want = 3 * o.pages_per_domain * sizeof(uint64_t);
  if (::stat(wpath.c_str(), &st) != 0) return "its version words " + wpath + " are missing";
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < want) {
    return "its version words " + wpath + " are " + std::to_string(st.st_size) + " bytes long, " +
           std::to_string(want) + " expected (cut short)";
  }
  return {};
}

Result<std::unique_ptr<VersionSegments>> VersionSegments::create(const Options& o) {
  if (o.domains == 0 || o.pages_per_domain == 0 || o.pages_per_domain % k_pages_per_domain_unit != 0) {
    return Status(ErrorCode::invalid_argument, "version segments need at least one domain and a multiple of " +
                                                   std::to_string(k_pages_per_domain_unit) + " pages per domain");
  }
  auto s = std::unique_ptr<VersionSegments>(new VersionSegments);
  s->m_dir = o.dir;
  s->m_domains = o.domains;
  s->m_pages_per_domain = o.pages_per_domain;
  s->m_domains_state.resize(o.domains);
  const uint64_t words_bytes = s->domain_words_bytes();
  TIERMEM_ASSIGN_OR_RETURN(s->m_headers, Reservation::reserve(o.domains * k_segment_header_bytes, "version headers"));
  TIERMEM_ASSIGN_OR_RETURN(s->m_word_space, Reservation::reserve(o.domains * words_bytes, "version words"));
  TIERMEM_ASSIGN_OR_RETURN(s->m_l3_space, Reservation::reserve(o.domains * 2 * words_bytes, "L3 words"));
  for (uint32_t d = 0; d < o.domains; ++d) TIERMEM_RETURN_IF_ERROR(s->open_domain(o, d));
  s->m_words = reinterpret_cast<uint64_t*>(s->m_word_space.base());
  s->m_l3 = reinterpret_cast<uint64_t*>(s->m_l3_space.base());
  return s;
}

Status VersionSegments::open_domain(const Options& o, uint32_t d) {
  DomainState& st = m_domains_state[d];
  const uint64_t asked = d < o.adopt.size() ? o.adopt[d] : 0;
  const std::string hpath = header_path(o.dir, d);
  const std::string wpath = words_path(o.dir, d);
  if (asked != 0) st.why = unadoptable(o, d, asked);
  st.adopted = asked != 0 && st.why.empty();
  st.generation = st.adopted ? asked : random_nonzero();
  std::error_code ec;
  if (!st.adopted) {
    // Fresh files: nothing of an earlier daemon's, and a client still
    // mapping the old ones keeps an unlinked file nobody else sees.
    std::filesystem::remove(hpath, ec);
    std::filesystem::remove(wpath, ec);
  }
  TIERMEM_ASSIGN_OR_RETURN(st.header_fd, open_segment(hpath, k_segment_header_bytes));
  TIERMEM_ASSIGN_OR_RETURN(st.words_fd, open_segment(wpath, file_bytes()));
  // A words file a tenant grew: back to its size (its words are intact).
  if (::ftruncate(st.words_fd.get(), static_cast<off_t>(file_bytes())) != 0) {
    return Status(ErrorCode::io_error, "sizing " + wpath + ": " + std::strerror(errno));
  }
  // The header's storage now: the daemon writes it at once, and on a full
  // file system a write into a hole raises SIGBUS; this says which file
  // instead. (The words get storage as their pages are used, some MiB per
  // domain; a hole the tenant punches is TruncationGuard's.)
  TIERMEM_RETURN_IF_ERROR(commit_file_range(st.header_fd.get(), 0, k_segment_header_bytes, "the segment header " + hpath));
  st.header_reader.reset(::open(hpath.c_str(), O_RDONLY | O_CLOEXEC));
  if (!st.header_reader.valid()) {
    return Status(ErrorCode::io_error, "opening " + hpath + " for reading: " + std::strerror(errno));
  }
  const uint64_t words_bytes = domain_words_bytes();
  TIERMEM_RETURN_IF_ERROR(m_headers.map(d * k_segment_header_bytes, k_segment_header_bytes, st.header_fd.get(), 0));
  TIERMEM_RETURN_IF_ERROR(m_word_space.map(d * words_bytes, words_bytes, st.words_fd.get(), 0));
  TIERMEM_RETURN_IF_ERROR(m_l3_space.map(d * 2 * words_bytes, 2 * words_bytes, st.words_fd.get(), words_bytes));
  SegmentHeader* h = header_of(d);
  h->layout = SegmentHeader::k_layout;
  h->node = o.node;
  h->domain = d;
  h->memory_generation = st.generation;
  h->pages = o.pages_per_domain;
  h->page_size = o.page_size;
  std::atomic_ref<uint64_t>(h->incarnation).store(o.incarnation, std::memory_order_seq_cst);
  std::atomic_ref<uint64_t>(h->magic).store(SegmentHeader::k_magic, std::memory_order_release);
  return Status();
}

void VersionSegments::retire() {
  for (uint32_t d = 0; d < m_domains; ++d) {
    std::atomic_ref<uint64_t>(header_of(d)->incarnation).store(0, std::memory_order_seq_cst);
  }
}

std::vector<uint64_t> VersionSegments::memory_generations() const {
  std::vector<uint64_t> out;
  for (const DomainState& st : m_domains_state) out.push_back(st.generation);
  return out;
}

SegmentHeader* VersionSegments::header_of(uint32_t domain) const {
  return reinterpret_cast<SegmentHeader*>(m_headers.base() + uint64_t{domain} * k_segment_header_bytes);
}

const SegmentHeader& VersionSegments::header(uint32_t domain) const { return *header_of(domain); }

Result<SegmentTrim> VersionSegments::trim_words(uint32_t d, std::string* path) const {
  if (d >= m_domains) return SegmentTrim{};
  *path = words_path(m_dir, d);
  return trim_segment(m_domains_state[d].words_fd.get(), file_bytes(), *path);
}

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
