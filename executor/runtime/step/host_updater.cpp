#include "executor/runtime/step/host_updater.hpp"

namespace tiermem::exec {

HostUpdater::HostUpdater(const Graph& graph, Compute& side, Compute& host)
    : m_graph(graph), m_side(side), m_host(host), m_worker([this] { work(); }) {}

HostUpdater::~HostUpdater() {
  {
    std::lock_guard lock(m_mutex);
    m_stop = true;
  }
  m_wake.notify_all();
  m_worker.join();
}

void HostUpdater::queue(int op, uint64_t ticket, const TensorMemory& next, const TensorMemory& committed) {
  {
    std::lock_guard lock(m_mutex);
    m_jobs.push_back({op, ticket, next, committed});
  }
  m_wake.notify_one();
}

std::set<int> HostUpdater::finish(Round* round) {
  std::unique_lock lock(m_mutex);
  m_idle.wait(lock, [this] { return m_jobs.empty() && !m_busy; });
  std::set<int> done;
  done.swap(m_done);
  if (round != nullptr) *round = m_round;
  m_round = Round{};
  return done;
}

void HostUpdater::work() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(m_mutex);
      m_wake.wait(lock, [this] { return m_stop || !m_jobs.empty(); });
      if (m_stop) return;
      job = std::move(m_jobs.front());
      m_jobs.pop_front();
      m_busy = true;
    }
    // The gradient is home once its drain is; then the update, as the
    // step's end would run it.
    m_side.host_wait_side(job.ticket);
    const Op& op = m_graph.ops[static_cast<size_t>(job.op)];
    const auto home = std::chrono::steady_clock::now();
    run_op(m_host, m_graph, op, job.next, false, &job.committed);
    const double busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - home).count();
    {
      std::lock_guard lock(m_mutex);
      if (m_round.elements == 0) m_round.first_home = home;
      m_round.busy_s += busy;
      m_round.elements += m_graph.tensors[static_cast<size_t>(op.in[0])].elements();
      m_done.insert(job.op);
      ++m_ran;
      m_busy = false;
      if (m_jobs.empty()) m_idle.notify_all();
    }
  }
}

}  // namespace tiermem::exec
