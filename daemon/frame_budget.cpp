#include "daemon/frame_budget.hpp"

#include <algorithm>
#include <set>

#include <tiermem/units.h>

namespace tiermem {

uint64_t next_frame_capacity(uint64_t have, uint64_t waiting, uint64_t length) {
  return std::min(length, std::max({have + waiting, 2 * have, k_min_frame_buffer}));
}

FrameBudget::FrameBudget(uint64_t total, uint64_t per_uid) : m_total(total), m_per_uid(per_uid) {}

bool FrameBudget::Claim::granted() const { return is_granted; }

bool FrameBudget::fits(uid_t uid, uint64_t bytes) const {
  const auto it = m_held_by.find(uid);
  const uint64_t by_uid = it == m_held_by.end() ? 0 : it->second;
  return m_held + bytes <= m_total && by_uid + bytes <= m_per_uid;
}

void FrameBudget::take_locked(uid_t uid, uint64_t bytes) {
  m_held += bytes;
  m_held_by[uid] += bytes;
}

std::shared_ptr<FrameBudget::Claim> FrameBudget::claim(uid_t uid, std::string who, uint64_t bytes,
                                                       std::function<void()> wake) {
  auto c = std::make_shared<Claim>();
  c->uid = uid;
  c->who = std::move(who);
  c->bytes = bytes;
  c->since = Clock::now();
  std::vector<std::function<void()>> woken;
  {
    std::lock_guard lock(m_mutex);
    if (m_line.empty() && fits(uid, bytes) && !m_closed) {
      take_locked(uid, bytes);
      c->is_granted = true;
      return c;
    }
    c->wake = std::move(wake);
    m_line.push_back(c);
    // Those before it in line wait for their own uid: this one may pass.
    woken = grant_locked();
  }
  for (auto& w : woken) w();
  return c;
}

std::vector<std::function<void()>> FrameBudget::grant_locked() {
  std::vector<std::function<void()>> woken;
  if (m_closed) return woken;
  std::set<uid_t> full;  // uids whose first claim in line does not fit their share
  for (auto it = m_line.begin(); it != m_line.end();) {
    Claim& c = **it;
    if (full.count(c.uid) != 0) {
      ++it;
      continue;
    }
    const auto held = m_held_by.find(c.uid);
    if ((held == m_held_by.end() ? 0 : held->second) + c.bytes > m_per_uid) {
      full.insert(c.uid);  // waits for its own uid; others may pass
      ++it;
      continue;
    }
    if (m_held + c.bytes > m_total) break;  // nobody passes the first in line for the total
    take_locked(c.uid, c.bytes);
    c.is_granted = true;
    if (c.wake) woken.push_back(std::move(c.wake));
    it = m_line.erase(it);
  }
  return woken;
}

Status FrameBudget::settle(const std::shared_ptr<Claim>& claim) {
  std::vector<std::function<void()>> woken;
  Status refused;
  {
    std::lock_guard lock(m_mutex);
    if (claim->is_granted) return Status();
    const auto at = std::find(m_line.begin(), m_line.end(), claim);
    if (at != m_line.end()) m_line.erase(at);
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - claim->since).count();
    const auto by = m_held_by.find(claim->uid);
    const uint64_t by_uid = by == m_held_by.end() ? 0 : by->second;
    const std::string what = "a frame of " + format_size(claim->bytes) + " waited " + std::to_string(waited) +
                             " ms for the daemon's frame budget: ";
    if (by_uid + claim->bytes > m_per_uid) {
      refused = Status(ErrorCode::busy, what + claim->who + " holds " + format_size(by_uid) +
                                            " of its " + format_size(m_per_uid) +
                                            " in frames being read or handled (control.frame_budget_per_uid_bytes); "
                                            "try again, or send fewer large frames at once");
    } else {
      refused = Status(ErrorCode::busy, what + "frames being read or handled hold " + format_size(m_held) + " of " +
                                            format_size(m_total) + " (control.frame_budget_bytes, " +
                                            std::to_string(m_line.size()) + " more waiting); try again");
    }
    // It may have been first in line: the others may pass now.
    woken = grant_locked();
  }
  for (auto& w : woken) w();
  return refused;
}

void FrameBudget::release(uid_t uid, uint64_t bytes) {
  if (bytes == 0) return;
  std::vector<std::function<void()>> woken;
  {
    std::lock_guard lock(m_mutex);
    m_held -= std::min(m_held, bytes);
    auto it = m_held_by.find(uid);
    if (it != m_held_by.end()) {
      it->second -= std::min(it->second, bytes);
      if (it->second == 0) m_held_by.erase(it);
    }
    woken = grant_locked();
  }
  for (auto& w : woken) w();
}

void FrameBudget::close() {
  std::lock_guard lock(m_mutex);
  m_closed = true;
}

uint64_t FrameBudget::held() const {
  std::lock_guard lock(m_mutex);
  return m_held;
}

uint64_t FrameBudget::held_by(uid_t uid) const {
  std::lock_guard lock(m_mutex);
  auto it = m_held_by.find(uid);
  return it == m_held_by.end() ? 0 : it->second;
}

size_t FrameBudget::waiting() const {
  std::lock_guard lock(m_mutex);
  return m_line.size();
}

}  // namespace tiermem
