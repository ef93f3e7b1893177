// The per-thread wake fds of waiting threads (Waiter in wait_policy.hpp):
// eventfds only, nothing of any fabric, so every fabric's waits share them.
#include "transport/wait_policy.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <mutex>
#include <vector>

namespace tiermem::transport_detail {

void Waiter::wake() {
  if (!sleeping.load(std::memory_order_seq_cst)) return;
  const uint64_t one = 1;
  (void)::write(fd, &one, sizeof one);
}

void Waiter::drain() {
  uint64_t n = 0;
  (void)::read(fd, &n, sizeof n);
}

namespace {

std::mutex g_waiters_lock;
std::vector<Waiter*> g_free_waiters;

// A thread's lease on a waiter, given back when the thread ends.
struct WaiterLease {
  Waiter* waiter = nullptr;
  ~WaiterLease() {
    if (waiter == nullptr) return;
    waiter->sleeping.store(false);
    std::lock_guard lock(g_waiters_lock);
    g_free_waiters.push_back(waiter);
  }
};

}  // namespace

Waiter& Waiter::of_this_thread() {
  thread_local WaiterLease lease;
  if (lease.waiter == nullptr) {
    std::lock_guard lock(g_waiters_lock);
    if (!g_free_waiters.empty()) {
      lease.waiter = g_free_waiters.back();
      g_free_waiters.pop_back();
    } else {
      lease.waiter = new Waiter;
      lease.waiter->fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    }
  }
  return *lease.waiter;
}

}  // namespace tiermem::transport_detail
