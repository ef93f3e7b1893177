// QoS classes (H3) of reads, writes and atomics (internal): a deadline for
// the whole call (common/deadline.hpp bounds every wait inside it, and the
// daemons' waits through Request.deadline_ms), retries for best_effort, a
// copy's bytes for graceful_degrade, and errors that say which class, which
// deadline, what the home node's state is and what was tried.
//
// It runs the attempts its owner gives it; it does not know how bytes move.
#pragma once

#include <chrono>
#include <functional>

#include <tiermem/client.h>

#include "proto/control_stub.hpp"

namespace tiermem::detail {

class QosRunner {
 public:
  // `daemon`: this client's (asked for the home node's state when a call
  // runs out of time); `self`: its node.
  QosRunner(ControlStub& daemon, NodeId self) : m_daemon(daemon), m_self(self) {}

  void set_options(const QosOptions& options) { m_options = options; }
  // The deadline of a call of class `qos` (0 for standard: none).
  std::chrono::milliseconds budget(QosClass qos) const;
  // The longest deadline any class has.
  std::chrono::milliseconds longest() const { return m_options.graceful_degrade; }

  using Attempt = std::function<Status()>;
  // A read or write of `gva` in class `qos` (not standard): `home` tries
  // the home, under a deadline of its share of the budget (best_effort
  // spreads its attempts over the whole budget); `from_copy` (a read under
  // graceful_degrade only) reads a copy in what is left of it.
  Status copy(QosClass qos, bool write, Gva gva, const Attempt& home, const Attempt& from_copy);
  // An atomic in class `qos` (not standard): tried once, never again (it
  // may have been applied).
  Result<uint64_t> atomic(QosClass qos, Gva gva, const std::function<Result<uint64_t>()>& once);

 private:
  // deadline_exceeded for a call of class `qos` begun at `start`, naming
  // the home node's state as the local daemon sees it and what was tried.
  Status exceeded(QosClass qos, const char* what, Gva gva, std::chrono::steady_clock::time_point start,
                  const std::string& tried);

  ControlStub& m_daemon;
  const NodeId m_self;
  QosOptions m_options;
};

}  // namespace tiermem::detail
