#include "daemon/check_ins.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace tiermem {
namespace {

uint64_t unix_ms() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

proto::NodeInfo::Health to_proto(NodeHealth h) { return static_cast<proto::NodeInfo::Health>(h); }

}  // namespace

void CheckIns::opened(uint64_t session, const std::string& name, pid_t pid, uid_t uid, const std::string& tenant,
                      uint32_t interval_ms) {
  std::lock_guard lock(m_mutex);
  Edge& e = m_edges[session];
  e.name = name;
  e.tenant = tenant;
  e.pid = pid;
  e.uid = uid;
  e.interval_ms = interval_ms;
  e.last = Clock::now();
  e.last_unix_ms = e.since_unix_ms = unix_ms();
  e.health = NodeHealth::healthy;
}

void CheckIns::seen(uint64_t session) {
  std::lock_guard lock(m_mutex);
  auto it = m_edges.find(session);
  if (it == m_edges.end()) return;
  it->second.last = Clock::now();
  it->second.last_unix_ms = unix_ms();
  if (it->second.health != NodeHealth::healthy) update(session, it->second, it->second.last);
}

void CheckIns::closed(uint64_t session) {
  std::lock_guard lock(m_mutex);
  auto it = m_edges.find(session);
  if (it == m_edges.end()) return;
  if (it->second.health != NodeHealth::healthy) {
    spdlog::info("client '{}' (session {}, pid {}) gone: its connection closed (it was {})", it->second.name, session,
                 it->second.pid, node_health_name(it->second.health));
  }
  m_edges.erase(it);
}

NodeHealth CheckIns::state_of(const Edge& e, Clock::time_point now, uint32_t* missed) const {
  *missed = 0;
  if (e.interval_ms == 0) return NodeHealth::healthy;  // connected; it never promised check-ins
  const auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(now - e.last);
  *missed = static_cast<uint32_t>(std::min<int64_t>(quiet.count() / e.interval_ms, UINT32_MAX));
  // Never unreachable before degraded: at least one more interval after it.
  const auto unreachable_after =
      std::max<std::chrono::milliseconds>(m_unreachable_after, std::chrono::milliseconds(
                                                                   (m_degraded_after + 1) * e.interval_ms));
  if (quiet >= unreachable_after) return NodeHealth::unreachable;
  if (*missed >= m_degraded_after) return NodeHealth::degraded;
  return NodeHealth::healthy;
}

void CheckIns::update(uint64_t session, Edge& e, Clock::time_point now) {
  uint32_t missed = 0;
  const NodeHealth h = state_of(e, now, &missed);
  if (h == e.health) return;
  const auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(now - e.last).count();
  if (h == NodeHealth::healthy) {
    spdlog::info("client '{}' (session {}, pid {}) check-ins: {} -> healthy (checked in again)", e.name, session,
                 e.pid, node_health_name(e.health));
  } else {
    spdlog::warn("client '{}' (session {}, pid {}) check-ins: {} -> {} ({} check-in(s) of every {} ms missed, none for "
                 "{} ms)",
                 e.name, session, e.pid, node_health_name(e.health), node_health_name(h), missed, e.interval_ms, quiet);
  }
  e.health = h;
  e.since_unix_ms = unix_ms();
}

std::chrono::milliseconds CheckIns::sweep() {
  std::lock_guard lock(m_mutex);
  const auto now = Clock::now();
  uint32_t shortest = 1000;
  for (auto& [session, e] : m_edges) {
    update(session, e, now);
    if (e.interval_ms > 0) shortest = std::min(shortest, e.interval_ms);
  }
  return std::chrono::milliseconds(std::clamp<uint32_t>(shortest / 2, 5, 500));
}

std::vector<proto::ClientEdge> CheckIns::edges() {
  std::lock_guard lock(m_mutex);
  const auto now = Clock::now();
  std::vector<proto::ClientEdge> out;
  for (auto& [session, e] : m_edges) {
    update(session, e, now);
    uint32_t missed = 0;
    (void)state_of(e, now, &missed);
    proto::ClientEdge c;
    c.set_session(session);
    c.set_client_name(e.name);
    c.set_pid(static_cast<uint32_t>(e.pid));
    c.set_uid(e.uid);
    c.set_tenant(e.tenant);
    c.set_health(to_proto(e.health));
    c.set_health_since_ms(e.since_unix_ms);
    c.set_last_checkin_ms(e.last_unix_ms);
    c.set_missed(missed);
    c.set_interval_ms(e.interval_ms);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace tiermem
