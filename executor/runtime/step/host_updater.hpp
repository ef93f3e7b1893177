// The optimizer on the host, overlapped with the backward pass (offloaded
// with --offload-update host, no gradient clipping, no data-parallel
// replicas whose sums come after the step): as soon as a
// parameter's gradient has been drained home (its side copy done), a worker
// thread updates that parameter on the host compute (HostAdamPool's pinned
// threads on a GPU rank) while the compute goes on with the rest of the
// backward pass, torchao's and prime-rl's way. The update op is the one the
// step would run at its end, on the same memory: the same bits. finish()
// waits for every queued update and says which ran.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "executor/compute.hpp"
#include "executor/graph.hpp"
#include "executor/interpreter.hpp"

namespace tiermem::exec {

class HostUpdater {
 public:
  // `side`: the compute whose side copies drain the gradients (waited for
  // on the host); `host`: where the updates run.
  HostUpdater(const Graph& graph, Compute& side, Compute& host);
  ~HostUpdater();
  HostUpdater(const HostUpdater&) = delete;
  HostUpdater& operator=(const HostUpdater&) = delete;

  // Update op `op` once side copy `ticket` is done, with the step's memory
  // (next copy) and committed copy; both stay valid until finish().
  void queue(int op, uint64_t ticket, const TensorMemory& next, const TensorMemory& committed);
  // What the updates since the last finish() took: the host's rate and the
  // time the first of them could start (its gradient home).
  struct Round {
    std::chrono::steady_clock::time_point first_home{};  // epoch: none ran
    double busy_s = 0;      // running updates
    int64_t elements = 0;   // of the parameters updated
  };
  // Waits for everything queued; the ops that ran since the last finish()
  // (and, `round`, what they took).
  std::set<int> finish(Round* round = nullptr);
  // Updates run beside the backward pass since the start.
  uint64_t ran() const { return m_ran.load(std::memory_order_relaxed); }

 private:
  struct Job {
    int op;
    uint64_t ticket;
    TensorMemory next, committed;
  };
  void work();

  const Graph& m_graph;
  Compute& m_side;
  Compute& m_host;
  std::mutex m_mutex;
  std::condition_variable m_wake, m_idle;
  std::deque<Job> m_jobs;
  std::set<int> m_done;
  Round m_round;
  bool m_busy = false, m_stop = false;
  std::atomic<uint64_t> m_ran{0};
  std::thread m_worker;
};

}  // namespace tiermem::exec
