// How a thread waits for the fabric without a timer tick in a round trip.
//
// A thread that waits first polls (a round trip on an idle host is shorter
// than a sleep and a wake-up), then sleeps in poll() on the fabric's event fd
// (UCX: the worker's) and on a wake fd of its own, with no timeout but the
// caller's deadline. The answer itself wakes it: either its bytes make the
// event fd readable, or another thread that progressed the fabric and ran the
// answer's callback writes the sleeper's wake fd (Waiter::wake).
// Fabric-neutral: each fabric's transport drives its own progress and sleep
// around these (Waiter's functions are in wait_policy.cpp).
//
// Polling pays only while answers come sooner than the poll lasts; on a busy
// host (a trainer computing on every core) a poller takes the CPU the peer it
// waits for needs, and every round trip becomes a scheduler time slice.
// SpinPolicy learns which case holds from the waits themselves.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace tiermem::transport_detail {

// Whether, and how long, to poll before sleeping. Shared by the threads of a
// transport; lock-free.
class SpinPolicy {
 public:
  explicit SpinPolicy(std::chrono::nanoseconds limit) : m_limit(limit.count()) {}
  // Before any thread uses it.
  void set_limit(std::chrono::nanoseconds limit) { m_limit = limit.count(); }

  // How long the next wait polls before it sleeps: the limit while polling
  // has been paying, else 0 (and the limit once in k_probe_every waits, to
  // notice that the host became idle again).
  std::chrono::nanoseconds budget() {
    if (m_limit == 0) return std::chrono::nanoseconds(0);
    if (m_score.load(std::memory_order_relaxed) > 0) return std::chrono::nanoseconds(m_limit);
    const uint32_t n = m_waits.fetch_add(1, std::memory_order_relaxed);
    return std::chrono::nanoseconds(n % k_probe_every == 0 ? m_limit : 0);
  }

  // A wait ended after `took`, having polled for `polled` of it; `slept`
  // whether it had to sleep. A wait that polled and still slept says polling
  // did not pay; one that slept at once but would have been caught by polling
  // says it would have: its news came within the limit, and what it took
  // beyond that may be its own wake-up (k_wake_allowance), which polling
  // would not have paid. (Judged by `took` alone, a daemon whose client also
  // slept saw both wake-ups in every gap, 100-120 us on an idle VM, and
  // never learnt that polling would pay.)
  void record(std::chrono::nanoseconds took, std::chrono::nanoseconds polled, bool slept) {
    if (m_limit == 0) return;
    int delta = 0;
    if (!slept) delta = polled.count() > 0 ? 1 : 0;
    else if (polled.count() > 0) delta = -2;
    else if (took.count() < m_limit + k_wake_allowance) delta = 1;
    if (delta == 0) return;
    int s = m_score.load(std::memory_order_relaxed);
    int next;
    do {
      next = s + delta;
      next = next < -k_score_limit ? -k_score_limit : next > k_score_limit ? k_score_limit : next;
    } while (!m_score.compare_exchange_weak(s, next, std::memory_order_relaxed));
  }

  std::chrono::nanoseconds limit() const { return std::chrono::nanoseconds(m_limit); }

 private:
  static constexpr int k_score_limit = 8;
  // What a sleeping thread's wake-up may cost (50-100 us on an idle VM
  // whose cores sleep deeply; a busy host's scheduler slices are
  // milliseconds, beyond it).
  static constexpr int64_t k_wake_allowance = 100'000;  // ns
  static constexpr uint32_t k_probe_every = 32;
  int64_t m_limit;
  std::atomic<int> m_score{1};
  std::atomic<uint32_t> m_waits{0};
};

// How long a serving thread (a daemon's progress thread, between requests)
// polls, given how long a waiting thread does. A server's gap between two
// requests of one client holds that client's own wake-up when the client
// sleeps (on an idle VM about 100 us a round trip against 15 us when both
// poll): with the same limit on both sides, a client that slept once makes
// the server stop polling and the server's sleeping makes the client stop,
// and the pair stays there (remote_bench tcp: an 8-byte get at 100 us where
// polling gives 15 us). Polling through a sleeping client's round trip lets
// the server notice that polling pays, and the client follows (a server at
// 90 us fell back to sleeping in one idle run of three; at 120 us, with
// SpinPolicy's wake-up allowance, 2 runs of 6 still settled at 75-85 us, none
// at the 100-120 us of both sleeping). A longer floor costs the busy host: at 200 us a descheduled
// client's round trip waited out the server's poll (p90 230 us, coherent
// fetch-adds at 0.57 with every core busy). A server nobody asks polls once,
// then sleeps; on a busy host its SpinPolicy stops the polling as a waiter's
// does. 0 (no polling) stays 0.
constexpr std::chrono::nanoseconds serving_spin(std::chrono::nanoseconds waiting) { return waiting * 4; }

// A thread's own wake fd (an eventfd), for answers another thread runs the
// callback of while this one sleeps. One per thread while it lives, made on
// first use; a thread that ends hands its waiter to the next thread that asks
// (never freed, its fd never closed: a completion that arrives late wakes a
// waiter that then only looks and sleeps again, never a closed or reused fd).
struct Waiter {
  int fd = -1;
  std::atomic<bool> sleeping{false};
  // Wakes the thread if it sleeps (callers hold no lock it could need).
  void wake();
  // Reads what wake() wrote, so the next sleep sleeps.
  void drain();
  static Waiter& of_this_thread();
};

}  // namespace tiermem::transport_detail
