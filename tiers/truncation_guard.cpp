#include "tiers/truncation_guard.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

namespace tiermem {
namespace {

constexpr size_t k_slots = 4096;

// Read by the signal handler: lock-free atomics only. A slot is live while
// `start` is non-zero; it is written last when watching, cleared first when
// not.
struct Slot {
  std::atomic<bool> used{false};
  std::atomic<uintptr_t> start{0};
  std::atomic<size_t> length{0};
  std::atomic<int> fd{-1};
  std::atomic<uint64_t> file_offset{0};
};

std::array<Slot, k_slots> g_slots;
std::atomic<uint64_t> g_repairs{0};
struct sigaction g_previous {};
std::mutex g_install_mutex;
bool g_installed = false;

std::atomic<uint64_t> g_unbacked{0};
std::atomic_flag g_repairing = ATOMIC_FLAG_INIT;
constexpr uint64_t k_page = 4096;

// Every watched file longer than the furthest any mapping of it reaches,
// cut back to that (a tenant grew it and may have filled the file system).
// Only system calls: fstat and ftruncate are async-signal-safe.
void cut_grown_files() {
  for (Slot& s : g_slots) {
    if (s.start.load(std::memory_order_acquire) == 0) continue;
    struct stat st {};
    if (::fstat(s.fd.load(std::memory_order_relaxed), &st) != 0) continue;
    uint64_t end = 0;
    for (Slot& o : g_slots) {  // the furthest end of any mapping of this file
      if (o.start.load(std::memory_order_acquire) == 0) continue;
      struct stat ot {};
      if (::fstat(o.fd.load(std::memory_order_relaxed), &ot) != 0 || ot.st_dev != st.st_dev || ot.st_ino != st.st_ino) {
        continue;
      }
      end = std::max<uint64_t>(end, o.file_offset.load(std::memory_order_relaxed) + o.length.load(std::memory_order_relaxed));
    }
    const uint64_t blocks = static_cast<uint64_t>(st.st_blocks) * 512;
    if (end > 0 && (static_cast<uint64_t>(st.st_size) > end || blocks > end + (1 << 20))) {
      (void)::ftruncate(s.fd.load(std::memory_order_relaxed), static_cast<off_t>(end));
    }
  }
}

// Makes the access at `address`, in a watched mapping, possible again; false
// when the address is in none. A file cut short is extended again (the cut
// part reads as zeros: the tenant who cut it lost it). A page that cannot
// get storage (a hole, on a file system a tenant filled) gets it after grown
// files are cut back; failing that, the daemon's view of that one page
// becomes a private page of zeros, so the daemon never dies of it: the page
// is the file's tenant's (it made the hole) and only that tenant's memory is
// then wrong (counted, unbacked_pages()).
bool repair(uintptr_t address) {
  for (Slot& s : g_slots) {
    const uintptr_t start = s.start.load(std::memory_order_acquire);
    if (start == 0 || address < start || address - start >= s.length.load(std::memory_order_relaxed)) continue;
    const int fd = s.fd.load(std::memory_order_relaxed);
    const uint64_t needed = s.file_offset.load(std::memory_order_relaxed) + s.length.load(std::memory_order_relaxed);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return false;
    if (static_cast<uint64_t>(st.st_size) < needed) {
      if (::ftruncate(fd, static_cast<off_t>(needed)) != 0) return false;
      g_repairs.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    const uintptr_t page = address & ~uintptr_t{k_page - 1};
    const off_t file_page = static_cast<off_t>(s.file_offset.load(std::memory_order_relaxed) + (page - start));
    if (::fallocate(fd, 0, file_page, k_page) == 0) return true;
    cut_grown_files();
    if (::fallocate(fd, 0, file_page, k_page) == 0) return true;
    void* p = ::mmap(reinterpret_cast<void*>(page), k_page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) return false;
    g_unbacked.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  return false;
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const int saved = errno;
  if (info != nullptr && info->si_code == BUS_ADRERR) {
    while (g_repairing.test_and_set(std::memory_order_acquire)) {
    }
    const bool repaired = repair(reinterpret_cast<uintptr_t>(info->si_addr));
    g_repairing.clear(std::memory_order_release);
    if (repaired) {
      errno = saved;
      return;  // the access is retried, and now finds the page backed
    }
  }
  errno = saved;
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default action: returning faults again, now without us.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGBUS, &dfl, nullptr);
}

Status install_locked() {
  struct sigaction ours {};
  ours.sa_sigaction = on_sigbus;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  struct sigaction old {};
  if (::sigaction(SIGBUS, &ours, &old) != 0) {
    return Status(ErrorCode::io_error, std::string("installing the SIGBUS handler: ") + std::strerror(errno));
  }
  if (!((old.sa_flags & SA_SIGINFO) != 0 && old.sa_sigaction == on_sigbus)) g_previous = old;
  g_installed = true;
  return Status();
}

}  // namespace

Status TruncationGuard::install() {
  std::lock_guard lock(g_install_mutex);
  return install_locked();
}

uint64_t TruncationGuard::repairs() { return g_repairs.load(std::memory_order_relaxed); }

uint64_t TruncationGuard::unbacked_pages() { return g_unbacked.load(std::memory_order_relaxed); }

Result<TruncationGuard> TruncationGuard::watch(std::byte* start, size_t length, int fd, uint64_t file_offset) {
  {
    std::lock_guard lock(g_install_mutex);
    if (!g_installed) {
      if (Status s = install_locked(); !s.ok()) return s;
    }
  }
  const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return Status(ErrorCode::io_error, std::string("dup of a mapped file: ") + std::strerror(errno));
  for (size_t i = 0; i < k_slots; ++i) {
    Slot& s = g_slots[i];
    bool expected = false;
    if (!s.used.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) continue;
    s.length.store(length, std::memory_order_relaxed);
    s.fd.store(copy, std::memory_order_relaxed);
    s.file_offset.store(file_offset, std::memory_order_relaxed);
    s.start.store(reinterpret_cast<uintptr_t>(start), std::memory_order_release);
    return TruncationGuard(static_cast<int>(i));
  }
  ::close(copy);
  return Status(ErrorCode::busy, "more than " + std::to_string(k_slots) + " mapped files to watch");
}

TruncationGuard::TruncationGuard(TruncationGuard&& other) noexcept : m_slot(std::exchange(other.m_slot, -1)) {}

TruncationGuard& TruncationGuard::operator=(TruncationGuard&& other) noexcept {
  if (this != &other) {
    TruncationGuard gone(std::move(*this));
    m_slot = std::exchange(other.m_slot, -1);
  }
  return *this;
}

TruncationGuard::~TruncationGuard() {
  if (m_slot < 0) return;
  Slot& s = g_slots[static_cast<size_t>(m_slot)];
  s.start.store(0, std::memory_order_release);
  ::close(s.fd.exchange(-1, std::memory_order_relaxed));
  s.used.store(false, std::memory_order_release);
}

}  // namespace tiermem
