// QosRunner: QoS classes (H3) of reads, writes and atomics (see
// qos_runner.hpp).
#include "client/qos_runner.hpp"

#include <thread>

#include <tiermem/status_macros.h>

#include "client/client_core.hpp"
#include "common/deadline.hpp"

namespace tiermem::detail {
namespace {

using Clock = std::chrono::steady_clock;

// What a later attempt, or another copy, may do better: the home is slow,
// stopped, unreachable or busy. Anything else (bad address, out of range,
// permission) is the answer, whatever the class.
bool worth_retrying(const Status& s) {
  return home_unreachable(s) || s.code() == ErrorCode::busy || s.code() == ErrorCode::deadline_exceeded;
}

uint64_t ms_since(Clock::time_point start) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

}  // namespace

std::chrono::milliseconds QosRunner::budget(QosClass qos) const {
  switch (qos) {
    case QosClass::strict: return m_options.strict;
    case QosClass::best_effort: return m_options.best_effort;
    case QosClass::graceful_degrade: return m_options.graceful_degrade;
    case QosClass::standard: break;
  }
  return std::chrono::milliseconds(0);
}

Status QosRunner::exceeded(QosClass qos, const char* what, Gva gva, Clock::time_point start,
                            const std::string& tried) {
  // The local daemon's view of the home (answered from its memory).
  std::string state = "node " + std::to_string(gva.node);
  auto nodes = [&] {
    ScopedDeadline d(Clock::now() + std::chrono::milliseconds(20));
    return m_daemon.nodes();
  }();
  bool found = false;
  if (nodes.ok()) {
    for (const NodeInfo& n : nodes->nodes) {
      if (n.node != gva.node) continue;
      found = true;
      state += " is " + std::string(node_health_name(n.health)) + " (" + std::to_string(n.missed_heartbeats) +
               " heartbeat(s) missed, link " + std::string(node_state_name(n.state)) + ")";
    }
  }
  if (!found) state += (gva.node == m_self ? " is this node" : " is in an unknown state");
  return Status(ErrorCode::deadline_exceeded,
                std::string(qos_class_name(qos)) + " " + what + " of " + gva.to_string() + " did not finish within " +
                    std::to_string(budget(qos).count()) + " ms (" + std::to_string(ms_since(start)) +
                    " ms spent); " + state + "; tried: " + tried);
}

Status QosRunner::copy(QosClass qos, bool write, Gva gva, const Attempt& home, const Attempt& from_copy) {
  const auto start = Clock::now();
  const auto deadline = start + budget(qos);
  const char* what = write ? "write" : "read";
  // graceful_degrade leaves half its time for the fallback; best_effort
  // gives each of its attempts an equal share (an attempt that fails early
  // leaves the next one more).
  const auto home_deadline = qos == QosClass::graceful_degrade ? start + budget(qos) / 2 : deadline;
  const uint32_t attempts = qos == QosClass::best_effort ? 1 + m_options.best_effort_retries : 1;
  std::string tried;
  for (uint32_t i = 0; i < attempts && Clock::now() < home_deadline; ++i) {
    const auto attempt_ends = start + (home_deadline - start) * (i + 1) / attempts;
    Status s;
    {
      ScopedDeadline bounded(attempt_ends);
      s = home();
    }
    if (s.ok()) return s;
    if (!worth_retrying(s)) return s;
    tried += (tried.empty() ? "" : "; ") + std::string("the home, attempt ") + std::to_string(i + 1) + " of " +
             std::to_string(attempts) + " at " + std::to_string(ms_since(start)) + " ms: " + s.to_string();
    // A failure that came at once (the node is known to be down) waits out
    // its share: the attempts are spread over the whole budget, so a node
    // back within it is found, and a call that fails takes its budget.
    if (qos == QosClass::best_effort && Clock::now() < attempt_ends) std::this_thread::sleep_until(attempt_ends);
  }
  if (qos == QosClass::graceful_degrade && from_copy) {
    ScopedDeadline bounded(deadline);
    Status s = from_copy();
    if (s.ok()) return s;
    tried += "; a copy: " + s.to_string();
  }
  return exceeded(qos, what, gva, start, tried);
}

Result<uint64_t> QosRunner::atomic(QosClass qos, Gva gva, const std::function<Result<uint64_t>()>& once) {
  const auto start = Clock::now();
  Result<uint64_t> r = [&] {
    ScopedDeadline bounded(start + budget(qos));
    return once();
  }();
  if (r.ok() || !worth_retrying(r.status())) return r;
  return exceeded(qos, "atomic", gva, start, r.status().to_string() + " (its outcome is unknown)");
}

}  // namespace tiermem::detail
